"""Leases and results (spec/000, the control plane's side) and DESIGN.md's lease rules."""

import asyncio

import asyncpg
import grpc
import pytest

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from tests.support import Farm, actions_spec, device, eventually

RENEWED = lease_pb2.RENEWAL_RESULT_RENEWED
CONFLICT = lease_pb2.RENEWAL_RESULT_CONFLICT


async def submit(client, **kw) -> task_pb2.Task:  # type: ignore[no-untyped-def]
    return await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(spec=actions_spec(), **kw)
    )


async def assigned(farm: Farm, **kw):  # type: ignore[no-untyped-def]
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task = await submit(client, **kw)
    return client, host, task, await host.acquire_one("s1")


async def status_is(farm: Farm, task_id: str, status: str) -> bool:
    return await farm.status(task_id) == status


async def test_lease_renewal_succeeds(farm: Farm) -> None:
    """THEN the expiry is extended without changing the task attempt or device."""
    _, host, task, a = await assigned(farm)
    (before,) = await farm.attempts(task.task_id)
    answer = await host.renew_answer(a.lease_id)
    (state,) = answer.leases
    assert state.result == RENEWED
    assert answer.valid_for.ToTimedelta() == farm.settings.lease_ttl
    (after,) = await farm.attempts(task.task_id)
    assert after["lease_expires_at"] > before["lease_expires_at"]
    assert (after["attempt"], after["device_serial"], after["host_id"]) == (1, "s1", "h1")
    row = await farm.task_row(task.task_id)
    assert (row["attempt"], row["device_serial"], row["status"]) == (1, "s1", "dispatched")


async def test_first_renewal_acknowledges_and_later_ones_change_nothing_else(farm: Farm) -> None:
    _, host, task, a = await assigned(farm)
    assert await farm.status(task.task_id) == "assigned"
    await host.renew(a.lease_id)
    await host.renew(a.lease_id)
    kinds = [e["kind"] for e in await farm.events(task.task_id)]
    assert kinds == ["submit", "assign", "acknowledge"]


async def test_lease_is_stale_or_foreign(farm: Farm) -> None:
    """THEN a conflict, and the current attempt is neither revived nor altered."""
    _client, host, task, a = await assigned(farm)
    other = await farm.host("h2", "s9")
    # foreign: another host's token, even with its own host id on the stream
    (foreign,) = await other.renew(a.lease_id)
    assert foreign.result == CONFLICT
    # expired: the lease ran out and the sweep requeued the task
    await farm.expire_now(a.lease_id)
    await eventually(lambda: status_is(farm, task.task_id, "queued"), what="requeue")
    (expired,) = await host.renew(a.lease_id)
    assert expired.result == CONFLICT
    # replaced: a newer attempt holds the task now
    b = await host.acquire_one("s1")
    assert b.attempt == 2
    before = await farm.attempts(task.task_id)
    (replaced,) = await host.renew(a.lease_id)
    assert replaced.result == CONFLICT
    assert await farm.attempts(task.task_id) == before
    assert [r["state"] for r in before] == ["expired", "active"]
    # unknown and malformed ids are conflicts too, never errors
    (unknown,) = await host.renew("2f1bd1a2-0000-4000-8000-000000000000")
    (garbage,) = await host.renew("not-a-lease")
    assert unknown.result == garbage.result == CONFLICT


async def test_renewing_a_released_lease_is_a_conflict_and_revives_nothing(farm: Farm) -> None:
    _, host, task, a = await assigned(farm)
    await host.release(a.lease_id)
    assert await farm.status(task.task_id) == "queued"
    (state,) = await host.renew(a.lease_id)
    assert state.result == CONFLICT
    assert [r["state"] for r in await farm.attempts(task.task_id)] == ["released"]


async def test_one_renewal_carries_many_leases(farm: Farm) -> None:
    client = await farm.client()
    serials = [f"s{i}" for i in range(5)]
    host = await farm.host("h1", *serials)
    for _ in serials:
        await submit(client)
    found = await host.acquire(*serials, wait=1)
    assert len(found) == 5
    ids = [a.lease_id for a in found]
    states = await host.renew(*ids, "not-a-lease")
    assert [s.lease_id for s in states] == [*ids, "not-a-lease"]
    assert [s.result for s in states] == [RENEWED] * 5 + [CONFLICT]


async def test_report_a_successful_result(farm: Farm) -> None:
    """THEN the task is done, the device reservation released, the result recorded."""
    _, host, task, a = await assigned(farm)
    await host.renew(a.lease_id)
    result = task_pb2.TaskResult(
        steps=[
            task_pb2.StepResult(
                index=0,
                name="tap",
                status=task_pb2.STEP_STATUS_OK,
                output="ok",
                data={"sha256": "abc"},
            )
        ]
    )
    done = await host.c.lease.ReportResult(
        lease_pb2.ReportResultRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            outcome=lease_pb2.OUTCOME_DONE,
            result=result,
        )
    )
    assert done.status == task_pb2.TASK_STATUS_DONE
    assert done.result == result
    assert done.HasField("finished_at")
    assert await farm.device_holder("h1", "s1") is None
    stored = task_pb2.TaskResult.FromString((await farm.task_row(task.task_id))["result"])
    assert stored == result


async def test_report_a_cancelled_result(farm: Farm) -> None:
    """THEN the task is cancelled, the device released, the result recorded."""
    client, host, task, a = await assigned(farm)
    await host.renew(a.lease_id)
    await client.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=task.task_id))
    cancelled = await host.report(a, lease_pb2.OUTCOME_CANCELLED, error="stopped before step 1")
    assert cancelled.status == task_pb2.TASK_STATUS_CANCELLED
    assert cancelled.result.error == "stopped before step 1"
    assert await farm.device_holder("h1", "s1") is None


async def test_retry_a_result_after_response_loss(farm: Farm) -> None:
    """THEN the recorded terminal result comes back, without a new attempt or error."""
    _, host, task, a = await assigned(farm)
    await host.renew(a.lease_id)
    first = await host.report(a, lease_pb2.OUTCOME_DONE)
    before = await farm.snapshot()
    again = await host.report(a, lease_pb2.OUTCOME_DONE)
    assert again == first
    assert await farm.snapshot() == before
    assert len(await farm.attempts(task.task_id)) == 1


async def test_a_different_outcome_for_a_finished_attempt_is_refused(farm: Farm) -> None:
    _, host, _task, a = await assigned(farm)
    await host.report(a, lease_pb2.OUTCOME_FAILED, error="boom")
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.report(a, lease_pb2.OUTCOME_DONE)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert await farm.snapshot() == before


async def test_stale_attempt_reports_after_requeue(farm: Farm) -> None:
    """THEN the stale report is rejected and the newer attempt's state is preserved."""
    _, host, task, a = await assigned(farm)
    await host.renew(a.lease_id)
    await farm.expire_now(a.lease_id)
    await eventually(lambda: status_is(farm, task.task_id, "queued"), what="requeue")
    b = await host.acquire_one("s1")
    await host.renew(b.lease_id)
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.report(a, lease_pb2.OUTCOME_DONE)
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert await farm.snapshot() == before
    row = await farm.task_row(task.task_id)
    assert (row["status"], row["attempt"]) == ("dispatched", 2)


async def test_a_report_on_an_expired_lease_not_yet_swept_is_aborted(farm: Farm) -> None:
    _, host, _task, a = await assigned(farm)
    await farm.plane.stop(0)  # no sweeper: the lease is expired but still marked active
    await farm.expire_now(a.lease_id)
    await farm.start(0)
    host = await farm.host("h1")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.report(a, lease_pb2.OUTCOME_DONE)
    assert err.value.code() == grpc.StatusCode.ABORTED


async def test_a_host_reporting_on_another_hosts_lease_is_aborted_and_changes_nothing(
    farm: Farm,
) -> None:
    _, _host, _task, a = await assigned(farm)
    intruder = await farm.host("h2", "s2")
    before = await farm.snapshot()
    for call in (intruder.report(a, lease_pb2.OUTCOME_DONE), intruder.release(a.lease_id)):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.ABORTED
    assert await farm.snapshot() == before


async def test_expiry_requeues_until_max_attempts_then_fails(farm: Farm) -> None:
    _, host, task, a = await assigned(farm, max_attempts=2)
    await farm.expire_now(a.lease_id)
    await eventually(lambda: status_is(farm, task.task_id, "queued"), what="requeue")
    assert await farm.device_holder("h1", "s1") is None
    b = await host.acquire_one("s1")
    await farm.expire_now(b.lease_id)
    await eventually(lambda: status_is(farm, task.task_id, "failed"), what="failed")
    row = await farm.task_row(task.task_id)
    assert "expired on attempt 2 of 2" in row["error"]
    assert await farm.device_holder("h1", "s1") is None
    assert await host.acquire("s1", wait=0.2) == []


async def test_release_requeues_at_once_like_an_expiry(farm: Farm) -> None:
    _, host, task, a = await assigned(farm)
    await host.release(a.lease_id, "draining")
    row = await farm.task_row(task.task_id)
    assert (row["status"], row["host_id"], row["device_serial"]) == ("queued", None, None)
    assert (await farm.events(task.task_id))[-1]["detail"] == "draining"
    again = await host.acquire_one("s1")
    assert (again.task_id, again.attempt) == (task.task_id, 2)


async def test_registering_again_updates_the_listed_devices_and_marks_the_others_gone(
    farm: Farm,
) -> None:
    """THEN the host's labels and its listed devices are the new ones, the rest gone."""
    host = await farm.host("h1", "s1", "s2", rack="r1")
    await host.register("s2", "s3", rack="r2")
    assert farm.db is not None
    rows = await farm.db.fetch(
        "SELECT serial, state, labels->>'rack' AS rack FROM devices WHERE host_id = 'h1'"
        " ORDER BY serial"
    )
    assert [tuple(r) for r in rows] == [
        ("s1", "gone", "r1"),
        ("s2", "device", "r2"),
        ("s3", "device", "r2"),
    ]
    labels = await farm.db.fetchval("SELECT labels FROM hosts WHERE host_id = 'h1'")
    assert labels == {"rack": "r2"}


async def test_every_device_carries_its_host_s_id_as_a_label_nothing_overrides(
    farm: Farm,
) -> None:
    """THEN a device's labels end with `host_id`, its host's id, whatever the host or the
    device say for it; a selector of serial and host_id is taken by that host's phone of
    the serial only, though another host has one of the same serial."""
    a = await farm.host("h1")
    await a.c.lease.RegisterHost(
        lease_pb2.RegisterHostRequest(
            host_id="h1", labels={"host_id": "other"}, devices=[device("s1", host_id="other")]
        )
    )
    b = await farm.host("h2", "s1")
    assert farm.db is not None
    rows = await farm.db.fetch("SELECT host_id, labels->>'host_id' FROM devices ORDER BY 1")
    assert [tuple(r) for r in rows] == [("h1", "h1"), ("h2", "h2")]
    client = await farm.client()
    selector = task_pb2.DeviceSelector(serial="s1", labels={"host_id": "h1"})
    task = await submit(client, selector=selector)
    assert await b.acquire("s1", wait=0.2) == []
    assert (await a.acquire_one("s1")).task_id == task.task_id


async def test_releasing_a_lease_whose_attempt_ended_changes_nothing(farm: Farm) -> None:
    """THEN the release succeeds and the reported outcome, attempt and events stand."""
    _, host, task, a = await assigned(farm)
    await host.report(a, lease_pb2.OUTCOME_DONE)
    before = await farm.snapshot()
    await host.release(a.lease_id, "late")
    assert await farm.snapshot() == before
    assert await farm.status(task.task_id) == "done"


async def test_releasing_a_lease_that_does_not_exist_is_aborted(farm: Farm) -> None:
    """THEN ABORTED: no such lease for this host, and nothing changes."""
    _, host, _task, _a = await assigned(farm)
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.release("00000000-0000-4000-8000-000000000000")
    assert err.value.code() == grpc.StatusCode.ABORTED
    assert "no such lease for this host" in (err.value.details() or "")
    assert await farm.snapshot() == before


async def test_acquire_long_poll_is_woken_by_a_new_task(farm: Farm) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1")
    waiting = asyncio.create_task(host.acquire("s1", wait=30))
    await eventually(lambda: _has_waiter(farm), what="the acquire to be waiting")
    task = await submit(client)
    found = await asyncio.wait_for(waiting, 25)
    assert [a.task_id for a in found] == [task.task_id]


def _has_waiter(farm: Farm) -> bool:
    assert farm.plane is not None
    return len(farm.plane.hub.dispatcher) == 1


async def test_acquire_returns_empty_after_wait_when_nothing_matches(farm: Farm) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1")
    await submit(client, selector=task_pb2.DeviceSelector(serial="other"))
    assert await host.acquire("s1", wait=0.3) == []


async def test_acquire_gives_at_most_one_task_per_device_by_priority_then_age(farm: Farm) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2")
    low = await submit(client, priority=0)
    high = await submit(client, priority=5)
    mid = await submit(client, priority=1)
    found = await host.acquire("s1", "s2", wait=1)
    assert sorted(a.task_id for a in found) == sorted([high.task_id, mid.task_id])
    assert len({a.device_serial for a in found}) == 2
    assert await farm.status(low.task_id) == "queued"


async def test_acquire_matches_serial_and_labels(farm: Farm) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2", rack="a")
    wants_s2 = await submit(client, selector=task_pb2.DeviceSelector(serial="s2"))
    wants_rack_b = await submit(client, selector=task_pb2.DeviceSelector(labels={"rack": "b"}))
    wants_model = await submit(
        client, selector=task_pb2.DeviceSelector(labels={"rack": "a", "model": "Pixel Test"})
    )
    found = {a.task_id: a.device_serial for a in await host.acquire("s1", "s2", wait=1)}
    assert found[wants_s2.task_id] == "s2"
    assert found[wants_model.task_id] == "s1"
    assert wants_rack_b.task_id not in found


async def test_acquire_gives_a_device_one_of_two_tasks_naming_it_and_the_rest_a_general_one(
    farm: Farm,
) -> None:
    """One queue scan serves a group of alike devices: a task naming a device already given
    a task in the same call stays queued, and the other device still gets work."""
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2")
    first = await submit(client, priority=9, selector=task_pb2.DeviceSelector(serial="s1"))
    second = await submit(client, priority=8, selector=task_pb2.DeviceSelector(serial="s1"))
    general = await submit(client, priority=1)
    assignments = await host.acquire("s1", "s2", wait=1)
    assert {a.task_id: a.device_serial for a in assignments} == {
        first.task_id: "s1",
        general.task_id: "s2",
    }
    assert await farm.status(second.task_id) == "queued"
    # Once s1 is free again, the task naming it is next.
    for a in assignments:
        await host.report(a, lease_pb2.OUTCOME_DONE)
    again = await host.acquire("s1", "s2", wait=1)
    assert [(a.task_id, a.device_serial) for a in again] == [(second.task_id, "s1")]


async def test_acquire_ignores_devices_not_idle_or_not_the_hosts(farm: Farm) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1")
    other = await farm.host("h2", "x1")
    await submit(client)
    await submit(client)
    assert await other.acquire("s1", wait=0) == []  # h2 has no s1
    first = await host.acquire("s1", wait=0)
    assert len(first) == 1
    assert await host.acquire("s1", wait=0) == []  # s1 is reserved now


async def test_acquire_never_hands_one_task_to_two_hosts(farm: Farm) -> None:
    client = await farm.client()
    hosts = [await farm.host(f"h{i}", *[f"h{i}-s{j}" for j in range(5)]) for i in range(4)]
    tasks = [await submit(client) for _ in range(30)]
    results = await asyncio.gather(
        *[h.acquire(*[f"{h.host_id}-s{j}" for j in range(5)], wait=1) for h in hosts]
    )
    handed = [a.task_id for r in results for a in r]
    assert len(handed) == len(set(handed)) == 20
    assert set(handed) <= {t.task_id for t in tasks}
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM devices WHERE task_id IS NOT NULL") == 20


async def test_concurrent_acquires_for_one_device_reserve_it_once(farm: Farm) -> None:
    """Acquire reads devices without locking them and reserves one only after taking its
    task: two Acquires racing for the same device must still give it one task, and leave
    the loser's task queued, not half-assigned."""
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2")
    assert farm.db is not None
    for _ in range(10):
        tasks = [await submit(client) for _ in range(4)]
        results = await asyncio.gather(*[host.acquire("s1", "s2", wait=0) for _ in range(4)])
        handed = [a for r in results for a in r]
        assert sorted(a.device_serial for a in handed) == ["s1", "s2"], handed
        rows = await farm.db.fetch(
            "SELECT status, count(*) AS n FROM tasks WHERE task_id = ANY($1::uuid[])"
            " GROUP BY status",
            [t.task_id for t in tasks],
        )
        assert {r["status"]: r["n"] for r in rows} == {"assigned": 2, "queued": 2}
        assert await farm.db.fetchval("SELECT count(*) FROM attempts WHERE state = 'active'") == 2
        for a in handed:
            await host.report(a, lease_pb2.OUTCOME_DONE)
        assert await farm.db.fetchval("SELECT count(*) FROM devices WHERE task_id IS NOT NULL") == 0
        for t in tasks:
            if t.task_id not in {a.task_id for a in handed}:
                await client.scheduler.CancelTask(
                    scheduler_pb2.CancelTaskRequest(task_id=t.task_id)
                )


async def test_an_acquire_whose_phone_another_acquire_took_takes_the_next_idle_one(
    farm: Farm,
) -> None:
    """GIVEN an Acquire of s1 and s2 that locked a task and waits for s1, which an Acquire
    of s1 alone reserved and has not committed yet, and the other queued tasks held by
    other Acquires, WHEN the one of s1 commits, THEN the waiting Acquire reserves s2 for
    its task rather than leave s2 idle with that task still queued."""
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2")
    tasks = [await submit(client) for _ in range(4)]
    first, _, third, fourth = (t.task_id for t in tasks)
    holder = await asyncpg.connect(farm.dsn)  # other Acquires' tasks, locked
    taker = await asyncpg.connect(farm.dsn)  # an Acquire of s1 alone, not committed
    try:
        holding = holder.transaction()
        await holding.start()
        await holder.execute(
            "SELECT 1 FROM tasks WHERE task_id = ANY($1::uuid[]) FOR NO KEY UPDATE",
            [third, fourth],
        )
        taking = taker.transaction()
        await taking.start()
        took = await taker.fetch(
            "SELECT task_id FROM amc_acquire('h1', '{s1}', interval '60 seconds')"
            " WHERE task_id IS NOT NULL"
        )
        assert [str(r["task_id"]) for r in took] == [first]
        racing = asyncio.create_task(host.acquire("s1", "s2", wait=0))
        assert farm.db is not None
        db = farm.db

        async def waits_for_s1() -> bool:
            query = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            return bool(await db.fetchval(query))

        await eventually(waits_for_s1, what="the racing Acquire to wait for s1")
        await taking.commit()
        handed = await asyncio.wait_for(racing, 10)
        assert [a.device_serial for a in handed] == ["s2"], handed
        row = await db.fetchrow("SELECT task_id FROM devices WHERE serial = 's2'")
        assert str(row["task_id"]) == handed[0].task_id
        await holding.rollback()
    finally:
        await holder.close()
        await taker.close()


async def test_stopping_a_replica_returns_parked_acquires_at_once(farm: Farm) -> None:
    host = await farm.host("h1", "s1")
    waiting = asyncio.create_task(host.acquire("s1", wait=60))
    await eventually(lambda: _has_waiter(farm), what="the acquire to be waiting")
    assert farm.plane is not None
    await farm.plane.stop(30)
    assert await asyncio.wait_for(waiting, 10) == []
    farm.plane = None


# -- results in a batch ---------------------------------------------------------------------


def _result(a: lease_pb2.Assignment, outcome: int, **kw) -> lease_pb2.ReportResultRequest:  # type: ignore[no-untyped-def]
    fields = {"task_id": a.task_id, "attempt": a.attempt, "lease_id": a.lease_id, **kw}
    return lease_pb2.ReportResultRequest(outcome=outcome, **fields)


async def test_results_reported_together_are_each_answered_as_alone(farm: Farm) -> None:
    """One call, one transaction: recorded ones free their devices; a stale one is refused
    with the code ReportResult would give, and changes nothing."""
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2", "s3")
    tasks = [await submit(client) for _ in range(3)]
    handed = await host.acquire("s1", "s2", "s3", wait=5)
    assert len(handed) == 3
    await farm.expire_now(handed[2].lease_id)
    answer = await host.c.lease.ReportResults(
        lease_pb2.ReportResultsRequest(
            results=[
                _result(handed[0], lease_pb2.OUTCOME_DONE),
                _result(handed[1], lease_pb2.OUTCOME_FAILED),
                _result(handed[2], lease_pb2.OUTCOME_DONE),
            ]
        )
    )
    codes = [a.code for a in answer.answers]
    assert codes == [0, 0, grpc.StatusCode.ABORTED.value[0]]
    assert [a.task.status for a in answer.answers[:2]] == [
        task_pb2.TASK_STATUS_DONE,
        task_pb2.TASK_STATUS_FAILED,
    ]
    assert "no longer current" in answer.answers[2].message
    by_id = {t.task_id: t for t in tasks}
    assert await farm.status(handed[0].task_id) == "done"
    assert await farm.status(handed[1].task_id) == "failed"
    assert handed[2].task_id in by_id
    # Not recorded: still the expired attempt's (or already requeued by the sweep).
    assert await farm.status(handed[2].task_id) in ("assigned", "queued")
    (stale,) = await farm.attempts(handed[2].task_id)
    assert stale["outcome"] is None
    assert await farm.device_holder("h1", handed[0].device_serial) is None
    # The identical batch again: the recorded ones come back as recorded.
    again = await host.c.lease.ReportResults(
        lease_pb2.ReportResultsRequest(results=[_result(handed[0], lease_pb2.OUTCOME_DONE)])
    )
    assert [a.code for a in again.answers] == [0]
    kinds = [e["kind"] for e in await farm.events(handed[0].task_id)]
    assert kinds.count("report") == 1


async def test_a_malformed_result_in_a_batch_refuses_the_whole_call(farm: Farm) -> None:
    """THEN INVALID_ARGUMENT naming the result, and nothing is recorded."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    await submit(client)
    (a,) = await host.acquire("s1", wait=5)
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.c.lease.ReportResults(
            lease_pb2.ReportResultsRequest(
                results=[
                    _result(a, lease_pb2.OUTCOME_DONE),
                    _result(a, lease_pb2.OUTCOME_DONE, attempt=0),
                ]
            )
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("results[1].attempt")
    assert await farm.snapshot() == before


async def test_a_result_for_another_hosts_lease_in_a_batch_is_aborted(farm: Farm) -> None:
    client = await farm.client()
    h1 = await farm.host("h1", "s1")
    h2 = await farm.host("h2", "s2")
    await submit(client)
    (a,) = await h1.acquire("s1", wait=5)
    answer = await h2.c.lease.ReportResults(
        lease_pb2.ReportResultsRequest(results=[_result(a, lease_pb2.OUTCOME_DONE)])
    )
    assert [x.code for x in answer.answers] == [grpc.StatusCode.ABORTED.value[0]]
    assert await farm.status(a.task_id) == "assigned"
