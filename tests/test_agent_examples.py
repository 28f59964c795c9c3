"""The agent examples of README.md and docs/cli.md, run as written against a farm like the
one `make run` starts (authentication off, a host `local` with simulated phones): the
ten-line loop with the client library, and the MCP configuration that points an agent's
MCP client at `amc mcp` (driven here by the `mcp` package's own stdio client); and the
README's episode from a snapshot, against the same farm whose host `local` runs an
emulator pool of the emulator double (tests/support/emulators.py)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import asyncpg
import pytest

from amc_common.channel import aio_channel
from control_plane.server import ControlPlane
from host_agent.agent import Agent
from host_agent.clean_profile import Profiles
from tests.support import eventually
from tests.support.agent import TEST_SETTINGS
from tests.support.doc_examples import fences
from tests.support.emulators import EmulatorWorld
from tests.test_doc_examples import farm_like_make_run

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", ROOT / "docs" / "cli.md"]
MAKE_RUN_ADDRESS = "127.0.0.1:50051"

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def address(database_url: str) -> AsyncIterator[str]:
    async with farm_like_make_run(database_url, phones=1) as address:
        yield address


def agent_loop(path: Path) -> str:
    (block,) = [
        b for b in fences(path, "python") if "farm.session(" in b and "start_snapshot" not in b
    ]
    return block


@asynccontextmanager
async def farm_with_an_emulator_pool(database_url: str, world: EmulatorWorld) -> AsyncIterator[str]:
    """As `make run`'s farm (authentication off, the host `local`, cleaning on), its host
    running a pool of one emulator double reset to `default_boot` between leases."""
    plane = ControlPlane(database_url, listen="127.0.0.1:0", insecure=True)
    await plane.start()
    address = f"127.0.0.1:{plane.port}"
    channel = aio_channel(address)
    settings = replace(TEST_SETTINGS, host_id="local", clean_profile=Profiles())
    agent = Agent(settings, world.source(world.settings(world.pool(1, 1))), channel)
    running = asyncio.create_task(agent.run())
    try:
        await eventually(lambda: agent.registered.is_set() or running.done(), what="the agent")
        yield address
    finally:
        agent.stop()
        await asyncio.wait_for(running, 30)
        await channel.close()
        await plane.stop(0)
        await world.close()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
async def test_the_agent_loop_runs_as_written_and_ends_its_session_done(
    address: str, doc: Path
) -> None:
    """THEN the loop looks and taps three times, takes a screenshot, and its task, done,
    has the seven actions as steps."""
    code = agent_loop(doc).replace(MAKE_RUN_ADDRESS, address)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert out.decode().startswith("7 steps, "), out.decode()


async def test_the_readmes_episode_starts_from_its_snapshot_as_written(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """THEN the README's session from a snapshot runs as written on a host's emulator pool:
    its phone is the emulator, which loaded `login_screen` before the tap (its pool's
    snapshot is another), and the session's task says it started from it."""
    (code,) = [b for b in fences(DOCS[0], "python") if "start_snapshot=" in b]
    world = await EmulatorWorld.make(tmp_path, monkeypatch)
    async with farm_with_an_emulator_pool(database_url, world) as address:
        await eventually(lambda: emulator_ready(database_url), timeout=30, what="the emulator")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            code.replace(MAKE_RUN_ADDRESS, address),
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        loaded = [e["snapshot"] for e in world.read_events("loaded")]
    assert proc.returncode == 0, err.decode()
    assert out.decode() == "emulator-5600 started from login_screen\n"
    assert "login_screen" in loaded, loaded


async def emulator_ready(database_url: str) -> bool:
    """The pool's instance is ready, and its host has told the control plane its snapshots."""
    conn = await asyncpg.connect(database_url)
    try:
        return bool(
            await conn.fetchval(
                "SELECT count(*) FROM devices d JOIN hosts h USING (host_id)"
                " WHERE d.serial = 'emulator-5600' AND d.condition = 'ready'"
                " AND h.snapshots @> ARRAY['login_screen']"
            )
        )
    finally:
        await conn.close()


def test_the_two_documents_show_the_same_loop() -> None:
    """THEN README.md and docs/cli.md do not drift apart."""
    assert agent_loop(DOCS[0]) == agent_loop(DOCS[1])


async def test_the_readmes_mcp_configuration_starts_amc_mcp_for_an_agent(address: str) -> None:
    """THEN the `mcpServers` entry, its address pointed at this farm, starts a server
    whose tools list the farm's phone and lend it: a tap, then close_session ends the
    session done."""
    mcp = pytest.importorskip("mcp")
    # The stdio entry (the HTTP one, beside it, names a URL: tests/test_mcp_http.py's).
    (block,) = [b for b in fences(ROOT / "README.md", "json") if '"command"' in b]
    (server,) = json.loads(block)["mcpServers"].values()
    assert server["command"] == "amc"
    args = [address if a == MAKE_RUN_ADDRESS else a for a in server["args"]]
    params = mcp.StdioServerParameters(
        command=str(ROOT / ".venv" / "bin" / "amc"), args=args, env=server.get("env"), cwd=ROOT
    )
    async with (
        asyncio.timeout(60),
        mcp.stdio_client(params) as (read, write),
        mcp.ClientSession(read, write) as agent,
    ):
        await agent.initialize()
        while True:  # the host counts as connected once its stream's opening is written
            listed = await agent.call_tool("list_phones", {})
            if not listed.content[0].text.startswith("no phone"):
                break
            await asyncio.sleep(0.05)
        head, phone = listed.content[0].text.splitlines()
        assert head == "1 phone: 1 free"
        assert phone.startswith("sim-0  free  ") and "model=Simulated" in phone, phone
        tapped = await agent.call_tool("tap", {"x": 10, "y": 20})
        assert tapped.content[0].text == "tap 10,20: ok"
        closed = await agent.call_tool("close_session", {})
        assert closed.content[0].text.endswith(" done (1 actions)")
