"""How interactive sessions end, through the real API with a real host agent on simulated
phones (or a host played through the Lease service): each end reaches the client as the
finished task, then the stream's OK; a client that vanishes mid-action stops it at once;
the lease is checked by the database's clock and its end ends the relay; a session is
never requeued, never opened twice for one request id, and a token's sessions are
limited."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from datetime import timedelta
from typing import Any

import grpc
import pytest

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_common.channel import write_unless_ended
from control_plane.config import Settings
from host_agent.simulated import SimulatedSource
from tests.support import Farm, HostClient, eventually, seconds, tap, wait_action
from tests.support.agent import SHORT_TTL, get, running_agent, short_ttl_farm, status_is
from tests.test_sessions import act, dispatched, last_task, opening, relay_of

NOWHERE = task_pb2.DeviceSelector(labels={"model": "Nowhere"})
QUEUED = task_pb2.TASK_STATUS_QUEUED


async def device_free(farm: Farm) -> bool:
    assert farm.db is not None
    held = "SELECT count(*) FROM devices WHERE task_id IS NOT NULL"
    return await farm.db.fetchval(held) == 0


async def test_a_client_that_vanishes_mid_wait_stops_it_at_once_and_frees_the_phone(
    farm: Farm,
) -> None:
    """THEN a 30-second wait the client left is stopped at once: within a few seconds the
    task is failed, "session abandoned" (not a lost relay), with the wait as its step, and
    the phone is free."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        relay = relay_of(farm, task.task_id)
        await call.write(act(wait_action(30)))
        await eventually(lambda: relay.sent == 1, what="wait sent")
        started = time.monotonic()
        call.cancel()
        await status_is(farm, task.task_id, "failed", within=20)
        took = time.monotonic() - started
        final = await get(client, task.task_id)
        assert await eventually(lambda: device_free(farm), what="the phone freed")
    assert took < 5, f"the phone was held {took:.1f}s"
    assert final.result.error == "session abandoned"
    assert [s.name for s in final.result.steps] in (["wait"], [])


async def end_by_cancel(farm: Farm, task_id: str) -> None:
    client = await farm.client()
    await client.scheduler.CancelTask(
        scheduler_pb2.CancelTaskRequest(task_id=task_id, reason="operator: phone needed")
    )


@pytest.mark.parametrize(
    ("ends", "status", "error", "cancel_reason"),
    [
        ("cancel", task_pb2.TASK_STATUS_CANCELLED, "cancelled", "operator: phone needed"),
        ("idle", task_pb2.TASK_STATUS_FAILED, "idle timeout", ""),
        ("deadline", task_pb2.TASK_STATUS_FAILED, "deadline exceeded", ""),
    ],
)
async def test_a_session_that_ended_while_idle_answers_the_clients_next_action_with_its_end(
    farm: Farm, ends: str, status: int, error: str, cancel_reason: str
) -> None:
    """THEN a client that acts after its idle session ended (cancelled by an operator,
    idle too long, past its longest duration) writes its action, reads the finished task
    (its status, error and the cancel's reason), and the stream ends OK: never gRPC's
    INTERNAL for a write refused."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = client.scheduler.OpenSession()
        fields: dict[str, Any] = {"max_duration": seconds(1)} if ends == "deadline" else {}
        await call.write(opening(idle=1.0 if ends == "idle" else 30.0, **fields))
        task = await dispatched(call)
        if ends == "cancel":
            await end_by_cancel(farm, task.task_id)
        assert farm.plane is not None
        sessions = farm.plane.hub.sessions
        await eventually(lambda: sessions.get(uuid.UUID(task.task_id)) is None, what="its end")
        assert await write_unless_ended(call, act(tap()))
        final = await last_task(call)
    assert final.status == status
    assert final.result.error.startswith(error), final.result.error
    assert final.cancel_reason == cancel_reason


async def test_a_join_under_a_lease_expired_but_not_swept_is_refused(database_url: str) -> None:
    """THEN a host joining a session under its lease once the lease's time ran out by the
    database's clock (the sweep has not ended it yet) is refused FAILED_PRECONDITION."""
    settings = Settings(sweep_interval=timedelta(hours=1))
    async with short_ttl_farm(database_url, settings) as farm:
        client = await farm.client()
        host = await farm.host("h1", "s1")
        call = client.scheduler.OpenSession()
        await call.write(opening())
        queued = (await asyncio.wait_for(call.read(), 10)).task
        a = await host.acquire_one("s1")
        assert a.task_id == queued.task_id
        await farm.expire_now(a.lease_id)
        joining = await join(host, a)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(joining.read(), 10)
        call.cancel()
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "not the live lease" in (caught.value.details() or "")


async def join(host: HostClient, a: lease_pb2.Assignment) -> Any:
    """A SessionActions call joining `a`'s session."""
    call = host.c.lease.SessionActions()
    request = lease_pb2.SessionActionsRequest(
        join=lease_pb2.SessionJoin(task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id)
    )
    await call.write(request)
    return call


async def test_a_session_whose_lease_the_sweep_ended_ends_its_relay_and_its_stream(
    database_url: str,
) -> None:
    """THEN a host that joined and then stopped renewing loses the lease to the sweep, and
    at once its call ends and the client's stream ends with the task failed, "lease lost:
    it expired" (not after the idle timeout)."""
    async with short_ttl_farm(database_url) as farm:
        client = await farm.client()
        host = await farm.host("h1", "s1")
        call = client.scheduler.OpenSession()
        await call.write(opening(idle=60))
        await asyncio.wait_for(call.read(), 10)
        a = await host.acquire_one("s1")
        await host.renew(a.lease_id)  # acknowledged: dispatched
        joining = await join(host, a)
        await dispatched(call)
        started = time.monotonic()
        final = await last_task(call)
        assert time.monotonic() - started < 20
        assert await asyncio.wait_for(joining.read(), 10) is grpc.aio.EOF
    assert final.status == task_pb2.TASK_STATUS_FAILED
    assert final.result.error == "lease lost: it expired"


async def test_a_session_given_back_as_device_lost_fails_and_is_never_requeued(
    farm: Farm,
) -> None:
    """THEN a host giving a session's lease back because its phone was lost (a give-back
    that other tasks are requeued by, apart from max_attempts) fails the session, "device
    lost: …", with one attempt."""
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2")
    call = client.scheduler.OpenSession()
    await call.write(opening())
    await asyncio.wait_for(call.read(), 10)
    a = await host.acquire_one("s1")
    await host.release(a.lease_id, "s1 unplugged", device_lost=True)
    final = (await get(client, a.task_id)).result
    call.cancel()
    row = await farm.task_row(a.task_id)
    assert row["status"] == "failed" and row["attempt"] == 1
    assert final.error == "device lost: s1 unplugged"
    assert await host.acquire("s1", "s2") == []


async def test_a_session_opened_again_with_its_request_id_never_makes_a_second_task(
    farm: Farm,
) -> None:
    """THEN an opening sent again with the request id of a session still queued is refused
    FAILED_PRECONDITION naming it; once that session ended, the opening is answered with
    its finished task and the stream ends; one task in all."""
    client = await farm.client()
    first = client.scheduler.OpenSession()
    await first.write(opening(selector=NOWHERE, request_id="agent-7/open-1"))
    queued = (await asyncio.wait_for(first.read(), 10)).task
    again = client.scheduler.OpenSession()
    await again.write(opening(selector=NOWHERE, request_id="agent-7/open-1"))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(again.read(), 10)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert queued.task_id in (caught.value.details() or "")
    await first.done_writing()
    assert (await last_task(first)).status == task_pb2.TASK_STATUS_CANCELLED
    late = client.scheduler.OpenSession()
    await late.write(opening(selector=NOWHERE, request_id="agent-7/open-1"))
    answer = (await asyncio.wait_for(late.read(), 10)).task
    assert (answer.task_id, answer.status) == (queued.task_id, task_pb2.TASK_STATUS_CANCELLED)
    assert await asyncio.wait_for(late.read(), 10) is grpc.aio.EOF
    listed = await client.scheduler.ListTasks(scheduler_pb2.ListTasksRequest())
    assert [t.task_id for t in listed.tasks] == [queued.task_id]


async def test_a_token_past_its_session_limit_is_refused_resource_exhausted(
    database_url: str,
) -> None:
    """THEN with --max-sessions-per-token 2, a token's third open session is refused
    RESOURCE_EXHAUSTED in one line and creates nothing; another token still opens one, and
    the first opens again once one of its own ended."""
    async with short_ttl_farm(database_url, replace(SHORT_TTL, max_sessions_per_token=2)) as farm:
        client, other = await farm.client(), await farm.client()
        calls = []
        for _ in range(2):
            calls.append(client.scheduler.OpenSession())
            await calls[-1].write(opening(selector=NOWHERE))
            await asyncio.wait_for(calls[-1].read(), 10)
        third = client.scheduler.OpenSession()
        await third.write(opening(selector=NOWHERE))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(third.read(), 10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "\n" not in (details := caught.value.details() or "")
        assert "--max-sessions-per-token" in details
        assert await farm_tasks(farm) == 2
        theirs = other.scheduler.OpenSession()
        await theirs.write(opening(selector=NOWHERE))
        assert (await asyncio.wait_for(theirs.read(), 10)).task.status == QUEUED
        await calls[0].done_writing()
        await last_task(calls[0])
        fourth = client.scheduler.OpenSession()
        await fourth.write(opening(selector=NOWHERE))
        assert (await asyncio.wait_for(fourth.read(), 10)).task.status == QUEUED
        for c in (calls[1], theirs, fourth):
            c.cancel()


async def farm_tasks(farm: Farm) -> int:
    assert farm.db is not None
    return int(await farm.db.fetchval("SELECT count(*) FROM tasks"))


@pytest.mark.parametrize("ends", ["close", "cancel", "idle"])
async def test_a_sessions_end_is_heard_as_a_change_not_found_by_a_periodic_read(
    database_url: str, ends: str
) -> None:
    """THEN with the periodic re-read out of the test's reach (watch_refresh 10 minutes), a
    session closed by its client, cancelled by an operator or idle too long answers its
    client with the finished task: its end is a change every replica hears, read when it
    comes (also when the session's watch heard it and was stopped before reading it)."""
    settings = Settings(lease_ttl=timedelta(seconds=15), watch_refresh=timedelta(minutes=10))
    async with short_ttl_farm(database_url, settings) as farm:
        client = await farm.client()
        async with running_agent(farm, SimulatedSource(1, delay=0.0)):
            call = client.scheduler.OpenSession()
            await call.write(opening(idle=1.0 if ends == "idle" else 30.0))
            task = await dispatched(call)
            await call.write(act(tap(1, 2)))
            assert (await asyncio.wait_for(call.read(), 20)).HasField("step")
            if ends == "close":
                await call.write(
                    scheduler_pb2.OpenSessionRequest(close=scheduler_pb2.SessionClose())
                )
            elif ends == "cancel":
                await end_by_cancel(farm, task.task_id)
            final = await last_task(call)
    expected = {
        "close": task_pb2.TASK_STATUS_DONE,
        "cancel": task_pb2.TASK_STATUS_CANCELLED,
        "idle": task_pb2.TASK_STATUS_FAILED,
    }
    assert (final.task_id, final.status) == (task.task_id, expected[ends])
