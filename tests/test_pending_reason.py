"""Why a queued task waits is read from one snapshot (issue 27.2): a phone that takes the
task while GetTask reads it is never counted busy with it. And it is one classification
with one wording for every front: GetTask, ListTasks, WatchTask, OpenSession's waiting
responses and GetQueue (`amc queue`, the console) say the same for the same farm."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import asyncpg
import grpc
import pytest

from amc.v1 import admin_pb2, lease_pb2, scheduler_pb2, task_pb2
from amc_common.device_conditions import CONDITIONS as CONDITIONS_KNOWN
from control_plane import pending
from tests.support import Clients, Farm, HostClient, actions_spec, device, eventually
from tests.test_host_operations import disconnect, stay_connected
from tests.test_sessions import opening


def on_rack(rack: str) -> scheduler_pb2.SubmitTaskRequest:
    return scheduler_pb2.SubmitTaskRequest(
        spec=actions_spec(), selector=task_pb2.DeviceSelector(labels={"rack": rack})
    )


def _read(result: Any, task_id: uuid.UUID) -> bool:
    """Whether a statement's answer holds the task's row."""
    rows = result if isinstance(result, list) else [result]
    return any(isinstance(r, asyncpg.Record) and r.get("task_id") == task_id for r in rows)


def take_it_after_the_first_read(farm: Farm, task_id: str, host: HostClient, serial: str) -> None:
    """Right after the first statement that reads the task's row returns, and before the
    next one starts, `host`'s idle phone `serial` takes the task
    through a real Acquire: the worst interleaving a read made of several statements can
    meet, made certain."""
    assert farm.plane is not None
    store, wanted, armed = farm.plane.store, uuid.UUID(task_id), [True]

    def racing(real: Any) -> Any:
        async def statement(name: str, *args: Any) -> Any:
            result = await real(name, *args)
            if armed[0] and _read(result, wanted):
                armed[0] = False
                await host.acquire_one(serial)
            return result

        return statement

    # Every aggregate of the store sends its statements through the one Database.
    store.db.fetch = racing(store.db.fetch)  # type: ignore[method-assign]
    store.db.fetchrow = racing(store.db.fetchrow)  # type: ignore[method-assign]


async def test_a_task_submitted_while_a_matching_phone_is_idle_never_reads_all_busy(
    farm: Farm,
) -> None:
    host = await farm.host("h1", "p1", "p2", rack="r1")
    client = await farm.client()
    first = await client.scheduler.SubmitTask(on_rack("r1"))
    assert (await host.acquire_one("p1")).task_id == first.task_id
    task = await client.scheduler.SubmitTask(on_rack("r1"))
    take_it_after_the_first_read(farm, task.task_id, host, "p2")

    got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))

    # Read before p2 took it: queued, and p2 idle. (Read apart, the task was queued and
    # then both phones busy: "2 matching devices, all busy".)
    assert "busy" not in got.pending_reason
    assert got.status == task_pb2.TASK_STATUS_QUEUED
    assert got.pending_reason == "1 matching device is idle; its host has not taken the task yet"
    assert await farm.device_holder("h1", "p2") == task.task_id
    again = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))
    assert (again.status, again.device_serial, again.pending_reason) == (
        task_pb2.TASK_STATUS_ASSIGNED,
        "p2",
        "",
    )


async def test_a_listed_task_taken_while_the_page_is_read_gets_no_busy_reason(
    farm: Farm,
) -> None:
    host = await farm.host("h1", "p1", "p2", rack="r1")
    client = await farm.client()
    first = await client.scheduler.SubmitTask(on_rack("r1"))
    assert (await host.acquire_one("p1")).task_id == first.task_id
    task = await client.scheduler.SubmitTask(on_rack("r1"))
    take_it_after_the_first_read(farm, task.task_id, host, "p2")

    page = await client.scheduler.ListTasks(
        scheduler_pb2.ListTasksRequest(statuses=[task_pb2.TASK_STATUS_QUEUED])
    )

    # The page read it queued; p2 took it before its reason was read: no reason, rather
    # than one that says p2 is busy.
    (listed,) = [t for t in page.tasks if t.task_id == task.task_id]
    assert "busy" not in listed.pending_reason
    assert await farm.device_holder("h1", "p2") == task.task_id


async def test_a_missing_task_is_not_found(farm: Farm) -> None:
    client = await farm.client()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=str(uuid.uuid4())))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


# -- one classification, every front -------------------------------------------------------

C = scheduler_pb2


async def _health(host: HostClient, serial: str, condition: int) -> None:
    """`serial` as its host's probe judged it (what a real agent reports)."""
    await host.c.lease.ReportDeviceHealth(
        lease_pb2.ReportDeviceHealthRequest(
            host_id=host.host_id,
            devices=[lease_pb2.DeviceHealth(serial=serial, condition=condition, reason="probe")],
        )
    )


async def _charging(farm: Farm, host: HostClient, op: Clients) -> None:
    await _health(host, "s1", C.DEVICE_CONDITION_CHARGING_HOLD)


async def _too_hot(farm: Farm, host: HostClient, op: Clients) -> None:
    await _health(host, "s1", C.DEVICE_CONDITION_TOO_HOT)


async def _low_storage(farm: Farm, host: HostClient, op: Clients) -> None:
    await _health(host, "s1", C.DEVICE_CONDITION_LOW_STORAGE)


async def _quarantined(farm: Farm, host: HostClient, op: Clients) -> None:
    await _health(host, "s1", C.DEVICE_CONDITION_QUARANTINED)


async def _cordoned_device(farm: Farm, host: HostClient, op: Clients) -> None:
    await op.admin.CordonDevice(admin_pb2.CordonDeviceRequest(host_id="h1", serial="s1"))


async def _cordoned_host(farm: Farm, host: HostClient, op: Clients) -> None:
    await op.admin.CordonHost(admin_pb2.CordonHostRequest(host_id="h1"))


async def _drained_host(farm: Farm, host: HostClient, op: Clients) -> None:
    await op.admin.DrainHost(admin_pb2.DrainHostRequest(host_id="h1"))


async def _offline(farm: Farm, host: HostClient, op: Clients) -> None:
    await disconnect(farm, "h1")


async def _unauthorized(farm: Farm, host: HostClient, op: Clients) -> None:
    phone = device("s1")
    phone.state = C.DEVICE_STATE_UNAUTHORIZED
    await host.c.lease.RegisterHost(
        lease_pb2.RegisterHostRequest(host_id="h1", labels={"rack": "r1"}, devices=[phone])
    )


async def _busy(farm: Farm, host: HostClient, op: Clients) -> None:
    await op.scheduler.SubmitTask(on_rack("r1"))
    await host.acquire_one("s1")


async def _no_match(farm: Farm, host: HostClient, op: Clients) -> None:
    await host.register("s1", rack="r2")


async def _idle(farm: Farm, host: HostClient, op: Clients) -> None:
    pass


async def _mixed(farm: Farm, host: HostClient, op: Clients) -> None:
    """Four phones: s1 busy, s2 charging, s3 cordoned, s4 on a drained host."""
    await host.register("s1", "s2", "s3", rack="r1")
    await _busy(farm, host, op)
    await _health(host, "s2", C.DEVICE_CONDITION_CHARGING_HOLD)
    await op.admin.CordonDevice(admin_pb2.CordonDeviceRequest(host_id="h1", serial="s3"))
    await farm.host("h2", "s4", rack="r1")
    await op.admin.DrainHost(admin_pb2.DrainHostRequest(host_id="h2"))


# The farm: host h1 (rack=r1, connected) with phone s1; then the condition; then a task
# for rack=r1 waits. Its reason, read through every front.
CONDITIONS: list[tuple[str, Any, str]] = [
    ("charging", _charging, "1 matching phone held: 1 charging (battery low)"),
    ("too hot", _too_hot, "1 matching phone held: 1 too hot"),
    ("low storage", _low_storage, "1 matching phone held: 1 low on storage"),
    ("quarantined", _quarantined, "1 matching phone held: 1 quarantined"),
    ("cordoned device", _cordoned_device, "every matching device is cordoned"),
    ("cordoned host", _cordoned_host, "every matching host is cordoned"),
    ("drained host", _drained_host, "every matching host is drained"),
    ("offline", _offline, "every matching device is offline"),
    ("unauthorized", _unauthorized, "every matching device is offline"),
    ("busy", _busy, "1 matching device, busy"),
    ("no match", _no_match, "no registered device matches rack=r1"),
    ("idle", _idle, "1 matching device is idle; its host has not taken the task yet"),
    ("mixed", _mixed, "1 matching device, busy (1 held, 1 cordoned, 1 on a drained host)"),
]


@pytest.mark.parametrize(
    ("setup", "reason"), [c[1:] for c in CONDITIONS], ids=[c[0] for c in CONDITIONS]
)
async def test_every_front_gives_the_same_reason_for_the_same_farm(
    farm: Farm, setup: Any, reason: str
) -> None:
    """THEN GetTask, ListTasks, WatchTask, OpenSession's waiting response and GetQueue (as
    counted: `amc queue`, the console's Queue page) say the same reason for the selector."""
    assert farm.plane is not None
    op = await farm.operator()
    host = await farm.host("h1", "s1", rack="r1")
    stream = await stay_connected(farm, host)
    try:
        await setup(farm, host, op)
        task = await op.scheduler.SubmitTask(on_rack("r1"))
        got = await op.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))
        page = await op.scheduler.ListTasks(
            scheduler_pb2.ListTasksRequest(statuses=[task_pb2.TASK_STATUS_QUEUED])
        )
        (listed,) = [t for t in page.tasks if t.task_id == task.task_id]
        watch = op.scheduler.WatchTask(scheduler_pb2.WatchTaskRequest(task_id=task.task_id))
        watched = await anext(aiter(watch))
        watch.cancel()
        session = op.scheduler.OpenSession()
        await session.write(opening(selector=task_pb2.DeviceSelector(labels={"rack": "r1"})))
        waiting = (await session.read()).task
        session.cancel()
        store, window = farm.plane.store, farm.plane.settings.lease_ttl
        await eventually(lambda: store.queue.count_queue(timedelta(0), window), what="a count")
        queue = await op.scheduler.GetQueue(scheduler_pb2.GetQueueRequest())
    finally:
        await stream.close()
    (group,) = [g for g in queue.groups if dict(g.selector.labels) == {"rack": "r1"}]
    assert got.status == task_pb2.TASK_STATUS_QUEUED
    fronts = {
        "GetTask": got.pending_reason,
        "ListTasks": listed.pending_reason,
        "WatchTask": watched.pending_reason,
        "OpenSession": waiting.pending_reason,
        "GetQueue": group.waiting_because,
    }
    assert fronts == dict.fromkeys(fronts, reason)


def test_every_condition_but_ready_has_its_words() -> None:
    """THEN a held phone's condition is worded for each condition the farm knows."""
    assert set(pending.HELD_AS) == set(CONDITIONS_KNOWN) - {"ready"}
