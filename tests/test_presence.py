"""A host is connected while it keeps its renewal stream open, leases or not, and shows
disconnected soon after its agent dies; idle hosts cost no write per interval (issue 11.2)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest

from amc.v1 import scheduler_pb2
from control_plane.config import Settings
from control_plane.domain import Role
from scripts.launch import HostAgentCommand
from tests.support import Clients, Farm, eventually
from tests.test_host_agent_process import agent_process, log_events

TTL = 1.5
SHORT = Settings(
    lease_ttl=timedelta(seconds=TTL),
    sweep_interval=timedelta(seconds=0.05),
    watch_refresh=timedelta(seconds=1),
)


@pytest.fixture
async def short_farm(database_url: str) -> AsyncIterator[Farm]:
    f = Farm(database_url, SHORT)
    await f.start()
    try:
        yield f
    finally:
        await f.stop()


async def _host(operator: Clients, host_id: str) -> scheduler_pb2.Host:
    hosts = (await operator.scheduler.ListHosts(scheduler_pb2.ListHostsRequest())).hosts
    (host,) = [h for h in hosts if h.host_id == host_id]
    return host


async def test_an_idle_host_stays_connected_and_a_killed_one_shows_disconnected(
    short_farm: Farm, tmp_path: Path
) -> None:
    farm = short_farm
    token = tmp_path / "host.token"
    token.write_text(await farm.token(Role.HOST, "idle-1") + "\n")
    log = tmp_path / "agent.log"
    operator = await farm.operator()
    assert farm.db is not None
    command = HostAgentCommand(
        farm.address,
        "idle-1",
        token_file=token,
        simulated_devices=2,
        acquire_wait=30,
        log_format="json",
    )
    async with agent_process(command, log) as proc:
        await eventually(
            lambda: "registered" in [e.get("event") for e in log_events(log)],
            timeout=30,
            what="the agent to register",
        )
        await eventually(
            lambda: farm.db.fetchval("SELECT replica_id IS NOT NULL FROM hosts"),
            what="the stream to be recorded",
        )
        writes_before = await _host_writes(farm)
        # Past two TTLs with nothing to run: still connected, last_seen keeps moving.
        first_seen = (await _host(operator, "idle-1")).last_seen_at.ToDatetime()
        deadline = time.monotonic() + 2 * TTL + 0.5
        while time.monotonic() < deadline:
            host = await _host(operator, "idle-1")
            assert host.connected, "an idle host with its stream open shows disconnected"
            await asyncio.sleep(0.1)
        assert host.last_seen_at.ToDatetime() > first_seen
        # No write to the host's row for being idle.
        assert await _host_writes(farm) == writes_before
        proc.kill()
        await proc.wait()
        killed = time.monotonic()
        await eventually(
            lambda: _disconnected(operator, "idle-1"), timeout=TTL + 1.0, what="disconnected"
        )
        assert time.monotonic() - killed <= TTL + 1.0


async def _disconnected(operator: Clients, host_id: str) -> bool:
    return not (await _host(operator, host_id)).connected


async def _host_writes(farm: Farm) -> str:
    """The row version of the host: any write to the row changes it."""
    assert farm.db is not None
    return str(await farm.db.fetchval("SELECT (ctid, xmin)::text FROM hosts"))
