"""Workloads 2 and 3 on the latency agent (its own pool of simulated devices, 10 ms per
action, an action log with CLOCK_MONOTONIC times), one trial at a time.

Pickup: SubmitTask of a one-action task to an idle device. Measured from just before the
call (time.monotonic() here) to
  * `dispatched`: the attempt's acknowledged_at (the database clock, turned monotonic),
    a lower bound: it is the start of the acknowledging transaction, not its commit;
  * the first action starting on the device (the agent's action log), an upper bound:
    the agent runs only after the acknowledgement's answer came back.
Cancel: a task of 100 uninterruptible 10 ms actions is running (WatchTask said
dispatched, then 20-40 ms more, so the cancel lands at a random point of an action).
Measured from CancelTask's return (the issue's start; also from just before the call) to
  * the runner stopped: the end of the task's last action (action log),
  * `cancelled` seen by the caller on the WatchTask stream it held open.
The split requested -> delivered -> stopped comes from the control plane's histograms
(amc_cancel_delivery_seconds, amc_cancel_stop_seconds) and, per trial, from the attempt
rows (cancel_requested_at, cancel_delivered_at, finished_at).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from amc.v1 import scheduler_pb2, task_pb2
from amc_common import statuses
from bench_lib import promtext, stack
from bench_lib.client import Client, Clock, key_actions, submit_request
from bench_lib.pgstats import Db
from bench_lib.stats import summarize

POOL = "latency"
HOST = "latency-0"
# 100 x 10 ms: long enough that the cancel (20-40 ms after `dispatched`) lands mid-run, short
# enough that the cancelled report (one step result per action) is of a realistic size.
LONG_TASK_ACTIONS = 100
TRIAL_TIMEOUT = 30.0


@dataclass(frozen=True)
class Trial:
    task_id: uuid.UUID
    serial: str
    t_submit: float  # just before SubmitTask
    t0: float  # just before the call being timed (Submit or Cancel)
    t_return: float  # the call returned
    t_end: float  # the watch saw the final status


async def _watch_until(
    client: Client, task_id: str, statuses: set[int], call: Any = None
) -> tuple[Any, task_pb2.Task]:
    """Read (or open) a WatchTask stream until the task reaches one of `statuses` or ends;
    the caller checks which."""
    call = call or client.scheduler.WatchTask(
        scheduler_pb2.WatchTaskRequest(task_id=task_id), timeout=TRIAL_TIMEOUT
    )
    while True:
        task = await call.read()
        if task is None or not isinstance(task, task_pb2.Task):
            raise RuntimeError(f"watch of {task_id} ended before {statuses}")
        if task.status in statuses or task.status in TERMINAL:
            return call, task


TERMINAL = statuses.numbers(statuses.TERMINAL, task_pb2.TaskStatus)


async def _pause() -> None:
    """Between trials: the device is idle again and its agent's Acquire is parked."""
    await asyncio.sleep(random.uniform(0.02, 0.04))


# -- pickup --------------------------------------------------------------------------------


async def pickup_trials(client: Client, trials: int, warmup: int, pool: str = POOL) -> list[Trial]:
    request = submit_request(key_actions(1), pool)
    done: list[Trial] = []
    for i in range(warmup + trials):
        t0 = time.monotonic()
        task = await client.scheduler.SubmitTask(request, timeout=TRIAL_TIMEOUT)
        t_return = time.monotonic()
        call, final = await _watch_until(client, task.task_id, {task_pb2.TASK_STATUS_DONE})
        t_end = time.monotonic()
        call.cancel()
        if final.status != task_pb2.TASK_STATUS_DONE:
            raise RuntimeError(f"pickup task {task.task_id} ended {final.status}, not done")
        if i >= warmup:
            done.append(
                Trial(uuid.UUID(task.task_id), final.device_serial, t0, t0, t_return, t_end)
            )
        await _pause()
    return done


class Spans:
    """Named samples in ms, summarised together."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def add(self, name: str, start: float | None, end: float | None) -> None:
        if start is not None and end is not None:
            self.values.setdefault(name, []).append((end - start) * 1e3)

    def summary(self) -> dict[str, dict[str, float]]:
        return {name: summarize(v) for name, v in self.values.items()}


def _mono(clock: Clock, at: Any) -> float | None:
    return clock.mono(at) if at is not None else None


def pickup_figures(
    trials: list[Trial],
    times: dict[uuid.UUID, Any],
    clock: Clock,
    actions: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Submit -> dispatched and -> first action, and the chain between them: the client's
    call reaching the database, queued -> assigned (NOTIFY, the parked Acquire), assigned ->
    dispatched (the Assignment reaching the agent, its acknowledging renewal), dispatched ->
    the first action (the renewal's answer reaching the agent, the runner starting)."""
    total, chain = Spans(), Spans()
    for t in trials:
        row = times[t.task_id]
        queued, assigned = _mono(clock, row["created_at"]), _mono(clock, row["assigned_at"])
        dispatched = _mono(clock, row["acknowledged_at"])
        first = _first_start(actions.get(t.serial, []), t.t0, t.t_end)
        total.add("submit_to_dispatched_ms", t.t0, dispatched)
        total.add("submit_to_first_action_ms", t.t0, first)
        total.add("submit_call_ms", t.t0, t.t_return)
        chain.add("submit_to_queued_ms", t.t0, queued)
        chain.add("queued_to_assigned_ms", queued, assigned)
        chain.add("assigned_to_dispatched_ms", assigned, dispatched)
        chain.add("dispatched_to_first_action_ms", dispatched, first)
    return {**total.summary(), "chain": chain.summary()}


# -- cancel --------------------------------------------------------------------------------


async def cancel_trials(client: Client, trials: int, warmup: int) -> tuple[list[Trial], int]:
    """(the timed trials, how many were void: the task ended before the cancel landed)."""
    request = submit_request(key_actions(LONG_TASK_ACTIONS), POOL)
    done: list[Trial] = []
    void = 0
    while len(done) < warmup + trials:
        trial = await _cancel_trial(client, request)
        if trial is None:
            void += 1
            if void > trials:
                raise RuntimeError("cancel: most tasks finished before their cancel landed")
        else:
            done.append(trial)
        await _pause()
    return done[warmup:], void


async def _cancel_trial(client: Client, request: scheduler_pb2.SubmitTaskRequest) -> Trial | None:
    t_submit = time.monotonic()
    task = await client.scheduler.SubmitTask(request, timeout=TRIAL_TIMEOUT)
    call, running = await _watch_until(client, task.task_id, {task_pb2.TASK_STATUS_DISPATCHED})
    if running.status != task_pb2.TASK_STATUS_DISPATCHED:
        call.cancel()
        return None
    try:
        await asyncio.sleep(random.uniform(0.02, 0.04))
        t0 = time.monotonic()
        try:
            await client.scheduler.CancelTask(
                scheduler_pb2.CancelTaskRequest(task_id=task.task_id, reason="benchmark"),
                timeout=TRIAL_TIMEOUT,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.FAILED_PRECONDITION:  # it finished first
                return None
            raise
        t_return = time.monotonic()
        _, final = await _watch_until(client, task.task_id, {task_pb2.TASK_STATUS_CANCELLED}, call)
        t_end = time.monotonic()
        if final.status != task_pb2.TASK_STATUS_CANCELLED:
            return None  # it finished first, and reported done
    finally:
        call.cancel()
    return Trial(uuid.UUID(task.task_id), running.device_serial, t_submit, t0, t_return, t_end)


def cancel_figures(
    trials: list[Trial],
    times: dict[uuid.UUID, Any],
    clock: Clock,
    actions: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """Cancel -> runner stopped and -> the caller sees `cancelled`, and the chain: the call
    reaching the database (requested), the host told (delivered: push or renewal answer),
    the runner stopped at the next action boundary, the cancelled report recorded
    (finished), the caller's WatchTask stream showing it."""
    total, chain = Spans(), Spans()
    for t in trials:
        row = times[t.task_id]
        requested = _mono(clock, row["cancel_requested_at"])
        delivered = _mono(clock, row["cancel_delivered_at"])
        finished = _mono(clock, row["finished_at"])
        stopped = _last_end(actions.get(t.serial, []), t.t_submit, t.t_end)
        # The measure starts when CancelTask has returned; the call's own time and
        # the figures from just before the call are kept beside it.
        total.add("returned_to_runner_stopped_ms", t.t_return, stopped)
        total.add("returned_to_cancelled_ms", t.t_return, t.t_end)
        total.add("cancel_to_cancelled_ms", t.t0, t.t_end)
        total.add("cancel_to_runner_stopped_ms", t.t0, stopped)
        total.add("cancel_call_ms", t.t0, t.t_return)
        chain.add("call_to_requested_ms", t.t0, requested)
        chain.add("requested_to_delivered_ms", requested, delivered)
        chain.add("delivered_to_runner_stopped_ms", delivered, stopped)
        chain.add("runner_stopped_to_finished_ms", stopped, finished)
        chain.add("finished_to_caller_ms", finished, t.t_end)
    return {**total.summary(), "chain": chain.summary()}


def metrics_split(before: promtext.Samples, after: promtext.Samples) -> dict[str, Any]:
    """The control plane's own view, in ms: requested -> delivered (by path), and
    delivered -> the host's cancelled report (amc_cancel_stop_seconds)."""

    def ms(h: promtext.Histogram) -> dict[str, float]:
        return {k: (v * 1e3 if k != "n" else v) for k, v in h.summary().items()}

    name = "amc_cancel_delivery_seconds"
    return {
        "requested_to_delivered_ms": ms(promtext.histogram(before, after, name)),
        "requested_to_delivered_push_ms": ms(promtext.histogram(before, after, name, path="push")),
        "requested_to_delivered_renewal_ms": ms(
            promtext.histogram(before, after, name, path="renewal")
        ),
        "delivered_to_stopped_ms": ms(promtext.histogram(before, after, "amc_cancel_stop_seconds")),
    }


# -- the action log ------------------------------------------------------------------------


def read_actions(path: Path) -> dict[str, list[dict[str, Any]]]:
    by_serial: dict[str, list[dict[str, Any]]] = {}
    if not path.exists():
        return by_serial
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record["action"] == "clean":  # the host's clean between leases, not a task's
            continue
        by_serial.setdefault(record["serial"], []).append(record)
    return by_serial


def _first_start(records: list[dict[str, Any]], after: float, before: float) -> float | None:
    starts = [r["started_monotonic"] for r in records if after <= r["started_monotonic"] <= before]
    return min(starts) if starts else None


def _last_end(records: list[dict[str, Any]], after: float, before: float) -> float | None:
    ends = [r["ended_monotonic"] for r in records if after <= r["started_monotonic"] <= before]
    return max(ends) if ends else None


async def run(
    st: stack.Stack, client: Client, db: Db, clock: Clock, trials: int, warmup: int
) -> dict[str, Any]:
    cpu0 = stack.cpu_now(st, (HOST,))
    pickup = await pickup_trials(client, trials, warmup)
    cpu1 = stack.cpu_now(st, (HOST,))
    before = await promtext.scrape(st.metrics_url)
    cancel, void = await cancel_trials(client, trials, warmup)
    after = await promtext.scrape(st.metrics_url)
    cpu2 = stack.cpu_now(st, (HOST,))
    actions = read_actions(st.action_logs[HOST])
    times = await db.attempt_times([t.task_id for t in pickup + cancel])
    return {
        "trials": trials,
        # CPU per task of each kind (its warm-ups and, for cancel, void trials included:
        # they are tasks too).
        "pickup": {
            **pickup_figures(pickup, times, clock, actions),
            "cpu_ms_per_task": stack.per_unit(cpu0, cpu1, trials + warmup),
        },
        "cancel": {
            "void_trials": void,
            **cancel_figures(cancel, times, clock, actions),
            "metrics": metrics_split(before, after),
            "cpu_ms_per_task": stack.per_unit(cpu1, cpu2, trials + warmup + void),
        },
    }
