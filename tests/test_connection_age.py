"""A replica ends its connections after --max-connection-age (an HTTP/2 GOAWAY: open calls
go on, new ones take a new connection), and a host agent moves its renewal stream to the
new connection: behind a load balancer, the hosts a replica took over spread out again.

Real replicas, real agents; the load balancer is a round-robin TCP proxy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from amc.v1 import scheduler_pb2
from control_plane.config import Settings
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, eventually, tap, wait_action
from tests.support.agent import TEST_SETTINGS, running_agent, status_is, submit
from tests.support.fakes.tcp_proxy import TcpProxy
from tests.support.replicas import Replica, farm_with_replicas

HOSTS = 6


def _moves() -> float:
    return REGISTRY.get_sample_value("amc_agent_stream_moves_total") or 0.0


async def _attempts(farm: Farm, task_id: str) -> list[tuple[str, str | None]]:
    assert farm.db is not None
    rows = await farm.db.fetch(
        "SELECT host_id, outcome FROM attempts WHERE task_id = $1 ORDER BY attempt", task_id
    )
    return [(r["host_id"], r["outcome"]) for r in rows]


async def test_a_host_moves_its_renewal_stream_when_its_connection_ages_and_keeps_its_lease(
    database_url: str,
) -> None:
    """THEN with connections aged out every ~1.5 s, the agent's renewal stream moves to a
    new connection again and again, and a task running 6 s across the moves keeps its one
    lease: it ends done, one attempt, every action run once; the host is still connected."""
    farm = Farm(database_url, Settings(max_connection_age=timedelta(seconds=1.5)))
    await farm.start()
    try:
        source = SimulatedSource(1, delay=0.05)
        serial = source.serials[0]
        client = await farm.client()
        before = _moves()
        async with running_agent(farm, source):
            task_id = await submit(client, actions_spec(tap(1, 1), wait_action(6), tap(2, 2)))
            await status_is(farm, task_id, "done", within=30)
            moved = _moves() - before
            assert farm.db is not None
            connected = await farm.db.fetchval(
                "SELECT replica_id IS NOT NULL FROM hosts WHERE host_id = $1", TEST_SETTINGS.host_id
            )
        assert moved >= 2, f"the renewal stream moved {moved} times in 6 s"
        assert await _attempts(farm, task_id) == [(TEST_SETTINGS.host_id, "done")]
        taps = [r.args for r in source.actions_for(serial) if r.action == "tap"]
        assert [(a["x"], a["y"]) for a in taps] == [(1, 1), (2, 2)]
        assert connected
    finally:
        await farm.stop()


@pytest.fixture
async def two_replicas(
    database_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Farm, list[Replica]]]:
    """Two replica processes that age connections out after 2 s, and an in-process one for
    tokens and database reads (it serves no host)."""
    async with farm_with_replicas(database_url, tmp_path, max_connection_age=2) as both:
        yield both


async def test_hosts_spread_over_the_replicas_again_when_the_balancer_has_two(
    two_replicas: tuple[Farm, list[Replica]],
) -> None:
    """THEN hosts that all reached one replica (the other was away) spread over both within
    a few connection ages once the balancer has both again; a task running through the
    moves ends done with its one attempt."""
    farm, (first, second) = two_replicas
    assert farm.db is not None
    async with AsyncExitStack() as stack:
        proxy = await stack.enter_async_context(TcpProxy("127.0.0.1", first.port))
        sources = [SimulatedSource(1, delay=0.05) for _ in range(HOSTS)]
        for i, source in enumerate(sources):
            await stack.enter_async_context(
                running_agent(farm, source, address=proxy.address, host_id=f"h{i}")
            )

        async def held_by() -> dict[str, int]:
            rows = await farm.db.fetch(  # type: ignore[union-attr]
                "SELECT replica_id, count(*) AS n FROM hosts WHERE replica_id IS NOT NULL "
                "AND host_id LIKE 'h%' GROUP BY replica_id"
            )
            return {r["replica_id"]: r["n"] for r in rows}

        async def all_on_one() -> str | None:
            held = await held_by()
            return next(iter(held)) if len(held) == 1 and sum(held.values()) == HOSTS else None

        on_first = await eventually(all_on_one, timeout=30, what="every host on the one replica")
        client = await farm.client()
        task_id = await submit(client, actions_spec(tap(1, 1), wait_action(6), tap(2, 2)))

        proxy.balance(("127.0.0.1", first.port), ("127.0.0.1", second.port))

        async def spread() -> dict[str, int] | None:
            held = await held_by()
            return held if len(held) == 2 and min(held.values()) >= 2 else None

        held = await eventually(spread, timeout=30, interval=0.2, what="hosts on both replicas")
        assert on_first in held
        await status_is(farm, task_id, "done", within=30)
        ((host, outcome),) = await _attempts(farm, task_id)
        assert outcome == "done" and host.startswith("h")


async def test_a_watched_host_moves_its_stream_once_its_screen_call_has_closed(
    database_url: str,
) -> None:
    """THEN while a viewer watches one of its phones, the host's renewal stream stays with
    its screen call on the aged connection (the viewer's frames keep coming, seq rising, the
    watch never told to start again); once nobody watches and the call closes after its
    linger, the stream moves."""
    farm = Farm(database_url, Settings(max_connection_age=timedelta(seconds=1)))
    await farm.start()
    try:
        operator = await farm.operator()
        source = SimulatedSource(1, delay=0.01)
        before = _moves()
        async with running_agent(farm, source, screen_linger=0.5) as agent:
            call = operator.scheduler.WatchScreen(
                scheduler_pb2.WatchScreenRequest(
                    host_id=TEST_SETTINGS.host_id, serial=source.serials[0], max_fps=10
                )
            )
            began = time.monotonic()
            seqs = []
            while time.monotonic() - began < 4:  # four connection ages
                frame = await asyncio.wait_for(call.read(), 10)
                assert frame is not grpc.aio.EOF, "the watch ended"
                seqs.append(frame.seq)
            assert seqs == sorted(seqs) and len(seqs) >= 10
            assert _moves() == before, "the stream moved while its screen call was open"
            call.cancel()
            await eventually(lambda: _moves() > before, timeout=15, what="the stream to move")
            assert agent.screens is not None and not agent.screens.calling
    finally:
        await farm.stop()
