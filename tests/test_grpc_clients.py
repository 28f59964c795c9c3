"""The README's operator session, run by gRPC clients this project did not write: grpcurl
and `buf curl`, both through server reflection, against a control plane as `make run`
starts it (authentication off, on loopback) with a host agent on one simulated phone.

The session submits the README's own long task, watches it reach the phone and cancels it
there: the cancellation must end it long before its minute-long wait would have."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from amc_common.channel import aio_channel
from control_plane.server import ControlPlane
from host_agent.agent import Agent
from host_agent.simulated import SimulatedSource
from tests.support import eventually
from tests.support.agent import TEST_SETTINGS
from tests.test_readme import tour_submit_body

ROOT = Path(__file__).resolve().parent.parent
GRPCURL = shutil.which("grpcurl", path=str(ROOT / ".venv" / "bin")) or "grpcurl"
BUF = Path(sys.executable).parent / "buf"  # the buf-bin wheel, with the project
# Well under the tour task's minute: the cancellation, not the wait, ends it.
CANCELLED_WITHIN = 20.0


@pytest.fixture
async def address(database_url: str) -> AsyncIterator[str]:
    plane = ControlPlane(database_url, listen="127.0.0.1:0", insecure=True)
    await plane.start()
    address = f"127.0.0.1:{plane.port}"
    channel = aio_channel(address)
    agent = Agent(TEST_SETTINGS, SimulatedSource(1), channel)
    running = asyncio.create_task(agent.run())
    try:
        await eventually(lambda: agent.registered.is_set() or running.done(), what="the agent")
        yield address
    finally:
        agent.stop()
        await asyncio.wait_for(running, 30)
        await channel.close()
        await plane.stop(0)


async def run(*argv: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, f"{argv[:3]} failed: {err.decode()}"
    return out.decode()


def grpcurl(address: str, method: str | None = None, body: object = None) -> list[str]:
    argv = [GRPCURL, "-plaintext"]
    if body is not None:
        argv += ["-d", json.dumps(body)]
    return [*argv, address, *([method] if method else [])]


def buf_curl(address: str, method: str, body: object = None) -> list[str]:
    argv = [str(BUF), "curl", "--protocol", "grpc", "--http2-prior-knowledge"]
    if body is not None:
        argv += ["--data", json.dumps(body)]
    return [*argv, f"http://{address}/{method}"]


async def session(address: str, call) -> list[str]:  # type: ignore[no-untyped-def]
    """Submit the README's task, let the phone take it, watch in the background, cancel:
    returns the statuses the watch printed."""
    submit = call(address, "amc.v1.Scheduler/SubmitTask", tour_submit_body())
    task = json.loads(await run(*submit))
    assert task["status"] == "TASK_STATUS_QUEUED"
    task_id = task.get("task_id") or task["taskId"]  # grpcurl keeps proto names, buf camelCases

    async def running() -> bool:
        get = call(address, "amc.v1.Scheduler/GetTask", {"task_id": task_id})
        return bool(json.loads(await run(*get))["status"] == "TASK_STATUS_DISPATCHED")

    await eventually(running, interval=0.2, what="the phone to run the task")
    watch = asyncio.create_task(
        run(*call(address, "amc.v1.Scheduler/WatchTask", {"task_id": task_id}))
    )
    cancel = {"task_id": task_id, "reason": "tour"}
    requested = json.loads(await run(*call(address, "amc.v1.Scheduler/CancelTask", cancel)))
    assert requested["status"] == "TASK_STATUS_DISPATCHED"
    printed = await asyncio.wait_for(watch, CANCELLED_WITHIN)
    return re.findall(r'"status": "(TASK_STATUS_\w+)"', printed)


async def test_grpcurl_runs_the_readme_session_through_reflection(address: str) -> None:
    services = (await run(*grpcurl(address, "list"))).split()
    assert {"amc.v1.Scheduler", "amc.v1.Lease", "grpc.health.v1.Health"} <= set(services)
    described = await run(*grpcurl(address), "describe", "amc.v1.Scheduler.SubmitTask")
    assert "rpc SubmitTask ( .amc.v1.SubmitTaskRequest ) returns ( .amc.v1.Task )" in described
    statuses = await session(address, grpcurl_call)
    assert statuses[-1] == "TASK_STATUS_CANCELLED"
    health = await run(*grpcurl(address, "grpc.health.v1.Health/Check"))
    assert "SERVING" in health


def grpcurl_call(address: str, method: str, body: object) -> list[str]:
    return grpcurl(address, method, body)


async def test_buf_curl_runs_the_same_session_through_reflection(address: str) -> None:
    assert BUF.exists(), "buf is missing: `make setup` installs it (the buf-bin wheel)"
    methods = (
        await run(
            str(BUF),
            "curl",
            "--protocol",
            "grpc",
            "--http2-prior-knowledge",
            "--list-methods",
            f"http://{address}",
        )
    ).split()
    assert "amc.v1.Scheduler/SubmitTask" in methods and "amc.v1.Lease/RenewLeases" in methods
    statuses = await eventually(lambda: session(address, buf_curl), what="the session")
    assert statuses[-1] == "TASK_STATUS_CANCELLED"
