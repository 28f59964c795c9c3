"""An operator's maintenance session (SessionOpen.maintenance): it takes its phone while the
phone is cordoned or its host drained, never a phone running a task; for operators only,
naming one phone. Through the real API, on a real host agent's simulated phones."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from amc.v1 import admin_pb2, scheduler_pb2, task_pb2
from amc_common.device_selector import HOST_LABEL
from host_agent.simulated import SimulatedSource
from tests.support import Clients, Farm, actions_spec, eventually, seconds, tap, wait_action
from tests.support.agent import running_agent, status_is, submit
from tests.test_host_operations import named_operator
from tests.test_sessions import act, dispatched, last_task, opening

DONE = task_pb2.TASK_STATUS_DONE
# An agent whose Acquires park longer than a session waits (dispatched: 20 s): only a wake-up
# brings it the session in time.
PARKED = {"acquire_wait": 60.0}


def maintenance(host_id: str, serial: str, **fields: Any) -> scheduler_pb2.OpenSessionRequest:
    selector = task_pb2.DeviceSelector(serial=serial, labels={HOST_LABEL: host_id})
    return opening(selector=selector, maintenance=True, **fields)


async def tapped(call: Any) -> task_pb2.StepResult:
    await call.write(act(tap(5, 5)))
    answer = await asyncio.wait_for(call.read(), 20)
    return answer.step.step


async def test_a_maintenance_session_takes_a_cordoned_phone_and_queued_work_does_not(
    farm: Farm,
) -> None:
    """THEN the cordoned phone runs the operator's session (its spec says maintenance, its
    submitter is the operator's token's name) while a task queued for it stays queued, and
    the phone is cordoned still once the session ended."""
    op, _ = await named_operator(farm, "alice")
    # Its Acquires park for longer than the test waits: the session's opening wakes them.
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id="lab1", **PARKED):
        await op.admin.CordonDevice(
            admin_pb2.CordonDeviceRequest(host_id="lab1", serial="sim-0", reason="flaky")
        )
        queued = await submit(op, actions_spec(tap()), selector=serial_selector("sim-0"))
        call = op.scheduler.OpenSession()
        await call.write(maintenance("lab1", "sim-0"))
        task = await dispatched(call)
        assert task.spec.session.maintenance and task.submitted_by == "alice"
        assert (task.host_id, task.device_serial) == ("lab1", "sim-0")
        assert (await tapped(call)).status == task_pb2.STEP_STATUS_OK
        assert await farm.status(queued) == "queued"
        await call.done_writing()
        assert (await last_task(call)).status == DONE
        assert farm.db is not None
        row = await farm.db.fetchrow("SELECT cordoned, task_id FROM devices WHERE host_id = 'lab1'")
        assert (row["cordoned"], row["task_id"]) == (True, None)
        assert await farm.status(queued) == "queued"


async def test_a_maintenance_session_takes_a_phone_of_a_drained_host(farm: Farm) -> None:
    """THEN a drained host's idle phone is offered still, and given the operator's session
    alone."""
    op, _ = await named_operator(farm)
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source, host_id="lab1", **PARKED) as agent:
        await op.admin.DrainHost(admin_pb2.DrainHostRequest(host_id="lab1", reason="update"))
        await eventually(lambda: agent.drained_by_centre, what="the agent to hear the drain")
        call = op.scheduler.OpenSession()
        await call.write(maintenance("lab1", "sim-0", queue_timeout=seconds(10)))
        task = await dispatched(call)
        assert (await tapped(call)).status == task_pb2.STEP_STATUS_OK
        await call.done_writing()
        assert (await last_task(call)).task_id == task.task_id


async def test_a_maintenance_session_never_takes_a_phone_running_a_task(farm: Farm) -> None:
    """THEN while the cordoned phone runs a task, the session waits, and its queue timeout
    ends it failed; the task runs on."""
    op, _ = await named_operator(farm)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id="lab1"):
        busy = await submit(op, actions_spec(wait_action(60)))
        await status_is(farm, busy, "dispatched")
        await op.admin.CordonDevice(
            admin_pb2.CordonDeviceRequest(host_id="lab1", serial="sim-0", reason="look")
        )
        call = op.scheduler.OpenSession()
        await call.write(maintenance("lab1", "sim-0", queue_timeout=seconds(1)))
        final = await _final(call)
        assert final.status == task_pb2.TASK_STATUS_FAILED
        assert "queue timeout" in final.result.error
        assert await farm.status(busy) == "dispatched"


async def test_a_plain_session_does_not_take_a_cordoned_phone(farm: Farm) -> None:
    """THEN without `maintenance` the cordon holds: its queue timeout ends the session."""
    op, _ = await named_operator(farm)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id="lab1"):
        await op.admin.CordonDevice(
            admin_pb2.CordonDeviceRequest(host_id="lab1", serial="sim-0", reason="look")
        )
        call = op.scheduler.OpenSession()
        selector = task_pb2.DeviceSelector(serial="sim-0", labels={HOST_LABEL: "lab1"})
        await call.write(opening(selector=selector, queue_timeout=seconds(1)))
        final = await _final(call)
        assert (final.status, final.attempt) == (task_pb2.TASK_STATUS_FAILED, 0)


@pytest.mark.parametrize(
    ("labels", "serial"),
    [({}, "sim-0"), ({HOST_LABEL: "lab1"}, ""), ({HOST_LABEL: "lab1", "rack": "r1"}, "sim-0")],
)
async def test_a_maintenance_session_names_one_phone(
    farm: Farm, labels: dict[str, str], serial: str
) -> None:
    """THEN a selector that is not a serial and its host is INVALID_ARGUMENT naming
    open.maintenance, and nothing is queued."""
    op = await farm.operator()
    call = op.scheduler.OpenSession()
    selector = task_pb2.DeviceSelector(serial=serial, labels=labels)
    await call.write(opening(selector=selector, maintenance=True))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "open.maintenance" in (refused.value.details() or "")
    assert await _tasks(op) == 0


async def test_a_client_may_not_open_a_maintenance_session(farm: Farm) -> None:
    client = await farm.client()
    call = client.scheduler.OpenSession()
    await call.write(maintenance("lab1", "sim-0"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "maintenance" in (refused.value.details() or "")
    assert await _tasks(client) == 0


def serial_selector(serial: str) -> task_pb2.DeviceSelector:
    return task_pb2.DeviceSelector(serial=serial)


async def _final(call: Any) -> task_pb2.Task:
    """The session's finished task, whatever came before it."""
    while True:
        response = await asyncio.wait_for(call.read(), 20)
        assert response is not grpc.aio.EOF
        if response.task.status in (DONE, task_pb2.TASK_STATUS_FAILED):
            call.cancel()
            return response.task


async def _tasks(client: Clients) -> int:
    return len((await client.scheduler.ListTasks(scheduler_pb2.ListTasksRequest())).tasks)
