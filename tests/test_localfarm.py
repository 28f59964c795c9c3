"""`make run` (scripts/localfarm.py) as a person runs it: the real script with its embedded
PostgreSQL, control plane and agent, on free ports and a data directory of the test's own,
in a process group of its own as a terminal's foreground job is. A second run beside a farm,
or beside what a killed farm left, refuses in one line naming every pid in its way; a second
Ctrl-C while the farm stops stops everything at once and leaves nothing behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from control_plane.embedded import EmbeddedPostgres
from scripts.farm_holders import holders
from tests.support import actions_spec, eventually, tap, wait_action

ROOT = Path(__file__).resolve().parent.parent
FLAGS = ("--listen", "--http-listen", "--metrics-listen", "--agent-metrics-listen")
# A farm's first start creates its database: well under this.
START = 90.0
# What "at once" means for a run that finds a farm already there.
AT_ONCE = 5.0

pytestmark = pytest.mark.timeout(240)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Farm:
    data_dir: Path
    addresses: dict[str, str]

    def argv(self, **other: str) -> list[str]:
        flags = {**self.addresses, **other}
        argv = [sys.executable, str(ROOT / "scripts" / "localfarm.py")]
        for flag, address in flags.items():
            argv += [flag, address]
        return [*argv, "--data-dir", str(self.data_dir), "--simulated-devices", "1"]


@pytest.fixture
def farm() -> Iterator[Farm]:
    # Not under pytest's tmp_path: as root the server runs as another user, and pytest
    # makes that tree private to root.
    root = Path(tempfile.mkdtemp(prefix="amc-localfarm-"))
    farm = Farm(root / "pgdata", {flag: f"127.0.0.1:{free_port()}" for flag in FLAGS})
    try:
        yield farm
    finally:
        # A test that failed may leave a farm's parts: none outlives it.
        for left in holders(farm.data_dir, list(farm.addresses.values())):
            if left.pid is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    psutil.Process(left.pid).kill()
        shutil.rmtree(root, ignore_errors=True)


async def start(argv: list[str]) -> asyncio.subprocess.Process:
    """The launcher in a process group of its own, as a terminal starts a foreground job
    (Ctrl-C there is SIGINT to that group)."""
    return await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=ROOT,
        start_new_session=True,
    )


async def until_line(proc: asyncio.subprocess.Process, text: str, seen: list[str]) -> None:
    """Reads the farm's output into `seen` until a line has `text`."""
    assert proc.stdout is not None
    async with asyncio.timeout(START):
        while not any(text in line for line in seen):
            line = (await proc.stdout.readline()).decode()
            assert line, f"the farm ended before {text!r}: {seen[-20:]}"
            seen.append(line)


def ctrl_c(proc: asyncio.subprocess.Process) -> None:
    os.killpg(proc.pid, signal.SIGINT)


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().split()[0])


def farm_processes(launcher: int, data_dir: Path) -> list[psutil.Process]:
    """Every process a running farm is made of: its launcher's descendants and its
    PostgreSQL (pg_ctl starts the server in a session of its own)."""
    root = psutil.Process(launcher)
    return [*root.children(recursive=True), psutil.Process(postmaster_pid(data_dir))]


def still_running(processes: list[psutil.Process]) -> list[str]:
    left = []
    for proc in processes:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{proc.pid} {proc.name()}")
        except psutil.NoSuchProcess:
            pass
    return left


def free(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket() as s:
        try:
            s.bind((host, int(port)))
        except OSError:
            return False
    return True


async def once(argv: list[str]) -> tuple[int, list[str], float]:
    """A run that should end at once: its exit code, its lines, how long it took."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    proc = await start(argv)
    async with asyncio.timeout(30):
        out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode().splitlines(), loop.time() - began


@pytest.fixture
async def first(farm: Farm) -> AsyncIterator[asyncio.subprocess.Process]:
    """The first farm, once it has said it is ready; stopped (SIGTERM) at the end."""
    proc = await start(farm.argv())
    try:
        await until_line(proc, "localfarm: ready", [])
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(60):
                await proc.communicate()


async def test_a_second_make_run_beside_a_farm_refuses_in_one_line_naming_its_pids(
    farm: Farm, first: asyncio.subprocess.Process
) -> None:
    """THEN the second run ends at once, exit 1, with one line naming the running farm's pid,
    how to stop it, and the pid of each of its processes (control plane, agent,
    PostgreSQL); it never says "ready", and the first farm goes on and stops cleanly."""
    parts = farm_processes(first.pid, farm.data_dir)
    code, lines, took = await once(farm.argv())
    assert took < AT_ONCE, took
    assert (code, len(lines)) == (1, 1), lines
    (line,) = lines
    assert line.startswith(f"localfarm: a farm is already running here (pid {first.pid};")
    assert farm.addresses["--listen"] in line and f"kill {first.pid}" in line, line
    for proc in parts:
        assert f"pid {proc.pid} ({proc.name()}" in line, (proc, line)
    # Other ports, the same data directory: the same farm's, found by its lock.
    others = {flag: f"127.0.0.1:{free_port()}" for flag in FLAGS}
    code, lines, _ = await once(farm.argv(**others))
    assert (code, len(lines)) == (1, 1), lines
    assert f"(pid {first.pid};" in lines[0]
    assert first.returncode is None
    first.send_signal(signal.SIGTERM)
    async with asyncio.timeout(60):
        out, _ = await first.communicate()
    assert first.returncode == 0, out.decode()[-2000:]
    assert out.decode().splitlines()[-1] == "localfarm: stopped"
    assert still_running(parts) == []


async def test_make_run_on_a_taken_port_names_it_its_pid_and_its_flag_and_starts_nothing(
    farm: Farm,
) -> None:
    """THEN one line names the address, the pid listening there and the flag to change,
    exit 1, and no PostgreSQL was started in the data directory."""
    host, _, port = farm.addresses["--http-listen"].rpartition(":")
    with socket.socket() as taken:
        taken.bind((host, int(port)))
        taken.listen()
        code, lines, took = await once(farm.argv())
    assert took < AT_ONCE, took
    assert (code, len(lines)) == (1, 1), lines
    assert lines[0].startswith(
        "localfarm: cannot start, its ports or data directory are held: "
        f"pid {os.getpid()} ({psutil.Process().name()}: {host}:{port})"
    ), lines[0]
    assert lines[0].endswith("make run ARGS='--http-listen 127.0.0.1:PORT'"), lines[0]
    assert not (farm.data_dir / "postmaster.pid").exists()


async def test_make_run_on_a_data_directory_whose_postgresql_runs_says_which(
    farm: Farm,
) -> None:
    """A PostgreSQL left running on the data directory (a farm killed, a control plane
    started by hand): one line with its pid and port and how to stop it, exit 1."""
    server = EmbeddedPostgres(farm.data_dir, durable=False)
    await asyncio.to_thread(server.start)
    try:
        pid = postmaster_pid(farm.data_dir)
        code, lines, took = await once(farm.argv())
    finally:
        await asyncio.to_thread(server.stop)
    assert took < AT_ONCE, took
    assert (code, len(lines)) == (1, 1), lines
    assert f"pid {pid} (postgres: the PostgreSQL of " in lines[0], lines[0]
    assert f", port {server.port})" in lines[0], lines[0]
    assert lines[0].endswith(f"stop them with `kill -INT {pid}`"), lines[0]
    await eventually(lambda: not (farm.data_dir / "postmaster.pid").exists(), what="stopped")


async def test_make_run_after_a_killed_farm_names_every_process_it_left(farm: Farm) -> None:
    """GIVEN a farm whose launcher was killed (SIGKILL: nothing of it stopped its parts)
    THEN the next run refuses in one line, exit 1, naming the pids of the control plane, the
    agent and PostgreSQL left running, and `kill -INT` of them stops them all."""
    proc = await start(farm.argv())
    await until_line(proc, "localfarm: ready", [])
    parts = farm_processes(proc.pid, farm.data_dir)
    # Its parts write on to its output: read to its end (theirs), or a full pipe stops them.
    assert proc.stdout is not None
    output = asyncio.create_task(proc.stdout.read())
    proc.kill()
    # Not proc.wait(): it waits for the output's end too, which the parts hold open.
    await eventually(lambda: proc.returncode is not None, what="the launcher killed")
    assert len(still_running(parts)) == 3, still_running(parts)
    try:
        code, lines, took = await once(farm.argv())
        assert took < AT_ONCE, took
        assert (code, len(lines)) == (1, 1), lines
        for part in parts:
            assert f"pid {part.pid} ({part.name()}" in lines[0], (part, lines[0])
        pids = " ".join(str(p.pid) for p in sorted(parts, key=lambda p: p.pid))
        assert lines[0].endswith(f"stop them with `kill -INT {pids}`"), lines[0]
        for part in parts:
            part.send_signal(signal.SIGINT)
        await eventually(lambda: not still_running(parts), timeout=60, what="stopped")
    finally:
        for part in parts:
            with contextlib.suppress(psutil.NoSuchProcess):
                part.kill()
        async with asyncio.timeout(30):
            await output


async def test_a_second_ctrl_c_while_a_farm_drains_stops_everything_at_once(farm: Farm) -> None:
    """GIVEN a farm running a task (a minute's wait), its agent allowed a minute to drain
    WHEN Ctrl-C, and again once the farm says it is stopping
    THEN the launcher ends within seconds without a traceback, no process of the farm is
    left, its ports are free and its PostgreSQL stopped; a new start on the same data
    directory and ports comes up ready."""
    argv = [*farm.argv(), "--drain-timeout", "60s"]
    proc = await start(argv)
    seen: list[str] = []
    await until_line(proc, "localfarm: ready", seen)
    parts = farm_processes(proc.pid, farm.data_dir)
    channel = aio_channel(farm.addresses["--listen"])
    try:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        spec = actions_spec(tap(), wait_action(60))
        task = await stub.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec))

        async def dispatched() -> bool:
            got = await stub.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))
            return bool(got.status == task_pb2.TASK_STATUS_DISPATCHED)

        await eventually(dispatched, timeout=30, what="the task running")
    finally:
        await channel.close()
    ctrl_c(proc)
    await until_line(proc, "localfarm: stopping: host agent (draining)", seen)
    ctrl_c(proc)
    loop = asyncio.get_running_loop()
    began = loop.time()
    await until_line(proc, "localfarm: stopped", seen)
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    took = loop.time() - began
    text = "".join(seen) + out.decode()
    assert took < 15, (took, text[-3000:])
    assert "Traceback" not in text, text[-3000:]
    assert "localfarm: stopping at once" in text, text[-3000:]
    assert text.splitlines()[-1] == "localfarm: stopped", text[-3000:]
    assert still_running(parts) == []
    assert all(free(address) for address in farm.addresses.values()), farm.addresses
    assert not (farm.data_dir / "postmaster.pid").exists()
    again = await start(argv)
    try:
        await until_line(again, "localfarm: ready", [])
    finally:
        again.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            out, _ = await again.communicate()
    assert again.returncode == 0, out.decode()[-2000:]


async def test_two_ctrl_c_at_once_stop_everything_without_a_traceback(farm: Farm) -> None:
    """WHEN two SIGINTs come back to back (a double Ctrl-C) THEN the farm stops at once, no
    traceback, nothing of it left running."""
    proc = await start(farm.argv())
    seen: list[str] = []
    await until_line(proc, "localfarm: ready", seen)
    parts = farm_processes(proc.pid, farm.data_dir)
    ctrl_c(proc)
    ctrl_c(proc)
    await until_line(proc, "localfarm: stopped", seen)
    async with asyncio.timeout(60):
        out, _ = await proc.communicate()
    text = "".join(seen) + out.decode()
    assert "Traceback" not in text, text[-3000:]
    assert proc.returncode == 0, text[-3000:]
    assert still_running(parts) == []
    assert all(free(address) for address in farm.addresses.values()), farm.addresses
