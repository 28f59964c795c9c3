"""scripts/demo.sh as a person runs it against `make run`'s farm: to its end, with a file
for the screenshot, and interrupted by Ctrl-C mid-run. Each time it leaves nothing behind:
no temporary file, no process of its own, no task of its still running."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from tests.support import eventually
from tests.test_doc_examples import environment, farm_like_make_run

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "scripts" / "demo.sh"

pytestmark = pytest.mark.timeout(180)
# What a terminal gives its foreground job: Ctrl-C's SIGINT (and SIGQUIT) at their
# defaults. A test run started in the background of a non-interactive shell (as CI may
# start it) has them ignored, every child inherits that, and a shell cannot trap a signal
# ignored on its entry: the demo would sleep through its Ctrl-C. So the demo starts through
# this, which restores them and then runs it.
AS_FOREGROUND = (
    sys.executable,
    "-c",
    "import os, signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGQUIT): signal.signal(s, signal.SIG_DFL)\n"
    "os.execvp(sys.argv[1], sys.argv[1:])",
)


@pytest.fixture
async def address(database_url: str) -> AsyncIterator[str]:
    async with farm_like_make_run(database_url, phones=2) as address:
        yield address


async def start(
    address: str, tmp: Path, *args: str, pause: float | None = None
) -> asyncio.subprocess.Process:
    """The demo in a session of its own, as a terminal's foreground job, its temporary
    files under `tmp` (`pause`: seconds its long task runs before the demo cancels it)."""
    env = environment(address) | {"TMPDIR": str(tmp)}
    if pause is not None:
        env["AMC_DEMO_PAUSE"] = str(pause)
    return await asyncio.create_subprocess_exec(
        *AS_FOREGROUND,
        "bash",
        str(DEMO),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def pausing(sid: int) -> bool:
    """The demo of session `sid` sleeps through its pause (its `sleep` has started)."""
    return any(found.endswith(" sleep") for found in of_session(sid))


def of_session(sid: int) -> list[str]:
    """The processes still running in the demo's session."""
    found = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        try:
            if os.getsid(proc.pid) == sid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.pid} {proc.info['name']}")
        except (ProcessLookupError, PermissionError):
            continue
    return found


def described(sid: int) -> list[str]:
    """The processes still running in the demo's session: pid, status, command line, and
    the signals each ignores and catches (from /proc)."""
    found = []
    for proc in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if os.getsid(proc.pid) != sid:
                continue
            masks = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
            sig = [m for m in masks if m.startswith(("SigIgn", "SigCgt", "SigBlk"))]
            found.append(f"{proc.pid} {proc.info['status']} {proc.info['cmdline']} {sig}")
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            continue
    return found


async def tasks(address: str) -> list[tuple[str, str]]:
    """(status, cancel reason) of every task of the farm, sorted."""
    channel = aio_channel(address)
    try:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        answer = await stub.ListTasks(scheduler_pb2.ListTasksRequest(page_size=100))
        return sorted((task_pb2.TaskStatus.Name(t.status), t.cancel_reason) for t in answer.tasks)
    finally:
        await channel.close()


async def test_the_demo_runs_to_its_end_and_leaves_nothing_behind(
    address: str, tmp_path: Path
) -> None:
    """THEN it exits 0 having cancelled its long task mid-run (the watch says 9), its
    temporary folder is gone, no process of it runs on, and no task of it still runs."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    proc = await start(address, tmp)
    async with asyncio.timeout(150):
        out, _ = await proc.communicate()
    text = out.decode()
    assert proc.returncode == 0, text
    assert "wrote screenshot of step 3 (evidence)" in text, text
    assert "watch ended with exit code 9 (9: cancelled)" in text, text
    assert list(tmp.iterdir()) == []
    assert of_session(proc.pid) == []
    assert await tasks(address) == [
        ("TASK_STATUS_CANCELLED", "demo"),
        ("TASK_STATUS_DONE", ""),
    ]


async def test_the_demo_keeps_the_screenshot_where_it_is_asked_to(
    address: str, tmp_path: Path
) -> None:
    kept = tmp_path / "evidence.png"
    (tmp_path / "tmp").mkdir()
    proc = await start(address, tmp_path / "tmp", str(kept))
    async with asyncio.timeout(150):
        out, _ = await proc.communicate()
    assert proc.returncode == 0, out.decode()
    assert kept.read_bytes().startswith(b"\x89PNG")
    assert list((tmp_path / "tmp").iterdir()) == []


async def test_a_demo_interrupted_mid_run_stops_its_watch_and_cancels_its_task(
    address: str, tmp_path: Path
) -> None:
    """WHEN Ctrl-C (SIGINT to its process group) while it watches its long task
    THEN it exits 130, its background watch is stopped (a background job ignores the
    terminal's SIGINT), its long task is cancelled, and its temporary folder is gone."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    # The long task left running long enough for the interrupt to come while it runs,
    # however slowly this test reads (under load it once came after the demo's own cancel).
    proc = await start(address, tmp, pause=600)
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(120):
            while not any(line.startswith("submitted ") for line in seen):
                line = (await proc.stdout.readline()).decode()
                assert line, seen
                seen.append(line)
        # Interrupted in its pause, as a person would be: a SIGINT that came while the
        # shell was starting the pause's `sleep` could be lost to the child before its exec.
        await eventually(lambda: pausing(proc.pid), what="the demo's pause")
        os.killpg(proc.pid, signal.SIGINT)
        try:
            async with asyncio.timeout(60):
                out, _ = await proc.communicate()
        except TimeoutError:
            # Said, so that a run where the interrupt went unheeded tells what still ran.
            raise AssertionError(
                f"the demo runs on 60 s after Ctrl-C: {described(proc.pid)}; it said {seen}"
            ) from None
    finally:
        if proc.returncode is None:  # never leave the demo behind
            os.killpg(proc.pid, signal.SIGKILL)
    text = "".join(seen) + out.decode()
    assert proc.returncode == 130, text
    assert of_session(proc.pid) == []
    assert list(tmp.iterdir()) == []
    assert "cancelled" in text and "(the demo stopped)" in text, text
    wanted = [("TASK_STATUS_CANCELLED", "demo stopped"), ("TASK_STATUS_DONE", "")]

    async def cancelled() -> bool:
        return await tasks(address) == wanted

    await eventually(cancelled, what=f"the tasks {wanted}")
