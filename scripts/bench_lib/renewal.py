"""Workload 4, renewal capacity: the load client (renew_load.py, its own process) holds L
leases as fake hosts and renews them back to back; meanwhile this samples the control
plane's CPU and RSS and PostgreSQL's CPU, and reads them over the client's measured window."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_lib import promtext, stack
from bench_lib.stats import summarize

HERE = Path(__file__).resolve().parent
SAMPLE_EVERY = 0.5


@dataclass(frozen=True)
class Options:
    leases: int
    seconds: float
    hosts: int = 10
    warmup: float = 3.0
    interval: float = 0.0


@dataclass(frozen=True)
class Sample:
    at: float
    cp_cpu: float
    cp_rss: int
    pg_cpu: float
    client_cpu: float
    machine: float


def _sample(st: stack.Stack, client_pid: int) -> Sample:
    assert st.control_plane is not None
    pm = st.postmaster_pid()
    return Sample(
        time.monotonic(),
        stack.cpu_seconds(st.control_plane.pid),
        stack.rss_bytes(st.control_plane.pid),
        stack.tree_cpu_seconds(pm) if pm else 0.0,
        stack.cpu_seconds(client_pid),
        stack.machine_busy_seconds(),
    )


async def run(
    st: stack.Stack, opt: Options, around: contextlib.AbstractAsyncContextManager[None]
) -> dict[str, Any]:
    """`around` is entered when the load client has its leases and starts renewing (the
    --profile hook), and left when it is done."""
    argv = [sys.executable, str(HERE / "renew_load.py"), "--address", st.address,
            "--leases", str(opt.leases), "--hosts", str(opt.hosts),
            "--seconds", str(opt.seconds), "--warmup", str(opt.warmup),
            "--interval", str(opt.interval)]  # fmt: skip
    before = await promtext.scrape(st.metrics_url)
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    samples: list[Sample] = []
    errors = asyncio.ensure_future(proc.stderr.read())
    try:
        ready = await proc.stdout.readline()  # "renewing": set-up done
        async with around:
            if ready.strip() == b"renewing":
                reading = asyncio.ensure_future(proc.stdout.read())
                while not reading.done():
                    samples.append(_sample(st, proc.pid))
                    st.check_alive()
                    await asyncio.wait([reading], timeout=SAMPLE_EVERY)
                out = await reading
        await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    err = await errors
    stack.save(st.root / "renew-load.log", err)
    if proc.returncode != 0 or ready.strip() != b"renewing":
        tail = err.decode(errors="replace")[-2000:]
        raise RuntimeError(f"renewal load client failed ({proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    after = await promtext.scrape(st.metrics_url)
    result["usage"] = _usage(samples, *result["window"])
    renewed = result["renewals_per_s"]
    result["cpu_us_per_renewal"] = {
        proc: result["usage"][f"{proc}_cores"] * 1e6 / renewed
        for proc in ("control_plane", "postgres", "load_client")
        if renewed and f"{proc}_cores" in result["usage"]
    }
    counter = "amc_renewals_total"
    result["server_renewals"] = promtext.value(after, counter, result="renewed") - (
        promtext.value(before, counter, result="renewed")
    )
    return result


def _usage(samples: list[Sample], start: float, end: float) -> dict[str, Any]:
    inside = [s for s in samples if start <= s.at <= end]
    if len(inside) < 2:
        return {}
    first, last = inside[0], inside[-1]
    wall = last.at - first.at
    return {
        "control_plane_cores": (last.cp_cpu - first.cp_cpu) / wall,
        "postgres_cores": (last.pg_cpu - first.pg_cpu) / wall,
        "load_client_cores": (last.client_cpu - first.client_cpu) / wall,
        "machine_busy_cores": (last.machine - first.machine) / wall,
        "control_plane_rss_mb": summarize([s.cp_rss / 2**20 for s in inside]),
    }
