"""`make run` (scripts/localfarm.py) as a person runs it twice: the real script with its
embedded PostgreSQL, control plane and agent, on free ports and a data directory of the
test's own. A second run beside a farm says so in one line and starts nothing."""

from __future__ import annotations

import asyncio
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from control_plane.embedded import EmbeddedPostgres
from tests.support import eventually

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
    try:
        yield Farm(root / "pgdata", {flag: f"127.0.0.1:{free_port()}" for flag in FLAGS})
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def start(argv: list[str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=ROOT
    )


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
async def running(farm: Farm) -> AsyncIterator[asyncio.subprocess.Process]:
    """The first farm, once it has said it is ready; stopped (SIGTERM) at the end."""
    proc = await start(farm.argv())
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(START):
            while not any("localfarm: ready" in line for line in seen):
                line = (await proc.stdout.readline()).decode()
                assert line, f"the first farm ended before it was ready: {seen}"
                seen.append(line)
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(60):
                await proc.communicate()


async def test_a_second_make_run_beside_a_farm_says_so_in_one_line_and_starts_nothing(
    farm: Farm, running: asyncio.subprocess.Process
) -> None:
    """THEN the second run ends at once with one line naming the running farm's pid and
    how to stop it, never says "ready", and the first farm goes on and stops cleanly."""
    code, lines, took = await once(farm.argv())
    assert took < AT_ONCE, took
    assert code == 0, lines
    assert len(lines) == 1, lines
    (line,) = lines
    assert line.startswith(f"localfarm: a farm is already running here (pid {running.pid};")
    assert farm.addresses["--listen"] in line and f"kill {running.pid}" in line, line
    # Other ports, the same data directory: the same farm's, found by its lock.
    others = {flag: f"127.0.0.1:{free_port()}" for flag in FLAGS}
    code, lines, _ = await once(farm.argv(**others))
    assert (code, len(lines)) == (0, 1), lines
    assert f"(pid {running.pid};" in lines[0]
    assert running.returncode is None
    running.send_signal(signal.SIGTERM)
    async with asyncio.timeout(60):
        out, _ = await running.communicate()
    assert running.returncode == 0, out.decode()[-2000:]
    assert out.decode().splitlines()[-1] == "localfarm: stopped"


async def test_make_run_on_a_taken_port_names_it_and_its_flag_and_starts_nothing(
    farm: Farm,
) -> None:
    """THEN one line names the address something listens on and the flag to change, exit 1,
    and no PostgreSQL was started in the data directory."""
    host, _, port = farm.addresses["--http-listen"].rpartition(":")
    with socket.socket() as taken:
        taken.bind((host, int(port)))
        taken.listen()
        code, lines, took = await once(farm.argv())
    assert took < AT_ONCE, took
    assert (code, len(lines)) == (1, 1), lines
    assert lines[0].startswith(f"localfarm: {host}:{port} is taken (in use)"), lines[0]
    assert "ARGS='--http-listen 127.0.0.1:PORT'" in lines[0], lines[0]
    assert not (farm.data_dir / "postmaster.pid").exists()


async def test_make_run_on_a_data_directory_whose_postgresql_runs_says_which(
    farm: Farm,
) -> None:
    """A PostgreSQL left running on the data directory (a farm killed, a control plane
    started by hand): one line with its pid and port and how to stop it, exit 1."""
    server = EmbeddedPostgres(farm.data_dir, durable=False)
    await asyncio.to_thread(server.start)
    try:
        pid = int((farm.data_dir / "postmaster.pid").read_text().split()[0])
        code, lines, took = await once(farm.argv())
    finally:
        await asyncio.to_thread(server.stop)
    assert took < AT_ONCE, took
    assert (code, len(lines)) == (1, 1), lines
    assert f"already runs (pid {pid}, port {server.port})" in lines[0], lines[0]
    assert f"kill -INT {pid}" in lines[0], lines[0]
    await eventually(lambda: not (farm.data_dir / "postmaster.pid").exists(), what="stopped")
