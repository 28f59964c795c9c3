#!/usr/bin/env python3
"""What reading the queue costs at farm scale (issue 20): a count of the queue
(amc_count_queue, what the control plane runs in the background), and GetQueue, GetTask (a
queued task, with its pending reason) and ListFairShares over gRPC, with --queued tasks
over --selectors selectors and --keys fairness keys, --history finished tasks beside them,
and a fleet of --hosts hosts with --phones phones each.

An embedded PostgreSQL (durable, default settings) in a throw-away directory and one
control plane in this process; the tasks, hosts and phones are written in bulk with SQL
(submitting 1,000,000 tasks one call at a time would measure the submits). Prints the
count's time (min / median / max over --counts counts) and each call's p50 / p99 over
--calls calls, one at a time.

    .venv/bin/python scripts/queue_scale.py --queued 100000
    .venv/bin/python scripts/queue_scale.py --queued 1000000 --history 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amc.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from amc_common.channel import aio_channel
from amc_testing.database import EmbeddedPostgres
from amc_testing.plane import ControlPlane, Settings, migrate

FILL = """
INSERT INTO queue_groups (selector_serial, selector_labels, fairness_key, anchor)
SELECT '', jsonb_build_object('model', 'm' || s, 'rack', 'r' || (s % 10)), 'team-' || k,
       amc_group_anchor('', jsonb_build_object('model', 'm' || s, 'rack', 'r' || (s % 10)))
FROM generate_series(1, $1::integer) s, generate_series(1, $2::integer) k;
"""
QUEUED = """
INSERT INTO tasks (task_id, caller, status, spec, selector_labels, max_attempts, group_id,
                   fairness_key, fair_tag, created_at, updated_at)
SELECT gen_random_uuid(), 'scale', 'queued', convert_to(repeat('x', 300), 'UTF8'),
       q.selector_labels, 3, q.group_id, q.fairness_key, i,
       now() - (i || ' ms')::interval, now() - (i || ' ms')::interval
FROM generate_series($1::integer, $2::integer) i
JOIN queue_groups q ON q.group_id = 1 + (hashint4(i) & 2147483647) % $3::integer;
"""
HISTORY = """
INSERT INTO tasks (task_id, caller, status, spec, selector_labels, max_attempts,
                   finished_at, created_at)
SELECT gen_random_uuid(), 'scale', 'done', convert_to(repeat('x', 300), 'UTF8'), '{}', 3,
       now(), now() - interval '1 day'
FROM generate_series($1::integer, $2::integer);
"""
FLEET = """
INSERT INTO hosts (host_id, labels, replica_id)
SELECT 'h' || i, jsonb_build_object('rack', 'r' || (i % 10), 'host', 'h' || i), NULL
FROM generate_series(1, $1::integer) i;
INSERT INTO devices (host_id, serial, state, model, labels)
SELECT 'h' || i, 'h' || i || '-' || j, 'device', 'm' || ((i * $2 + j) % $3 + 1),
       jsonb_build_object('rack', 'r' || (i % 10), 'host', 'h' || i,
                          'model', 'm' || ((i * $2 + j) % $3 + 1), 'sdk', '34')
FROM generate_series(1, $1::integer) i, generate_series(1, $2::integer) j;
"""
BATCH = 100_000


async def fill(db: asyncpg.Connection, args: argparse.Namespace) -> None:
    await db.execute(
        FILL.replace("$1::integer", str(args.selectors)).replace("$2::integer", str(args.keys))
    )
    groups = args.selectors * args.keys
    for first in range(1, args.queued + 1, BATCH):
        await db.execute(QUEUED, first, min(first + BATCH - 1, args.queued), groups)
    for first in range(1, args.history + 1, BATCH):
        await db.execute(HISTORY, first, min(first + BATCH - 1, args.history))
    fleet = (
        FLEET.replace("$1::integer", str(args.hosts))
        .replace("$2", str(args.phones))
        .replace("$3", str(args.selectors))
    )
    await db.execute(fleet)
    await db.execute("VACUUM ANALYZE")


def quantiles(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    p99 = ms[min(len(ms) - 1, int(len(ms) * 0.99))]
    return f"p50 {statistics.median(ms):7.1f} ms   p99 {p99:7.1f} ms"


async def timed(call, times: int) -> list[float]:  # type: ignore[no-untyped-def]
    took = []
    for _ in range(times):
        started = time.perf_counter()
        await call()
        took.append(time.perf_counter() - started)
    return took


def workdir() -> Path:
    """Under /tmp and 0755: as root, PostgreSQL runs as its own user, which must reach it."""
    root = Path(tempfile.mkdtemp(prefix="amc-queue-scale-"))
    root.chmod(0o755)
    return root


async def main(args: argparse.Namespace) -> None:
    root = workdir()
    server = EmbeddedPostgres(root / "data")
    url = server.start()
    plane: ControlPlane | None = None
    try:
        await migrate(url)
        db = await asyncpg.connect(url)
        started = time.monotonic()
        await fill(db, args)
        print(
            f"filled in {time.monotonic() - started:.0f} s: {args.queued:,} queued over "
            f"{args.selectors} selectors x {args.keys} keys, {args.history:,} finished, "
            f"{args.hosts * args.phones:,} phones on {args.hosts:,} hosts"
        )
        # The background count is what is measured below, so it is out of the way here.
        settings = Settings(queue_count_every=timedelta(hours=1))
        plane = ControlPlane(url, settings, listen="127.0.0.1:0", insecure=True)
        await plane.start()
        counts = []
        for _ in range(args.counts):
            started = time.perf_counter()
            queued = await plane.store.queue.count_queue(timedelta(0), settings.lease_ttl)
            counts.append(time.perf_counter() - started)
            assert queued == args.queued, queued
        ms = sorted(c * 1000 for c in counts)
        print(
            f"count of the queue        min {ms[0]:7.1f} ms   median "
            f"{statistics.median(ms):7.1f} ms   max {ms[-1]:7.1f} ms"
        )
        channel = aio_channel(f"127.0.0.1:{plane.port}")
        scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
        admin = admin_pb2_grpc.AdminStub(channel)
        task_id = str(
            await db.fetchval(
                "SELECT task_id FROM tasks WHERE status = 'queued' ORDER BY created_at LIMIT 1"
            )
        )
        calls = {
            "GetQueue": lambda: scheduler.GetQueue(scheduler_pb2.GetQueueRequest()),
            "GetTask (queued)": lambda: scheduler.GetTask(
                scheduler_pb2.GetTaskRequest(task_id=task_id)
            ),
            "ListFairShares": lambda: admin.ListFairShares(admin_pb2.ListFairSharesRequest()),
        }
        for name, call in calls.items():
            await timed(call, 5)  # warm: plans, connections
            print(f"{name:<25} {quantiles(await timed(call, args.calls))}")
        await channel.close()
        await db.close()
    finally:
        if plane is not None:
            await plane.stop(0)
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--selectors", type=int, default=200)
    parser.add_argument("--keys", type=int, default=5)
    parser.add_argument("--history", type=int, default=300_000)
    parser.add_argument("--hosts", type=int, default=500)
    parser.add_argument("--phones", type=int, default=4)
    parser.add_argument("--counts", type=int, default=5)
    parser.add_argument("--calls", type=int, default=500)
    asyncio.run(main(parser.parse_args()))
