"""One lock order (task row, then its attempt) in every transition: the acknowledging
renewal raced against cancel, report and release of the same tasks must never deadlock,
fail a call, lose a cancellation or leave the tables inconsistent (issue 11.1)."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

import asyncpg
import grpc
import pytest

from amc.v1 import admin_pb2, lease_pb2, scheduler_pb2, task_pb2
from control_plane.store.sql import QUERIES
from host_agent.retry import TRANSIENT_CODES
from tests.conftest import FAST
from tests.support import (
    Clients,
    Farm,
    HostClient,
    RenewStream,
    actions_spec,
    device,
    eventually,
    seconds,
)

T = TypeVar("T")

LEASES_PER_ROUND = 8
ROUNDS = 25  # 200 races per transition
RENEWED = lease_pb2.RENEWAL_RESULT_RENEWED
CONFLICT = lease_pb2.RENEWAL_RESULT_CONFLICT

Race = Callable[[Clients, HostClient, lease_pb2.Assignment], Awaitable[object]]


async def _cancel(client: Clients, _host: HostClient, a: lease_pb2.Assignment) -> object:
    return await client.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=a.task_id))


async def _report(_client: Clients, host: HostClient, a: lease_pb2.Assignment) -> object:
    return await host.report(a, lease_pb2.OUTCOME_DONE)


async def _release(_client: Clients, host: HostClient, a: lease_pb2.Assignment) -> object:
    await host.release(a.lease_id)
    return None


async def _consistent(farm: Farm) -> None:
    """Every task agrees with its attempts and devices."""
    assert farm.db is not None
    broken = await farm.db.fetch(
        """
        SELECT t.task_id, t.status, a.state, d.serial
        FROM tasks t
        LEFT JOIN attempts a ON a.task_id = t.task_id AND a.attempt = t.attempt
        LEFT JOIN devices d ON d.task_id = t.task_id
        WHERE (t.status IN ('assigned', 'dispatched')) <> (a.state IS NOT DISTINCT FROM 'active')
           OR (t.status IN ('assigned', 'dispatched')) <> (d.serial IS NOT NULL)
           OR (t.status = 'dispatched' AND a.acknowledged_at IS NULL)
        """
    )
    assert broken == [], broken
    live = await farm.db.fetchval(
        "SELECT count(*) FROM attempts a JOIN tasks t USING (task_id)"
        " WHERE a.state = 'active' AND t.attempt <> a.attempt"
    )
    assert live == 0


@pytest.mark.parametrize("race", [_cancel, _report, _release], ids=["cancel", "report", "release"])
async def test_acknowledging_renewal_races_transitions_without_deadlock(
    farm: Farm, race: Race
) -> None:
    """THEN no call fails, every cancel is recorded, and the tables stay consistent."""
    client = await farm.client()
    serials = [f"s{i}" for i in range(LEASES_PER_ROUND)]
    host = await farm.host("h1", *serials)
    stream = RenewStream(host)
    assert farm.db is not None
    deadlocks_before = await farm.db.fetchval(
        "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    )
    try:
        for _ in range(ROUNDS):
            await client.scheduler.SubmitTasks(
                scheduler_pb2.SubmitTasksRequest(
                    tasks=[
                        scheduler_pb2.SubmitTaskRequest(spec=actions_spec())
                        for _ in range(LEASES_PER_ROUND)
                    ]
                )
            )
            handed = await host.acquire(*serials, wait=5)
            assert len(handed) == LEASES_PER_ROUND
            renewal, *answers = await asyncio.gather(
                stream.renew(*[a.lease_id for a in handed]),
                *[race(client, host, a) for a in handed],
            )
            assert {s.result for s in renewal} <= {RENEWED, CONFLICT}
            if race is _cancel:
                for task in answers:
                    assert isinstance(task, task_pb2.Task)
                    assert task.cancel_requested_at.seconds > 0
                recorded = await farm.db.fetchval(
                    "SELECT count(*) FROM attempts WHERE lease_id = ANY($1::uuid[])"
                    " AND cancel_requested_at IS NOT NULL",
                    [a.lease_id for a in handed],
                )
                assert recorded == LEASES_PER_ROUND
                for a in handed:  # the host stops them: devices free for the next round
                    await host.report(a, lease_pb2.OUTCOME_CANCELLED)
            await _consistent(farm)
            assert (
                await farm.db.fetchval("SELECT count(*) FROM attempts WHERE state = 'active'") == 0
            )
            # Released tasks are queued again: cancel them so the next round starts empty.
            for row in await farm.db.fetch(
                "SELECT task_id::text FROM tasks WHERE status = 'queued'"
            ):
                await client.scheduler.CancelTask(
                    scheduler_pb2.CancelTaskRequest(task_id=row["task_id"])
                )
        deadlocks = await farm.db.fetchval(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        )
        assert deadlocks == deadlocks_before
    finally:
        await stream.close()


async def test_a_deadlock_is_retried_not_reported_as_an_outage(farm: Farm) -> None:
    """A transition chosen as a deadlock victim is run again: the caller sees success."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))
    (a,) = await host.acquire("s1", wait=5)
    assert farm.db is not None
    deadlocks = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
    before = await farm.db.fetchval(deadlocks)
    other = await asyncpg_connect(farm)
    try:
        # This session takes the attempt, then (once CancelTask holds the task and waits
        # for the attempt) the task: the wrong order on purpose, so that one side deadlocks.
        # It waits longer than the server's deadlock_timeout, so CancelTask is the victim.
        await other.execute("SET deadlock_timeout = '20s'")
        tx = other.transaction()
        await tx.start()
        await other.execute(
            "SELECT 1 FROM attempts WHERE lease_id = $1::uuid FOR UPDATE", a.lease_id
        )
        cancel = asyncio.ensure_future(
            client.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=task.task_id))
        )
        await eventually_waiting(farm, "amc_cancel")
        locker = asyncio.create_task(
            other.execute("SELECT 1 FROM tasks WHERE task_id = $1::uuid FOR UPDATE", task.task_id)
        )
        await asyncio.wait_for(locker, 10)
        await tx.commit()
        answer = await asyncio.wait_for(cancel, 10)
    finally:
        await other.close()
    assert answer.cancel_requested_at.seconds > 0
    assert await farm.db.fetchval(deadlocks) > before  # it happened, and was retried
    (attempt,) = await farm.attempts(task.task_id)
    assert attempt["cancel_requested_at"] is not None


async def test_a_report_that_keeps_losing_races_is_unavailable_so_the_host_retries_it(
    farm: Farm,
) -> None:
    """THEN a report whose every try is a deadlock victim is answered UNAVAILABLE (which a
    host agent retries), not ABORTED (which it takes as the final refusal of a stale lease
    and drops the result), nothing is recorded, and the same report afterwards is."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))
    (a,) = await host.acquire("s1", wait=5)
    await host.renew(a.lease_id)
    assert farm.db is not None
    await farm.db.execute(
        """
        CREATE FUNCTION test_always_deadlocked() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'deadlock (test)' USING ERRCODE = 'deadlock_detected'; END $$;
        CREATE TRIGGER test_always_deadlocked BEFORE UPDATE OF outcome ON attempts
            FOR EACH ROW EXECUTE FUNCTION test_always_deadlocked();
        """
    )
    try:
        with pytest.raises(grpc.aio.AioRpcError) as lost:
            await host.report(a, lease_pb2.OUTCOME_DONE)
    finally:
        await farm.db.execute("DROP TRIGGER test_always_deadlocked ON attempts")
    assert lost.value.code() == grpc.StatusCode.UNAVAILABLE, lost.value
    assert grpc.StatusCode.UNAVAILABLE in TRANSIENT_CODES
    assert await farm.status(task.task_id) == "dispatched"
    recorded = await host.report(a, lease_pb2.OUTCOME_DONE)
    assert recorded.status == task_pb2.TASK_STATUS_DONE
    assert await farm.status(task.task_id) == "done"


async def asyncpg_connect(farm: Farm) -> asyncpg.Connection:
    return await asyncpg.connect(farm.dsn)


async def eventually_waiting(farm: Farm, query: str) -> None:
    assert farm.db is not None
    db = farm.db
    await eventually(
        lambda: db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE $1",
            f"%{query}%",
        ),
        what=f"{query} to wait for a lock",
    )


# -- issue 21.2: statements over several tasks take them first, in task_id order ----------
#
# The interleavings the issue describes, forced: a renewal is stopped just before it changes
# one attempt row (a trigger installed in this test's database waits there for an advisory
# lock the test holds), the other side is let run until it waits for a lock, then the
# renewal goes on.

PAUSE = 4279621  # the advisory lock a stopped renewal waits for, held by the test


@pytest.fixture
async def quiet_farm(database_url: str) -> AsyncIterator[Farm]:
    """A farm whose own sweep does not run: the tests run each sweep when they mean to."""
    f = Farm(database_url, dataclasses.replace(FAST, sweep_interval=timedelta(hours=1)))
    await f.start()
    try:
        yield f
    finally:
        await f.stop()


class Pause:
    """A statement that comes to update a row of `table` for which `condition` (SQL over
    OLD and NEW) holds stops there, every row it has locked so far still held, until
    `resume()`: a trigger in this test's database, waiting for an advisory lock the test
    holds. (Left in place after: it then waits for nothing.)"""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    @classmethod
    async def before_update(cls, farm: Farm, table: str, condition: str) -> Pause:
        conn = await asyncpg_connect(farm)
        await conn.execute(
            f"""
            CREATE FUNCTION test_pause_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF {condition} THEN
                    PERFORM pg_advisory_xact_lock_shared({PAUSE});
                END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER test_pause BEFORE UPDATE ON {table}
                FOR EACH ROW EXECUTE FUNCTION test_pause_{table}();
            """
        )
        await conn.execute("SELECT pg_advisory_lock($1)", PAUSE)
        return cls(conn)

    @classmethod
    def renewal_at(cls, farm: Farm, lease_id: str) -> Awaitable[Pause]:
        """A renewal (amc_renew) stops at the attempt row of `lease_id`."""
        uuid.UUID(lease_id)  # a UUID, so safe to write into the SQL
        return cls.before_update(
            farm,
            "attempts",
            f"current_query() LIKE '%amc_renew(%' AND OLD.lease_id = '{lease_id}'::uuid",
        )

    async def resume(self) -> None:
        if not self.conn.is_closed():
            await self.conn.execute("SELECT pg_advisory_unlock($1)", PAUSE)
            await self.conn.close()


async def waiting(farm: Farm, query: str, event: str | None = None) -> int:
    """How many sessions running `query` (a part of its text, or the name of a statement in
    store/*.sql) wait for a lock (of kind `event`, if given)."""
    assert farm.db is not None
    text = QUERIES.get(query)
    return int(
        await farm.db.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND ($2::text IS NULL OR wait_event = $2)"
            " AND CASE WHEN $3::text IS NULL THEN query LIKE '%' || $1 || '%'"
            " ELSE left(query, 200) = left($3, 200) END",
            query,
            event,
            text,
        )
    )


async def attempt_locked(farm: Farm, lease_id: str) -> bool:
    """Whether some transaction holds the lease's attempt row locked."""
    conn = await asyncpg_connect(farm)
    try:
        async with conn.transaction():
            free = await conn.fetchval(
                "SELECT 1 FROM attempts WHERE lease_id = $1::uuid FOR UPDATE SKIP LOCKED",
                lease_id,
            )
        return free is None
    finally:
        await conn.close()


async def deadlock_count(farm: Farm) -> int:
    assert farm.db is not None
    return int(
        await farm.db.fetchval(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        )
    )


async def two_leases(
    client: Clients, host: HostClient, stream: RenewStream
) -> tuple[lease_pb2.Assignment, lease_pb2.Assignment]:
    """Two acknowledged leases of host h1 (devices s1, s2), of tasks with an hour's
    deadline: a and b, a's task_id the lower, b's attempt stored first (so a renewal's
    UPDATE meets b's row before a's, as it scans the host's attempts in the order they were
    stored)."""
    submitted = await client.scheduler.SubmitTasks(
        scheduler_pb2.SubmitTasksRequest(
            tasks=[
                scheduler_pb2.SubmitTaskRequest(
                    spec=actions_spec(),
                    selector=task_pb2.DeviceSelector(serial=serial),
                    deadline=seconds(3600),
                )
                for serial in ("s1", "s2")
            ]
        )
    )
    low, high = sorted(submitted.tasks, key=lambda t: uuid.UUID(t.task_id))
    b = await host.acquire_one(high.selector.serial)
    a = await host.acquire_one(low.selector.serial)
    assert uuid.UUID(a.task_id) < uuid.UUID(b.task_id)
    assert {s.result for s in await stream.renew(a.lease_id, b.lease_id)} == {RENEWED}
    return a, b


def done(*assignments: lease_pb2.Assignment) -> lease_pb2.ReportResultsRequest:
    return lease_pb2.ReportResultsRequest(
        results=[
            lease_pb2.ReportResultRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                outcome=lease_pb2.OUTCOME_DONE,
                result=task_pb2.TaskResult(),
            )
            for a in assignments
        ]
    )


async def test_a_renewal_of_b_then_a_and_a_batched_report_of_a_and_b_do_not_deadlock(
    farm: Farm,
) -> None:
    """GIVEN a renewal that has changed b's attempt and not yet a's, and a batched report
    of a and b let run until it waits WHEN the renewal goes on THEN neither is a deadlock
    victim: both results are recorded, both leases renewed, at once, the tables consistent."""
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2")
    stream = RenewStream(host)
    try:
        a, b = await two_leases(client, host, stream)
        deadlocks = await deadlock_count(farm)
        pause = await Pause.renewal_at(farm, b.lease_id)
        try:
            renewal = asyncio.ensure_future(stream.renew(b.lease_id, a.lease_id))
            await eventually(
                lambda: waiting(farm, "amc_renew(", "advisory"), what="the renewal to stop at b"
            )
            # The interleaving of the issue: the renewal holds what it took before b's row
            # (a's attempt row is not among it).
            assert not await attempt_locked(farm, a.lease_id)
            report = asyncio.ensure_future(host.c.lease.ReportResults(done(a, b)))
            await eventually(lambda: waiting(farm, "amc_report("), what="the report to wait")
        finally:
            resumed = time.monotonic()
            await pause.resume()
        answer = await asyncio.wait_for(report, 30)
        took = time.monotonic() - resumed
        renewed = await asyncio.wait_for(renewal, 30)
    finally:
        await stream.close()
    assert [x.code for x in answer.answers] == [0, 0], answer
    assert [s.result for s in renewed] == [RENEWED, RENEWED]
    assert [await farm.status(t.task_id) for t in (a, b)] == ["done", "done"]
    await _consistent(farm)
    assert await deadlock_count(farm) == deadlocks, f"deadlock; the report took {took:.2f} s"


async def test_a_renewal_and_the_deadline_sweep_do_not_deadlock(quiet_farm: Farm) -> None:
    """GIVEN leases a and b past their deadlines, a renewal stopped at b's attempt row, and
    the deadline sweep let run until it waits or ends WHEN the renewal goes on THEN neither
    is a deadlock victim, and the sweep (that round or the next) fails both tasks."""
    farm = quiet_farm
    assert farm.plane is not None and farm.db is not None
    store = farm.plane.store
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2")
    stream = RenewStream(host)
    try:
        a, b = await two_leases(client, host, stream)
        # a's deadline passed first (the sweep meets a's attempt row before b's); b's row
        # is written first, so it stays the first a renewal meets.
        for lease_id, ago in ((b.lease_id, 1), (a.lease_id, 2)):
            await farm.db.execute(
                "UPDATE attempts SET deadline_at = now() - $2 * interval '1 hour'"
                " WHERE lease_id = $1::uuid",
                lease_id,
                ago,
            )
        deadlocks = await deadlock_count(farm)
        pause = await Pause.renewal_at(farm, b.lease_id)
        try:
            renewal = asyncio.ensure_future(stream.renew(b.lease_id, a.lease_id))
            await eventually(
                lambda: waiting(farm, "amc_renew(", "advisory"), what="the renewal to stop at b"
            )
            assert not await attempt_locked(farm, a.lease_id)
            sweep = asyncio.ensure_future(store.leases.end_overrun(farm.settings.lease_ttl))

            async def waits_or_ended() -> bool:
                return sweep.done() or await waiting(farm, "deadline_exceeded") > 0

            await eventually(waits_or_ended, what="the sweep to wait or end")
        finally:
            resumed = time.monotonic()
            await pause.resume()
        first = await asyncio.wait_for(sweep, 30)
        took = time.monotonic() - resumed
        renewed = await asyncio.wait_for(renewal, 30)
        then = await store.leases.end_overrun(farm.settings.lease_ttl)
    finally:
        await stream.close()
    ended = sorted(str(e.task_id) for e in [*first, *then])
    assert ended == sorted([a.task_id, b.task_id])
    assert {s.result for s in renewed} <= {RENEWED, CONFLICT}
    for t in (a, b):
        row = await farm.task_row(t.task_id)
        assert (row["status"], row["error"]) == ("failed", "deadline exceeded")
    await _consistent(farm)
    assert await deadlock_count(farm) == deadlocks, f"deadlock; the sweep took {took:.2f} s"


STRESS_ROUNDS = 10


async def test_renewals_a_batched_report_and_the_sweeps_at_once_never_deadlock(
    quiet_farm: Farm,
) -> None:
    """Rounds of: 8 acknowledged leases of one host (3 of them past their deadline, 2 run
    out) and 4 queued tasks past their queue timeout; at once, two renewals of all 8 leases
    (two streams of the host) and a batched report of all 8, each in a random order, the
    deadline sweep, the queue-timeout sweep and the expiry sweep. THEN no call fails and no
    deadlock happens; each task ends once (reported done, or failed by the sweep that came
    first, its report then refused as stale); the tables stay consistent."""
    farm = quiet_farm
    assert farm.plane is not None and farm.db is not None
    db, store, ttl = farm.db, farm.plane.store, farm.settings.lease_ttl
    client = await farm.client()
    serials = [f"s{i}" for i in range(LEASES_PER_ROUND)]
    host = await farm.host("h1", *serials)
    streams = [RenewStream(host), RenewStream(host)]
    rng = random.Random(21)
    deadlocks = await deadlock_count(farm)
    try:
        for _ in range(STRESS_ROUNDS):
            await client.scheduler.SubmitTasks(
                scheduler_pb2.SubmitTasksRequest(
                    tasks=[
                        scheduler_pb2.SubmitTaskRequest(
                            spec=actions_spec(), max_attempts=1, deadline=seconds(3600)
                        )
                        for _ in serials
                    ]
                )
            )
            handed = await host.acquire(*serials, wait=5)
            assert len(handed) == LEASES_PER_ROUND
            await streams[0].renew(*[a.lease_id for a in handed])
            waiting_tasks = await client.scheduler.SubmitTasks(
                scheduler_pb2.SubmitTasksRequest(
                    tasks=[
                        scheduler_pb2.SubmitTaskRequest(
                            spec=actions_spec(),
                            selector=task_pb2.DeviceSelector(serial="nowhere"),
                            queue_timeout=seconds(3600),
                        )
                        for _ in range(4)
                    ]
                )
            )
            await db.execute(
                "UPDATE tasks SET queue_deadline = now() - interval '1 second'"
                " WHERE task_id = ANY ($1::uuid[])",
                [t.task_id for t in waiting_tasks.tasks],
            )
            overrun, ran_out = handed[:3], handed[3:5]
            for a in rng.sample(overrun, len(overrun)):
                await db.execute(
                    "UPDATE attempts SET deadline_at = now() - interval '1 hour'"
                    " WHERE lease_id = $1::uuid",
                    a.lease_id,
                )
            for a in ran_out:
                await farm.expire_now(a.lease_id)

            first, second, third = (rng.sample(handed, len(handed)) for _ in range(3))
            request = done(*third)
            renewed_1, renewed_2, report, *_ = await asyncio.gather(
                streams[0].renew(*[a.lease_id for a in first]),
                streams[1].renew(*[a.lease_id for a in second]),
                host.c.lease.ReportResults(request),
                store.leases.end_overrun(ttl),
                store.tasks.time_out_queued(),
                store.leases.expire(),
            )
            # The next sweep: what this one skipped (held by a transition meanwhile).
            await store.leases.expire()
            await store.leases.end_overrun(ttl)
            assert {s.result for s in [*renewed_1, *renewed_2]} <= {RENEWED, CONFLICT}
            answers = {r.task_id: x for r, x in zip(request.results, report.answers, strict=True)}
            for a in handed:
                row = await farm.task_row(a.task_id)
                answer = answers[a.task_id]
                if answer.code == 0:
                    assert row["status"] == "done"
                else:
                    assert answer.code == grpc.StatusCode.ABORTED.value[0], answer
                    assert row["status"] == "failed"
                    assert row["error"] in ("deadline exceeded", "lease expired on attempt 1 of 1")
            for t in waiting_tasks.tasks:
                row = await farm.task_row(t.task_id)
                assert (row["status"], row["error"]) == ("failed", "queue timeout")
            await _consistent(farm)
            assert await db.fetchval("SELECT count(*) FROM attempts WHERE state = 'active'") == 0
    finally:
        for stream in streams:
            await stream.close()
    assert await deadlock_count(farm) == deadlocks


# -- issue 21.4: the host row orders cordon, drain and remove with Acquire ----------------
#
# An Acquire is held half-way, its task picked and its device not yet reserved, by a
# transaction of the test's that holds the device row; the host operation is let run until
# it waits or answers, then the device is let go.

ORPHANS = """
    SELECT count(*) FROM attempts a WHERE a.state = 'active'
      AND (NOT EXISTS (SELECT 1 FROM hosts h WHERE h.host_id = a.host_id)
           OR NOT EXISTS (SELECT 1 FROM devices d
                          WHERE d.host_id = a.host_id AND d.serial = a.device_serial))
"""


class RowHold:
    """A transaction of the test's holding rows locked until `release()`."""

    def __init__(self, conn: asyncpg.Connection, tx: Any) -> None:
        self.conn, self.tx = conn, tx

    @classmethod
    async def of(cls, farm: Farm, sql: str, *args: object) -> RowHold:
        conn = await asyncpg_connect(farm)
        tx = conn.transaction()
        await tx.start()
        assert await conn.fetch(sql, *args), "nothing to hold"
        return cls(conn, tx)

    async def release(self) -> None:
        if not self.conn.is_closed():
            await self.tx.rollback()
            await self.conn.close()


def hold_device(farm: Farm, host_id: str, serial: str) -> Awaitable[RowHold]:
    return RowHold.of(
        farm,
        "SELECT 1 FROM devices WHERE host_id = $1 AND serial = $2 FOR UPDATE",
        host_id,
        serial,
    )


async def waits_or_answered(farm: Farm, call: asyncio.Future[Any], query: str) -> None:
    async def check() -> bool:
        return call.done() or await waiting(farm, query) > 0

    await eventually(check, what=f"{query} to wait for a lock or answer")


async def outcome(call: Awaitable[T]) -> T | grpc.aio.AioRpcError:
    try:
        return await asyncio.wait_for(call, 30)
    except grpc.aio.AioRpcError as error:
        return error


def said(answer: object) -> str:
    """An outcome, short: the error's code and details, or the assigned tasks."""
    if isinstance(answer, grpc.aio.AioRpcError):
        return f"{answer.code().name}: {answer.details()}"
    if isinstance(answer, list):
        return f"assigned {[a.task_id for a in answer]}"
    return type(answer).__name__


async def test_remove_host_and_an_acquire_reserving_its_device_leave_no_orphaned_lease(
    farm: Farm,
) -> None:
    """GIVEN a disconnected host's Acquire that has picked a task and waits to reserve the
    device WHEN RemoveHost runs meanwhile, then the Acquire goes on THEN no active attempt
    is left whose host or device is gone: the Acquire's lease stands and the removal is
    refused for it (FAILED_PRECONDITION, 1 lease), host and device kept."""
    op = await farm.operator()
    host = await farm.host("h1", "s1")
    task = await op.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))
    assert farm.db is not None
    await farm.db.execute(
        "UPDATE hosts SET last_seen_at = now() - interval '1 hour', replica_id = NULL"
    )
    device = await hold_device(farm, "h1", "s1")
    try:
        acquire = asyncio.ensure_future(host.acquire("s1"))
        await eventually(lambda: waiting(farm, "amc_acquire("), what="the Acquire to wait")
        remove = asyncio.ensure_future(
            op.admin.RemoveHost(admin_pb2.RemoveHostRequest(host_id="h1", reason="gone"))
        )
        await waits_or_answered(farm, remove, "amc_remove_host(")
    finally:
        await device.release()
    handed = await outcome(acquire)
    removed = await outcome(remove)
    orphans = await farm.db.fetchval(ORPHANS)
    assert orphans == 0, f"Acquire: {said(handed)}; RemoveHost: {said(removed)}"
    assert isinstance(handed, list) and [a.task_id for a in handed] == [task.task_id]
    assert isinstance(removed, grpc.aio.AioRpcError), removed
    assert removed.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "holds 1 lease" in (removed.details() or "")
    assert await farm.device_holder("h1", "s1") == task.task_id
    await _consistent(farm)


async def test_an_acquire_after_remove_host_took_the_host_gets_nothing(farm: Farm) -> None:
    """GIVEN RemoveHost holding the host, its devices' removal held up WHEN an Acquire of
    that host comes THEN it gets nothing (the host is not registered, after the removal),
    the task stays queued, no lease is left."""
    op = await farm.operator()
    host = await farm.host("h1", "s1")
    task = await op.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))
    assert farm.db is not None
    await farm.db.execute(
        "UPDATE hosts SET last_seen_at = now() - interval '1 hour', replica_id = NULL"
    )
    device = await hold_device(farm, "h1", "s1")
    try:
        remove = asyncio.ensure_future(
            op.admin.RemoveHost(admin_pb2.RemoveHostRequest(host_id="h1", reason="gone"))
        )
        await eventually(lambda: waiting(farm, "amc_remove_host("), what="the removal to wait")
        acquire = asyncio.ensure_future(host.acquire("s1"))
        await waits_or_answered(farm, acquire, "amc_acquire(")
    finally:
        await device.release()
    removed = await outcome(remove)
    handed = await outcome(acquire)
    orphans = await farm.db.fetchval(ORPHANS)
    assert orphans == 0, f"Acquire: {said(handed)}; RemoveHost: {said(removed)}"
    assert isinstance(removed, admin_pb2.RemoveHostResponse), removed
    assert isinstance(handed, grpc.aio.AioRpcError), handed
    assert handed.code() == grpc.StatusCode.FAILED_PRECONDITION  # HostNotRegistered
    assert await farm.status(task.task_id) == "queued"
    assert await farm.db.fetchval("SELECT count(*) FROM attempts") == 0


@pytest.mark.parametrize("operation", ["CordonHost", "DrainHost"])
async def test_no_assignment_commits_after_a_cordon_returned(farm: Farm, operation: str) -> None:
    """GIVEN an Acquire that has picked a task and waits to reserve the device WHEN the
    host is cordoned (or drained) meanwhile, then the Acquire goes on THEN they are ordered:
    the assignment came first and the cordon's answer counts its lease; and an Acquire
    after the cordon returned gets nothing."""
    op = await farm.operator()
    host = await farm.host("h1", "s1", "s2")
    first = await op.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))
    device = await hold_device(farm, "h1", "s1")
    try:
        acquire = asyncio.ensure_future(host.acquire("s1"))
        await eventually(lambda: waiting(farm, "amc_acquire("), what="the Acquire to wait")
        request = admin_pb2.CordonHostRequest(host_id="h1", reason="maintenance")
        call = getattr(op.admin, operation)
        cordon = asyncio.ensure_future(call(request))
        await waits_or_answered(farm, cordon, "set_host_cordon")
    finally:
        await device.release()
    handed = await outcome(acquire)
    cordoned = await outcome(cordon)
    assert isinstance(handed, list) and isinstance(cordoned, admin_pb2.HostOperationResponse)
    assert farm.db is not None
    leases = await farm.db.fetchval(
        "SELECT count(*) FROM attempts WHERE host_id = 'h1' AND state = 'active'"
    )
    # Either the assignment came first (and the cordon counted it) or nothing was assigned.
    assert cordoned.leases == leases == len(handed), (
        f"the cordon counted {cordoned.leases} lease(s); {leases} active after the"
        f" Acquire, which {said(handed)}"
    )
    assert [a.task_id for a in handed] in ([first.task_id], [])

    second = await op.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))
    assert await host.acquire("s1", "s2") == []
    assert await farm.status(second.task_id) == "queued"
    assert (
        await farm.db.fetchval(
            "SELECT count(*) FROM attempts WHERE host_id = 'h1' AND state = 'active'"
        )
        == leases
    )
    await _consistent(farm)


async def test_a_registration_that_drops_a_device_and_remove_host_do_not_deadlock(
    farm: Farm,
) -> None:
    """GIVEN a disconnected host registering again without one of its devices, stopped once
    it has marked that device gone WHEN RemoveHost runs meanwhile THEN neither is a deadlock
    victim: the registration comes first (the host row before its devices), so the removal
    finds the host connected and is refused; the dropped device is gone, the other kept."""
    op = await farm.operator()
    host = await farm.host("h1", "s1", "s2")
    assert farm.db is not None
    await farm.db.execute(
        "UPDATE hosts SET last_seen_at = now() - interval '1 hour', replica_id = NULL"
    )
    deadlocks = await deadlock_count(farm)
    pause = await Pause.before_update(farm, "devices", "NEW.state = 'gone'")
    try:
        register = asyncio.ensure_future(host.register("s1"))
        await eventually(
            lambda: waiting(farm, "register_host", "advisory"), what="the registration to stop"
        )
        remove = asyncio.ensure_future(
            op.admin.RemoveHost(admin_pb2.RemoveHostRequest(host_id="h1", reason="gone"))
        )
        await waits_or_answered(farm, remove, "amc_remove_host(")
    finally:
        resumed = time.monotonic()
        await pause.resume()
    registered = await outcome(register)
    removed = await outcome(remove)
    took = time.monotonic() - resumed
    assert isinstance(registered, lease_pb2.RegisterHostResponse), said(registered)
    assert isinstance(removed, grpc.aio.AioRpcError), said(removed)
    assert removed.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is connected" in (removed.details() or "")
    states = await farm.db.fetch("SELECT serial, state FROM devices ORDER BY serial")
    assert [tuple(r) for r in states] == [("s1", "device"), ("s2", "gone")]
    assert await deadlock_count(farm) == deadlocks, f"deadlock; the removal took {took:.2f} s"


async def test_two_acquires_meeting_capped_keys_in_opposite_orders_do_not_deadlock(
    farm: Farm,
) -> None:
    """GIVEN keys ka and kb, both capped, and two hosts of two device groups each, whose
    Acquires meet the keys in opposite orders (h1's first group matches ka's task, its
    second kb's; h2's the other way round), both Acquires held at their first cap lock
    (this session holds both keys' locks) WHEN the locks are let go THEN neither is a
    deadlock victim (with deadlock_timeout at 50 ms, a wait in a cycle fails at once):
    each takes its two tasks. Taken device group by device group, h1 held ka waiting for
    kb while h2 held kb waiting for ka."""
    assert farm.db is not None
    await farm.db.execute(
        "INSERT INTO fair_shares (fairness_key, max_devices) VALUES ('ka', 10), ('kb', 10)"
    )
    order: dict[str, list[str]] = {}
    for name, slots in (("h1", ("a", "b")), ("h2", ("c", "d"))):
        host = await farm.host(name)
        await host.c.lease.RegisterHost(
            lease_pb2.RegisterHostRequest(
                host_id=name, devices=[device(f"{name}-{s}", slot=s) for s in slots]
            )
        )
        # The device groups in the order amc_acquire's loop meets them (the same query).
        rows = await farm.db.fetch(
            "SELECT dv.labels FROM devices dv WHERE dv.host_id = $1"
            " AND dv.serial = ANY ($2::text[]) AND dv.state = 'device'"
            " AND dv.task_id IS NULL AND NOT dv.cordoned AND dv.condition = 'ready'"
            " GROUP BY dv.labels",
            name,
            [f"{name}-{s}" for s in slots],
        )
        order[name] = [r["labels"]["slot"] for r in rows]
    (h1_first, h1_second), (h2_first, h2_second) = order["h1"], order["h2"]
    client = await farm.client()
    for key, slots in (("ka", (h1_first, h2_second)), ("kb", (h1_second, h2_first))):
        for slot in slots:
            await client.scheduler.SubmitTask(
                scheduler_pb2.SubmitTaskRequest(
                    spec=actions_spec(),
                    selector=task_pb2.DeviceSelector(labels={"slot": slot}),
                    fairness_key=key,
                )
            )
    locker, first, second = [await asyncpg_connect(farm) for _ in range(3)]
    try:
        await locker.execute(
            "SELECT pg_advisory_lock(hashtextextended('amc_fair_share:' || k, 0))"
            " FROM unnest(ARRAY['ka', 'kb']) k"
        )
        acquires = []
        for conn, name in ((first, "h1"), (second, "h2")):
            await conn.execute("SET deadlock_timeout = '50ms'")
            serials = [f"{name}-{s}" for s in order[name]]
            acquires.append(
                asyncio.ensure_future(
                    conn.fetch(QUERIES["acquire"], name, serials, timedelta(seconds=30))
                )
            )

        async def both_waiting() -> bool:
            return (
                any(a.done() for a in acquires) or await waiting(farm, "acquire", "advisory") == 2
            )

        await eventually(both_waiting, what="both Acquires to wait for a cap's lock")
        await locker.execute("SELECT pg_advisory_unlock_all()")
        answers = await asyncio.gather(
            *(asyncio.wait_for(a, 10) for a in acquires), return_exceptions=True
        )
    finally:
        for conn in (locker, first, second):
            await conn.close()
    for answer in answers:
        assert not isinstance(answer, BaseException), f"{type(answer).__name__}: {answer}"
    taken = [[r["task_id"] for r in rows if r["task_id"]] for rows in answers]  # type: ignore[union-attr]
    assert [len(t) for t in taken] == [2, 2]


async def leases_lower_on(
    client: Clients, host: HostClient, stream: RenewStream, serial: str
) -> tuple[lease_pb2.Assignment, lease_pb2.Assignment]:
    """Two acknowledged leases of host h1 (devices s1, s2), a's task_id the lower and a on
    `serial`: pairs are submitted (and the others cancelled) until one falls that way."""
    for _ in range(40):
        submitted = await client.scheduler.SubmitTasks(
            scheduler_pb2.SubmitTasksRequest(
                tasks=[
                    scheduler_pb2.SubmitTaskRequest(
                        spec=actions_spec(), selector=task_pb2.DeviceSelector(serial=s)
                    )
                    for s in ("s1", "s2")
                ]
            )
        )
        low, high = sorted(submitted.tasks, key=lambda t: uuid.UUID(t.task_id))
        if low.selector.serial == serial:
            a = await host.acquire_one(low.selector.serial)
            b = await host.acquire_one(high.selector.serial)
            assert {x.result for x in await stream.renew(a.lease_id, b.lease_id)} == {RENEWED}
            return a, b
        for t in (low, high):
            await client.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=t.task_id))
    raise AssertionError(f"no pair with the lower task on {serial} in 40")


@pytest.mark.parametrize("lower_on", ["s1", "s2"])
async def test_a_batched_report_and_a_health_report_of_its_devices_do_not_deadlock(
    farm: Farm, lower_on: str
) -> None:
    """GIVEN a batched report of a and b (task_id order) stopped at b's task, holding a's
    device, and a health report (a probe round's conditions) of b's device then a's WHEN
    the report goes on THEN neither is a deadlock victim (PostgreSQL finds one only after
    its deadlock_timeout, 1 s, which every phone of the host waited): the report takes its
    tasks' devices in serial order after its tasks, and the health report its devices in
    serial order."""
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2")
    stream = RenewStream(host)
    try:
        a, b = await leases_lower_on(client, host, stream, lower_on)
        deadlocks = await deadlock_count(farm)
        pause = await Pause.before_update(
            farm, "tasks", f"current_query() LIKE '%amc_report(%' AND OLD.task_id = '{b.task_id}'"
        )
        try:
            report = asyncio.ensure_future(host.c.lease.ReportResults(done(a, b)))
            await eventually(
                lambda: waiting(farm, "report_results", "advisory"), what="it to stop at b"
            )
            hot = [
                lease_pb2.DeviceHealth(serial=s, condition=scheduler_pb2.DEVICE_CONDITION_TOO_HOT)
                for s in (b.device_serial, a.device_serial)
            ]
            request = lease_pb2.ReportDeviceHealthRequest(host_id=host.host_id, devices=hot)
            health = asyncio.ensure_future(host.c.lease.ReportDeviceHealth(request))
            await eventually(lambda: waiting(farm, "set_device_health"), what="it to wait")
        finally:
            resumed = time.monotonic()
            await pause.resume()
        answer = await asyncio.wait_for(report, 30)
        took = time.monotonic() - resumed
        await asyncio.wait_for(health, 30)
    finally:
        await stream.close()
    assert [x.code for x in answer.answers] == [0, 0], answer
    assert [await farm.status(t.task_id) for t in (a, b)] == ["done", "done"]
    await _consistent(farm)
    assert await deadlock_count(farm) == deadlocks, f"deadlock; the report took {took:.2f} s"
