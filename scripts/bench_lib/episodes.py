"""The `episodes` workload: agent-style sessions on a pool of emulator doubles (the
`emulator` program's stand-in, tests/support/fakes/emulator.py, with the published 0.6 s
snapshot load), run by a real host agent process (`--emulator AVD:N:N`) whose instances
register with a private adb server (the adbutils wheel's). Each of N clients opens a
session from the pool's snapshot, sends 20 taps, closes it, and again, for --episodes-
seconds; each emulator is reset between leases by a snapshot load over its console.

Figures: episodes per hour per emulator, beside the ideal (each emulator busy every second
not spent in its own load: an episode's own actions plus the load time, back to back);
lease-to-first-action (the session's lease made -> its first action answered; and open ->
first action, which includes waiting for a reset); AMC's own part of a reset (the lease's
end -> the phone ready again, as the control plane records both, less the load time).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_testing.emulators import AdbServer, install_double, make_avd
from bench_lib.pgstats import Db
from bench_lib.stack import AGENT_TOKEN, Stack, cpu_now, spawn, tree_cpu_seconds
from bench_lib.stats import summarize
from scripts.launch import HostAgentCommand

HOST = "emulator-host"
POOL = "episodes"
AVD = "Bench_API_34"
SNAPSHOT = "default_boot"
ACTIONS = 20
PORTS = "5600-5682"
TAP = scheduler_pb2.OpenSessionRequest(
    action=task_pb2.SessionAction(action=task_pb2.Action(tap=task_pb2.Tap(x=10, y=20)))
)
CLOSE = scheduler_pb2.OpenSessionRequest(close=scheduler_pb2.SessionClose())
TARGET_OVERHEAD_MS = (100.0, 300.0)
TARGET_FIRST_ACTION_P50_S = 1.0
TARGET_EFFICIENCY = 0.95


@dataclass(frozen=True)
class Options:
    emulators: int = 20
    seconds: float = 60.0
    load_seconds: float = 0.6


@dataclass
class Episode:
    task_id: str
    opened: float
    first_action: float
    # Wall-clock time of the first action's answer (beside the lease's creation in the
    # database, on the same machine's clock).
    first_wall: float
    actions_done: float
    closed: float
    ok: bool


def _idle(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromSeconds(int(seconds))
    return d


async def _episode(stub: scheduler_pb2_grpc.SchedulerStub) -> Episode:
    call: Any = stub.OpenSession()
    opened = time.perf_counter()
    task_id = ""
    await call.write(
        scheduler_pb2.OpenSessionRequest(
            open=scheduler_pb2.SessionOpen(
                selector=task_pb2.DeviceSelector(labels={"pool": POOL}),
                idle_timeout=_idle(60),
                start_snapshot=SNAPSHOT,
            )
        )
    )
    while True:
        response = await call.read()
        if response is grpc.aio.EOF:
            raise RuntimeError("a session ended before its phone was ready")
        task_id = response.task.task_id or task_id
        status = response.task.status
        if status == task_pb2.TASK_STATUS_DISPATCHED:
            break
        if status not in (task_pb2.TASK_STATUS_QUEUED, task_pb2.TASK_STATUS_ASSIGNED):
            raise RuntimeError(f"a session ended {status} before its phone was ready")
    first, first_wall = 0.0, 0.0
    for i in range(ACTIONS):
        await call.write(TAP)
        response = await call.read()
        if response is grpc.aio.EOF or not response.HasField("step"):
            raise RuntimeError(
                f"a session ended during its actions, at tap {i + 1}: {_said(response)}"
            )
        if i == 0:
            first, first_wall = time.perf_counter(), time.time()
    actions_done = time.perf_counter()
    await call.write(CLOSE)
    await call.done_writing()
    status = 0
    while (response := await call.read()) is not grpc.aio.EOF:
        if response.HasField("task"):
            status = response.task.status
    ok = status == task_pb2.TASK_STATUS_DONE
    return Episode(task_id, opened, first, first_wall, actions_done, time.perf_counter(), ok)


async def _client(stub: scheduler_pb2_grpc.SchedulerStub, until: float, out: list[Episode]) -> None:
    while time.perf_counter() < until:
        out.append(await _episode(stub))


async def _wait_ready(db: Db, n: int, within: float = 180.0) -> None:
    """The pool's N instances registered and ready (their first clean passed)."""
    deadline = time.monotonic() + within
    sql = (
        "SELECT count(*) FROM devices WHERE host_id = $1 AND state = 'device'"
        " AND condition = 'ready' AND labels->>'kind' = 'emulator'"
    )
    while time.monotonic() < deadline:
        if await db.conn.fetchval(sql, HOST) >= n:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the {n} emulators of {HOST} were not all ready within {within:.0f}s")


async def _reset_overheads(db: Db, tasks: list[str], load_seconds: float) -> list[float]:
    """Per ended lease: its end -> the phone's next clean reported (ready again), less the
    load time, ms."""
    rows = await db.conn.fetch(
        """
        SELECT extract(epoch FROM (
                 SELECT min(e.at) FROM host_events e
                 WHERE e.host_id = a.host_id AND e.serial = a.device_serial
                   AND e.kind = 'cleaning' AND e.at >= a.ended_at)
               - a.ended_at) AS took
        FROM attempts a WHERE a.task_id = ANY ($1::uuid[]) AND a.ended_at IS NOT NULL
        """,
        tasks,
    )
    return [(float(r["took"]) - load_seconds) * 1000 for r in rows if r["took"] is not None]


async def _lease_to_first_action(db: Db, episodes: list[Episode]) -> list[float]:
    """Per episode: its lease's creation (the attempt's row) -> its first action answered, ms."""
    rows = await db.conn.fetch(
        "SELECT task_id::text AS task_id, extract(epoch FROM created_at) AS made"
        " FROM attempts WHERE task_id = ANY ($1::uuid[])",
        [e.task_id for e in episodes],
    )
    made = {r["task_id"]: float(r["made"]) for r in rows}
    return [(e.first_wall - made[e.task_id]) * 1000 for e in episodes if e.task_id in made]


def _world(root: Path, load_seconds: float) -> dict[str, str]:
    """The AVD, the double on PATH, the console token: the agent's environment."""
    home, avds, bin_dir = root / "emu-home", root / "avd", root / "emu-bin"
    home.mkdir(parents=True, exist_ok=True)
    make_avd(avds, AVD, snapshots=(SNAPSHOT,))
    install_double(bin_dir)
    (home / ".emulator_console_auth_token").write_text("bench-token")
    return {
        "HOME": str(home),
        "ANDROID_AVD_HOME": str(avds),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "AMC_FAKE_EMULATOR_LOAD_SECONDS": str(load_seconds),
        "AMC_FAKE_EMULATOR_BOOT_SECONDS": "0.5",
    }


def _cpu(stack: Stack) -> dict[str, float]:
    """CPU seconds so far: the control plane, PostgreSQL, the agent, and its doubles."""
    out = cpu_now(stack, (HOST,))
    agent = stack.agents.get(HOST)
    out["doubles"] = tree_cpu_seconds(agent.pid) - out["agent"] if agent else 0.0
    return out


async def run(stack: Stack, options: Options, say: Callable[[str], None]) -> dict[str, Any]:
    n = options.emulators
    adb = AdbServer(stack.root / "emu-adb")
    await adb.start()
    command = HostAgentCommand(
        control_plane=stack.address,
        host_id=HOST,
        token=AGENT_TOKEN,
        labels={"pool": POOL},
        adb=f"127.0.0.1:{adb.port}",
        drain_timeout=0,
        log_format=stack.log_format,
    )
    argv = [*command.argv(), "--emulator", f"{AVD}:{n}:{n}", "--emulator-budget", "0.01,1MB"]
    argv += ["--emulator-ports", PORTS]
    env = {**command.env(), **_world(stack.root, options.load_seconds)}
    stack.agents[HOST] = spawn(f"host agent {HOST}", argv, stack.root / f"agent-{HOST}.log", env)
    channel = grpc.aio.insecure_channel(stack.address)
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    db = await Db.connect(stack.dsn)
    try:
        say(f"episodes: {n} emulator doubles (load {options.load_seconds:g}s) starting")
        await _wait_ready(db, n)
        await _episode(stub)  # warm: the channel, the session path
        say(f"episodes: {n} clients, {ACTIONS} taps an episode, for {options.seconds:g}s")
        episodes: list[Episode] = []
        before = _cpu(stack)
        started = time.perf_counter()
        until = started + options.seconds
        await asyncio.gather(*(_client(stub, until, episodes) for _ in range(n)))
        elapsed = time.perf_counter() - started
        cpu = {k: v - before[k] for k, v in _cpu(stack).items()}
        load = os.getloadavg()
        overheads = await _reset_overheads(db, [e.task_id for e in episodes], options.load_seconds)
        first_actions = await _lease_to_first_action(db, episodes)
    finally:
        await db.close()
        await channel.close()
        child = stack.agents.pop(HOST, None)
        if child is not None:
            child.stop()
        await adb.stop()
    per_hour = len(episodes) / elapsed * 3600 / n
    own = [e.actions_done - e.first_action for e in episodes]
    ideal_cycle = (sum(own) / max(1, len(own))) + options.load_seconds
    out = {
        "emulators": n,
        "load_seconds": options.load_seconds,
        "seconds": elapsed,
        "episodes": len(episodes),
        "episodes_per_hour_per_emulator": per_hour,
        "ideal_per_hour_per_emulator": 3600 / ideal_cycle,
        "efficiency": per_hour / (3600 / ideal_cycle),
        "lease_to_first_action_ms": summarize(first_actions),
        "open_to_first_action_ms": summarize(
            [(e.first_action - e.opened) * 1000 for e in episodes]
        ),
        "reset_overhead_ms": summarize(overheads),
        # CPU ms an episode (the window's CPU over its episodes): AMC's processes, and the
        # doubles (the phones' side: not AMC's); the load average as the window ended.
        "cpu_ms_per_episode": {k: v * 1000 / max(1, len(episodes)) for k, v in cpu.items()},
        "load_average": list(load),
        "verified": all(e.ok for e in episodes) and bool(episodes),
    }
    say(
        f"  {per_hour:,.0f} episodes/h per emulator ({out['efficiency']:.0%} of the ideal),"
        f" reset overhead p50 {out['reset_overhead_ms'].get('p50', 0):.0f} ms; CPU ms/episode "
        + ", ".join(f"{k} {v:.1f}" for k, v in out["cpu_ms_per_episode"].items())
        + f"; load {load[0]:.1f}"
    )
    return out


def _said(response: object) -> str:
    """What came instead of a tap's step: the end of the call, a refusal, or the task."""
    if response is grpc.aio.EOF:
        return "the call ended"
    if response.HasField("refused"):  # type: ignore[attr-defined]
        refused = response.refused  # type: ignore[attr-defined]
        return f"refused {refused.code}: {refused.message}"
    task = response.task  # type: ignore[attr-defined]
    status = task_pb2.TaskStatus.Name(task.status)
    return f"task {task.task_id} {status}: {task.result.error or task.cancel_reason or '-'}"
