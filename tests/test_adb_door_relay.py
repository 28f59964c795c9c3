"""adb doors across control-plane replicas (processes on one database): the door's calls
meet on the replica holding its session's client call, whichever replica they reached, and
a replica that dies takes the door down with its session."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import adb_pb2, scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from control_plane.config import Settings
from control_plane.domain import Role
from host_agent.adb import AdbSource
from host_agent.simulated import SimulatedSource
from tests.support import Farm, seconds
from tests.support.agent import running_agent, status_is
from tests.support.doors import connected, door, offline, user_key
from tests.support.fakes.adbd import FakeAdbd
from tests.support.fakes.phone import FakePhone
from tests.support.fakes.real_adb import RealAdbServer
from tests.support.replicas import Replica
from tests.test_session_relay import relay_address


@pytest.fixture
async def replicas(
    database_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Farm, Replica, Replica]]:
    """An in-process replica for tokens and database reads, and two replica processes:
    the door's (its session's) and the host's."""
    farm = Farm(database_url, Settings(lease_ttl=timedelta(seconds=15)))
    await farm.start()
    pair = [Replica(database_url, log=tmp_path / f"replica{i}.log") for i in range(2)]
    try:
        await asyncio.gather(*(r.start() for r in pair))
        yield farm, pair[0], pair[1]
    finally:
        for r in pair:
            r.stop()
        await farm.stop()


@pytest.fixture
async def user_adb(tmp_path: Path) -> AsyncIterator[RealAdbServer]:
    async with RealAdbServer(tmp_path / "user-adb") as server:
        yield server


async def test_a_door_whose_host_reached_another_replica_carries_adb_to_the_phone(
    replicas: tuple[Farm, Replica, Replica], user_adb: RealAdbServer, tmp_path: Path
) -> None:
    """THEN the host's door call is relayed to the door's replica: shell and a push reach
    the fake phone through the host's adb server, and stopping the door ends it done."""
    farm, door_side, host_side = replicas
    token = await farm.token(Role.CLIENT)
    fake = FakePhone("FAKE0001")
    data = os.urandom(1024 * 1024)
    (tmp_path / "one.bin").write_bytes(data)
    async with FakeAdbd(fake) as adbd, RealAdbServer(tmp_path / "host-adb") as host_adb:
        await host_adb.connect(adbd.address)
        source = AdbSource(port=host_adb.port)
        async with running_agent(farm, source, address=host_side.address):
            args = ("--adb-key", str(user_key(user_adb)))
            async with door(door_side.address, token, *args) as d:
                await connected(user_adb, d.address)
                assert await user_adb.shell(d.address, "echo relayed") == b"relayed\n"
                await user_adb.adb("-s", d.address, "push", str(tmp_path / "one.bin"), "/sdcard/o")
                task_id = await _only_task(farm)
                assert await relay_address(farm, task_id) == door_side.address
                assert await d.stop() == 0
            assert await status_is(farm, task_id, "done") == "done"
    assert fake.files["/sdcard/o"] == data


async def test_a_doors_call_on_another_replica_is_relayed_to_its_session(
    replicas: tuple[Farm, Replica, Replica],
) -> None:
    """THEN a door opened on the replica that does not hold the session reaches it: a shell
    stream runs on the phone; another token's is PERMISSION_DENIED there."""
    farm, session_side, other_side = replicas
    token = await farm.token(Role.CLIENT)
    async with running_agent(farm, SimulatedSource(1), address=session_side.address):
        session = _doors(farm, session_side, token).OpenSession()
        await session.write(_opening())
        task_id = await _dispatched(session)
        call = _doors(farm, other_side, token).AdbStreams()
        await call.write(adb_pb2.AdbStreamsRequest(open=adb_pb2.AdbDoorOpen(task_id=task_id)))
        first = await asyncio.wait_for(call.read(), 20)
        assert first.phone.model == "Simulated"
        frame = adb_pb2.AdbFrame(stream=1, open="shell:echo across")
        await call.write(adb_pb2.AdbStreamsRequest(frame=frame))
        got = await _stream_output(call)
        assert got == b"across\n"
        stranger = _doors(farm, other_side, await farm.token(Role.CLIENT)).AdbStreams()
        await stranger.write(adb_pb2.AdbStreamsRequest(open=adb_pb2.AdbDoorOpen(task_id=task_id)))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await asyncio.wait_for(stranger.read(), 20)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        call.cancel()
        await session.done_writing()


async def test_the_death_of_the_doors_replica_takes_its_phone_offline(
    replicas: tuple[Farm, Replica, Replica], user_adb: RealAdbServer
) -> None:
    """THEN the door's adb client sees the phone go offline, the door exits saying the
    session ended, and the host reports the session failed (its relay lost)."""
    farm, door_side, host_side = replicas
    token = await farm.token(Role.CLIENT)
    async with running_agent(farm, SimulatedSource(1), address=host_side.address):
        args = ("--adb-key", str(user_key(user_adb)))
        async with door(door_side.address, token, *args) as d:
            await connected(user_adb, d.address)
            task_id = await _only_task(farm)
            door_side.kill()
            await offline(user_adb, d.address)
            assert await d.wait() != 0
        await status_is(farm, task_id, "failed", within=30)
    assert farm.db is not None
    error = await farm.db.fetchval("SELECT error FROM tasks WHERE task_id = $1", task_id)
    assert "session relay lost" in error


def _opening() -> scheduler_pb2.OpenSessionRequest:
    return scheduler_pb2.OpenSessionRequest(
        open=scheduler_pb2.SessionOpen(idle_timeout=seconds(30), adb=True)
    )


async def _dispatched(call: Any) -> str:
    while True:
        response = await asyncio.wait_for(call.read(), 20)
        if response.task.status == task_pb2.TASK_STATUS_DISPATCHED:
            return str(response.task.task_id)


def _doors(farm: Farm, replica: Replica, token: str) -> scheduler_pb2_grpc.SchedulerStub:
    channel = aio_channel(replica.address, token)
    farm._channels.append(channel)
    return scheduler_pb2_grpc.SchedulerStub(channel)


async def _stream_output(call: Any) -> bytes:
    out = b""
    while True:
        response = await asyncio.wait_for(call.read(), 20)
        frame = response.frame
        part = frame.WhichOneof("part")
        if part == "data":
            out += frame.data
            ack = adb_pb2.AdbFrame(stream=frame.stream, ack=len(frame.data))
            await call.write(adb_pb2.AdbStreamsRequest(frame=ack))
        elif part in ("close", "refused"):
            return out


async def _only_task(farm: Farm) -> str:
    assert farm.db is not None
    return str(await farm.db.fetchval("SELECT task_id FROM tasks"))
