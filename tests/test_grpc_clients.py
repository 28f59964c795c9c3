"""The README's operator session, run by gRPC clients this project did not write: grpcurl
and `buf curl`, both through server reflection, against a control plane as `make run`
starts it (authentication off, on loopback)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from control_plane.server import ControlPlane
from tests.support import eventually

ROOT = Path(__file__).resolve().parent.parent
GRPCURL = shutil.which("grpcurl", path=str(ROOT / ".venv" / "bin")) or "grpcurl"
BUF = ROOT / ".tools" / "node_modules" / ".bin" / "buf"
SUBMIT = {
    "spec": {"actions": {"actions": [{"tap": {"x": 100, "y": 200}}, {"wait": {"duration": "20s"}}]}}
}


@pytest.fixture
async def address(database_url: str) -> AsyncIterator[str]:
    plane = ControlPlane(database_url, listen="127.0.0.1:0", insecure=True)
    await plane.start()
    try:
        yield f"127.0.0.1:{plane.port}"
    finally:
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
    """Submit, watch in the background, cancel: returns the statuses the watch printed."""
    task = json.loads(await run(*call(address, "amc.v1.Scheduler/SubmitTask", SUBMIT)))
    assert task["status"] == "TASK_STATUS_QUEUED"
    task_id = task.get("task_id") or task["taskId"]  # grpcurl keeps proto names, buf camelCases
    watch = asyncio.create_task(
        run(*call(address, "amc.v1.Scheduler/WatchTask", {"task_id": task_id}))
    )
    cancelled = json.loads(
        await run(
            *call(address, "amc.v1.Scheduler/CancelTask", {"task_id": task_id, "reason": "tour"})
        )
    )
    assert cancelled["status"] == "TASK_STATUS_CANCELLED"
    printed = await watch
    return [line.split('"')[3] for line in printed.splitlines() if '"status"' in line]


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
    assert BUF.exists(), "buf is missing: `make tools` installs it (npm @bufbuild/buf)"
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
