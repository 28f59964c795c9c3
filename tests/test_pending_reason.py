"""Why a queued task waits is read from one snapshot (issue 27.2): a phone that takes the
task while GetTask reads it is never counted busy with it."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import grpc
import pytest

from amc.v1 import scheduler_pb2, task_pb2
from tests.support import Farm, HostClient, actions_spec


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
