"""One lock order (task row, then its attempt) in every transition: the acknowledging
renewal raced against cancel, report and release of the same tasks must never deadlock,
fail a call, lose a cancellation or leave the tables inconsistent (issue 11.1)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from tests.support import Clients, Farm, HostClient, RenewStream, actions_spec, eventually

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
