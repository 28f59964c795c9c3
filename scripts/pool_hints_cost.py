#!/usr/bin/env python3
"""What the emulator pools' hints cost a replica at fleet size (control_plane.pool_hints):
every HINT_EVERY seconds, while a renewal stream there told of pools, the replica reads the
queue as last counted (the `queue_groups` statement, GetQueue's) and matches each stream's
pools against the queued selectors in memory.

An embedded PostgreSQL in a throw-away directory, --queued tasks over --selectors selectors
x --keys fairness keys (written with SQL, as scripts/queue_scale.py does), the queue counted
once; then the statement's p50 / p99 over --calls reads, and the matching's CPU (one
`update` of the replica's hints, p50 over --rounds) with 10, 100 and --hosts streams each
telling one pool (an emulator pool's labels, its host's among them); half the queue's
selectors name an emulator snapshot, half a phone model. No gRPC: the loop's two parts,
each timed alone, on an in-process control plane.

    .venv/bin/python scripts/pool_hints_cost.py --hosts 1000
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import asyncpg

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from queue_scale import BATCH, QUEUED, quantiles, workdir

from amc_testing.database import EmbeddedPostgres
from amc_testing.plane import ControlPlane, Settings, migrate

# The groups the hints read (control_plane.pool_hints.GROUPS).
GROUPS = 10_000
# Half the selectors ask for an emulator of a snapshot (with its rack), half for a model
# (distinct up to 400 selectors).
FILL = """
INSERT INTO queue_groups (selector_serial, selector_labels, fairness_key, anchor)
SELECT '', l, 'team-' || k, amc_group_anchor('', l)
FROM (SELECT s, CASE WHEN s % 2 = 0
                     THEN jsonb_build_object('snapshot/s' || (s / 2 % 20), 'yes',
                                             'rack', 'r' || (s / 40 % 10))
                     ELSE jsonb_build_object('model', 'm' || s, 'rack', 'r' || (s % 10)) END AS l
      FROM generate_series(1, $1::integer) s) sel,
     generate_series(1, $2::integer) k;
"""


def pool_labels(i: int) -> dict[str, str]:
    """An emulator pool's labels on host i: what its instances are labelled."""
    return {
        "kind": "emulator",
        "avd": "Pixel_API_34",
        "snapshot": f"s{i % 20}",
        f"snapshot/s{i % 20}": "yes",
        "api": "34",
        "rack": f"r{i // 20 % 10}",
        "host": f"h{i}",
    }


async def main(args: argparse.Namespace) -> None:
    root = workdir()
    server = EmbeddedPostgres(root / "data")
    url = server.start()
    plane: ControlPlane | None = None
    try:
        await migrate(url)
        db = await asyncpg.connect(url)
        await db.execute(
            FILL.replace("$1::integer", str(args.selectors)).replace("$2::integer", str(args.keys))
        )
        groups = args.selectors * args.keys
        for first in range(1, args.queued + 1, BATCH):
            await db.execute(QUEUED, first, min(first + BATCH - 1, args.queued), groups)
        await db.execute("VACUUM ANALYZE")
        await db.close()
        settings = Settings(queue_count_every=timedelta(hours=1))
        plane = ControlPlane(url, settings, listen="127.0.0.1:0", insecure=True)
        await plane.start()
        queued = await plane.store.queue.count_queue(timedelta(0), settings.lease_ttl)
        print(f"{queued:,} queued over {groups:,} groups ({args.selectors} selectors)")
        took = []
        for _ in range(args.calls):
            started = time.perf_counter()
            read, _, _ = await plane.store.queue.groups(GROUPS)
            took.append(time.perf_counter() - started)
        print(f"the statement (queue_groups, {len(read):,} rows)   {quantiles(took)}")
        for hosts in sorted({10, 100, args.hosts}):
            hints = plane.hub.pools  # the replica's own, as its renewal streams use it
            pushed: list[dict[str, int]] = []
            streams = contextlib.ExitStack()
            for i in range(hosts):
                streams.enter_context(
                    hints.told(f"h{i}", [("pool", pool_labels(i))], pushed.append)
                )
            cpu = []
            for _ in range(args.rounds):
                for told in hints._told.values():  # every round a change: all compared
                    told.last = {}
                started = time.process_time()
                hints.update(read)
                cpu.append(time.process_time() - started)
            streams.close()
            ms = statistics.median(cpu) * 1000
            wanting = sum(1 for counts in pushed[-hosts:] if any(counts.values()))
            print(
                f"matching, {hosts:>5} hosts with a pool x {len(read):,} groups:"
                f" {ms:8.2f} ms CPU a round ({ms / args.every / 10:.2f} % of a core"
                f" at one round per {args.every:g} s); {wanting} pools wanted"
            )
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
    parser.add_argument("--hosts", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--every", type=float, default=1.5, help="seconds between rounds")
    asyncio.run(main(parser.parse_args()))
