"""Following one task until it ends, for `amc watch` and `amc submit --wait`.

WatchTask sends the current state and then each change. A replica that shuts down ends
its streams with UNAVAILABLE ("watch again"), so once the first state has arrived a
dropped stream is opened again, with backoff, rather than failing the command; a server
that is not there at all still fails at once. The person is told when the stream drops
and when the reason changes, not at every try.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from amc.v1 import task_pb2
from amc_cli.client import Client
from amc_cli.errors import CliError, ExitCode

RETRIES = 8
FIRST_BACKOFF = 0.25
MAX_BACKOFF = 5.0

OUTCOME_EXIT = {
    task_pb2.TASK_STATUS_DONE: ExitCode.OK,
    task_pb2.TASK_STATUS_FAILED: ExitCode.TASK_FAILED,
    task_pb2.TASK_STATUS_CANCELLED: ExitCode.TASK_CANCELLED,
}

OnChange = Callable[[task_pb2.Task, task_pb2.Task | None], None]


def follow(
    client: Client,
    task_id: str,
    on_change: OnChange,
    on_retry: Callable[[str], None] | None = None,
) -> task_pb2.Task:
    """Calls `on_change(task, previous)` for each state seen; returns the terminal task."""
    last: task_pb2.Task | None = None
    retries = 0
    told = ""
    while True:
        try:
            for task in client.watch(task_id):
                on_change(task, last)
                last, retries, told = task, 0, ""
                if task.status in OUTCOME_EXIT:
                    return task
            problem = "the watch stream ended before the task did"
        except grpc.RpcError as exc:
            resumable = isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.UNAVAILABLE
            if last is None or not resumable or retries >= RETRIES:
                raise client.failed(exc, "watch task") from None
            problem = " ".join((exc.details() or "stream dropped").split())
        if last is None or retries >= RETRIES:
            raise CliError(f"watch task: {problem}")
        delay = min(FIRST_BACKOFF * 2**retries, MAX_BACKOFF)
        retries += 1
        if on_retry is not None and problem != told:
            on_retry(f"watch interrupted ({problem}); watching again, up to {RETRIES} tries")
        told = problem
        time.sleep(delay)


def outcome_exit(task: task_pb2.Task) -> ExitCode:
    return OUTCOME_EXIT.get(task.status, ExitCode.ERROR)
