"""Live screens are bounded: a token holds at most --max-viewers-per-token watches on a
replica, and a host's renewal stream holds at most one pending screen_wanted push however
many viewers wait for its feed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest

from amc.v1 import lease_pb2, scheduler_pb2
from control_plane.artifacts import PostgresArtifacts
from control_plane.lease_service import LeaseService
from control_plane.renewals import RenewalStream
from host_agent.simulated import SimulatedSource
from tests.conftest import FAST
from tests.support import Farm, eventually
from tests.support.agent import running_agent

HOST, SERIAL = "host-1", "sim-0"


@pytest.fixture
async def farm(database_url: str) -> AsyncIterator[Farm]:
    f = Farm(database_url, replace(FAST, max_viewers_per_token=3))
    await f.start()
    try:
        yield f
    finally:
        await f.stop()


async def test_a_token_watching_its_limit_of_screens_is_refused_one_more(farm: Farm) -> None:
    """GIVEN --max-viewers-per-token 3 THEN a token's fourth watch on the replica is
    refused RESOURCE_EXHAUSTED in one line naming the limit, while its three go on and
    another token may watch; once one of the three closes, the token may watch again."""
    assert farm.plane is not None
    operator, other = await farm.operator(), await farm.operator()
    request = scheduler_pb2.WatchScreenRequest(host_id=HOST, serial=SERIAL)
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        hub = farm.plane.hub
        await eventually(lambda: hub.connected(HOST), what="the host's renewal stream")
        calls = [operator.scheduler.WatchScreen(request) for _ in range(3)]
        for call in calls:
            assert (await asyncio.wait_for(call.read(), 20)).serial == SERIAL
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(operator.scheduler.WatchScreen(request).read(), 20)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        details = caught.value.details() or ""
        assert "--max-viewers-per-token 3" in details and "\n" not in details
        for call in calls:
            assert (await asyncio.wait_for(call.read(), 20)).serial == SERIAL
        elsewhere = other.scheduler.WatchScreen(request)
        assert (await asyncio.wait_for(elsewhere.read(), 20)).serial == SERIAL
        calls.pop().cancel()
        await eventually(lambda: hub.screens.viewers() == 3, what="the closed watch to go")
        again = operator.scheduler.WatchScreen(request)
        assert (await asyncio.wait_for(again.read(), 20)).serial == SERIAL
        for call in [*calls, elsewhere, again]:
            call.cancel()


async def test_a_host_s_stream_holds_one_pending_screen_wanted_however_many_viewers_wait(
    farm: Farm,
) -> None:
    """GIVEN a host's renewal stream on this replica that is not being read (its outbox
    not drained, as when the host reads slowly) and no screen feed WHEN 20 viewers of its
    phone arrive THEN one screen_wanted push waits on the stream, not 20; once it went
    out, the next viewer asks again."""
    assert farm.plane is not None
    plane = farm.plane
    host = await farm.host("host-9", "p-1")
    service = LeaseService(
        plane.auth, plane.store, plane.effects, plane.settings, plane.peers,
        PostgresArtifacts(plane.store),
    )  # fmt: skip
    requests: asyncio.Queue[lease_pb2.RenewLeasesRequest] = asyncio.Queue()

    async def sent() -> AsyncIterator[lease_pb2.RenewLeasesRequest]:
        while True:
            yield await requests.get()

    stream = RenewalStream(service).run(sent())

    async def up_to(seq: int) -> list[Any]:
        """What the stream sends, up to the answer to renewal `seq`."""
        await requests.put(lease_pb2.RenewLeasesRequest(host_id=host.host_id, seq=seq))
        out = []
        while not (response := await asyncio.wait_for(anext(stream), 10)).seq == seq:
            out.append(response)
        return out

    try:
        await up_to(1)
        operator = await farm.operator()
        request = scheduler_pb2.WatchScreenRequest(host_id="host-9", serial="p-1")
        calls = [operator.scheduler.WatchScreen(request) for _ in range(3)]
        other = await farm.operator()
        calls += [other.scheduler.WatchScreen(request) for _ in range(3)]
        more = [await farm.operator() for _ in range(7)]
        calls += [c.scheduler.WatchScreen(request) for c in more for _ in range(2)]
        await eventually(lambda: plane.hub.screens.viewers() == 20, what="20 viewers")
        pushes = await up_to(2)
        assert [p.screen_wanted for p in pushes] == [True]
        calls.append((await farm.operator()).scheduler.WatchScreen(request))
        await eventually(lambda: plane.hub.screens.viewers() == 21, what="one more viewer")
        assert [p.screen_wanted for p in await up_to(3)] == [True]
        for call in calls:
            call.cancel()
    finally:
        await stream.aclose()
