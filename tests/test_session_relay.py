"""Interactive sessions across replicas (issue 23): a session whose client is connected to
one control-plane process and whose host's SessionActions call reached another is relayed
between them; a replica that dies ends the session as the spec says."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import grpc
import pytest

from amc.v1 import admin_pb2_grpc, lease_pb2, lease_pb2_grpc, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel, write_unless_ended
from control_plane.config import Settings
from control_plane.domain import Role
from control_plane.session_hosts import RELAYED_BY
from host_agent.simulated import SimulatedSource
from tests.support import Clients, Farm, tap, wait_action
from tests.support.agent import cancel, running_agent, status_is
from tests.support.replicas import Replica
from tests.test_replicas import host_on
from tests.test_sessions import PNG_MAGIC, act, dispatched, last_task, opening

OK = task_pb2.STEP_STATUS_OK


@pytest.fixture
async def replicas(
    database_url: str, tmp_path: Any
) -> AsyncIterator[tuple[Farm, Replica, Replica]]:
    """An in-process replica for tokens and database reads, plus two replica processes:
    the client's and the host's."""
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


async def client_at(farm: Farm, replica: Replica) -> Clients:
    channel = aio_channel(replica.address, await farm.token(Role.CLIENT))
    farm._channels.append(channel)
    return Clients(
        channel,
        scheduler_pb2_grpc.SchedulerStub(channel),
        lease_pb2_grpc.LeaseStub(channel),
        admin_pb2_grpc.AdminStub(channel),
    )


async def relay_address(farm: Farm, task_id: str) -> str:
    """The address recorded for the replica holding the session's client call."""
    assert farm.db is not None
    address = await farm.db.fetchval(
        "SELECT r.address FROM session_relays s JOIN replicas r USING (replica_id)"
        " WHERE s.task_id = $1",
        task_id,
    )
    return str(address)


async def error_of(farm: Farm, task_id: str) -> str:
    assert farm.db is not None
    return str(await farm.db.fetchval("SELECT error FROM tasks WHERE task_id = $1", task_id))


async def test_a_session_whose_host_reached_another_replica_is_relayed_to_its_client(
    replicas: tuple[Farm, Replica, Replica],
) -> None:
    """THEN actions and observations cross between the two processes, every step is in
    the task's history, and closing the stream ends the task done."""
    farm, client_side, host_side = replicas
    client = await client_at(farm, client_side)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), address=host_side.address):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        assert await relay_address(farm, task.task_id) == client_side.address
        await call.write(act(tap(100, 200), screenshot=True, ui_dump=True))
        answer = (await asyncio.wait_for(call.read(), 20)).step
        assert answer.step.status == OK and answer.step.name == "tap"
        assert answer.screenshot_png.startswith(PNG_MAGIC)
        assert "<hierarchy" in answer.ui_dump_xml
        for i in range(1, 20):
            await call.write(act(tap(i, i)))
            step = (await asyncio.wait_for(call.read(), 20)).step.step
            assert (step.index, step.status) == (i, OK)
        await call.done_writing()
        final = await last_task(call)
    assert final.status == task_pb2.TASK_STATUS_DONE
    assert [s.index for s in final.result.steps] == list(range(20))
    assert await farm.status(task.task_id) == "done"


async def test_a_relayed_session_cancelled_mid_action_ends_cancelled(
    replicas: tuple[Farm, Replica, Replica],
) -> None:
    """THEN the cancel reaches the host on the other replica, its running wait stops, and
    the task ends cancelled."""
    farm, client_side, host_side = replicas
    client = await client_at(farm, client_side)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), address=host_side.address):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        await call.write(act(wait_action(30)))
        await status_is(farm, task.task_id, "dispatched")
        await cancel(client, task.task_id)
        step = (await asyncio.wait_for(call.read(), 20)).step.step
        assert step.status == task_pb2.STEP_STATUS_CANCELLED
        final = await last_task(call)
    assert final.status == task_pb2.TASK_STATUS_CANCELLED


async def test_the_death_of_the_clients_replica_ends_a_relayed_session_failed(
    replicas: tuple[Farm, Replica, Replica],
) -> None:
    """THEN the host's relay is lost, the host reports the session failed (not cancelled:
    nobody asked), saying so, and the phone is free again."""
    farm, client_side, host_side = replicas
    client = await client_at(farm, client_side)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), address=host_side.address):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        await call.write(act(tap()))
        assert (await asyncio.wait_for(call.read(), 20)).step.step.status == OK
        client_side.kill()
        with pytest.raises(grpc.aio.AioRpcError):
            await asyncio.wait_for(call.read(), 20)
        await status_is(farm, task.task_id, "failed", within=30)
    assert "session relay lost" in await error_of(farm, task.task_id)
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM devices WHERE task_id IS NOT NULL") == 0


async def test_the_death_of_the_hosts_replica_ends_a_relayed_session_failed(
    replicas: tuple[Farm, Replica, Replica],
) -> None:
    """THEN the client's stream ends with the task failed once the host, reconnected to
    the restarted replica, reports the relay lost (or, should its report give up first,
    once the sweep finds its lease expired): never cancelled, never done."""
    farm, client_side, host_side = replicas
    client = await client_at(farm, client_side)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), address=host_side.address):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        host_side.kill()
        await host_side.start()
        while (response := await asyncio.wait_for(call.read(), 60)).HasField("step"):
            pass
        final = response.task
    assert final.status == task_pb2.TASK_STATUS_FAILED
    # The host's report once the replica is back; on a slow machine its report may give up
    # first, and the sweep fails the task when the lease runs out.
    assert final.result.error.startswith(("session relay lost", "lease expired")), final.result
    assert await farm.status(task.task_id) == "failed"


async def test_a_relayed_join_whose_client_left_is_refused_and_never_relayed_again(
    replicas: tuple[Farm, Replica, Replica],
) -> None:
    """THEN a SessionActions call that names the session's live lease but carries the
    relayed-by mark, on a replica where the client is not, is UNAVAILABLE (no loop)."""
    farm, client_side, host_side = replicas
    client = await client_at(farm, client_side)
    host = await host_on(farm, host_side, "h1", "s1")
    call = client.scheduler.OpenSession()
    await call.write(opening())
    queued = (await asyncio.wait_for(call.read(), 20)).task
    a = await host.acquire_one("s1")
    assert a.task_id == queued.task_id
    joining = host.c.lease.SessionActions(metadata=((RELAYED_BY, "elsewhere"),))
    await joining.write(
        lease_pb2.SessionActionsRequest(
            join=lease_pb2.SessionJoin(task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id)
        )
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(joining.read(), 20)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no longer connected" in (caught.value.details() or "")
    call.cancel()


async def test_a_relayed_client_that_vanishes_mid_wait_stops_it_at_once(
    replicas: tuple[Farm, Replica, Replica],
) -> None:
    """THEN the client's replica tells the host's, and the host stops the 30-second wait
    at once: the task is failed, "session abandoned" (not "session relay lost: INTERNAL"),
    within a few seconds, and the phone is free."""
    farm, client_side, host_side = replicas
    client = await client_at(farm, client_side)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), address=host_side.address):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        await call.write(act(wait_action(30)))
        # The wait under way: a client leaving before it began ends the same way.
        await asyncio.sleep(0.5)
        started = asyncio.get_running_loop().time()
        call.cancel()
        await status_is(farm, task.task_id, "failed", within=20)
        took = asyncio.get_running_loop().time() - started
    assert took < 5, f"the phone was held {took:.1f}s"
    assert await error_of(farm, task.task_id) == "session abandoned"
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM devices WHERE task_id IS NOT NULL") == 0


async def test_a_relayed_session_cancelled_while_idle_answers_the_next_action_with_its_end(
    replicas: tuple[Farm, Replica, Replica],
) -> None:
    """THEN an operator's cancel of an idle relayed session reaches its client as the
    finished task (cancelled, with the cancel's reason) when it next acts, and the stream
    ends OK."""
    farm, client_side, host_side = replicas
    client = await client_at(farm, client_side)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), address=host_side.address):
        call = client.scheduler.OpenSession()
        await call.write(opening(idle=30))
        task = await dispatched(call)
        await cancel(client, task.task_id)
        await status_is(farm, task.task_id, "cancelled")
        assert await write_unless_ended(call, act(tap()))
        final = await last_task(call)
    assert final.status == task_pb2.TASK_STATUS_CANCELLED
    assert final.cancel_reason == "test"
