"""Step progress costs little: the replica holding a host's renewal stream keeps the steps of
the leases it renewed in memory and writes them, of all its hosts, in one statement every
`progress_every`; watchers on every replica are told, and read them from the database.
What waits is written when the replica stops, and again once a database that was away is
back; a step of a task that ended before the write is not kept."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest
from prometheus_client import REGISTRY

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane import progress as progress_module
from control_plane.config import Settings
from control_plane.domain import LeaseId, Renewal, Role, StepProgress, TaskId
from control_plane.embedded import EmbeddedPostgres
from control_plane.errors import DatabaseUnavailable
from control_plane.progress import write_once
from tests.conftest import FAST
from tests.support import Farm, HostClient, eventually, tap, wait_action, workflow_spec
from tests.support.replicas import farm_with_replicas
from tests.test_replicas import _clients_at
from tests.test_step_progress import progress, renew_with, step

# No write but the ones a test makes (or the stop's).
NEVER = replace(FAST, progress_every=timedelta(hours=1))
# What the docs promise for a step a renewal carried: shown on every replica within the
# replica's write period (1 s by default, the binary's) and a re-read; the agent adds its
# renew interval (5 s) before the renewal. The deadline is the documented bound for a
# step sent by an agent, which leaves a renewal sent directly room on a busy machine.
SHOWN_WITHIN = 6.0

# Every INSERT statement into attempt_steps, counted by a statement-level trigger.
COUNT_WRITES = """
CREATE TABLE step_writes (at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE FUNCTION count_step_writes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO step_writes DEFAULT VALUES;
    RETURN NULL;
END $$;
CREATE TRIGGER count_step_writes AFTER INSERT ON attempt_steps
    FOR EACH STATEMENT EXECUTE FUNCTION count_step_writes();
"""


async def workflow_on(farm: Farm, host: HostClient, serial: str) -> lease_pb2.Assignment:
    """A three-step workflow submitted for `serial`, acquired and acknowledged by `host`."""
    client = await farm.client()
    spec = workflow_spec(login=[tap()], search=[wait_action(1)], pay=[tap()])
    await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(spec=spec, selector=task_pb2.DeviceSelector(serial=serial))
    )
    a = await host.acquire_one(serial)
    await host.renew(a.lease_id)
    return a


async def kept(conn: asyncpg.Connection) -> list[tuple[str, int]]:
    rows = await conn.fetch(
        "SELECT task_id::text, step_index FROM attempt_steps ORDER BY task_id, step_index"
    )
    return [(r["task_id"], r["step_index"]) for r in rows]


async def test_the_steps_of_many_hosts_renewals_are_written_in_one_statement(
    database_url: str,
) -> None:
    conn = await asyncpg.connect(database_url)
    farm = Farm(database_url, NEVER)
    stopped = False
    try:
        await farm.start()
        await conn.execute(COUNT_WRITES)
        hosts = [await farm.host(f"h{i}", f"s{i}") for i in range(4)]
        leases = [await workflow_on(farm, h, f"s{i}") for i, h in enumerate(hosts)]
        # Each host renews twice, each renewal with two steps: 8 renewals, 16 steps.
        for first in (0, 2):
            for host, a in zip(hosts, leases, strict=True):
                sent = progress(a.lease_id, step(first, "a"), step(first + 1, "b"))
                answer = await renew_with(host, [a.lease_id], sent)
                assert answer.leases[0].result == lease_pb2.RENEWAL_RESULT_RENEWED

        # Answered, and nothing written yet: the steps wait in the replica.
        assert await conn.fetchval("SELECT count(*) FROM step_writes") == 0
        assert await kept(conn) == []

        await farm.stop()  # a replica that stops writes what waits
        stopped = True

        assert await conn.fetchval("SELECT count(*) FROM step_writes") == 1
        expected = sorted((a.task_id, i) for a in leases for i in range(4))
        assert await kept(conn) == expected
    finally:
        if not stopped:
            await farm.stop()
        await conn.close()


async def test_a_step_of_a_task_that_ended_before_the_write_is_not_kept(database_url: str) -> None:
    farm = Farm(database_url, NEVER)
    await farm.start()
    try:
        assert farm.plane is not None and farm.db is not None
        host, host2 = await farm.host("h1", "s1"), await farm.host("h2", "s2")
        a, b = await workflow_on(farm, host, "s1"), await workflow_on(farm, host2, "s2")
        await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))
        await renew_with(host2, [b.lease_id], progress(b.lease_id, step(0, "login")))
        await host.report(a, lease_pb2.OUTCOME_DONE)

        assert await write_once(farm.plane.store, farm.plane.hub) == 2

        assert await kept(farm.db) == [(b.task_id, 0)]
    finally:
        await farm.stop()


async def test_a_step_another_write_keeps_meanwhile_is_kept_once(database_url: str) -> None:
    farm = Farm(database_url, NEVER)
    await farm.start()
    other = await asyncpg.connect(database_url)
    try:
        assert farm.plane is not None and farm.db is not None
        host = await farm.host("h1", "s1")
        a = await workflow_on(farm, host, "s1")
        await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))
        # Another replica's write of the same step (its host sent it again there), not
        # committed yet when this replica's write looks for it.
        meanwhile = other.transaction()
        await meanwhile.start()
        await other.execute(
            "INSERT INTO attempt_steps (task_id, attempt, step_index, step)"
            " VALUES ($1::uuid, 1, 0, 'other')",
            a.task_id,
        )
        write = asyncio.create_task(write_once(farm.plane.store, farm.plane.hub))

        async def waits() -> bool:
            assert farm.db is not None
            return bool(
                await farm.db.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE wait_event_type = 'Lock' AND query LIKE '%amc_keep_steps%'"
                )
            )

        await eventually(waits, what="the write waiting for the other one's step")
        await meanwhile.commit()

        assert await asyncio.wait_for(write, 10) == 1
        rows = await farm.db.fetch("SELECT step_index, step FROM attempt_steps")
        assert [(r["step_index"], bytes(r["step"])) for r in rows] == [(0, b"other")]
    finally:
        await other.close()
        await farm.stop()


@pytest.fixture
async def own_database() -> AsyncIterator[EmbeddedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="amc-progress-"))
    server = EmbeddedPostgres(root / "data", durable=True)
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


async def test_steps_wait_while_the_database_is_away_and_are_written_when_it_is_back(
    own_database: EmbeddedPostgres,
) -> None:
    farm = Farm(own_database.url, NEVER)
    await farm.start()
    try:
        assert farm.plane is not None
        host = await farm.host("h1", "s1")
        a = await workflow_on(farm, host, "s1")
        await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))
        own_database.stop("immediate")
        with pytest.raises(DatabaseUnavailable):
            await write_once(farm.plane.store, farm.plane.hub)
        own_database.start()

        async def written() -> bool:
            try:
                return await write_once(farm.plane.store, farm.plane.hub) == 1
            except DatabaseUnavailable:
                return False

        await eventually(written, timeout=30, what="the step written once the database is back")
        await farm.reconnect_db()
        assert farm.db is not None
        assert await kept(farm.db) == [(a.task_id, 0)]
    finally:
        await farm.stop()


async def test_progress_sent_to_one_replica_shows_on_another_within_its_write_period(
    database_url: str, tmp_path: Path
) -> None:
    settings = Settings(lease_ttl=timedelta(seconds=15))
    async with farm_with_replicas(database_url, tmp_path, settings) as (farm, replicas):
        holding, other = replicas
        host = HostClient(
            "h1", _clients_at(farm, holding.address, await farm.token(Role.HOST, "h1"))
        )
        await host.register("s1")
        client = _clients_at(farm, other.address, await farm.token(Role.CLIENT))
        spec = workflow_spec(login=[tap()], search=[wait_action(1)], pay=[tap()])
        task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec))
        a = await host.acquire_one("s1")
        await host.renew(a.lease_id)
        seen: list[task_pb2.Task] = []

        async def watch() -> None:
            async for update in client.scheduler.WatchTask(
                scheduler_pb2.WatchTaskRequest(task_id=task.task_id)
            ):
                seen.append(update)

        watcher = asyncio.create_task(watch())
        try:
            await eventually(lambda: seen, what="the watch's first answer")
            await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))
            await eventually(
                lambda: any(t.progress.running_name == "search" for t in seen),
                timeout=SHOWN_WITHIN,
                what="step 0 on the other replica's WatchTask",
            )
            got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))
            assert [s.name for s in got.progress.steps] == ["login"]
            await renew_with(host, [a.lease_id], progress(a.lease_id, step(1, "search")))

            async def second() -> bool:
                got = await client.scheduler.GetTask(
                    scheduler_pb2.GetTaskRequest(task_id=task.task_id)
                )
                return got.progress.running_name == "pay"

            await eventually(second, timeout=SHOWN_WITHIN, what="step 1 on its GetTask")
            await eventually(
                lambda: any(t.progress.running_name == "pay" for t in seen),
                timeout=SHOWN_WITHIN,
                what="step 1 on its WatchTask",
            )
        finally:
            watcher.cancel()


def test_steps_past_what_a_replica_keeps_waiting_are_dropped_and_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress_module, "MAX_PENDING_BYTES", 250)
    waiting = progress_module.Progress()
    lease, task = uuid.uuid4(), uuid.uuid4()
    renewed = [Renewal(LeaseId(lease), False, TaskId(task), 1)]
    sent = [StepProgress(str(lease), i, bytes(100)) for i in range(3)]
    dropped = REGISTRY.get_sample_value("amc_step_progress_total", {"result": "dropped"}) or 0.0

    # Two fit; the third would pass the bound. A step sent again waits once.
    assert waiting.add(renewed, sent) == 2
    assert waiting.add(renewed, sent[:1]) == 1
    assert len(waiting) == 2
    after = REGISTRY.get_sample_value("amc_step_progress_total", {"result": "dropped"})
    assert after == dropped + 1
    # Taken for a write, and given back when it failed: all of it waits again.
    taken = waiting.take()
    assert (len(taken), len(waiting)) == (2, 0)
    waiting.give_back(taken)
    assert len(waiting) == 2


async def test_a_host_moving_its_stream_loses_no_step_sent_to_the_replica_it_left(
    database_url: str, tmp_path: Path
) -> None:
    """A step answered by replica A waits in A's memory; the host's next renewal, with the
    next step, goes to replica B (its connection moved): a watcher on B sees both, in
    order, within the write period."""
    settings = Settings(lease_ttl=timedelta(seconds=15))
    async with farm_with_replicas(database_url, tmp_path, settings) as (farm, replicas):
        first, second = replicas
        token = await farm.token(Role.HOST, "h1")
        on_first = HostClient("h1", _clients_at(farm, first.address, token))
        await on_first.register("s1")
        client = _clients_at(farm, second.address, await farm.token(Role.CLIENT))
        spec = workflow_spec(login=[tap()], search=[wait_action(1)], pay=[tap()])
        task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec))
        a = await on_first.acquire_one("s1")
        await on_first.renew(a.lease_id)
        await renew_with(on_first, [a.lease_id], progress(a.lease_id, step(0, "login")))
        on_second = HostClient("h1", _clients_at(farm, second.address, token))
        on_second.seq = on_first.seq
        answer = await renew_with(on_second, [a.lease_id], progress(a.lease_id, step(1, "search")))
        assert answer.leases[0].result == lease_pb2.RENEWAL_RESULT_RENEWED

        async def both() -> bool:
            got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))
            return [s.name for s in got.progress.steps] == ["login", "search"]

        await eventually(both, timeout=SHOWN_WITHIN, what="both steps on the second replica")
        assert farm.db is not None
        rows = await farm.db.fetch(
            "SELECT attempt, step_index FROM attempt_steps WHERE task_id = $1::uuid"
            " ORDER BY step_index",
            task.task_id,
        )
        assert [(r["attempt"], r["step_index"]) for r in rows] == [(1, 0), (1, 1)]
