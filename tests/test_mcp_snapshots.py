"""An AI agent's session from a snapshot, through the MCP server (the `mcp` SDK's client on
the server's JSON-RPC loop) on a pool of emulator doubles: `open_session(snapshot=…)` has
the emulator load it before the first action, and one no emulator has is a one-line tool
error that queues nothing."""

from __future__ import annotations

import pytest

pytest.importorskip("mcp")

from amc_client import Farm as Client
from amc_client.mcp_server import ClientSessions, Defaults
from control_plane.domain import Role
from tests.support import Farm, eventually
from tests.support.emulators import EmulatorWorld
from tests.test_emulator_pools import EMULATOR, FIRST, ready, running, world
from tests.test_mcp_server import _content, _error, agent

__all__ = ["world"]  # the emulator pools' fixture, used here too


async def test_an_agent_opens_a_session_from_a_snapshot_and_an_unknown_one_is_refused(
    farm: Farm, world: EmulatorWorld
) -> None:
    """THEN open_session with `snapshot` answers with the session, its phone and the
    snapshot, and the emulator loaded that snapshot before the session's first action; a
    snapshot no emulator of the farm has is refused in one line naming it, and no task is
    queued for it."""
    assert farm.db is not None
    token = await farm.token(Role.CLIENT)
    async with running(farm, world), Client(farm.address, token=token) as client:
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the emulator")
        sessions = ClientSessions(client, Defaults(idle_timeout=30, labels=EMULATOR))
        async with agent(sessions) as mcp:
            tasks_before = await farm.db.fetchval("SELECT count(*) FROM tasks")
            refused = _error(await mcp.call_tool("open_session", {"snapshot": "nope"}))
            assert "nope" in refused and "snapshot" in refused, refused
            assert await farm.db.fetchval("SELECT count(*) FROM tasks") == tasks_before
            loads_before = len(world.read_events("loaded"))
            (opened,) = _content(await mcp.call_tool("open_session", {"snapshot": "login_screen"}))
            assert opened.text.startswith("session "), opened.text
            assert opened.text.endswith(f"on phone {FIRST}, from snapshot login_screen")
            loaded = [e["snapshot"] for e in world.read_events("loaded")][loads_before:]
            assert loaded == ["login_screen"]
            _content(await mcp.call_tool("tap", {"x": 5, "y": 5}))
            _content(await mcp.call_tool("close_session", {}))
