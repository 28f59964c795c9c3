"""Live screens across replica processes: a viewer on a replica other than the one holding
the phone's host is served by a relay made as the replica (its proof, not a viewer's
token); viewers are authorized on their own replica; a token never passes as a replica."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc
from amc_common.channel import aio_channel
from control_plane.domain import Role
from host_agent import metrics as agent_metrics
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, eventually, tap, wait_action
from tests.support.agent import running_agent, status_is, submit
from tests.support.replicas import Replica, farm_with_replicas

HOST, SERIAL = "host-1", "sim-0"


def stub(farm: Farm, replica: Replica, token: str) -> scheduler_pb2_grpc.SchedulerStub:
    channel = aio_channel(replica.address, token)
    farm._channels.append(channel)
    return scheduler_pb2_grpc.SchedulerStub(channel)


async def first_frame(call: Any, within: float = 20.0) -> scheduler_pb2.ScreenFrame:
    frame = await asyncio.wait_for(call.read(), within)
    assert frame is not grpc.aio.EOF
    return frame  # type: ignore[no-any-return]


async def frames_go_on(call: Any, count: int = 4) -> list[int]:
    """`count` more frames, their seqs rising."""
    seqs = [(await first_frame(call, 10)).seq for _ in range(count)]
    assert seqs == sorted(seqs) and len(set(seqs)) == count
    return seqs


async def watch_from(replica_stub: Any, **fields: Any) -> Any:
    """The first call that gets a frame, while the host's replica is not yet known as
    its host's (FAILED_PRECONDITION until its presence is written)."""

    async def attempt() -> Any:
        call = replica_stub.WatchScreen(scheduler_pb2.WatchScreenRequest(**fields))
        try:
            await first_frame(call, 10)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            return None
        return call

    return await eventually(attempt, timeout=20, what="a relayed frame")


async def test_a_client_watching_its_task_from_another_replica_gets_frames_operators_keep_theirs(
    database_url: str, tmp_path: Path
) -> None:
    """GIVEN the phone's host on replica B WHEN a client watches its own running task from
    replica A THEN it gets the phone's frames (the relay from A to B is made as a replica,
    not with the client's token, which B would refuse a device watch); operators watching
    the phone on A (through the same relay) and on B go on getting frames after the client
    left."""
    async with farm_with_replicas(database_url, tmp_path) as (farm, (near, far)):
        client_token = await farm.token(Role.CLIENT)
        operator_token = await farm.token(Role.OPERATOR)
        client = farm.clients(client_token)
        async with running_agent(farm, SimulatedSource(1, delay=0.01), address=far.address):
            task_id = await submit(client, actions_spec(wait_action(60), tap()))
            await status_is(farm, task_id, "dispatched")
            viewer = await watch_from(stub(farm, near, client_token), task_id=task_id)
            frame = await first_frame(viewer)
            assert (frame.host_id, frame.serial) == (HOST, SERIAL)
            await frames_go_on(viewer)
            by_device = {"host_id": HOST, "serial": SERIAL}
            near_operator = stub(farm, near, operator_token).WatchScreen(
                scheduler_pb2.WatchScreenRequest(**by_device)
            )
            far_operator = stub(farm, far, operator_token).WatchScreen(
                scheduler_pb2.WatchScreenRequest(**by_device)
            )
            await frames_go_on(near_operator)
            await frames_go_on(far_operator)
            viewer.cancel()
            await asyncio.sleep(0.5)  # the client's watch is gone on both replicas
            await frames_go_on(near_operator, 8)
            await frames_go_on(far_operator, 8)
            near_operator.cancel()
            far_operator.cancel()
            await client.scheduler.CancelTask(
                scheduler_pb2.CancelTaskRequest(task_id=task_id, reason="test over")
            )
            await status_is(farm, task_id, "cancelled")
            assert [a["state"] for a in await farm.attempts(task_id)] == ["cancelled"]
    relayed = (tmp_path / "replica0.log").read_text()
    assert "screen relayed" in relayed and "PERMISSION_DENIED" not in relayed


async def test_a_token_never_passes_as_a_replica(farm: Farm) -> None:
    """THEN a device watch by a client token with a relayed mark is refused (operators
    only); a made-up replica proof is UNAUTHENTICATED; the farm's own proof on any other
    method is PERMISSION_DENIED; the proof works on WatchScreen (what relays call)."""
    assert farm.db is not None and farm.plane is not None
    client = await farm.client()
    by_device = scheduler_pb2.WatchScreenRequest(host_id=HOST, serial=SERIAL)
    marked = client.scheduler.WatchScreen(
        by_device, metadata=[("amc-screen-relayed-by", farm.plane.hub.replica)]
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await first_frame(marked)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    secret = bytes(await farm.db.fetchval("SELECT secret FROM replica_secret")).hex()
    bare = grpc.aio.insecure_channel(farm.address)
    try:
        scheduler = scheduler_pb2_grpc.SchedulerStub(bare)
        forged = scheduler.WatchScreen(
            by_device, metadata=[("authorization", f"Replica {'0' * len(secret)}")]
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await first_frame(forged)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        proof = [("authorization", f"Replica {secret}")]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await scheduler.ListTasks(scheduler_pb2.ListTasksRequest(), metadata=proof)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "relayed screens and logs only" in (caught.value.details() or "")
        # The farm's proof may watch by device (the phone is unknown here: NOT_FOUND).
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await first_frame(scheduler.WatchScreen(by_device, metadata=proof))
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await bare.close()


async def test_a_relay_asks_the_rate_its_phones_viewers_want_as_they_come_and_go(
    database_url: str, tmp_path: Path
) -> None:
    """GIVEN the phone's host on replica B and a thumbnail of it watched on A (its relay at
    a thumbnail's rate) WHEN a live viewer on A joins THEN its frames come at a live rate
    (the relay was opened again at its rate) WHEN it leaves THEN the host goes back to a
    thumbnail's captures."""
    async with farm_with_replicas(database_url, tmp_path) as (farm, (near, far)):
        token = await farm.token(Role.OPERATOR)
        async with running_agent(farm, SimulatedSource(1, delay=0.01), address=far.address):
            thumb = await watch_from(
                stub(farm, near, token), host_id=HOST, serial=SERIAL, thumbnail=True
            )
            live = stub(farm, near, token).WatchScreen(
                scheduler_pb2.WatchScreenRequest(host_id=HOST, serial=SERIAL, max_fps=10)
            )
            await first_frame(live)
            started = asyncio.get_running_loop().time()
            seqs = await frames_go_on(live, 10)
            # Ten frames within a couple of seconds: not a thumbnail's one per 3 s.
            assert asyncio.get_running_loop().time() - started < 3.0, seqs
            live.cancel()
            await asyncio.sleep(1.0)  # the relay opened again at a thumbnail's rate
            captured = agent_metrics.SCREEN_CAPTURES._value.get()
            await asyncio.sleep(6.5)
            assert agent_metrics.SCREEN_CAPTURES._value.get() - captured <= 3
            assert (await first_frame(thumb, 10)).serial == SERIAL
            thumb.cancel()
