"""The database fails over under running control planes: a primary and a synchronous
streaming standby (embedded servers), the primary killed and the standby promoted. The
replicas find the new primary through the multi-host URL, serve again, hand their parked
Acquires work, and every transition acknowledged before the failover is there."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_common.statuses import Outcome
from control_plane.config import Settings
from control_plane.domain import Role
from control_plane.embedded import ReplicatedPostgres
from control_plane.store import Store
from host_agent.agent import Agent
from host_agent.fencing import HeldLease
from host_agent.simulated import SimulatedSource
from host_agent.stop_token import StopReason
from tests.support import Farm, actions_spec, eventually, tap, wait_action
from tests.support.agent import TEST_SETTINGS, finished, running_agent, submit

# Leases outlive the test: a task running before the failovers is still running after them.
SETTINGS = Settings(sweep_interval=timedelta(seconds=0.1), lease_ttl=timedelta(minutes=10))
# What the control planes must have answered before the failover, read back after it.
ACKNOWLEDGED = (
    "SELECT t.task_id, t.status, t.attempt,"
    " (SELECT count(*) FROM task_events e WHERE e.task_id = t.task_id) AS events,"
    " (SELECT array_agg(a.lease_id ORDER BY a.attempt) FROM attempts a"
    "   WHERE a.task_id = t.task_id) AS leases"
    " FROM tasks t ORDER BY t.task_id"
)


@pytest.fixture
async def pair() -> AsyncIterator[ReplicatedPostgres]:
    # Not under pytest's tmp_path: the servers run as an unprivileged user under root.
    root = Path(tempfile.mkdtemp(prefix="amc-failover-"))
    servers = ReplicatedPostgres(root)
    await asyncio.to_thread(servers.start)
    try:
        yield servers
    finally:
        await asyncio.to_thread(servers.stop)
        shutil.rmtree(root, ignore_errors=True)


async def test_a_url_with_two_hosts_connects_to_the_writable_one(
    pair: ReplicatedPostgres,
) -> None:
    # The standby listed first: a connection that took any server would land on it.
    url = f"postgresql://postgres@127.0.0.1:{pair.standby.port},127.0.0.1:{pair.primary.port}/postgres"
    store = await Store.open(url, min_size=3, max_size=3)
    try:
        await store.ping()
        held = [await store.db.pool.acquire() for _ in range(3)]
        ports = {int(await c.fetchval("SELECT current_setting('port')")) for c in held}
        for c in held:
            await store.db.pool.release(c)
        assert ports == {pair.primary.port}
    finally:
        await store.close()


@pytest.mark.timeout(300)
async def test_a_failover_under_running_control_planes_loses_nothing_acknowledged(
    pair: ReplicatedPostgres,
) -> None:
    a = Farm(pair.url, SETTINGS)
    b = Farm(pair.url, SETTINGS)
    await a.start()
    await b.start()
    try:
        client = await a.client()
        worker = await a.host("h-work", "w1", "w2")
        parked_host = await b.host("h-park", "p1")
        # Transitions acknowledged before the failover: queued, assigned, running, done.
        await _acknowledge_some(client, worker)
        before = await _rows(pair)
        assert len(before) == 5

        for round_ in (1, 2):  # the second after the old primary rejoined as the standby
            parked = asyncio.create_task(parked_host.acquire("p1", wait=60))
            await eventually(
                lambda: b.plane is not None and len(b.plane.hub.dispatcher) == 1,
                what="the Acquire parked on the other replica",
            )
            await asyncio.to_thread(pair.kill_primary)
            await asyncio.to_thread(pair.promote)
            # A deadline for the test, not the target (<= 10 s, measured by make chaos).
            task = await eventually(
                lambda: _submit(client, serial="p1"), timeout=45, what="a submit to work again"
            )
            # The parked Acquire (on the replica that did not take the submit) gets it.
            got = await asyncio.wait_for(parked, 40)
            assert [g.task_id for g in got] == [task.task_id]
            await parked_host.report(got[0], lease_pb2.OUTCOME_DONE)

            after = await _rows(pair)
            missing = {k: v for k, v in before.items() if after.get(k) != v}
            assert not missing, f"acknowledged before the failover, changed or lost: {missing}"
            before = after
            if round_ == 1:
                await asyncio.to_thread(pair.rejoin)
        assert a.plane is not None and b.plane is not None
        assert not a.plane.crashed.is_set() and not b.plane.crashed.is_set()
    finally:
        await _stop(a, b)


async def _stop(*farms: Farm) -> None:
    for farm in farms:
        if farm.db is not None:  # on the first server listed, which may be gone
            farm.db.terminate()
            farm.db = None
        await farm.stop()


async def _acknowledge_some(client: Any, worker: Any) -> None:
    tasks = [
        await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(
                spec=actions_spec(), selector=task_pb2.DeviceSelector(serial=serial)
            )
        )
        for serial in ("w1", "w2", "w1", "w2", "w1")
    ]
    first, second = await worker.acquire("w1", "w2", wait=5)
    await worker.renew(first.lease_id, second.lease_id)  # acknowledged: running
    await worker.report(first, lease_pb2.OUTCOME_DONE)
    assert {t.task_id for t in tasks} >= {first.task_id, second.task_id}


async def _rows(pair: ReplicatedPostgres) -> dict[str, tuple[Any, ...]]:
    conn = await asyncpg.connect(pair.url, target_session_attrs="read-write")
    try:
        return {str(r["task_id"]): tuple(r) for r in await conn.fetch(ACKNOWLEDGED)}
    finally:
        await conn.close()


async def _submit(client: Any, serial: str) -> Any:
    try:
        return await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(
                spec=actions_spec(), selector=task_pb2.DeviceSelector(serial=serial)
            ),
            timeout=5,
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return None
        raise


async def test_a_replica_whose_server_turns_read_only_reconnects_and_serves_again(
    pair: ReplicatedPostgres,
) -> None:
    """A primary demoted in place (read-only to every session) refuses writes: they are
    UNAVAILABLE, never INTERNAL, the connections there are dropped, and once a writable
    server is back the replica serves again."""
    farm = Farm(pair.url, SETTINGS)
    await farm.start()
    try:
        client = await farm.client()
        assert await _submit(client, serial="s1") is not None
        await asyncio.to_thread(
            pair.primary.sql,
            "ALTER SYSTEM SET default_transaction_read_only = on",
            "SELECT pg_reload_conf()",
        )
        await eventually(lambda: _refused(client), what="a submit refused UNAVAILABLE")
        await asyncio.to_thread(
            pair.primary.sql,
            "ALTER SYSTEM RESET default_transaction_read_only",
            "SELECT pg_reload_conf()",
        )
        task = await eventually(lambda: _submit(client, serial="s1"), what="a submit to work")
        assert (await _rows(pair))[task.task_id][1] == "queued"
    finally:
        await _stop(farm)


async def _refused(client: Any) -> bool:
    try:
        await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(spec=actions_spec()), timeout=5
        )
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc.details()
        assert "internal" not in (exc.details() or "").lower()
        return True
    return False


# -- asynchronous replication: a lease the new primary does not know -------------------------

# Long leases, renewed every second: after the failover the host's next renewal reaches the
# new primary long before its own fencing deadline (48 s after its last renewal) could pass.
LOST_LEASE_SETTINGS = Settings(
    sweep_interval=timedelta(seconds=0.1),
    lease_ttl=timedelta(seconds=60),
    renew_interval=timedelta(seconds=1),
)


@pytest.fixture
async def async_pair() -> AsyncIterator[ReplicatedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="amc-failover-async-"))
    servers = ReplicatedPostgres(root, synchronous=False)
    await asyncio.to_thread(servers.start)
    try:
        yield servers
    finally:
        await asyncio.to_thread(servers.stop)
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.timeout(300)
async def test_renewals_of_a_lease_the_new_primary_does_not_know_stop_the_run_and_report_nothing(
    async_pair: ReplicatedPostgres,
) -> None:
    """With asynchronous replication the standby is behind when the primary dies: the task
    reached it (queued), its assignment did not. The real host agent runs the task under
    that lease; after the failover its renewals of the lease are refused by the new primary,
    so it stops the run (LEASE_LOST) and nothing it sends for the lease changes anything:
    the task is not ended by it, no attempt row with the lost lease appears, and the phone
    takes new work."""
    pair = async_pair
    farm = Farm(pair.url, LOST_LEASE_SETTINGS)
    await farm.start()
    source = SimulatedSource(1, delay=0.01)
    serial = source.serials[0]
    try:
        client = await farm.client()
        # A token made beforehand: one made while the standby is down would be lost with the
        # failover.
        host_token = await farm.token(Role.HOST, TEST_SETTINGS.host_id)
        # The host and its phone registered, on both servers; then the agent stops, so the
        # task waits queued until the standby has fallen behind.
        async with running_agent(farm, source, token=host_token):
            pass
        task_id = await submit(
            client,
            actions_spec(tap(1, 1), wait_action(600), tap(2, 2)),
            selector=task_pb2.DeviceSelector(serial=serial),
        )
        await asyncio.to_thread(pair.wait_caught_up)
        await asyncio.to_thread(pair.standby.stop, "fast")

        async with running_agent(farm, source, token=host_token) as agent:
            lease = await _held(agent, task_id)
            await eventually(lambda: source.actions_for(serial), what="the run's first tap")
            old = await _fetch(
                pair.primary.url, "SELECT status FROM tasks WHERE task_id = $1", task_id
            )
            assert [r["status"] for r in old] == ["dispatched"]  # acknowledged, old primary only

            await asyncio.to_thread(pair.kill_primary)
            await asyncio.to_thread(pair.standby.start)
            await asyncio.to_thread(pair.promote)
            new = pair.primary.url
            assert (
                await _fetch(new, "SELECT 1 FROM attempts WHERE lease_id = $1", lease.lease_id)
                == []
            )

            # The next renewal that reaches the new primary is refused: the run stops.
            await eventually(lambda: lease.token.tripped, timeout=45, what="the run to stop")
            assert lease.token.reason is StopReason.LEASE_LOST
            assert lease.conflicted  # by the renewal's answer, not by the fencing deadline
            record = await finished(agent, task_id, within=45)
            assert record.lease is lease
            assert record.result is not None and record.result.outcome is Outcome.FAILED
            assert record.result.stop_reason is StopReason.LEASE_LOST
            # Its release and its FAILED report were sent, and refused: no such lease.
            assert record.delivery is not None and not record.delivery.accepted
            assert record.delivery.code == grpc.StatusCode.ABORTED, record.delivery
            # Stopped in the wait: the run's last tap never reached the phone.
            assert {"x": 2, "y": 2} not in [r.args for r in source.actions_for(serial)]

            # Nothing the host sent for the lost lease changed the new primary.
            assert (
                await _fetch(new, "SELECT 1 FROM attempts WHERE lease_id = $1", lease.lease_id)
                == []
            )
            (row,) = await _fetch(new, "SELECT status FROM tasks WHERE task_id = $1", task_id)
            assert row["status"] in ("queued", "assigned", "dispatched")
            assert await _reports(new, task_id) == []

            # The phone is free again: the task (queued there) and then new work run on it.
            await client.scheduler.CancelTask(
                scheduler_pb2.CancelTaskRequest(task_id=task_id, reason="test")
            )
            await eventually(
                lambda: _status(new, task_id, "cancelled"),
                timeout=30,
                what="the lost task cancelled",
            )
            fresh = await submit(
                client, actions_spec(tap(3, 3)), selector=task_pb2.DeviceSelector(serial=serial)
            )
            await eventually(
                lambda: _status(new, fresh, "done"), timeout=30, what="new work done on the phone"
            )
            (done,) = await _fetch(
                new, "SELECT host_id, device_serial, state FROM attempts WHERE task_id = $1", fresh
            )
            assert tuple(done) == (TEST_SETTINGS.host_id, serial, "done")

        assert await _fetch(new, "SELECT 1 FROM attempts WHERE lease_id = $1", lease.lease_id) == []
        assert all(
            r["outcome"] in (None, "cancelled")
            for r in await _fetch(new, "SELECT outcome FROM attempts WHERE task_id = $1", task_id)
        )
        assert [s for s in await _reports(new, task_id) if s in ("done", "failed")] == []
        assert {"x": 2, "y": 2} not in [r.args for r in source.actions_for(serial)]
        assert farm.plane is not None and not farm.plane.crashed.is_set()
    finally:
        await _stop(farm)


async def _held(agent: Agent, task_id: str) -> HeldLease:
    def lease() -> HeldLease | None:
        held = agent.keeper.held() if agent.keeper is not None else []
        return next((h for h in held if h.task_id == task_id and not h.unanswered), None)

    found = await eventually(lease, timeout=30, what=f"the agent to acknowledge {task_id}")
    assert found is not None
    return found


async def _fetch(url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return await conn.fetch(query, *(uuid.UUID(a) for a in args))
    finally:
        await conn.close()


async def _reports(url: str, task_id: str) -> list[str]:
    rows = await _fetch(
        url, "SELECT to_status FROM task_events WHERE task_id = $1 AND kind = 'report'", task_id
    )
    return [str(r["to_status"]) for r in rows]


async def _status(url: str, task_id: str, wanted: str) -> bool:
    (row,) = await _fetch(url, "SELECT status FROM tasks WHERE task_id = $1", task_id)
    return bool(row["status"] == wanted)
