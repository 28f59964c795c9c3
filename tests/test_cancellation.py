"""The task-cancellation spec (spec/004), through the real control plane."""

import asyncio

import asyncpg
import grpc
import pytest

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from tests.support import Farm, actions_spec, eventually, tap

CANCELLED = task_pb2.TASK_STATUS_CANCELLED


async def submit(farm: Farm, client, **kw) -> task_pb2.Task:  # type: ignore[no-untyped-def]
    return await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap(), tap()), **kw)
    )


async def cancel(client, task_id: str, reason: str = "") -> task_pb2.Task:  # type: ignore[no-untyped-def]
    return await client.scheduler.CancelTask(
        scheduler_pb2.CancelTaskRequest(task_id=task_id, reason=reason)
    )


async def dispatched(farm: Farm, client, host, serial: str = "s1"):  # type: ignore[no-untyped-def]
    task = await submit(farm, client)
    a = await host.acquire_one(serial)
    (state,) = await host.renew(a.lease_id)
    assert state.result == lease_pb2.RENEWAL_RESULT_RENEWED
    assert await farm.status(task.task_id) == "dispatched"
    return task, a


async def test_cancel_a_task_that_has_not_been_assigned(farm: Farm) -> None:
    """THEN the status becomes cancelled in the same request and no assignment or lease is
    ever created for it."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task = await submit(farm, client)
    reply = await cancel(client, task.task_id, "not needed")
    assert reply.status == CANCELLED
    assert reply.cancel_reason == "not needed"
    assert await farm.status(task.task_id) == "cancelled"
    assert await host.acquire("s1", wait=0.2) == []
    assert await farm.attempts(task.task_id) == []
    assert await farm.device_holder("h1", "s1") is None


async def test_cancel_a_task_that_has_not_been_assigned_while_an_acquire_races_it(
    farm: Farm,
) -> None:
    """Either the cancel wins (cancelled, no attempt, no lease) or the acquire does (the
    cancel becomes a request on attempt 1); never a lease on a cancelled task."""
    client = await farm.client()
    host = await farm.host("h1", *[f"s{i}" for i in range(10)])
    for _ in range(10):
        task = await submit(farm, client)
        reply, found = await asyncio.gather(
            cancel(client, task.task_id), host.acquire(*[f"s{i}" for i in range(10)], wait=0)
        )
        attempts = await farm.attempts(task.task_id)
        if reply.status == CANCELLED:
            assert attempts == [] and found == []
        else:
            assert [a.task_id for a in found] == [task.task_id]
            assert len(attempts) == 1 and attempts[0]["cancel_requested_at"] is not None
            await host.report(found[0], lease_pb2.OUTCOME_CANCELLED)
        assert await farm.status(task.task_id) == "cancelled"


async def test_cancel_a_task_currently_executing_on_a_host(farm: Farm) -> None:
    """THEN the request is recorded against the current attempt, the status stays
    dispatched until the host reports, and the request survives a control-plane restart."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task, a = await dispatched(farm, client, host)
    reply = await cancel(client, task.task_id, "operator said so")
    assert reply.status == task_pb2.TASK_STATUS_DISPATCHED
    assert reply.HasField("cancel_requested_at")
    (attempt,) = await farm.attempts(task.task_id)
    assert attempt["cancel_requested_at"] is not None
    await farm.restart()
    host = await farm.host("h1")
    (state,) = await host.renew(a.lease_id)
    assert state.result == lease_pb2.RENEWAL_RESULT_RENEWED and state.cancel_pending
    assert await farm.status(task.task_id) == "dispatched"


async def test_owning_host_observes_the_pending_cancellation_at_lease_renewal(farm: Farm) -> None:
    """THEN the renewal response signals the pending cancellation."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task, a = await dispatched(farm, client, host)
    (before,) = await host.renew(a.lease_id)
    assert not before.cancel_pending
    await cancel(client, task.task_id)
    (after,) = await host.renew(a.lease_id)
    assert after.cancel_pending and after.result == lease_pb2.RENEWAL_RESULT_RENEWED


async def test_cancel_is_pushed_on_the_open_renewal_stream_without_waiting_for_a_renewal(
    farm: Farm,
) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task, a = await dispatched(farm, client, host)
    stream = host.stream()
    await stream.renew(a.lease_id)
    await cancel(client, task.task_id)
    push = await eventually(lambda: stream.pushes, what="a pushed cancellation")
    assert [(s.lease_id, s.cancel_pending) for s in push[0].leases] == [(a.lease_id, True)]
    await stream.close()


async def test_cancellation_is_not_instantaneous(farm: Farm) -> None:
    """THEN the task need not be cancelled before the host's next renewal cycle completes:
    it stays dispatched until the host reports."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task, a = await dispatched(farm, client, host)
    await cancel(client, task.task_id)
    assert await farm.status(task.task_id) == "dispatched"
    await host.renew(a.lease_id)
    assert await farm.status(task.task_id) == "dispatched"
    reported = await host.report(a, lease_pb2.OUTCOME_CANCELLED)
    assert reported.status == CANCELLED


async def test_execution_stops_due_to_a_cancellation_request_is_recorded_as_cancelled(
    farm: Farm,
) -> None:
    """THEN the control plane marks the task cancelled and releases its device."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task, a = await dispatched(farm, client, host)
    await cancel(client, task.task_id)
    reported = await host.report(a, lease_pb2.OUTCOME_CANCELLED, error="stopped before step 2")
    assert reported.status == CANCELLED
    assert await farm.device_holder("h1", "s1") is None
    assert (await farm.attempts(task.task_id))[0]["state"] == "cancelled"


async def test_cancel_a_task_twice(farm: Farm) -> None:
    """THEN the same successful response as the first, without a duplicate record."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task, _ = await dispatched(farm, client, host)
    first = await cancel(client, task.task_id, "first")
    second = await cancel(client, task.task_id, "second")
    assert first == second
    events = [e["kind"] for e in await farm.events(task.task_id)]
    assert events.count("cancel_requested") == 1
    assert (await farm.task_row(task.task_id))["cancel_reason"] == "first"


async def test_cancel_an_already_cancelled_task(farm: Farm) -> None:
    """THEN success reflecting the cancelled status, without error."""
    client = await farm.client()
    task = await submit(farm, client)
    await cancel(client, task.task_id)
    before = await farm.snapshot()
    again = await cancel(client, task.task_id)
    assert again.status == CANCELLED
    assert await farm.snapshot() == before


async def test_cancel_a_completed_task(farm: Farm) -> None:
    """THEN a conflict error, and the task's status and result remain unchanged."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task, a = await dispatched(farm, client, host)
    await host.report(a, lease_pb2.OUTCOME_DONE)
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await cancel(client, task.task_id)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "already done" in (err.value.details() or "")
    assert await farm.snapshot() == before


async def test_cancel_a_failed_task_is_refused_and_changes_nothing(farm: Farm) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task, a = await dispatched(farm, client, host)
    await host.report(a, lease_pb2.OUTCOME_FAILED, error="boom")
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await cancel(client, task.task_id)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await farm.snapshot() == before


async def test_lease_expires_while_a_cancellation_is_pending(farm: Farm) -> None:
    """THEN the task becomes cancelled and its device is released, not requeued."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task, a = await dispatched(farm, client, host)
    await cancel(client, task.task_id)
    await farm.expire_now(a.lease_id)
    await eventually(lambda: _is(farm, task.task_id, "cancelled"), what="cancelled on expiry")
    assert await farm.device_holder("h1", "s1") is None
    assert [r["state"] for r in await farm.attempts(task.task_id)] == ["expired"]
    assert await host.acquire("s1", wait=0.2) == []


async def test_report_cancelled_without_a_cancellation_request_is_refused(farm: Farm) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1")
    _task, a = await dispatched(farm, client, host)
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.report(a, lease_pb2.OUTCOME_CANCELLED)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no cancellation request" in (err.value.details() or "")
    assert await farm.snapshot() == before


async def test_done_report_after_a_cancel_request_is_recorded_as_done(farm: Farm) -> None:
    """The run finished before it saw the request: the work was done."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task, a = await dispatched(farm, client, host)
    await cancel(client, task.task_id)
    reported = await host.report(a, lease_pb2.OUTCOME_DONE)
    assert reported.status == task_pb2.TASK_STATUS_DONE
    assert reported.HasField("cancel_requested_at")


async def _is(farm: Farm, task_id: str, status: str) -> bool:
    return await farm.status(task_id) == status


async def test_a_cancel_request_is_notified_after_its_commit_not_inside_its_transaction(
    farm: Farm,
) -> None:
    """amc_cancel sends no NOTIFY (inside its transaction it would hold the notification
    queue's lock through the WAL flush, one cancel after another); CancelTask's replica
    sends it once committed, naming the host, lease, task and attempt."""
    assert farm.db is not None
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2")
    first, _ = await dispatched(farm, client, host, "s1")
    second, a = await dispatched(farm, client, host, "s2")
    heard: list[str] = []
    listener = await asyncpg.connect(farm.dsn)
    try:
        await listener.add_listener("amc_cancel", lambda *args: heard.append(args[3]))
        code = await farm.db.fetchval(
            "SELECT code FROM amc_cancel($1::uuid, 'by hand')", first.task_id
        )
        assert code == "requested"
        # Notifications arrive in commit order: a NOTIFY of the cancel would come first.
        await farm.db.execute("NOTIFY amc_cancel, 'after'")
        await eventually(lambda: "after" in heard, what="the notification sent after it")
        assert heard == ["after"]
        await cancel(client, second.task_id)
        sent = await eventually(lambda: heard[1:], what="CancelTask's notification")
        host_id, lease, task_id, attempt, _ = sent[0].split(" ")
        assert (host_id, lease, task_id, attempt) == ("h1", a.lease_id, second.task_id, "1")
    finally:
        await listener.close()
