"""Workload 9, flood (issue 20): one team floods the phones, another submits now and then.

In a database of its own (`amc_flood`, same server), one fresh replica and --flood-phones
phones (hosts of 4, label pool=flood; fleet_host.FleetHost in this process, each holding a
phone --flood-task-seconds per task, as a one-second task would). Fair shares: team-a and
team-b, weight 1 each, no cap (Admin SetFairShare). Then:

1. team A submits --flood-tasks tasks for pool=flood (fairness key team-a) through
   SubmitTasks in batches of 500, 4 calls in flight, as fast as it can; the phones start on
   them at once;
2. once A's last batch is in, team B submits one task a second (--flood-b-rate) for the
   same phones (fairness key team-b) for --flood-seconds: the window;
3. B's tasks are waited for; A's are not (the flood would take tasks x task-seconds /
   phones to drain: 21 minutes at the issue's sizes); the phones are stopped.

Figures: B's pickup (just before its SubmitTask -> the Acquire answer naming it arrives at
its host, one clock) p50 / p99; A's tasks done per second over the window against the
phones' capacity (phones / task-seconds), and the share of phone-time in the window that A's
and B's tasks held (Acquire answer -> report accepted). Targets: B's pickup p99 <= one task
length + 0.2 s; A keeps >= 90 % of the phones busy (its drain rate / capacity).
Verified in PostgreSQL: every B task done exactly once; no task of A's with more than one
attempt, every A task reported done has one done event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from amc.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from amc_common.logs import configure
from bench_lib import promtext, stack
from bench_lib.client import bounded, key_actions
from bench_lib.fleet_host import Counters, FleetHost
from bench_lib.fleet_load import HOST_CHANNEL_OPTIONS, Usage
from bench_lib.pgstats import Db
from bench_lib.stats import summarize

DATABASE = "amc_flood"
POOL = "flood"
TEAM_A, TEAM_B = "team-a", "team-b"
DEVICES_PER_HOST = 4
A_BATCH = 500  # SubmitTasks' limit
A_CALLS = 4

# Issue 20's targets: B waits at most about one of A's tasks; A keeps the phones busy.
B_MARGIN_S = 0.2
A_BUSY_SHARE = 0.9


@dataclass(frozen=True)
class Options:
    tasks: int = 50_000  # team A's
    phones: int = 40
    task_seconds: float = 1.0
    seconds: float = 120.0  # team B's window
    b_rate: float = 1.0
    lease_ttl: float = 15.0
    drain_timeout: float = 30.0


@dataclass
class Tally:
    assigned: dict[str, float] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)
    # The tasks waited for (B's, once await_all names them); all_done is set when every
    # one of them is done.
    awaited: set[str] | None = None
    all_done: asyncio.Event = field(default_factory=asyncio.Event)

    def on_assigned(self, task_id: str, at: float) -> None:
        self.assigned.setdefault(task_id, at)

    def on_done(self, task_id: str, at: float) -> None:
        self.done.setdefault(task_id, at)
        if self.awaited is not None:
            self.awaited.discard(task_id)
            if not self.awaited:
                self.all_done.set()

    def await_all(self, ids: set[str]) -> None:
        self.awaited = {t for t in ids if t not in self.done}
        if not self.awaited:
            self.all_done.set()


def busy_share(tally: Tally, tasks: set[str], w0: float, w1: float, phones: int) -> float:
    """Phone-time the tasks held inside [w0, w1] (Acquire answer -> report accepted; a task
    still held at w1 counts to w1), over phones x (w1 - w0)."""
    held = 0.0
    for t in tasks:
        start = tally.assigned.get(t)
        if start is None:
            continue
        end = tally.done.get(t, w1)
        held += max(0.0, min(end, w1) - max(start, w0))
    return held / (phones * (w1 - w0)) if w1 > w0 else 0.0


async def set_shares(channel: grpc.aio.Channel) -> None:
    """Both teams weight 1, no cap, as an operator sets them (Admin SetFairShare)."""
    admin = admin_pb2_grpc.AdminStub(channel)
    for key in (TEAM_A, TEAM_B):
        request = admin_pb2.SetFairShareRequest(
            fairness_key=key, weight=1, clear_max_devices=True, reason="bench: flood"
        )
        await admin.SetFairShare(request, timeout=10)


async def wait_parked(url: str, hosts: int, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        samples = await promtext.scrape(url)
        if promtext.value(samples, "amc_acquires_waiting") >= hosts:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the {hosts} flood hosts did not all park within {within:.0f}s")


async def run(st: stack.Stack, opt: Options, say: Callable[[str], None]) -> dict[str, Any]:
    # The hosts report through the agent's own ResultBatcher, in this process: its line per
    # result would cost more than playing the hosts does.
    configure(level="WARNING")
    dsn = await st.create_database(DATABASE)
    n_hosts = max(1, opt.phones // DEVICES_PER_HOST)
    phones = n_hosts * DEVICES_PER_HOST
    replica = await st.start_replica("flood-cp", opt.lease_ttl, dsn)
    pm = st.postmaster_pid()
    assert pm is not None
    counters = Counters()
    tally = Tally()
    hosts: list[FleetHost] = []
    channels: list[grpc.aio.Channel] = []
    submit_channel = aio_channel(replica.address)
    scheduler = scheduler_pb2_grpc.SchedulerStub(submit_channel)
    spec = key_actions(1)
    selector = task_pb2.DeviceSelector(labels={"pool": POOL})
    a_ids: set[str] = set()
    b_sent: dict[str, float] = {}
    failed: list[str] = []
    try:
        await set_shares(submit_channel)
        prefix = f"flood-{uuid.uuid4().hex[:6]}"
        for i in range(n_hosts):
            channel = aio_channel(replica.address, options=HOST_CHANNEL_OPTIONS)
            channels.append(channel)
            hosts.append(
                FleetHost(
                    f"{prefix}-h{i:03d}",
                    {"pool": POOL},
                    channel,
                    devices=DEVICES_PER_HOST,
                    counters=counters,
                    on_assigned=tally.on_assigned,
                    on_done=tally.on_done,
                    work_seconds=opt.task_seconds,
                )
            )
        for host in hosts:
            await host.register()
        for host in hosts:
            host.start()
        await wait_parked(replica.metrics_url, n_hosts)
        say(f"flood: {phones} phones; team A submits {opt.tasks:,} tasks of {opt.task_seconds:g}s")
        counters.phase = "flood"
        before = Usage([replica.child.pid], pm)

        def a_batch(lo: int, hi: int) -> Callable[[], Any]:
            async def call() -> None:
                request = scheduler_pb2.SubmitTasksRequest(
                    tasks=[
                        scheduler_pb2.SubmitTaskRequest(
                            spec=spec, selector=selector, max_attempts=1, fairness_key=TEAM_A
                        )
                        for _ in range(lo, hi)
                    ]
                )
                try:
                    answer = await scheduler.SubmitTasks(request, timeout=120)
                except grpc.aio.AioRpcError as exc:
                    failed.append(f"A {exc.code().name}: {exc.details()}")
                    return
                a_ids.update(t.task_id for t in answer.tasks)

            return call

        a_started = time.monotonic()
        await bounded(
            [a_batch(lo, min(opt.tasks, lo + A_BATCH)) for lo in range(0, opt.tasks, A_BATCH)],
            A_CALLS,
        )
        a_submitted = time.monotonic()
        say(
            f"  A's {len(a_ids):,} tasks in {a_submitted - a_started:.1f}s; team B submits"
            f" {opt.b_rate:g}/s for {opt.seconds:g}s"
        )

        async def b_one() -> None:
            request = scheduler_pb2.SubmitTaskRequest(
                spec=spec, selector=selector, max_attempts=1, fairness_key=TEAM_B
            )
            sent = time.monotonic()
            try:
                task = await scheduler.SubmitTask(request, timeout=60)
            except grpc.aio.AioRpcError as exc:
                failed.append(f"B {exc.code().name}: {exc.details()}")
                return
            b_sent[task.task_id] = sent

        w0 = time.monotonic()
        window_before = Usage([replica.child.pid], pm)
        count = round(opt.b_rate * opt.seconds)
        calls = []
        for i in range(count):
            await asyncio.sleep(max(0.0, w0 + i / opt.b_rate - time.monotonic()))
            calls.append(asyncio.ensure_future(b_one()))
        await asyncio.sleep(max(0.0, w0 + opt.seconds - time.monotonic()))
        w1 = time.monotonic()
        window_after = Usage([replica.child.pid], pm)
        await asyncio.gather(*calls)
        tally.await_all(set(b_sent))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(tally.all_done.wait(), opt.drain_timeout)
        counters.phase = "close"
    finally:
        await asyncio.gather(*(h.stop() for h in hosts), return_exceptions=True)
        await asyncio.gather(*(c.close() for c in channels), return_exceptions=True)
        await submit_channel.close()
        replica.child.stop()
    usage = window_after.cores_since(window_before)
    b_ids = set(b_sent)
    a_done_in = [t for t in a_ids if w0 <= tally.done.get(t, -1.0) <= w1]
    b_done_in = [t for t in b_ids if w0 <= tally.done.get(t, -1.0) <= w1]
    capacity = phones / opt.task_seconds
    a_rate = len(a_done_in) / (w1 - w0)
    check = await verify(dsn, a_ids, b_ids)
    a_done_all = sum(1 for t in a_ids if t in tally.done)
    tasks_in_window = max(1, len(a_done_in) + len(b_done_in))
    out = {
        "settings": {
            "tasks": opt.tasks,
            "phones": phones,
            "task_seconds": opt.task_seconds,
            "seconds": opt.seconds,
            "b_rate_per_s": opt.b_rate,
            "fair_shares": {TEAM_A: 1, TEAM_B: 1},
        },
        "a_submitted": len(a_ids),
        "a_submit_s": a_submitted - a_started,
        "a_done_before_window": sum(1 for t in a_ids if tally.done.get(t, w0) < w0),
        "a_done_in_window": len(a_done_in),
        "a_done_total": a_done_all,
        "a_per_s": a_rate,
        "capacity_per_s": capacity,
        "a_share_of_capacity": a_rate / capacity,
        "a_busy_share": busy_share(tally, a_ids, w0, w1, phones),
        "b_busy_share": busy_share(tally, b_ids, w0, w1, phones),
        "window_s": w1 - w0,
        "b_submitted": len(b_ids),
        "b_done": sum(1 for t in b_ids if t in tally.done),
        "b_pickup_ms": summarize(
            [(tally.assigned[t] - s) * 1e3 for t, s in b_sent.items() if t in tally.assigned]
        ),
        "b_submit_to_done_ms": summarize(
            [(tally.done[t] - s) * 1e3 for t, s in b_sent.items() if t in tally.done]
        ),
        "usage": usage,
        "control_plane_cpu_ms_per_task": usage["control_plane_cores"]
        * usage["wall_s"]
        * 1e3
        / tasks_in_window,
        "postgres_cpu_ms_per_task": usage["postgres_cores"]
        * usage["wall_s"]
        * 1e3
        / tasks_in_window,
        "whole_run_usage": window_after.cores_since(before),
        "submit_failures": len(failed),
        "submit_failure_example": failed[0] if failed else "",
        "errors": {
            **{k: v for k, v in vars(counters).items() if k != "failed_after_s"},
            "total": counters.total(),
        },
        "check": check,
    }
    out["verified"] = bool(
        check["b_ok"] and check["a_ok"] and not failed and out["b_done"] == len(b_ids) > 0
    )
    out["targets"] = judge(out)
    return out


async def verify(dsn: str, a_ids: set[str], b_ids: set[str]) -> dict[str, Any]:
    db = await Db.connect(dsn)
    try:
        b = await db.lifecycle_check([uuid.UUID(t) for t in b_ids])
        a = await db.conn.fetchrow(
            """
            SELECT count(*) FILTER (WHERE t.status = 'done') AS done,
                   count(*) FILTER (WHERE t.attempt > 1) AS retried,
                   (SELECT count(*) FROM task_events e JOIN tasks x USING (task_id)
                     WHERE x.fairness_key = $1 AND e.to_status = 'done') AS done_events,
                   (SELECT count(*) FROM attempts a JOIN tasks x USING (task_id)
                     WHERE x.fairness_key = $1 AND a.attempt > 1) AS second_attempts
            FROM tasks t WHERE t.fairness_key = $1
            """,
            TEAM_A,
        )
    finally:
        await db.close()
    n = len(b_ids)
    b_counts = {k: int(v) for k, v in b.items() if isinstance(v, int)}
    wanted = ("tasks", "done", "attempts", "attempts_done", "done_events")
    a_counts = {k: int(v) for k, v in dict(a or {}).items()}
    return {
        "b": b_counts,
        "b_ok": n > 0 and all(b_counts.get(k) == n for k in wanted),
        "a": a_counts,
        "a_ok": bool(
            a_counts
            and a_counts["retried"] == 0
            and a_counts["second_attempts"] == 0
            and a_counts["done_events"] == a_counts["done"]
            and len(a_ids) >= a_counts["done"]
        ),
    }


def judge(out: dict[str, Any]) -> dict[str, Any]:
    p = out["b_pickup_ms"]
    limit_ms = (out["settings"]["task_seconds"] + B_MARGIN_S) * 1e3
    return {
        "b_pickup_p99": bool(p["p99"] <= limit_ms) if p.get("n") else None,
        "a_keeps_phones_busy": bool(out["a_share_of_capacity"] >= A_BUSY_SHARE),
    }
