"""A running attempt's phone log across replica processes: a reader on a replica other than
the one holding its host's calls is served by a relay made as the replica (its proof, not
the reader's token), filtered where the reader reads; the reader is authorized on its own
replica."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc
from amc_common import logcat
from amc_common.channel import aio_channel
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, eventually, tap, wait_action
from tests.support.agent import running_agent, status_is, submit
from tests.support.replicas import Replica, farm_with_replicas
from tests.test_phone_logs import launch


def stub(farm: Farm, replica: Replica, token: str) -> scheduler_pb2_grpc.SchedulerStub:
    channel = aio_channel(replica.address, token)
    farm._channels.append(channel)
    return scheduler_pb2_grpc.SchedulerStub(channel)


async def followed(reader: scheduler_pb2_grpc.SchedulerStub, **fields: Any) -> Any:
    """The first follow whose first message comes, while the host's replica is not yet
    known as its host's (FAILED_PRECONDITION until its presence is written)."""

    async def attempt() -> Any:
        call = reader.StreamLogs(scheduler_pb2.StreamLogsRequest(follow=True, **fields))
        try:
            first = await call.read()
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            return None
        return call, first

    return await eventually(attempt, timeout=20, what="a relayed log")


async def test_a_client_follows_its_tasks_log_from_another_replica_through_a_relay(
    database_url: str, tmp_path: Path
) -> None:
    """GIVEN the phone's host on replica B WHEN its task's submitter follows the task's log
    from replica A, priority I and above THEN it gets the lines so far and a tap done while
    it follows, only I and above (and the marks), and the call ends OK with the attempt;
    the relay is made as the replica (B saw no PERMISSION_DENIED); another team's client
    is refused on A."""
    async with farm_with_replicas(database_url, tmp_path) as (farm, (near, far)):
        token = await farm.token(Role.CLIENT)
        client = farm.clients(token)
        source = SimulatedSource(1)
        async with running_agent(farm, source, address=far.address):
            spec = actions_spec(launch(), wait_action(4), tap(321, 654), wait_action(1))
            task_id = await submit(client, spec)
            await status_is(farm, task_id, "dispatched")
            call, first = await followed(stub(farm, near, token), task_id=task_id, min_level="I")
            seen = list(first.lines)
            while (message := await call.read()) is not grpc.aio.EOF:
                seen += message.lines
            await status_is(farm, task_id, "done")
        entries = [e for x in seen if (e := logcat.parse(x))]
        assert any(e.message == "step 1 'launch_app' began" for e in entries)
        assert any(e.message == "step 3 'tap' began" for e in entries)  # while it followed
        assert any(e.message == "step 4 'wait' began" for e in entries)
        assert {e.level for e in entries} <= {"I", "W", "E", "F"}  # the taps' D lines left
        assert not any("(x=321.0, y=654.0)" in x for x in seen)
        stranger = stub(farm, near, await farm.token(Role.CLIENT))
        request = scheduler_pb2.StreamLogsRequest(task_id=task_id)
        refused = stranger.StreamLogs(request)
        try:
            await refused.read()
        except grpc.aio.AioRpcError as exc:
            assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
        else:
            raise AssertionError("another team's client read the log")
    near_log = (tmp_path / "replica0.log").read_text()
    far_log = (tmp_path / "replica1.log").read_text()
    assert "log relayed" in near_log and "PERMISSION_DENIED" not in far_log
    assert "log followed" in far_log
