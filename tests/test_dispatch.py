"""Targeted dispatch (issue 10): a queued task wakes only parked Acquires that can take it,
through whichever replica it was queued; nothing is woken, and the database is not asked,
when no parked host can take it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from datetime import datetime

import asyncpg
import pytest
from prometheus_client import REGISTRY

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane.dispatch import MAX_PAYLOAD, RECENT, Dispatcher, Offer, Waiter
from control_plane.lease_service import REPOLL_SPREAD
from tests.conftest import FAST
from tests.support import Clients, Farm, HostClient, actions_spec, eventually

# -- the index on its own -------------------------------------------------------------------


def _parked(d: Dispatcher, host: str, *devices: tuple[str, dict[str, str]]) -> Waiter:
    w = Waiter(host)
    d.park(w, list(devices))
    return w


def test_an_offer_wakes_only_a_waiter_whose_idle_device_matches() -> None:
    d = Dispatcher()
    a = _parked(d, "a", ("a1", {"rack": "a", "model": "p7"}))
    b = _parked(d, "b", ("b1", {"rack": "b", "model": "p7"}))
    assert d.offer(Offer("t1", None, {"rack": "b", "model": "p7"})) is b
    assert not a.woken and b.woken
    assert d.offer(Offer("t2", "a1", {})) is a
    assert d.offer(Offer("t3", None, {"rack": "c"})) is None
    assert d.offer(Offer("t4", "a1", {"rack": "b"})) is None  # serial and labels both


def test_matching_looks_at_the_rarest_label_not_every_host() -> None:
    d = Dispatcher()
    for i in range(1000):
        _parked(d, f"h{i}", (f"s{i}", {"model": "p7", "rack": f"r{i}"}))
    d.looked_at = 0
    woken = d.offer(Offer("t", None, {"model": "p7", "rack": "r777"}))
    assert woken is not None and woken.host_id == "h777"
    assert d.looked_at == 1
    d.looked_at = 0
    assert d.offer(Offer("u", None, {"model": "p8"})) is None
    assert d.looked_at == 0


def test_a_waiter_is_offered_no_more_tasks_than_it_has_idle_devices() -> None:
    d = Dispatcher()
    one = _parked(d, "one", ("s1", {"rack": "a"}))
    two = _parked(d, "two", ("s2", {"rack": "a"}))
    first = d.offer(Offer("t1", None, {"rack": "a"}))
    second = d.offer(Offer("t2", None, {"rack": "a"}))
    assert {first, second} == {one, two}
    assert d.offer(Offer("t3", None, {"rack": "a"})) is None


def test_offers_made_while_an_acquire_was_asking_the_database_are_replayed() -> None:
    d = Dispatcher()
    w = Waiter("h")
    mark = d.offered
    d.offer(Offer("t1", None, {"rack": "a"}))  # not parked yet: nobody woken
    d.offer(Offer("t2", None, {"rack": "b"}))
    d.park(w, [("s1", {"rack": "a"})])
    assert d.missed_since(mark, w)
    assert w.offered == ["t1"] and w.woken
    # More than it remembers: the waiter just looks again.
    late = Waiter("late")
    mark = d.offered
    for i in range(RECENT + 1):
        d.offer(Offer(f"x{i}", None, {"rack": "z"}))
    d.park(late, [("s9", {"rack": "q"})])
    assert d.missed_since(mark, late) and late.everything


def test_leaving_removes_a_waiter_from_every_list() -> None:
    d = Dispatcher()
    w = _parked(d, "h", ("s1", {"rack": "a"}), ("s2", {"rack": "b"}))
    d.leave(w)
    assert len(d) == 0
    assert d.offer(Offer("t", "s1", {})) is None
    assert d.offer(Offer("u", None, {"rack": "b"})) is None


def test_an_offer_too_big_for_a_notification_travels_without_its_labels() -> None:
    big = Offer("t", "s1", {f"k{i}": "v" * 100 for i in range(100)})
    replica, offer = Offer.from_payload(big.to_payload("r1"))
    assert (replica, offer.task_id, offer.serial, offer.labels) == ("r1", "t", "s1", None)
    assert len(big.to_payload("r1")) <= MAX_PAYLOAD
    small = Offer("t", None, {"rack": "a"})
    assert Offer.from_payload(small.to_payload("r1")) == ("r1", small)
    with pytest.raises(ValueError):
        Offer.from_payload(json.dumps({"r": "x"}))


# -- end to end -----------------------------------------------------------------------------


def _queries() -> float:
    return REGISTRY.get_sample_value("amc_acquire_queries_total") or 0.0


async def _submit(client: Clients, **selector: str) -> task_pb2.Task:
    serial = selector.pop("serial", "")
    return await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(
            spec=actions_spec(), selector=task_pb2.DeviceSelector(serial=serial, labels=selector)
        )
    )


async def _parked_hosts(farm: Farm, n: int) -> None:
    assert farm.plane is not None
    dispatcher = farm.plane.hub.dispatcher
    await eventually(lambda: len(dispatcher) == n, what=f"{n} parked Acquires")


async def test_a_queued_task_wakes_only_the_host_that_can_take_it(farm: Farm) -> None:
    """THEN the host of the task's rack gets it, and no other parked Acquire asks again."""
    client = await farm.client()
    hosts = [await farm.host(f"h{i}", f"h{i}-s1", rack=f"r{i}") for i in range(20)]
    parked = [asyncio.create_task(h.acquire(f"{h.host_id}-s1", wait=30)) for h in hosts]
    await _parked_hosts(farm, 20)
    before = _queries()
    task = await _submit(client, rack="r7")
    (a,) = await asyncio.wait_for(parked[7], 10)
    assert a.task_id == task.task_id and a.device_serial == "h7-s1"
    assert _queries() - before == 1  # h7's, and nobody else's
    await _parked_hosts(farm, 19)
    # A task no parked host can take wakes nobody and asks the database nothing.
    other = await _submit(client, rack="nowhere")
    await _submit(client, serial="no-such-serial")
    assert _queries() - before == 1
    assert await farm.status(other.task_id) == "queued"
    assert not any(p.done() for i, p in enumerate(parked) if i != 7)
    for p in parked:
        p.cancel()


async def test_tasks_queued_together_are_spread_over_the_hosts_that_can_take_them(
    farm: Farm,
) -> None:
    """Each woken host is offered at most one task per idle device; the rest go on."""
    client = await farm.client()
    hosts = [await farm.host(f"h{i}", f"h{i}-s1", f"h{i}-s2", rack="a") for i in range(3)]
    parked = [
        asyncio.create_task(h.acquire(f"{h.host_id}-s1", f"{h.host_id}-s2", wait=30)) for h in hosts
    ]
    await _parked_hosts(farm, 3)
    await client.scheduler.SubmitTasks(
        scheduler_pb2.SubmitTasksRequest(
            tasks=[
                scheduler_pb2.SubmitTaskRequest(
                    spec=actions_spec(), selector=task_pb2.DeviceSelector(labels={"rack": "a"})
                )
                for _ in range(6)
            ]
        )
    )
    handed = [a for r in await asyncio.wait_for(asyncio.gather(*parked), 10) for a in r]
    assert len(handed) == len({a.task_id for a in handed}) == 6


async def test_an_offer_a_busy_host_could_not_use_goes_to_another(farm: Farm) -> None:
    """A host woken for two tasks with one idle device takes one; the other task reaches
    the next host that can take it without waiting for a re-poll."""
    client = await farm.client()
    h1 = await farm.host("h1", "s1", rack="a")
    first = asyncio.create_task(h1.acquire("s1", wait=30))
    await _parked_hosts(farm, 1)
    await _submit(client, rack="a")
    (a1,) = await asyncio.wait_for(first, 10)
    # h2 parks; a task queued meanwhile must reach it at once.
    h2 = await farm.host("h2", "s2", rack="a")
    second = asyncio.create_task(h2.acquire("s2", wait=30))
    await _parked_hosts(farm, 1)
    t2 = await _submit(client, rack="a")
    (a2,) = await asyncio.wait_for(second, 10)
    assert a2.task_id == t2.task_id
    await h1.report(a1, lease_pb2.OUTCOME_DONE)


async def test_a_requeued_task_is_offered_to_a_parked_host(farm: Farm) -> None:
    client = await farm.client()
    h1 = await farm.host("h1", "s1", rack="a")
    h2 = await farm.host("h2", "s2", rack="a")
    task = await _submit(client, rack="a")
    a = await h1.acquire_one("s1")
    waiting = asyncio.create_task(h2.acquire("s2", wait=30))
    await _parked_hosts(farm, 1)
    await h1.release(a.lease_id)
    (again,) = await asyncio.wait_for(waiting, 10)
    assert (again.task_id, again.attempt) == (task.task_id, 2)


def test_a_waiter_with_no_idle_device_is_not_indexed() -> None:
    d = Dispatcher()
    _parked(d, "busy")
    assert len(d) == 0
    assert d.offer(Offer("t", None, {})) is None


async def test_a_phone_freed_by_an_expiry_wakes_the_acquire_that_listed_it(farm: Farm) -> None:
    """The host's Acquire listed s1 while a dead lease still held it: when the lease
    expires, the Acquire looks again and takes the task waiting for s1 at once."""
    client = await farm.client()
    host = await farm.host("h1", "s1", rack="a")
    old = await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(spec=actions_spec(), max_attempts=1)
    )
    (a,) = await host.acquire("s1", wait=5)
    assert a.task_id == old.task_id
    # The host restarted and offers s1 again; the database still has it held.
    waiting = asyncio.create_task(host.acquire("s1", wait=30))
    assert farm.plane is not None
    dispatcher = farm.plane.hub.dispatcher
    await eventually(lambda: dispatcher.acquires_of("h1") == 1, what="the Acquire to wait")
    task = await _submit(client, serial="s1")
    await farm.expire_now(a.lease_id)
    (got,) = await asyncio.wait_for(waiting, 10)
    assert got.task_id == task.task_id
    assert await farm.status(old.task_id) == "failed"


def test_waking_all_wakes_acquires_with_no_idle_phone_too() -> None:
    """After a missed notification (the listener reconnected) every Acquire looks again,
    also one whose phones were all held when it looked: one may have been freed since."""
    d = Dispatcher()
    busy = Waiter("busy")
    d.enter(busy)
    d.park(busy, [])
    d.wake_all()
    assert busy.woken and busy.everything


async def test_notifications_that_could_not_be_sent_are_sent_again() -> None:
    """The statement that tells the other replicas failed (the database blinked): the
    offers go again, with what came meanwhile, instead of being lost."""
    from control_plane.hub import Hub

    hub = Hub()
    sent: list[list[tuple[str, str]]] = []
    failures = [RuntimeError("connection reset")]

    async def send(batch: list[tuple[str, str]]) -> None:
        if failures:
            raise failures.pop()
        sent.append(batch)

    sender = asyncio.create_task(hub.send_outbox(send))
    try:
        hub.queued([Offer("t1", None, {"rack": "a"})])
        await eventually(lambda: sent, what="the offer to be sent again")
        (batch,) = sent
        assert [channel for channel, _ in batch] == ["amc_queued"]
        assert Offer.from_payload(batch[0][1])[1].task_id == "t1"
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender


async def test_a_task_change_is_heard_once_on_its_replica_and_once_on_another(
    database_url: str,
) -> None:
    """THEN a task submitted through replica A is heard there once, as it is committed (its
    notification's echo is not a second change: each is a read for the task's watchers),
    and once on replica B; B's cancel of it is heard once on each, A's watcher woken."""
    a, b = Farm(database_url, FAST), Farm(database_url, FAST)
    await a.start()
    await b.start()
    heard: dict[str, list[str]] = {"a": [], "b": []}
    try:
        assert a.plane is not None and b.plane is not None
        with (
            a.plane.hub.listening(lambda c, p: c == "amc_task" and heard["a"].append(p)),
            b.plane.hub.listening(lambda c, p: c == "amc_task" and heard["b"].append(p)),
        ):
            task = await (await a.client()).scheduler.SubmitTask(
                scheduler_pb2.SubmitTaskRequest(
                    spec=actions_spec(),
                    selector=task_pb2.DeviceSelector(labels={"model": "Nowhere"}),
                )
            )
            await eventually(lambda: heard["b"] == [task.task_id], what="B hears the submit")
            assert heard["a"] == [task.task_id]
            with a.plane.hub.watch(uuid.UUID(task.task_id)) as changed:
                await (await b.client()).scheduler.CancelTask(
                    scheduler_pb2.CancelTaskRequest(task_id=task.task_id, reason="test")
                )
                await asyncio.wait_for(changed.wait(), 10)
            await eventually(lambda: len(heard["a"]) == 2, what="A hears B's cancel")
            # Anything more A might hear of its own submit came before B's cancel.
            assert heard == {"a": [task.task_id] * 2, "b": [task.task_id] * 2}
    finally:
        await b.stop()
        await a.stop()


# -- offers that must not be lost (issue 21, item 5) ----------------------------------------


async def _looked_since(db: asyncpg.Connection, since: datetime) -> bool:
    """An Acquire's statement began and ended after `since` (the database's clock)."""
    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE '%amc_acquire(%'"
        " AND state = 'idle' AND query_start > $1 AND pid <> pg_backend_pid()"
    )
    return bool(await db.fetchval(sql, since))


async def test_an_offer_that_finds_its_task_briefly_locked_is_taken_when_the_lock_goes(
    farm: Farm,
) -> None:
    """The task is row-locked by a transaction that does not take it (as another Acquire's
    scan whose device was taken meanwhile) when its offer reaches the parked host: the
    host's look skips it (SKIP LOCKED). The host still takes it within moments of the lock
    going, not when its 60 s wait ends."""
    assert farm.plane is not None and farm.db is not None
    client = await farm.client()
    host = await farm.host("h1", "s1", rack="a")
    task = await _submit(client, rack="a")  # nobody parked: it stays queued
    locker = await asyncpg.connect(farm.dsn)
    try:
        lock = locker.transaction()
        await lock.start()
        await locker.execute(
            "SELECT 1 FROM tasks WHERE task_id = $1::uuid FOR UPDATE", task.task_id
        )
        parked = asyncio.create_task(host.acquire("s1", wait=60))
        await _parked_hosts(farm, 1)  # its first look skipped the locked task
        # The offer arrives, as from a replica that queued (or requeued) the task.
        sent = await farm.db.fetchval("SELECT clock_timestamp()")
        payload = Offer(task.task_id, None, {"rack": "a"}).to_payload("another-replica")
        await farm.db.execute("SELECT pg_notify('amc_queued', $1)", payload)
        db = farm.db
        await eventually(lambda: _looked_since(db, sent), what="the woken host to look")
        assert not parked.done()
        await lock.rollback()  # released without taking it
        released = time.monotonic()
        try:
            got = await asyncio.wait_for(parked, 5)
        except TimeoutError:
            raise AssertionError("the task was not taken within 5 s of its lock going") from None
        assert [a.task_id for a in got] == [task.task_id]
        assert time.monotonic() - released < 5
        assert await farm.status(task.task_id) == "assigned"
    finally:
        await locker.close()


async def test_a_parked_host_registering_labels_a_queued_task_wants_takes_it_at_once(
    farm: Farm,
) -> None:
    """A parked host re-registers its phone with labels that now match a queued task: its
    Acquire takes the task within moments, not when its 60 s wait ends."""
    client = await farm.client()
    host = await farm.host("h1", "s1", rack="old")
    parked = asyncio.create_task(host.acquire("s1", wait=60))
    await _parked_hosts(farm, 1)
    task = await _submit(client, rack="new")  # no parked host matches: nobody is woken
    assert await farm.status(task.task_id) == "queued"
    assert not parked.done()
    await host.register("s1", rack="new")
    registered = time.monotonic()
    try:
        got = await asyncio.wait_for(parked, 5)
    except TimeoutError:
        raise AssertionError("the task was not taken within 5 s of the registration") from None
    assert [a.task_id for a in got] == [task.task_id]
    assert time.monotonic() - registered < 5


async def test_parked_acquires_of_hosts_that_connected_together_come_back_spread(
    farm: Farm,
) -> None:
    """THEN 20 hosts that park at once with the same 2 s wait return spread over hundreds of
    milliseconds (the server cuts a random share of each wait, at most 40 %), and a
    wait that runs out with nothing offered asks the database nothing more: one query per
    Acquire."""
    hosts = [await farm.host(f"h{i}", f"s{i}") for i in range(20)]

    async def timed(host: HostClient) -> float:
        started = time.monotonic()
        assert await host.acquire(host.host_id.replace("h", "s"), wait=2) == []
        return time.monotonic() - started

    # A first round takes in the registrations' own wake-ups (each host's registration wakes
    # its Acquires once); the second is counted.
    await asyncio.gather(*(timed(h) for h in hosts))
    queries = REGISTRY.get_sample_value("amc_acquire_queries_total") or 0.0
    took = await asyncio.gather(*(timed(h) for h in hosts))
    assert max(took) - min(took) > 0.2, took
    assert min(took) > 2 * (1 - REPOLL_SPREAD) - 0.1, took
    assert (REGISTRY.get_sample_value("amc_acquire_queries_total") or 0.0) - queries == 20
