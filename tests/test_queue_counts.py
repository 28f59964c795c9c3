"""Reading the queue at scale (issue 20): GetQueue, ListFairShares and the queue's metrics
read the queue as counted in the background (queue_group_stats), one replica at a time and
at most every few seconds, never the backlog; the counts are the backlog's, the devices
each selector matches are counted as GetQueue always said, and a count's own cost is
bounded in time."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from amc.v1 import admin_pb2, scheduler_pb2, task_pb2
from control_plane import queue_stats
from control_plane.config import Settings
from control_plane.domain import KeyLoad, Role
from control_plane.gauges import top_keys
from control_plane.store.sql import QUERIES
from tests.support import Clients, Farm, actions_spec, eventually

S = scheduler_pb2
A = admin_pb2
TTL = timedelta(seconds=15)


def _task(*, key: str = "", serial: str = "", **labels: str) -> S.SubmitTaskRequest:
    return S.SubmitTaskRequest(
        spec=actions_spec(),
        selector=task_pb2.DeviceSelector(serial=serial, labels=labels),
        fairness_key=key,
    )


async def _submit(client: Clients, *tasks: S.SubmitTaskRequest) -> list[str]:
    answer = await client.scheduler.SubmitTasks(S.SubmitTasksRequest(tasks=list(tasks)))
    return [t.task_id for t in answer.tasks]


async def _count(farm: Farm) -> int:
    """A count now, whenever the last one was (as the loop would make it when due); the
    tasks it found queued. Tried again while the replica's own loop is counting."""
    assert farm.plane is not None
    store = farm.plane.store
    return await eventually(lambda: store.queue.count_queue(timedelta(0), TTL), what="a count")


async def _task_rows_read(db: asyncpg.Connection, sql: str, *args: Any) -> int:
    """Rows of `tasks` (its heap and its indexes) one statement reads, counted by
    PostgreSQL for its transaction: the counter after it less the counter before it (the
    counter also holds what earlier transactions of the connection read until they are
    flushed to the statistics, at most once a second)."""
    counter = (
        "SELECT sum(pg_stat_get_xact_tuples_returned(c.oid)) FROM pg_class c"
        " WHERE c.oid = 'tasks'::regclass"
        "    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'tasks'::regclass)"
    )
    async with db.transaction():
        before = await db.fetchval(counter)
        await db.fetch(sql, *args)
        after = await db.fetchval(counter)
    return int(after - before)


async def test_the_counts_are_the_backlogs_by_selector_and_key_with_the_matching_devices(
    farm: Farm,
) -> None:
    """THEN after a count GetQueue has each selector's queued tasks (its fairness keys
    summed), the total, and the devices each selector matches by use (idle, busy, the rest:
    cordoned, offline, a serial's device only), and ListFairShares each key's."""
    client = await farm.client()
    operator = await farm.operator()
    h1 = await farm.host("h1", "s1", "s2", rack="r1")
    await farm.host("h2", "s3", rack="r2")
    await operator.admin.CordonDevice(A.CordonDeviceRequest(host_id="h2", serial="s3"))
    await _submit(client, _task(rack="r1", key="qa"))
    await h1.acquire("s1")  # s1 busy
    await _submit(client, *[_task(rack="r1", key="qa") for _ in range(3)])
    await _submit(client, *[_task(rack="r1", key="ci") for _ in range(2)])
    await _submit(client, _task(rack="r2"), _task(serial="s2"), _task(serial="s2"))
    await _submit(client, _task(model="Pixel9"))
    assert await _count(farm) == 9
    queue = await operator.scheduler.GetQueue(S.GetQueueRequest())
    groups = {
        (g.selector.serial, tuple(sorted(g.selector.labels.items()))): (
            g.count,
            g.devices_idle,
            g.devices_busy,
            g.devices_unavailable,
        )
        for g in queue.groups
    }
    assert groups == {
        ("", (("rack", "r1"),)): (5, 1, 1, 0),
        ("s2", ()): (2, 1, 0, 0),
        ("", (("rack", "r2"),)): (1, 0, 0, 1),
        ("", (("model", "Pixel9"),)): (1, 0, 0, 0),
    }
    assert queue.total == 9 and queue.HasField("counted_at")
    assert queue.groups[0].waiting_because == (
        "1 matching device is idle; its host has not taken the task yet"
    )
    shares = await operator.admin.ListFairShares(A.ListFairSharesRequest())
    assert {s.fairness_key: (s.queued, s.running) for s in shares.shares} == {
        "qa": (3, 1),
        "ci": (2, 0),
        "default": (4, 0),
    }


async def test_reading_the_queue_reads_no_queued_task(farm: Farm) -> None:
    """THEN with 2,000 tasks queued, GetQueue's statement reads no row of `tasks` and
    ListFairShares' reads only the running ones: what it costs does not grow with the
    backlog."""
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2", rack="r1")
    for _ in range(4):
        await _submit(client, *[_task(rack=f"r{i % 40}", key=f"k{i % 7}") for i in range(500)])
    await host.acquire("s1", "s2")
    assert farm.db is not None
    await farm.db.execute("ANALYZE tasks")
    await _count(farm)
    assert await _task_rows_read(farm.db, QUERIES["queue_groups"], 100) == 0
    assert await _task_rows_read(farm.db, QUERIES["fair_shares"], None, 500) <= 2


async def test_one_replica_counts_at_a_time_and_not_again_within_the_period(
    farm: Farm, database_url: str
) -> None:
    """THEN a count while another transaction counts does nothing, and so does one asked
    within the period of the last; one asked after it counts."""
    assert farm.plane is not None and farm.db is not None
    store = farm.plane.store
    await _submit(await farm.client(), _task(rack="r1"))
    other = await asyncpg.connect(database_url)
    try:
        async with other.transaction():
            await other.execute("SELECT pg_advisory_xact_lock(4279619, 2)")
            assert await store.queue.count_queue(timedelta(0), TTL) is None
        assert await _count(farm) == 1
        assert await store.queue.count_queue(timedelta(hours=1), TTL) is None
        assert await _count(farm) == 1
    finally:
        await other.close()


class SlowCounts:
    """A store whose counts take `took` seconds; it records the period each was asked with."""

    def __init__(self, took: float, calls: int) -> None:
        self.took = took
        self.asked: list[timedelta] = []
        self.calls = calls
        self.done = asyncio.Event()
        self.queue = self  # the store's queue aggregate: this

    async def count_queue(self, every: timedelta, connected_within: timedelta) -> int:
        self.asked.append(every)
        await asyncio.sleep(self.took)
        if len(self.asked) >= self.calls:
            self.done.set()
        return 0


async def test_a_slow_count_stretches_the_period_so_counting_takes_a_tenth_of_a_connection() -> (
    None
):
    """THEN after a count that took 0.05 s the next is asked no sooner than 0.5 s after the
    last (ten times as long), whatever the configured period."""
    store = SlowCounts(0.05, calls=3)
    settings = Settings(queue_count_every=timedelta(seconds=0.01))
    loop = asyncio.create_task(queue_stats.keep_queue_counted(store, settings))  # type: ignore[arg-type]
    try:
        await asyncio.wait_for(store.done.wait(), 10)
    finally:
        loop.cancel()
    assert store.asked[0] == timedelta(seconds=0.01)
    assert all(every >= timedelta(seconds=0.5) for every in store.asked[1:]), store.asked


def test_the_per_key_series_are_the_busiest_keys_and_the_rest_summed_as_other() -> None:
    """THEN of 25 keys the 20 with most queued are named, the other 5 (and a key that is
    literally called `other`) summed; keys with nothing queued or running are left out."""
    loads = [KeyLoad(f"k{i:02}", i, 1, float(i)) for i in range(1, 26)]
    loads += [KeyLoad("other", 100, 0, 500.0), KeyLoad("idle", 0, 0, None)]
    shown = {k.key: k for k in top_keys(loads, 20)}
    assert len(shown) == 21
    assert set(shown) - {"other"} == {f"k{i:02}" for i in range(6, 26)}
    assert shown["other"] == KeyLoad("other", 1 + 2 + 3 + 4 + 5 + 100, 5, 500.0)


async def test_the_per_key_gauges_follow_the_count(farm: Farm) -> None:
    """THEN after a count and a refresh of the gauges, amc_fair_share_queued and
    amc_fair_share_running say each key's tasks, and amc_queue_count_age_seconds how old
    the count is."""
    assert farm.plane is not None
    client = await farm.client()
    host = await farm.host("h1", "s1")
    await _submit(client, *[_task(key="qa") for _ in range(3)])
    await host.acquire("s1")
    await _count(farm)
    await farm.plane.gauges.refresh()

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    assert sample("amc_fair_share_queued", key="qa") == 2
    assert sample("amc_fair_share_running", key="qa") == 1
    assert sample("amc_fair_share_queued", key="other") == 0
    age = sample("amc_queue_count_age_seconds")
    assert age is not None and 0 <= age < 5


@pytest.mark.parametrize("role", [Role.CLIENT])
async def test_get_queue_stays_for_operators(farm: Farm, role: Role) -> None:
    """THEN a client token is refused GetQueue, as before."""
    import grpc

    client = farm.clients(await farm.token(role))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.scheduler.GetQueue(S.GetQueueRequest())
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_the_task_gauges_read_no_finished_task(farm: Farm) -> None:
    """THEN amc_tasks says the tasks queued (as counted) and running (now), and the
    gauges' statement reads no finished task of 5,000: its cost every few seconds does not grow with
    the history kept."""
    assert farm.plane is not None and farm.db is not None
    client = await farm.client()
    host = await farm.host("h1", "s1")
    for _ in range(10):
        await _submit(client, *[_task(rack="r1") for _ in range(500)])
    await farm.db.execute(
        "SELECT amc_cancel(task_id, 'history') FROM tasks WHERE status = 'queued'"
    )
    await _submit(client, *[_task() for _ in range(3)])
    await host.acquire("s1")
    await farm.db.execute("VACUUM ANALYZE tasks")
    await _count(farm)
    await farm.plane.gauges.refresh()

    def tasks(status: str) -> float | None:
        return REGISTRY.get_sample_value("amc_tasks", {"status": status})

    assert (tasks("queued"), tasks("assigned"), tasks("dispatched")) == (2, 1, 0)
    assert tasks("cancelled") is None
    read = await _task_rows_read(farm.db, QUERIES["farm_gauges"], TTL, 20)
    assert read <= 2, f"the gauges read {read} rows of tasks (5,000 finished, 1 running)"
