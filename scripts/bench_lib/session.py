"""The `session` workload (issue 23): interactive sessions on simulated phones that answer at
once (sim delay 0), each sending taps back to back over its OpenSession stream for a
window: the action round trip through AMC (client -> control plane -> host agent -> phone
and back), beside the same taps sent straight to a simulated phone in this process (what
the phone itself costs, so that the difference is the relay's), and the control plane's
and the agent's CPU per action. Run at each of --session-sizes concurrent sessions, back to
back (a closed loop: its round trip is the sessions over the actions/s the two processes
can carry) and then paced at --session-rate actions/s each where sizes x rate <= 1,000/s
(the relay's cost where the processes have room, as a fleet acting once in a while per
phone gives them). Then
--session-starts sessions opened one after another on an idle phone: open -> DISPATCHED
(the host joined), beside the pickup figure of `make bench`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import duration_pb2

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_testing.host import SimulatedSource
from bench_lib import latency
from bench_lib.client import Client, Clock
from bench_lib.pgstats import Db
from bench_lib.stack import AgentSpec, Stack, cpu_now, cpu_seconds, per_unit, tree_cpu_seconds
from bench_lib.stats import summarize

HOST = "session-host"
POOL = "sessions"
TAP = scheduler_pb2.OpenSessionRequest(
    action=task_pb2.SessionAction(action=task_pb2.Action(tap=task_pb2.Tap(x=10, y=20)))
)


# The paced windows' most actions/s in all (half what the two processes carry back to back
# on a 2-core machine): a size beyond it has no paced window.
PACED_MOST = 1000


@dataclass(frozen=True)
class Options:
    sizes: tuple[int, ...] = (1, 50, 200)
    seconds: float = 10.0
    starts: int = 50
    # Each session's actions/s in the paced windows (0: none).
    rate: float = 10.0


def _seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(value * 1e9))
    return d


OPEN = scheduler_pb2.OpenSessionRequest(
    open=scheduler_pb2.SessionOpen(
        selector=task_pb2.DeviceSelector(labels={"pool": POOL}), idle_timeout=_seconds(60)
    )
)


async def _open(stub: scheduler_pb2_grpc.SchedulerStub) -> tuple[Any, float, str]:
    """A session whose host joined; the seconds from the open to DISPATCHED; its task id."""
    call: Any = stub.OpenSession()
    started = time.monotonic()
    await call.write(OPEN)
    while True:
        response = await call.read()
        if response is grpc.aio.EOF:
            raise RuntimeError("a session ended before its phone was ready")
        status = response.task.status
        if status == task_pb2.TASK_STATUS_DISPATCHED:
            return call, time.monotonic() - started, response.task.task_id
        if status not in (task_pb2.TASK_STATUS_QUEUED, task_pb2.TASK_STATUS_ASSIGNED):
            raise RuntimeError(f"a session ended {status} before its phone was ready")


async def _close(call: Any) -> int:
    """Close the session; its task's status once it ended."""
    await call.done_writing()
    status = 0
    while (response := await call.read()) is not grpc.aio.EOF:
        if response.HasField("task"):
            status = response.task.status
    return status


async def _taps(call: Any, until: float, rtts: list[float], every: float = 0.0) -> None:
    """Taps back to back, or one each `every` seconds (from a random phase)."""
    due = time.perf_counter() + random.uniform(0, every)
    while time.perf_counter() < until:
        if every:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            due += every
        t0 = time.perf_counter()
        await call.write(TAP)
        response = await call.read()
        if response is grpc.aio.EOF or not response.HasField("step"):
            raise RuntimeError("a session ended during the window")
        rtts.append((time.perf_counter() - t0) * 1000)


async def _direct(sessions: int, seconds: float) -> list[float]:
    """The same taps straight to simulated phones (no AMC), as many at once."""
    source = SimulatedSource(sessions, delay=0.0)
    serials = [d.serial for d in await source.inventory()]
    rtts: list[float] = []
    until = time.perf_counter() + seconds

    async def one(serial: str) -> None:
        device = source.device(serial)
        while time.perf_counter() < until:
            t0 = time.perf_counter()
            await device.tap(10, 20)
            rtts.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0)  # as a gRPC round trip would, let the others run

    await asyncio.gather(*(one(s) for s in serials))
    await source.close()
    return rtts


async def _window(
    stack: Stack, stub: scheduler_pb2_grpc.SchedulerStub, n: int, seconds: float, rate: float = 0.0
) -> dict[str, Any]:
    calls = [c for c, _, _ in await asyncio.gather(*(_open(stub) for _ in range(n)))]
    assert stack.control_plane is not None
    cp, agent = stack.control_plane.pid, stack.agents[HOST].pid
    pm = stack.postmaster_pid() or 0
    cpu0 = (cpu_seconds(cp), cpu_seconds(agent), tree_cpu_seconds(pm))
    rtts: list[float] = []
    started = time.perf_counter()
    until = started + seconds
    every = 1 / rate if rate else 0.0
    await asyncio.gather(*(_taps(c, until, rtts, every) for c in calls))
    elapsed = time.perf_counter() - started
    cpu1 = (cpu_seconds(cp), cpu_seconds(agent), tree_cpu_seconds(pm))
    ended = await asyncio.gather(*(_close(c) for c in calls))
    direct = await _direct(n, min(seconds, 3.0))
    through = summarize(rtts)
    alone = summarize(direct)
    return {
        "sessions": n,
        "rate": rate,
        "actions": len(rtts),
        "actions_per_s": len(rtts) / elapsed,
        "rtt_ms": through,
        "direct_ms": alone,
        "relay_ms": {k: through[k] - alone[k] for k in ("p50", "p99")},
        "cp_cpu_us_per_action": (cpu1[0] - cpu0[0]) / max(1, len(rtts)) * 1e6,
        "agent_cpu_us_per_action": (cpu1[1] - cpu0[1]) / max(1, len(rtts)) * 1e6,
        "postgres_cpu_us_per_action": (cpu1[2] - cpu0[2]) / max(1, len(rtts)) * 1e6,
        "verified": all(s == task_pb2.TASK_STATUS_DONE for s in ended),
    }


# --profile: (name, agent, seconds) -> py-spy of the control plane and that agent meanwhile.
Profiled = Callable[[str, str | None, float], contextlib.AbstractAsyncContextManager[None]]


@contextlib.asynccontextmanager
async def _unprofiled(name: str, agent: str | None, seconds: float) -> AsyncIterator[None]:
    yield


async def run(
    stack: Stack,
    options: Options,
    say: Callable[[str], None],
    profiled: Profiled = _unprofiled,
) -> dict[str, Any]:
    stack.start_agent(AgentSpec(HOST, max(options.sizes), 0.0, POOL))
    channel = grpc.aio.insecure_channel(stack.address)
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    out: dict[str, Any] = {"windows": []}
    try:
        await _wait_phones(stub, max(options.sizes))
        for n in options.sizes:
            say(f"session: {n} sessions, taps back to back for {options.seconds:g}s")
            async with profiled(f"session-{n}", HOST, options.seconds + 5):
                window = await _window(stack, stub, n, options.seconds)
            say(
                f"  {window['actions_per_s']:.0f} actions/s, round trip p50 "
                f"{window['rtt_ms']['p50']:.2f} ms, p99 {window['rtt_ms']['p99']:.2f} ms"
            )
            out["windows"].append(window)
            if options.rate and n * options.rate <= PACED_MOST:
                say(f"session: {n} sessions, {options.rate:g} taps/s each for {options.seconds:g}s")
                window = await _window(stack, stub, n, options.seconds, options.rate)
                say(
                    f"  {window['actions_per_s']:.0f} actions/s, round trip p50 "
                    f"{window['rtt_ms']['p50']:.2f} ms, p99 {window['rtt_ms']['p99']:.2f} ms"
                )
                out["windows"].append(window)
        say(
            f"session: {options.starts} starts on an idle phone, one after another, each"
            " beside a task's pickup on the same phones"
        )
        async with profiled("session-starts", HOST, options.starts * 0.5 + 10):
            out.update(await _starts(stack, stub, options.starts))
    finally:
        await channel.close()
        child = stack.agents.pop(HOST, None)
        if child is not None:
            child.stop()
    out["verified"] = all(w["verified"] for w in out["windows"])
    return out


async def _starts(
    stack: Stack, stub: scheduler_pb2_grpc.SchedulerStub, starts: int
) -> dict[str, Any]:
    """Sessions opened one after another on an idle phone, each followed by a one-action
    task's pickup on the same phones (latency.pickup_trials, the pickup workload's measure):
    open -> DISPATCHED (the host joined) beside submit -> dispatched, and the session's
    chain from the database's timestamps: open -> queued -> assigned -> dispatched (the
    attempt acknowledged) -> the client told its host joined."""
    clock, client, db = Clock(), Client.connect(stack.address), await Db.connect(stack.dsn)
    opened: list[tuple[uuid.UUID, float, float]] = []
    pickups: list[latency.Trial] = []
    cpu = dict.fromkeys(cpu_now(stack, (HOST,)), 0.0)
    try:
        for _ in range(starts):
            cpu0 = cpu_now(stack, (HOST,))
            call, took, task_id = await _open(stub)
            t_joined = time.monotonic()
            opened.append((uuid.UUID(task_id), t_joined - took, t_joined))
            await _close(call)
            for k, v in per_unit(cpu0, cpu_now(stack, (HOST,)), 1, 1).items():
                cpu[k] += v
            pickups += await latency.pickup_trials(client, 1, 0, POOL)
        times = await db.attempt_times([t for t, _, _ in opened])
        picked = await db.attempt_times([t.task_id for t in pickups])
    finally:
        await client.close()
        await db.close()
    total, chain = latency.Spans(), latency.Spans()
    for task_id, t0, t_joined in opened:
        row = times[task_id]
        queued, assigned = clock.mono(row["created_at"]), clock.mono(row["assigned_at"])
        dispatched = clock.mono(row["acknowledged_at"]) if row["acknowledged_at"] else None
        total.add("open_to_joined_ms", t0, t_joined)
        chain.add("open_to_queued_ms", t0, queued)
        chain.add("queued_to_assigned_ms", queued, assigned)
        chain.add("assigned_to_dispatched_ms", assigned, dispatched)
        chain.add("dispatched_to_joined_ms", dispatched, t_joined)
    for trial in pickups:
        row = picked[trial.task_id]
        if row["acknowledged_at"] is not None:
            total.add("pickup_ms", trial.t0, clock.mono(row["acknowledged_at"]))
    spans = total.summary()
    return {
        "start_ms": spans.get("open_to_joined_ms", {}),
        "start_chain_ms": chain.summary(),
        "pickup_ms": spans.get("pickup_ms", {}),
        # Each start is a session opened and closed (a task submitted, run, reported).
        "start_cpu_ms_per_session": {k: v * 1e3 / max(1, starts) for k, v in cpu.items()},
    }


async def _wait_phones(stub: scheduler_pb2_grpc.SchedulerStub, n: int) -> None:
    """The agent's phones all open a session once (so each is registered and free)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            calls = [c for c, _, _ in await asyncio.gather(*(_open(stub) for _ in range(n)))]
        except (RuntimeError, grpc.aio.AioRpcError):
            await asyncio.sleep(0.5)
            continue
        await asyncio.gather(*(_close(c) for c in calls))
        return
    raise RuntimeError(f"the {n} phones of {HOST} did not all take a session within 60 s")
