"""Throwaway: what a run's log costs (not committed)."""
from __future__ import annotations

import asyncio

import pytest
import gzip
import os
import resource
import time

from amc.v1 import scheduler_pb2, task_pb2
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, tap, wait_action
from tests.support.agent import finished, get, running_agent, status_is, submit
from tests.test_phone_logs import kept_log, launch


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run_once(farm: Farm, spec, max_bytes: int, delay: float = 0.0):
    client = await farm.client()
    source = SimulatedSource(1, delay=delay)
    async with running_agent(farm, source, logcat_max_bytes=max_bytes) as agent:
        t0, c0 = time.monotonic(), cpu()
        task_id = await submit(client, spec)
        await finished(agent, task_id, within=600)
        t1, c1 = time.monotonic(), cpu()
        await status_is(farm, task_id, "done")
    return task_id, t1 - t0, c1 - c0


@pytest.mark.timeout(1200)
async def test_measure(farm: Farm) -> None:
    out = []
    # A minute of a simulated run: a launch, then a tap every second.
    minute = actions_spec(launch(), *[a for _ in range(60) for a in (tap(100, 200), wait_action(1))])
    for max_bytes in (4 << 20, 0, 4 << 20, 0):
        task_id, took, used = await run_once(farm, minute, max_bytes)
        line = f"minute run logcat={max_bytes}: {took:.2f}s wall, {used:.3f}s cpu"
        if max_bytes:
            artifact, text = await kept_log(await farm.operator(), task_id)
            raw = len(text.encode())
            line += f", kept {artifact.size_bytes} B gzip ({raw} B text, {len(text.splitlines())} lines)"
        out.append(line)
    # 300 taps back to back (no wait): what marks cost per step.
    taps = actions_spec(*[tap(10, 20) for _ in range(300)])
    for max_bytes in (4 << 20, 0, 4 << 20, 0):
        task_id, took, used = await run_once(farm, taps, max_bytes)
        out.append(f"300 taps logcat={max_bytes}: {took:.3f}s wall, {used:.3f}s cpu")
    with open("/tmp/logcat_measure/out.txt", "w") as f:
        f.write("\n".join(out) + "\n")
