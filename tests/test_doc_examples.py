"""The examples of README.md and docs/cli.md, run as written against a farm like the one
`make run` starts (authentication off, a host `local` with two simulated phones), in the
order a reader runs them, and what they print checked against what the documents say
(tests/support/doc_examples.py says how)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from amc_common.channel import aio_channel
from control_plane.server import ControlPlane
from host_agent.agent import Agent
from host_agent.clean_profile import Profiles
from host_agent.simulated import SimulatedSource
from tests.support import eventually
from tests.support.agent import TEST_SETTINGS
from tests.support.doc_examples import check, fences, run_console, run_sh

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CLI_DOC = ROOT / "docs" / "cli.md"
JQ = shutil.which("jq")

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(JQ is None, reason="no jq on this machine (apt-get install jq)"),
]


@pytest.fixture
async def address(database_url: str) -> AsyncIterator[str]:
    """A control plane as `make run` starts it, with its agent `local` on sim-0, sim-1."""
    async with farm_like_make_run(database_url, phones=2) as address:
        yield address


@pytest.fixture
async def one_phone(database_url: str) -> AsyncIterator[str]:
    """The same with one phone, sim-0 (`make run ARGS=--simulated-devices 1`): a task
    runs where a transcript says it does."""
    async with farm_like_make_run(database_url, phones=1) as address:
        yield address


@asynccontextmanager
async def farm_like_make_run(database_url: str, phones: int) -> AsyncIterator[str]:
    plane = ControlPlane(database_url, listen="127.0.0.1:0", insecure=True)
    await plane.start()
    address = f"127.0.0.1:{plane.port}"
    channel = aio_channel(address)
    # As `make run`'s agent: its phones cleaned between leases (the product's default).
    settings = replace(TEST_SETTINGS, host_id="local", clean_profile=Profiles())
    agent = Agent(settings, SimulatedSource(phones), channel)
    running = asyncio.create_task(agent.run())
    try:
        await eventually(lambda: agent.registered.is_set() or running.done(), what="the agent")
        yield address
    finally:
        agent.stop()
        await asyncio.wait_for(running, 30)
        await channel.close()
        await plane.stop(0)


@pytest.fixture
def reader(tmp_path: Path) -> Path:
    """Where the reader's shell is: the example files where the documents say they are,
    the files the examples write kept out of the checkout."""
    (tmp_path / "scripts").symlink_to(ROOT / "scripts")
    return tmp_path


def environment(address: str) -> dict[str, str]:
    """The reader's shell after `source .venv/bin/activate`, pointed at this farm."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMC_", "GRPC_"))}
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["AMC_ADDR"] = address
    return env


def block_with(path: Path, language: str, marker: str) -> str:
    (block,) = [b for b in fences(path, language) if marker in b]
    return block


async def test_the_readmes_tours_run_in_order_as_written_and_print_what_they_say(
    address: str, reader: Path
) -> None:
    """THEN every command of the grpcurl block, then of the `amc` block, succeeds (or fails
    as its `# ->` line says) and prints what its `# ->` lines show: GetHost's `cordoned`
    under `host`, the artifacts of a task that kept a screenshot and the one it fetches;
    the login workflow's screenshot written; an APK uploaded and installed by a task; the
    farm left as it was found."""
    env = environment(address)
    for marker, least in (("amc.v1.Admin/GetHost", 12), ("amc hosts cordon", 12), ("amc apps", 5)):
        block = block_with(README, "sh", marker)
        ran = await asyncio.to_thread(run_sh, block, cwd=reader, env=env, address=address)
        problems = check(ran)
        assert problems == [], "\n".join(problems)
        assert sum(len(r.command.expected) for r in ran) >= least
    assert (reader / "evidence.png").read_bytes().startswith(b"\x89PNG")


async def test_the_cli_docs_transcripts_run_as_written_and_print_what_they_show(
    one_phone: str, reader: Path
) -> None:
    """THEN each `$ amc …` of docs/cli.md's transcripts prints, line by line, what the
    document shows (ids, times, step durations and digests being this run's own), on
    `make run --simulated-devices 1`'s farm."""
    blocks = fences(CLI_DOC, "console")
    assert len(blocks) >= 2
    problems = await asyncio.to_thread(
        run_console, blocks, cwd=reader, env=environment(one_phone), address=one_phone
    )
    assert problems == [], "\n".join(problems)
