"""The renewal load client, a process of its own: fake hosts that hold many leases and
renew them over RenewLeases streams as fast as the control plane answers.

    renew_load.py --address 127.0.0.1:P --leases 10000 --hosts 10 \
        --seconds 30 [--warmup 3] [--interval 0]

Set-up: RegisterHost with up to 1000 devices per fake host (pool=renew); one task per lease,
queued through SubmitTasks in batches of 500; then Acquire (wait 0) until each host holds a
lease per device, through the API like a real host. Then every host keeps one stream with
one request in flight (or one per --interval seconds), each request naming all of its
leases. At the end every task is reported done (ReportResults, a host's results in one
call), as a host whose tasks ended would: the workload leaves finished tasks behind, not
leases that run out later under another workload. Prints one JSON line: renewals
answered RENEWED per second, round-trip times of the requests, the measured window
(CLOCK_MONOTONIC, so the parent can read the control plane's CPU over it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_testing.host import Outcome, RunResult, StepResult, StepStatus, report_request
from bench_lib.client import Client, bounded, key_actions
from bench_lib.stats import summarize

POOL = "renew"
MAX_DEVICES = 1000  # the control plane's limit per RegisterHost
BATCH = 500  # SubmitTasks' limit


@dataclass
class Tally:
    measure_from: float
    measure_to: float
    per_second: dict[int, int] = field(default_factory=dict)
    rtt_ms: list[float] = field(default_factory=list)
    renewed: int = 0
    conflicts: int = 0
    requests: int = 0

    def add(self, sent: float, answered: float, renewed: int, conflicts: int) -> None:
        if not self.measure_from <= answered < self.measure_to:
            return
        second = int(answered - self.measure_from)
        self.per_second[second] = self.per_second.get(second, 0) + renewed
        self.rtt_ms.append((answered - sent) * 1e3)
        self.renewed += renewed
        self.conflicts += conflicts
        self.requests += 1


def host_sizes(leases: int, hosts: int) -> list[int]:
    hosts = max(hosts, -(-leases // MAX_DEVICES))
    base, extra = divmod(leases, hosts)
    return [base + (1 if i < extra else 0) for i in range(hosts)]


async def register(client: Client, host_id: str, devices: int) -> None:
    await client.lease.RegisterHost(
        lease_pb2.RegisterHostRequest(
            host_id=host_id,
            labels={"pool": POOL},
            devices=[
                lease_pb2.DeviceInfo(serial=f"r{i}", state=scheduler_pb2.DEVICE_STATE_DEVICE)
                for i in range(devices)
            ],
        ),
        timeout=60,
    )


async def queue_tasks(client: Client, count: int) -> None:
    """`count` tasks for the pool, through SubmitTasks in batches of 500 (4 in flight)."""
    task = scheduler_pb2.SubmitTaskRequest(
        spec=key_actions(1), selector=task_pb2.DeviceSelector(labels={"pool": POOL})
    )

    def batch(size: int) -> Callable[[], Awaitable[Any]]:
        request = scheduler_pb2.SubmitTasksRequest(tasks=[task] * size)
        return lambda: client.scheduler.SubmitTasks(request, timeout=120)

    sizes = [min(BATCH, count - lo) for lo in range(0, count, BATCH)]
    await bounded([batch(n) for n in sizes], 4)


async def acquire_all(client: Client, host_id: str, devices: int) -> list[lease_pb2.Assignment]:
    held: dict[str, lease_pb2.Assignment] = {}
    while len(held) < devices:
        idle = [f"r{i}" for i in range(devices) if f"r{i}" not in held]
        answer = await client.lease.Acquire(
            lease_pb2.AcquireRequest(host_id=host_id, idle_serials=idle), timeout=120
        )
        if not answer.assignments:
            raise RuntimeError(f"{host_id}: no work for {len(idle)} idle devices")
        held.update((a.device_serial, a) for a in answer.assignments)
    return list(held.values())


async def report_done(client: Client, held: list[lease_pb2.Assignment]) -> int:
    """Every task of `held` reported done in one ReportResults; how many were recorded."""
    step = StepResult(0, "key", StepStatus.OK, datetime.now(UTC), timedelta(0))
    request = lease_pb2.ReportResultsRequest(
        results=[
            report_request(
                RunResult(Outcome.DONE, "", (step,)),
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
            )
            for a in held
        ]
    )
    answer = await client.lease.ReportResults(request, timeout=120)
    return sum(1 for a in answer.answers if a.code == 0)


async def renew_loop(
    client: Client,
    host_id: str,
    lease_ids: list[str],
    until: float,
    interval: float,
    tally: Tally,
) -> None:
    call = client.lease.RenewLeases()
    request = lease_pb2.RenewLeasesRequest(host_id=host_id, lease_ids=lease_ids)
    renewed_code = lease_pb2.RENEWAL_RESULT_RENEWED
    seq = 0
    while (sent := time.monotonic()) < until:
        seq += 1
        request.seq = seq
        await call.write(request)
        while (response := await call.read()).push:  # cancel pushes: none expected here
            pass
        answered = time.monotonic()
        renewed = sum(1 for s in response.leases if s.result == renewed_code)
        tally.add(sent, answered, renewed, len(response.leases) - renewed)
        if interval:
            await asyncio.sleep(max(0.0, sent + interval - time.monotonic()))
    await call.done_writing()
    call.cancel()


async def main(args: argparse.Namespace) -> dict[str, object]:
    client = Client.connect(args.address)
    try:
        sizes = host_sizes(args.leases, args.hosts)
        hosts = [f"renew-{i}" for i in range(len(sizes))]
        t0 = time.monotonic()
        for host_id, n in zip(hosts, sizes, strict=True):
            await register(client, host_id, n)
        await queue_tasks(client, args.leases)
        held = [await acquire_all(client, h, n) for h, n in zip(hosts, sizes, strict=True)]
        setup_s = time.monotonic() - t0
        print("renewing", flush=True)
        start = time.monotonic()
        tally = Tally(start + args.warmup, start + args.warmup + args.seconds)
        await asyncio.gather(
            *(
                renew_loop(
                    client, h, [a.lease_id for a in mine], tally.measure_to, args.interval, tally
                )
                for h, mine in zip(hosts, held, strict=True)
            )
        )
        reported = sum(await asyncio.gather(*(report_done(client, mine) for mine in held)))
    finally:
        await client.close()
    per_second = [tally.per_second.get(s, 0) for s in range(int(args.seconds))]
    return {
        "leases": args.leases,
        "hosts": len(hosts),
        "setup_s": setup_s,
        "window": [tally.measure_from, tally.measure_to],
        "renewals_per_s": tally.renewed / args.seconds,
        "per_second": per_second,
        "per_second_summary": summarize(per_second),
        "requests": tally.requests,
        "rtt_ms": summarize(tally.rtt_ms),
        "conflicts": tally.conflicts,
        "reported_done": reported,
    }


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--address", required=True)
    p.add_argument("--leases", type=int, default=10_000)
    p.add_argument("--hosts", type=int, default=10)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--interval", type=float, default=0.0)
    return p.parse_args(argv)


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse(sys.argv[1:])))), flush=True)
