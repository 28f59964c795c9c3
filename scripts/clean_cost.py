#!/usr/bin/env python3
"""What a clean between leases costs (issue 38): one simulated phone, one host agent and one
control plane in this process on an embedded PostgreSQL, TASKS one-tap tasks queued for
the phone at once, run one after another, in three runs: the phone not cleaned (a profile
with `enabled: false`, how it was before), cleaned by the default profile with its commands
answering at once (what AMC itself adds), and cleaned with each command taking
COMMAND_DELAY seconds (about what an adb shell round trip takes on a phone). For each: the
clean's own time (the agent's amc_agent_clean_seconds), and the lease-to-lease cycle: from
a task's report recorded to the next task's lease on the same phone (the phone idle in
between, for the control plane), p50 and p99, and tasks a minute.

    .venv/bin/python scripts/clean_cost.py [--tasks 200] [--command-delay 0.05]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import asyncpg
import prometheus_client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from amc_testing.database import EmbeddedPostgres
from amc_testing.host import Agent, AgentSettings, CleanProfile, Profiles, SimulatedSource
from amc_testing.plane import ControlPlane, Settings

CYCLE = """
SELECT extract(epoch FROM nxt.created_at - t.finished_at)::float8 AS gap
FROM attempts a JOIN tasks t ON t.task_id = a.task_id
JOIN LATERAL (SELECT b.created_at FROM attempts b
              WHERE b.host_id = a.host_id AND b.device_serial = a.device_serial
                AND b.created_at > a.created_at ORDER BY b.created_at LIMIT 1) nxt ON true
WHERE a.host_id = $1
"""


def _clean_seconds() -> tuple[float, float]:
    sample = prometheus_client.REGISTRY.get_sample_value
    total = sample("amc_agent_clean_seconds_sum", {"result": "passed"}) or 0.0
    count = sample("amc_agent_clean_seconds_count", {"result": "passed"}) or 0.0
    return total, count


async def one_run(
    address: str, dsn: str, name: str, profile: Profiles, delay: float, tasks: int
) -> dict[str, float]:
    source = SimulatedSource(1, delay=0.0, prefix=f"{name}-")
    source.clean_delay = delay
    settings = AgentSettings(host_id=name, acquire_wait=30.0, clean_profile=profile)
    agent = Agent(settings, source, aio_channel(address))
    running = asyncio.create_task(agent.run())
    before = _clean_seconds()
    channel = aio_channel(address)
    scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
    tap = task_pb2.Action(tap=task_pb2.Tap(x=1, y=1))
    spec = task_pb2.TaskSpec(actions=task_pb2.ActionList(actions=[tap]))
    selector = task_pb2.DeviceSelector(serial=f"{name}-0")
    conn = await asyncpg.connect(dsn)
    try:
        await agent.registered.wait()
        await asyncio.sleep(1.0)  # its first clean (the baseline) done
        began = time.monotonic()
        request = scheduler_pb2.SubmitTaskRequest(spec=spec, selector=selector)
        for _ in range(tasks):
            await scheduler.SubmitTask(request)
        done = "SELECT count(*) FROM attempts WHERE host_id = $1 AND state = 'done'"
        while True:
            if await conn.fetchval(done, name) >= tasks:
                break
            await asyncio.sleep(0.1)
        took = time.monotonic() - began
        gaps = sorted(r["gap"] for r in await conn.fetch(CYCLE, name))
    finally:
        await conn.close()
        agent.stop()
        await running
        await channel.close()
    after = _clean_seconds()
    cleans = after[1] - before[1]
    return {
        "clean_mean_ms": 1000 * (after[0] - before[0]) / cleans if cleans else 0.0,
        "cycle_p50_ms": 1000 * statistics.median(gaps),
        "cycle_p99_ms": 1000 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))],
        "tasks_per_minute": 60 * tasks / took,
    }


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        pg = EmbeddedPostgres(Path(scratch) / "pg")
        dsn = pg.start()
        plane = ControlPlane(dsn, Settings(), listen="127.0.0.1:0", insecure=True)
        await plane.start()
        address = f"127.0.0.1:{plane.port}"
        off = Profiles(defaults=CleanProfile(enabled=False))
        slow = f"cleaned, {args.command_delay * 1000:g} ms a command"
        runs = [
            ("not cleaned", "off", off, 0.0),
            ("cleaned, commands at once", "fast", Profiles(), 0.0),
            (slow, "slow", Profiles(), args.command_delay),
        ]
        try:
            heads = ("clean", "cycle p50", "cycle p99", "tasks/min")
            print(f"{'run':<32} " + " ".join(f"{h:>10}" for h in heads))
            for label, name, profile, delay in runs:
                got = await one_run(address, dsn, name, profile, delay, args.tasks)
                print(
                    f"{label:<32} {got['clean_mean_ms']:>8.1f}ms {got['cycle_p50_ms']:>8.1f}ms"
                    f" {got['cycle_p99_ms']:>8.1f}ms {got['tasks_per_minute']:>10.0f}"
                )
        finally:
            await plane.stop(0)
            pg.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--command-delay", type=float, default=0.05)
    asyncio.run(main(parser.parse_args()))
