"""The agent examples of README.md and docs/cli.md, run as written against a farm like the
one `make run` starts (authentication off, a host `local` with simulated phones): the
ten-line loop with the client library, and the MCP configuration that points an agent's
MCP client at `amc mcp` (driven here by the `mcp` package's own stdio client)."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.doc_examples import fences
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
    (block,) = [b for b in fences(path, "python") if "farm.session(" in b]
    return block


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
