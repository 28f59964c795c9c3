"""Workload 1, lifecycle throughput: N one-action no-op tasks submitted while the drain
agents (4 x 25 simulated devices, --sim-delay 0s) run them; tasks/s from the first submit
to the last `done`, checked row by row in PostgreSQL. Submitted in SubmitTasks batches
(`batch` > 1, a few calls in flight) or one SubmitTask per task (32 calls in flight)."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from dataclasses import dataclass
from typing import Any

from amc.v1 import scheduler_pb2
from bench_lib import pgstats, stack
from bench_lib.client import Client, Clock, bounded, key_actions, submit_request
from bench_lib.pgstats import Db
from bench_lib.stats import over_reps

POOL = "drain"
POLL = 0.05  # how often the benchmark counts `done` rows while waiting


@dataclass(frozen=True)
class Options:
    tasks: int
    concurrency: int = 32
    batch: int = 1
    timeout: float = 300.0
    # SubmitTasks calls in flight when batching.
    batch_concurrency: int = 4


async def run_once(st: stack.Stack, client: Client, db: Db, clock: Clock, opt: Options) -> dict:
    request = submit_request(key_actions(1), POOL)
    before = await pgstats.counters(st.dsn)
    since = await db.now()
    cpu0 = _cpu(st)
    first_submit = time.monotonic()

    async def submit() -> list[uuid.UUID]:
        task = await client.scheduler.SubmitTask(request, timeout=60)
        return [uuid.UUID(task.task_id)]

    async def submit_batch(n: int) -> list[uuid.UUID]:
        batch = scheduler_pb2.SubmitTasksRequest(tasks=[request] * n)
        answer = await client.scheduler.SubmitTasks(batch, timeout=60)
        return [uuid.UUID(t.task_id) for t in answer.tasks]

    if opt.batch > 1:
        full, rest = divmod(opt.tasks, opt.batch)
        sizes = [opt.batch] * full + ([rest] if rest else [])
        calls = [functools.partial(submit_batch, n) for n in sizes]
        submitting = asyncio.ensure_future(bounded(calls, opt.batch_concurrency))
    else:
        submitting = asyncio.ensure_future(bounded([submit] * opt.tasks, opt.concurrency))
    submitted: list[float] = []
    submitting.add_done_callback(lambda _: submitted.append(time.monotonic()))
    seen_all = await _wait_all_done(db, since, opt.tasks, submitting, opt.timeout)
    task_ids = [task_id for ids in await submitting for task_id in ids]
    cpu1 = _cpu(st)
    check = await db.lifecycle_check(task_ids)
    after = await pgstats.counters(st.dsn)
    last_done = clock.mono(check["last_finished"]) if check["last_finished"] else seen_all
    elapsed = last_done - first_submit
    wall = seen_all - first_submit
    return {
        "tasks": opt.tasks,
        "submit_batch": opt.batch,
        "tasks_per_s": opt.tasks / elapsed,
        "elapsed_s": elapsed,
        "client_seen_all_done_s": wall,
        "submit_phase_s": submitted[0] - first_submit,
        "verified": _verified(check, opt.tasks),
        "check": {k: v for k, v in check.items() if isinstance(v, int)},
        "cost": pgstats.per_item(before, after, opt.tasks),
        "cpu_cores": {k: (cpu1[k] - cpu0[k]) / wall for k in cpu0},
        "cpu_ms_per_task": {
            k: (cpu1[k] - cpu0[k]) * 1e3 / opt.tasks
            for k in ("control_plane", "agents", "postgres")
        },
    }


async def _wait_all_done(
    db: Db, since: Any, n: int, submitting: asyncio.Future[Any], timeout: float
) -> float:
    deadline = time.monotonic() + timeout
    while True:
        if submitting.done() and submitting.exception():
            raise submitting.exception()  # type: ignore[misc]
        if await db.count_done(since) >= n:
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"lifecycle: not all {n} tasks done within {timeout:.0f}s")
        await asyncio.sleep(POLL)


def _verified(check: dict[str, Any], n: int) -> bool:
    keys = ("tasks", "done", "attempts", "attempts_done", "done_events")
    return all(check[k] == n for k in keys)


def _cpu(st: stack.Stack) -> dict[str, float]:
    """CPU seconds so far: control plane, agents (together), PostgreSQL, the machine."""
    assert st.control_plane is not None
    pm = st.postmaster_pid()
    drain = [c for h, c in st.agents.items() if h.startswith(POOL)]
    return {
        "control_plane": stack.cpu_seconds(st.control_plane.pid),
        "agents": sum(stack.cpu_seconds(c.pid) for c in drain),
        "postgres": stack.tree_cpu_seconds(pm) if pm else 0.0,
        "benchmark_client": time.process_time(),
        "machine": stack.machine_busy_seconds(),
    }


def aggregate(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """min / median / max over the repetitions of every figure."""

    def cost(key: str) -> dict[str, object]:
        return over_reps([r["cost"][key] for r in reps])

    return {
        "tasks": reps[0]["tasks"],
        "submit_batch": reps[0]["submit_batch"],
        "tasks_per_s": over_reps([r["tasks_per_s"] for r in reps]),
        "elapsed_s": over_reps([r["elapsed_s"] for r in reps]),
        "verified": all(r["verified"] for r in reps),
        "commits_per_task": cost("commits_per_task"),
        "wal_fsyncs_per_task": cost("wal_fsyncs_per_task"),
        "wal_bytes_per_task": cost("wal_bytes_per_task"),
        "cpu_cores": {
            k: over_reps([r["cpu_cores"][k] for r in reps]) for k in reps[0]["cpu_cores"]
        },
        "cpu_ms_per_task": {
            k: over_reps([r["cpu_ms_per_task"][k] for r in reps])
            for k in reps[0]["cpu_ms_per_task"]
        },
        "reps": reps,
    }
