"""Retention, on a real control plane and PostgreSQL: finished tasks past --task-retention go
with their attempts and events, in batches that skip locked rows and run on one replica at a
time; hosts disconnected past --forget-hosts-after and holding no lease go with their
devices; what is recent, in flight or connected stays; the metrics count the rows."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta

import asyncpg
import grpc
import pytest
from prometheus_client import REGISTRY

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_common.statuses import Outcome
from control_plane.config import Settings
from control_plane.domain import Removed
from control_plane.flags import parser
from control_plane.retention import _batches
from control_plane.store import Store
from host_agent.simulated import SimulatedSource
from tests.support import Clients, Farm, actions_spec, eventually, tap
from tests.support.agent import finished, running_agent, status_is, submit
from tests.test_artifacts import dispatched, stored, upload, upload_messages
from tests.test_cli import control_plane

DAY = timedelta(days=1)
RETAINING = Settings(
    lease_ttl=timedelta(seconds=15),
    sweep_interval=timedelta(seconds=0.05),
    task_retention=DAY,
    forget_hosts_after=DAY,
    retention_interval=timedelta(seconds=0.05),
    retention_pause=timedelta(seconds=0.01),
)
# For the tests that run batches themselves: the replica's own loop stays out of the way.
RETENTION_OFF = replace(RETAINING, task_retention=None, forget_hosts_after=None)
RETENTION_LOCK = (4279619, 1)


@pytest.fixture
async def retaining(database_url: str) -> AsyncIterator[Farm]:
    farm = Farm(database_url, RETAINING)
    await farm.start()
    try:
        yield farm
    finally:
        await farm.stop()


@pytest.fixture
async def quiet(database_url: str) -> AsyncIterator[Farm]:
    farm = Farm(database_url, RETENTION_OFF)
    await farm.start()
    try:
        yield farm
    finally:
        await farm.stop()


def removed_total(kind: str) -> float:
    return REGISTRY.get_sample_value("amc_retention_removed_total", {"kind": kind}) or 0.0


def batches_total(what: str) -> float:
    return REGISTRY.get_sample_value("amc_retention_batch_seconds_count", {"what": what}) or 0.0


async def db(farm: Farm) -> asyncpg.Connection:
    assert farm.db is not None
    return farm.db


async def finished_ago(farm: Farm, task_ids: list[str], age: timedelta) -> None:
    """Test set-up: the tasks finished `age` ago (one microsecond apart, in list order:
    the first is the oldest)."""
    await (await db(farm)).execute(
        "UPDATE tasks t SET finished_at = now() - $2::interval"
        " - (cardinality($1::uuid[]) - o.n) * interval '1 microsecond'"
        " FROM unnest($1::uuid[]) WITH ORDINALITY AS o (task_id, n)"
        " WHERE t.task_id = o.task_id",
        task_ids,
        age,
    )


async def unseen_for(farm: Farm, host_id: str, age: timedelta) -> None:
    """Test set-up: the host's stream closed and it was last seen `age` ago."""
    await (await db(farm)).execute(
        "UPDATE hosts SET replica_id = NULL, last_seen_at = now() - $2::interval"
        " WHERE host_id = $1",
        host_id,
        age,
    )


async def submit_many(c: Clients, n: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, 500):
        answer = await c.scheduler.SubmitTasks(
            scheduler_pb2.SubmitTasksRequest(
                tasks=[
                    scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap()))
                    for _ in range(min(500, n - start))
                ]
            )
        )
        ids += [t.task_id for t in answer.tasks]
    return ids


async def cancel_all(c: Clients, task_ids: list[str]) -> None:
    for start in range(0, len(task_ids), 100):
        await asyncio.gather(
            *(
                c.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=t, reason="test"))
                for t in task_ids[start : start + 100]
            )
        )


async def rows(farm: Farm, table: str, task_ids: list[str]) -> int:
    return int(
        await (await db(farm)).fetchval(
            f"SELECT count(*) FROM {table} WHERE task_id = ANY ($1::uuid[])", task_ids
        )
    )


async def exists(c: Clients, task_id: str) -> bool:
    try:
        await c.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))
    except grpc.aio.AioRpcError as error:
        assert error.code() == grpc.StatusCode.NOT_FOUND, error
        return False
    return True


async def ran(farm: Farm, host_id: str, serial: str, outcome: int) -> str:
    """A task run on the host's device to `outcome` through the Lease API; its id."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(
            spec=actions_spec(tap()), selector=task_pb2.DeviceSelector(serial=serial)
        )
    )
    host = await farm.host(host_id, serial)
    assignment = await host.acquire_one(serial)
    await host.renew(assignment.lease_id)
    error = "" if outcome == lease_pb2.OUTCOME_DONE else "broke"
    await host.report(assignment, outcome, error=error)
    return str(task.task_id)


# -- tasks ------------------------------------------------------------------------------------


async def test_finished_tasks_past_retention_go_with_their_attempts_and_events(
    retaining: Farm,
) -> None:
    """Done, failed and cancelled tasks that finished more than --task-retention ago are
    gone, attempts and events too (GetTask: NOT_FOUND); a recent one, a queued one and a
    running one created long ago stay, with their rows; the counters count what went."""
    farm = retaining
    client = await farm.client()
    before = {k: removed_total(k) for k in ("tasks", "attempts", "task_events")}
    done = await ran(farm, "h1", "s1", lease_pb2.OUTCOME_DONE)
    failed = await ran(farm, "h2", "s2", lease_pb2.OUTCOME_FAILED)
    cancelled, recent = await submit_many(client, 2)
    await cancel_all(client, [cancelled, recent])
    queued, running = [
        (
            await client.scheduler.SubmitTask(
                scheduler_pb2.SubmitTaskRequest(
                    spec=actions_spec(tap()), selector=task_pb2.DeviceSelector(serial=serial)
                )
            )
        ).task_id
        for serial in ("nowhere", "s3")
    ]
    running_host = await farm.host("h3", "s3")
    await running_host.renew((await running_host.acquire_one("s3")).lease_id)
    await (await db(farm)).execute(
        "UPDATE tasks SET created_at = created_at - interval '90 days',"
        " updated_at = updated_at - interval '90 days' WHERE task_id = ANY ($1::uuid[])",
        [queued, running],
    )
    old = [done, failed, cancelled]
    # Events: submit, assign, acknowledge, report (x2), submit, cancel.
    assert (await rows(farm, "attempts", old), await rows(farm, "task_events", old)) == (2, 10)

    await finished_ago(farm, old, 2 * DAY)

    async def old_gone() -> bool:
        return await rows(farm, "tasks", old) == 0

    await eventually(old_gone, what="the old finished tasks deleted")
    assert await rows(farm, "attempts", old) == 0
    assert await rows(farm, "task_events", old) == 0
    for task_id in old:
        assert not await exists(client, task_id)
    kept = [recent, queued, running]
    for task_id in kept:
        assert await exists(client, task_id)
    assert [await farm.status(t) for t in kept] == ["cancelled", "queued", "dispatched"]
    assert await rows(farm, "task_events", kept) == 2 + 1 + 3
    assert await rows(farm, "attempts", [running]) == 1
    assert {k: removed_total(k) - v for k, v in before.items()} == {
        "tasks": 3,
        "attempts": 2,
        "task_events": 10,
    }


async def test_an_old_tasks_artifacts_go_with_it(retaining: Farm) -> None:
    """A finished task's screenshot goes with it, every chunk of its bytes too; reading it
    back is NOT_FOUND; the counter counts the artifact."""
    farm = retaining
    before = removed_total("artifacts")
    host, a = await dispatched(farm)
    await upload(host, upload_messages(a, bytes(range(256)) * 4096))  # 1 MiB: 4 chunks
    await host.report(a, lease_pb2.OUTCOME_DONE)
    assert await stored(farm) == (1, 4)
    await finished_ago(farm, [a.task_id], 2 * DAY)

    async def gone() -> bool:
        return await stored(farm) == (0, 0)

    await eventually(gone, what="the old task's artifact deleted")
    assert not await exists(await farm.client(), a.task_id)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await (await farm.client()).scheduler.ListArtifacts(
            scheduler_pb2.ListArtifactsRequest(task_id=a.task_id)
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert removed_total("artifacts") - before == 1


async def test_retention_deletes_a_large_backlog_in_batches_until_none_is_left(
    retaining: Farm,
) -> None:
    """1,200 old tasks go in batches of at most 500 (three at least), and all of them."""
    farm = retaining
    client = await farm.client()
    tasks, batches = removed_total("tasks"), batches_total("tasks")
    ids = await submit_many(client, 1200)
    await cancel_all(client, ids)
    await finished_ago(farm, ids, 2 * DAY)

    async def all_gone() -> bool:
        return await rows(farm, "tasks", ids) == 0

    await eventually(all_gone, timeout=30, what="1,200 old tasks deleted")
    assert await rows(farm, "task_events", ids) == 0
    assert removed_total("tasks") - tasks == 1200
    assert removed_total("task_events") >= 2400
    assert batches_total("tasks") - batches >= 3


async def test_a_batch_takes_at_most_its_limit_oldest_first(quiet: Farm) -> None:
    """Each statement removes at most its limit, the longest finished first: 500, 500,
    200, then nothing."""
    farm = quiet
    client = await farm.client()
    ids = await submit_many(client, 1200)
    await cancel_all(client, ids)
    await finished_ago(farm, ids, 2 * DAY)
    store = farm.plane.store  # type: ignore[union-attr]

    first = await store.retention.delete_old_tasks(DAY, 500)
    assert first == Removed(tasks=500, task_events=1000)
    assert await rows(farm, "tasks", ids[:500]) == 0
    assert await rows(farm, "tasks", ids[500:]) == 700
    counts = [(await store.retention.delete_old_tasks(DAY, 500)).tasks for _ in range(3)]
    assert counts == [500, 200, 0]


async def test_a_batch_skips_tasks_another_transaction_holds(quiet: Farm) -> None:
    """A task locked elsewhere (a late repeated report, a cancel) is skipped without
    waiting, and goes in a later batch once it is free."""
    farm = quiet
    client = await farm.client()
    ids = await submit_many(client, 3)
    await cancel_all(client, ids)
    await finished_ago(farm, ids, 2 * DAY)
    store = farm.plane.store  # type: ignore[union-attr]
    other = await asyncpg.connect(farm.dsn)
    try:
        async with other.transaction():
            await other.execute("SELECT 1 FROM tasks WHERE task_id = $1::uuid FOR UPDATE", ids[0])
            removed = await asyncio.wait_for(store.retention.delete_old_tasks(DAY, 500), 5)
            assert removed.tasks == 2
            assert await rows(farm, "tasks", ids) == 1
        assert (await store.retention.delete_old_tasks(DAY, 500)).tasks == 1
    finally:
        await other.close()


async def test_only_one_replica_runs_a_retention_batch_at_a_time(quiet: Farm) -> None:
    """While another replica's batch holds the retention lock, a batch removes nothing
    (and does not wait); once it is free, the next one does the work."""
    farm = quiet
    client = await farm.client()
    ids = await submit_many(client, 2)
    await cancel_all(client, ids)
    await finished_ago(farm, ids, 2 * DAY)
    await farm.host("old", "o1")
    await unseen_for(farm, "old", 2 * DAY)
    store = farm.plane.store  # type: ignore[union-attr]
    other = await asyncpg.connect(farm.dsn)
    try:
        async with other.transaction():
            await other.execute("SELECT pg_advisory_xact_lock($1, $2)", *RETENTION_LOCK)
            assert (
                await asyncio.wait_for(store.retention.delete_old_tasks(DAY, 500), 5) == Removed()
            )
            assert (
                await asyncio.wait_for(store.retention.forget_hosts(DAY, 500, "test"), 5)
                == Removed()
            )
        assert (await store.retention.delete_old_tasks(DAY, 500)).tasks == 2
        assert await store.retention.forget_hosts(DAY, 500, "test") == Removed(hosts=1, devices=1)
    finally:
        await other.close()


async def _limits(settings: Settings, rows: int) -> list[int]:
    """The limits `_batches` gives successive batches over `rows` rows due."""
    asked: list[int] = []
    left = rows

    async def batch(limit: int) -> Removed:
        nonlocal left
        asked.append(limit)
        taken = min(limit, left)
        left -= taken
        return Removed(tasks=taken)

    assert (await _batches("tasks", batch, settings)).tasks == rows
    return asked


async def test_slow_batches_shrink_and_quick_ones_stay_at_the_limit() -> None:
    """A batch slower than retention_batch_time halves the next one (a task's artifacts can
    weigh megabytes); quick ones keep the full limit; the round ends on a short batch."""
    quick = replace(RETAINING, retention_batch=500, retention_pause=timedelta(0))
    assert await _limits(replace(quick, retention_batch_time=timedelta(hours=1)), 1200) == [
        500,
        500,
        500,
    ]
    slow = replace(quick, retention_batch_time=timedelta(0))
    # 993 in the halving batches, then one at a time: 7 more, and one that finds none.
    assert await _limits(slow, 1000) == [500, 250, 125, 62, 31, 15, 7, 3] + [1] * 8


# -- hosts ------------------------------------------------------------------------------------


async def test_hosts_disconnected_past_forget_hosts_after_are_forgotten_with_their_devices(
    retaining: Farm,
) -> None:
    """A host unseen for longer than --forget-hosts-after and holding no lease leaves
    ListHosts with its devices, recorded in its history as removed by retention and why;
    one that holds a lease, one seen recently and one whose stream is open (idle, so never
    written since) stay; the counters count what went."""
    farm = retaining
    operator = await farm.operator()
    hosts, devices = removed_total("hosts"), removed_total("devices")
    await farm.host("gone", "g1", "g2")
    await farm.host("fresh", "f1")
    busy = await farm.host("busy", "b1")
    await operator.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(
            spec=actions_spec(tap()), selector=task_pb2.DeviceSelector(serial="b1")
        )
    )
    await busy.renew((await busy.acquire_one("b1")).lease_id)
    idle = await farm.host("idle", "i1")
    stream = idle.stream()
    try:
        await stream.renew()

        async def stream_recorded() -> bool:
            replica = await (await db(farm)).fetchval(
                "SELECT replica_id FROM hosts WHERE host_id = 'idle'"
            )
            return replica is not None

        await eventually(stream_recorded, what="the idle host's stream recorded")
        await (await db(farm)).execute(
            "UPDATE hosts SET last_seen_at = now() - interval '30 days' WHERE host_id = 'idle'"
        )
        await unseen_for(farm, "gone", 2 * DAY)
        await unseen_for(farm, "busy", 2 * DAY)

        async def listed() -> list[str]:
            answer = await operator.scheduler.ListHosts(scheduler_pb2.ListHostsRequest())
            return [h.host_id for h in answer.hosts]

        async def forgotten() -> bool:
            return "gone" not in await listed()

        await eventually(forgotten, what="host 'gone' forgotten")
        assert await listed() == ["busy", "fresh", "idle"]
        assert (
            await (await db(farm)).fetchval("SELECT count(*) FROM devices WHERE host_id = 'gone'")
            == 0
        )
        assert removed_total("hosts") - hosts == 1
        assert removed_total("devices") - devices == 2
        event = await (await db(farm)).fetchrow(
            "SELECT kind, actor, actor_name, reason FROM host_events WHERE host_id = 'gone'"
        )
        assert dict(event) == {
            "kind": "remove",
            "actor": "retention",
            "actor_name": "control plane",
            "reason": "not seen for 1d (--forget-hosts-after)",
        }
    finally:
        await stream.close()


async def test_a_forgotten_host_that_registers_again_is_back_with_its_devices(
    retaining: Farm,
) -> None:
    """Forgetting is not banning: the host's next registration brings it and its devices
    back, and it takes work again."""
    farm = retaining
    host = await farm.host("back", "k1")
    await unseen_for(farm, "back", 2 * DAY)

    async def forgotten() -> bool:
        count = await (await db(farm)).fetchval("SELECT count(*) FROM hosts WHERE host_id = 'back'")
        return count == 0

    await eventually(forgotten, what="host 'back' forgotten")
    await host.register("k1")
    client = await farm.client()
    await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap())))
    assert (await host.acquire_one("k1")).task_id


async def test_an_acquire_from_a_host_that_is_not_registered_is_failed_precondition(
    quiet: Farm,
) -> None:
    """A host the control plane forgot (or never knew) is told to register again
    (FAILED_PRECONDITION naming it), and nothing changes; a registered host whose phones
    are all unavailable is not: it simply gets nothing."""
    farm = quiet
    ghost = await farm.host("ghost")
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await ghost.acquire("s1", wait=0.2)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "host 'ghost' is not registered" in (info.value.details() or "")
    assert await farm.snapshot() == before
    known = await farm.host("known")
    await known.c.lease.RegisterHost(
        lease_pb2.RegisterHostRequest(
            host_id="known",
            devices=[lease_pb2.DeviceInfo(serial="k1", state=scheduler_pb2.DEVICE_STATE_OFFLINE)],
        )
    )
    assert await known.acquire("k1", wait=0.2) == []


async def test_an_agent_whose_host_was_forgotten_registers_again_and_takes_work(
    retaining: Farm,
) -> None:
    """THEN an agent that comes back after its host was forgotten (its Acquire refused as
    unregistered) registers its phones again by itself and runs the work queued for them."""
    farm = retaining
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source, host_id="comeback") as agent:
        # Set-up: the host removed as retention removes one after a long disconnection.
        await (await db(farm)).execute(
            "SELECT amc_remove_host('comeback', interval '0', 'retention', 'control plane', 'test')"
        )
        client = await farm.client()
        task_id = await submit(client, actions_spec(tap()))
        record = await finished(agent, task_id)
        assert record.result is not None and record.result.outcome is Outcome.DONE
        assert await status_is(farm, task_id, "done") == "done"
    registered = await (await db(farm)).fetchval(
        "SELECT count(*) FROM devices WHERE host_id = 'comeback'"
    )
    assert registered == 1


# -- the replica's heartbeat, which "last seen" rests on ------------------------------------


async def test_a_dead_replicas_hosts_keep_their_last_seen_when_its_row_goes(quiet: Farm) -> None:
    """When the row of a replica dead for a day is deleted, its hosts' last seen becomes
    its last heartbeat, not the older time their stream opened."""
    farm = quiet
    await farm.host("orphan", "x1")
    conn = await db(farm)
    await conn.execute(
        "INSERT INTO replicas (replica_id, started_at, seen_at)"
        " VALUES ('dead', now() - interval '40 days', now() - interval '2 days')"
    )
    await conn.execute(
        "UPDATE hosts SET replica_id = 'dead', last_seen_at = now() - interval '40 days'"
        " WHERE host_id = 'orphan'"
    )
    store: Store = farm.plane.store  # type: ignore[union-attr]
    await store.replicas.replica_gone("some-other-replica")
    row = await conn.fetchrow(
        "SELECT replica_id, now() - last_seen_at AS age FROM hosts WHERE host_id = 'orphan'"
    )
    assert row["replica_id"] is None
    assert 2 * DAY <= row["age"] < 2 * DAY + timedelta(minutes=1)
    assert await conn.fetchval("SELECT count(*) FROM replicas WHERE replica_id = 'dead'") == 0


# -- flags ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", timedelta(days=7)),
        ("12h", timedelta(hours=12)),
        ("30m", timedelta(minutes=30)),
        ("90s", timedelta(seconds=90)),
        ("1d12h", timedelta(days=1, hours=12)),
        ("1.5h", timedelta(minutes=90)),
        ("off", None),
        ("OFF", None),
        ("0", None),
        ("0d", None),
    ],
)
def test_retention_flags_take_durations_with_units_or_off(
    text: str, expected: timedelta | None
) -> None:
    """THEN the flag and its variable both read `7d`, `12h`, `30m`, `90s`, sums, and off."""
    args = parser({}).parse_args(["serve", "--task-retention", text])
    assert args.task_retention == expected
    args = parser({"AMC_FORGET_HOSTS_AFTER": text}).parse_args(["serve"])
    assert args.forget_hosts_after == expected


def test_retention_defaults_are_thirty_days_and_seven_days() -> None:
    """THEN without flags or variables, tasks are kept 30 days and hosts 7."""
    args = parser({}).parse_args(["serve"])
    assert (args.task_retention, args.forget_hosts_after) == (timedelta(days=30), timedelta(7))
    assert args.retention_interval == 60


@pytest.mark.parametrize("text", ["30", "7 days", "-1d", "1w", "d", ""])
async def test_a_retention_without_a_unit_or_malformed_is_refused(text: str) -> None:
    """A bare number is refused (seconds or days? a guess would delete history): exit 2,
    the error naming the flag and the accepted forms; nothing starts."""
    run = await control_plane("serve", f"--task-retention={text}", "--database-url", "x")
    assert run.code == 2, run
    assert "--task-retention: " in run.err, run.err
    assert "(e.g. 30d, 12h, 1m30s, or off)" in run.err or "is negative" in run.err, run.err
