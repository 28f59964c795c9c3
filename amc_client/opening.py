"""Opening an interactive session: the `OpenSession` call until its host joined, told as it
waits, and bounded by the queue timeout.

The first answer is the queued task with its `pending_reason`, so why it waits is known at
once: `on_wait` is told each state, and a selector no registered phone fits ("no
registered device matches model=Pixel9": the control plane's words) is also logged as a
warning on the `amc_client` logger at once (as `amc submit` warns), while the session
waits on for one to register. An `on_wait` that raises stops the wait: the session is
withdrawn and the exception propagates. It waits in the queue at most its queue timeout:
the control plane ends the task then ("queue timeout"), and the client withdraws it itself
a few seconds later if that end never came and the task still waits in the queue; either
raises NoPhone with the last reason given. A session a phone took is waited for until its
host joins: its apps (SessionOpen.apps) are installed first, which may take longer.

An opening carries a request id of its own (SessionOpen.request_id), the same each time it
is sent: an opening whose call broke before its first answer (UNAVAILABLE) is sent again,
and should the first have reached the control plane, the second is told so rather than
open a second session: refused FAILED_PRECONDITION naming the first while it lives, or
answered with its finished task. That first session is lost with its call (the control
plane withdraws it; so does the client, to be sure), and the opening raises SessionRefused
saying so: one opening, at most one session's task. A token past its sessions' limit
(RESOURCE_EXHAUSTED) is refused at once, not tried again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import Callable
from typing import Any

import grpc

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_client.errors import NoPhone, SessionRefused
from amc_client.phone import TERMINAL, Phone, TaskReader, hang_up
from amc_client.retry import Reach, Retry
from amc_common.channel import write_unless_ended

log = logging.getLogger("amc_client")

# How long a session waits for a phone unless told otherwise (Farm.session's queue_timeout).
DEFAULT_QUEUE_TIMEOUT = 60.0
# Past its queue timeout, how long the client waits for the control plane's own end of the
# wait (its sweep runs every second by default) before it withdraws the session itself.
SWEEP_GRACE = 5.0
# How the control plane's pending_reason begins when no registered device fits the
# selector at all (control_plane.pending.explain): nothing can take the task until one
# registers.
UNMATCHED = ("no registered device matches", "no device is registered")
QUEUE_TIMEOUT = "queue timeout"
# How many times an opening that could not be written (its call ended as it went) is sent.
UNSENT_TRIES = 3
# The session a request id opened before, as the control plane's refusal names it
# (control_plane.sessions: "request_id 'R' opened session ID already, which is queued…").
OPENED_BEFORE = re.compile(r"opened session (?P<task_id>[0-9a-fA-F-]{32,36}) already")

OnWait = Callable[[task_pb2.Task], None]


def unmatched(task: task_pb2.Task) -> bool:
    """Whether `task` waits for a phone no registered device could be."""
    return task.status == task_pb2.TASK_STATUS_QUEUED and task.pending_reason.startswith(UNMATCHED)


async def open_phone(
    stub: scheduler_pb2_grpc.SchedulerStub,
    retry: Retry,
    opening: scheduler_pb2.SessionOpen,
    *,
    queue_timeout: float | None,
    on_wait: OnWait | None,
    finished: TaskReader,
    reach: Reach | None = None,
) -> Phone:
    """The phone of a new session, once its host joined. `opening.request_id` is set here
    when it is not, and kept for every try."""
    if not opening.request_id:
        opening.request_id = uuid.uuid4().hex
    call, task = await _first_answer(stub, retry, opening, reach)
    waiting = _Waiting(on_wait, queue_timeout)
    limit = None if queue_timeout is None else queue_timeout + SWEEP_GRACE
    # Read apart from the wait for it: cancelling a grpc.aio read cancels the whole call.
    reading = asyncio.ensure_future(_dispatched(call, task, waiting))
    try:
        while not (await asyncio.wait({reading}, timeout=limit))[0]:
            if not await _queued(stub, task.task_id):
                limit = None  # a phone took it: its apps are installing, the host joins next
                continue
            reading.cancel()
            await withdraw(call)
            raise NoPhone(queue_timeout or 0.0, waiting.last, waiting.reason)
        task = reading.result()
    except NoPhone:
        raise
    except Exception:  # refused, ended, or stopped by on_wait: nothing may be left waiting
        await withdraw(call)
        raise
    except BaseException:
        reading.cancel()
        call.cancel()
        raise
    return Phone(call, task, finished=finished)


async def _queued(stub: scheduler_pb2_grpc.SchedulerStub, task_id: str) -> bool:
    """Whether the session's task still waits in the queue (so as not to withdraw one a
    phone took, whose apps take their time; a task that cannot be read counts as queued)."""
    try:
        task = await stub.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))
    except grpc.aio.AioRpcError:
        return True
    return bool(task.status == task_pb2.TASK_STATUS_QUEUED)


async def _first_answer(
    stub: scheduler_pb2_grpc.SchedulerStub,
    retry: Retry,
    opening: scheduler_pb2.SessionOpen,
    reach: Reach | None = None,
) -> tuple[Any, task_pb2.Task]:
    """The call and its first answer, the opening sent again (with its request id) after a
    transient failure; a try after the first that finds the session opened before raises
    SessionRefused."""
    tries = 0

    async def attempt() -> tuple[Any, task_pb2.Task]:
        nonlocal tries
        while True:
            tries += 1
            call: Any = stub.OpenSession()
            # Refused before the request went (a bad token): the read raises why.
            request = scheduler_pb2.OpenSessionRequest(open=opening)
            sent = await write_unless_ended(call, request)
            try:
                response = await call.read()
            except grpc.aio.AioRpcError as exc:
                if tries > 1 and exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                    await _opened_before(stub, exc)
                if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise SessionRefused(exc.details() or exc.code().name) from None
                # Ended as the opening went, grpc may say INTERNAL in place of the control
                # plane's status (grpc/grpc#36066): the opening never went, so ask again.
                if sent or exc.code() != grpc.StatusCode.INTERNAL or tries >= UNSENT_TRIES:
                    raise
                continue
            if response is grpc.aio.EOF:
                raise SessionRefused("the control plane ended the session before answering")
            if tries > 1 and response.task.status in TERMINAL:
                await hang_up(call)
                raise SessionRefused(_lost(response.task.task_id, _said(response.task)))
            return call, response.task

    return await retry.call(attempt, reach)


async def _opened_before(
    stub: scheduler_pb2_grpc.SchedulerStub, refused: grpc.aio.AioRpcError
) -> None:
    """A try that found the session an earlier try opened still queued or running (its
    call broke before it answered): withdraw it and say so. Returns for another refusal."""
    found = OPENED_BEFORE.search(refused.details() or "")
    if found is None:
        return
    task_id = found["task_id"]
    with contextlib.suppress(grpc.aio.AioRpcError):
        await stub.CancelTask(
            scheduler_pb2.CancelTaskRequest(
                task_id=task_id, reason="session lost with its call before it was answered"
            )
        )
    raise SessionRefused(_lost(task_id, "withdrawn"))


def _lost(task_id: str, how: str) -> str:
    return (
        f"the session's opening was cut before its answer and sent again: the control plane"
        f" had opened session {task_id} from the first, lost with its call ({how}); open a"
        " session again"
    )


def _said(task: task_pb2.Task) -> str:
    status: str = task_pb2.TaskStatus.Name(task.status).removeprefix("TASK_STATUS_").lower()
    why = task.cancel_reason or task.result.error
    return status + (f": {why}" if why else "")


class _Waiting:
    """What a session waiting for its phone was told last, and who is told."""

    def __init__(self, on_wait: OnWait | None, queue_timeout: float | None) -> None:
        self.on_wait = on_wait
        self.queue_timeout = queue_timeout
        self.last: task_pb2.Task | None = None
        self.reason = ""
        self.warned = False

    def saw(self, task: task_pb2.Task) -> None:
        self.last = task
        self.reason = task.pending_reason or self.reason
        if unmatched(task) and not self.warned and self.on_wait is None:
            self.warned = True
            bound = "as long as it takes"
            if self.queue_timeout is not None:
                bound = f"up to {self.queue_timeout:g} s"
            log.warning("%s; the session waits %s for one that fits", task.pending_reason, bound)
        if self.on_wait is not None:
            self.on_wait(task)


async def _dispatched(call: Any, task: task_pb2.Task, waiting: _Waiting) -> task_pb2.Task:
    while task.status != task_pb2.TASK_STATUS_DISPATCHED:
        if task.status in TERMINAL:
            failed = task.status == task_pb2.TASK_STATUS_FAILED
            if failed and task.result.error.startswith(QUEUE_TIMEOUT):
                raise NoPhone(waiting.queue_timeout or 0.0, task, waiting.reason)
            status, _, why = _said(task).partition(": ")
            said = f"session {status} before it started" + (f": {why}" if why else "")
            raise SessionRefused(said, task)
        waiting.saw(task)
        response = await call.read()
        if response is grpc.aio.EOF:
            raise SessionRefused("the control plane ended the session", task)
        task = response.task
    return task


async def withdraw(call: Any) -> None:
    """Give up a session that has no phone yet: its task ends cancelled ("closed by its
    client before it started"); cut if the control plane does not answer soon."""
    await hang_up(call)
