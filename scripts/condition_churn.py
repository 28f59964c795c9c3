#!/usr/bin/env python3
"""What phones changing condition cost the control plane (issue 22): a fleet of HOSTS hosts
x PHONES phones in the database (5,000 x 4), one control-plane process and its embedded
PostgreSQL (as `make bench` starts them), and SHARE of the phones changing condition per
minute (1 %: 200 changes a minute), each change one Lease.ReportDeviceHealth of its host
(a host's probe round sends what changed in one call). Windows of WINDOW seconds without
changes and with them, alternately; the CPU of the control plane and of PostgreSQL (its
backends included) in each, from /proc. The target: the changes add at most 0.05 cores of
control-plane CPU.

    .venv/bin/python scripts/condition_churn.py [--hosts 5000] [--phones 4] [--share 0.01]
                                                [--window 60] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amc.v1 import lease_pb2, lease_pb2_grpc, scheduler_pb2
from scripts.bench_lib import stack

CONDITIONS = (
    scheduler_pb2.DEVICE_CONDITION_READY,
    scheduler_pb2.DEVICE_CONDITION_TOO_HOT,
    scheduler_pb2.DEVICE_CONDITION_CHARGING_HOLD,
)


async def fill(dsn: str, hosts: int, phones: int) -> None:
    """The hosts and their phones, as registrations would leave them (one statement each)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "INSERT INTO hosts (host_id) SELECT 'h' || i FROM generate_series(1, $1::int) i",
            hosts,
        )
        await conn.execute(
            "INSERT INTO devices (host_id, serial, state) SELECT 'h' || i, 's' || d, 'device'"
            " FROM generate_series(1, $1::int) i, generate_series(1, $2::int) d",
            hosts,
            phones,
        )
        await conn.execute("ANALYZE")
    finally:
        await conn.close()


async def run(args: argparse.Namespace) -> None:
    st = stack.Stack(stack.workdir())
    try:
        st.start_postgres()
        await st.start_control_plane()
        await fill(st.dsn, args.hosts, args.phones)
        assert st.control_plane is not None
        plane, pg = st.control_plane.pid, st.postmaster_pid()
        assert pg is not None
        rate = args.hosts * args.phones * args.share / 60.0  # changes a second
        async with grpc.aio.insecure_channel(st.address) as channel:
            lease = lease_pb2_grpc.LeaseStub(channel)

            async def change() -> None:
                host, phone = random.randint(1, args.hosts), random.randint(1, args.phones)
                health = lease_pb2.DeviceHealth(
                    serial=f"s{phone}",
                    condition=random.choice(CONDITIONS),
                    reason="condition_churn",
                    battery_percent=random.randint(5, 100),
                    temperature_celsius=35.0,
                )
                await lease.ReportDeviceHealth(
                    lease_pb2.ReportDeviceHealthRequest(host_id=f"h{host}", devices=[health]),
                    timeout=10,
                )

            for _ in range(50):  # warm-up: connections, prepared statements
                await change()
            added = []
            for _ in range(args.rounds):
                for churn in (False, True):
                    cores = await window(args.window, rate if churn else 0.0, change, plane, pg)
                    name = "changing" if churn else "steady"
                    print(
                        f"{name}: control plane {cores[0]:.4f} cores, PostgreSQL "
                        f"{cores[1]:.4f} cores, {cores[2]} reports in {args.window:g}s",
                        flush=True,
                    )
                    added.append(cores[0] if churn else -cores[0])
            print(
                f"control-plane CPU added by {rate * 60:.0f} changes a minute: "
                f"{sum(added) / args.rounds:.4f} cores (target <= 0.05)"
            )
    finally:
        st.stop()


async def window(
    seconds: float, rate: float, change: Callable[[], Awaitable[None]], plane: int, pg: int
) -> tuple[float, float, int]:
    """Cores used by the control plane and PostgreSQL over `seconds`, `rate` changes a
    second (evenly spaced) meanwhile; and how many were sent."""
    began = time.monotonic()
    plane_0, pg_0 = stack.cpu_seconds(plane), stack.tree_cpu_seconds(pg)
    sent = 0
    while time.monotonic() - began < seconds:
        if rate:
            await change()
            sent += 1
            await asyncio.sleep(max(0.0, began + sent / rate - time.monotonic()))
        else:
            await asyncio.sleep(0.5)
    elapsed = time.monotonic() - began
    return (
        (stack.cpu_seconds(plane) - plane_0) / elapsed,
        (stack.tree_cpu_seconds(pg) - pg_0) / elapsed,
        sent,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=5000)
    p.add_argument("--phones", type=int, default=4)
    p.add_argument("--share", type=float, default=0.01, help="of the phones, per minute")
    p.add_argument("--window", type=float, default=60.0, help="seconds")
    p.add_argument("--rounds", type=int, default=2)
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
