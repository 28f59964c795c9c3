"""Interactive sessions (issue 23): Scheduler.OpenSession through the real API, relayed to a
real host agent on simulated phones over Lease.SessionActions."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from amc.v1 import scheduler_pb2, task_pb2
from amc_cli.render import spec_summary
from host_agent.simulated import SimulatedSource
from tests.support import Clients, Farm, seconds, tap, wait_action
from tests.support.agent import cancel, get, running_agent, short_ttl_farm, status_is

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
OK = task_pb2.STEP_STATUS_OK
DISPATCHED = task_pb2.TASK_STATUS_DISPATCHED


def opening(idle: float = 10.0, **fields: Any) -> scheduler_pb2.OpenSessionRequest:
    return scheduler_pb2.OpenSessionRequest(
        open=scheduler_pb2.SessionOpen(idle_timeout=seconds(idle), **fields)
    )


def act(action: task_pb2.Action, **observe: bool) -> scheduler_pb2.OpenSessionRequest:
    return scheduler_pb2.OpenSessionRequest(
        action=task_pb2.SessionAction(action=action, observe=task_pb2.Observe(**observe))
    )


async def dispatched(call: Any) -> task_pb2.Task:
    """The responses up to the one whose task is dispatched."""
    while True:
        response = await asyncio.wait_for(call.read(), 20)
        assert response is not grpc.aio.EOF
        if response.task.status == DISPATCHED:
            return response.task
        assert response.task.status in (
            task_pb2.TASK_STATUS_QUEUED,
            task_pb2.TASK_STATUS_ASSIGNED,
        ), response


async def last_task(call: Any) -> task_pb2.Task:
    """The final response's task, and the stream ends after it."""
    response = await asyncio.wait_for(call.read(), 20)
    assert response is not grpc.aio.EOF and response.HasField("task"), response
    assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF
    assert await call.code() == grpc.StatusCode.OK
    return response.task


async def task_count(client: Clients) -> int:
    return len((await client.scheduler.ListTasks(scheduler_pb2.ListTasksRequest())).tasks)


async def test_a_session_taps_and_observes_and_closing_it_ends_the_task_done(farm: Farm) -> None:
    """THEN the tap's step and the screenshot's bytes come back, the step is in the task's
    history with its kept screenshot, and closing the stream ends the task done."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        await call.write(act(tap(100, 200), screenshot=True, ui_dump=True, keep=True))
        answer = (await asyncio.wait_for(call.read(), 20)).step
        assert answer.step.status == OK and answer.step.name == "tap"
        assert answer.screenshot_png.startswith(PNG_MAGIC)
        assert "<hierarchy" in answer.ui_dump_xml
        await call.write(act(tap(1, 2)))
        second = (await asyncio.wait_for(call.read(), 20)).step
        assert second.step.index == 1 and not second.screenshot_png
        await call.done_writing()
        final = await last_task(call)
    assert final.task_id == task.task_id and final.status == task_pb2.TASK_STATUS_DONE
    steps = (await get(client, task.task_id)).result.steps
    assert [(s.index, s.name, s.status) for s in steps] == [(0, "tap", OK), (1, "tap", OK)]
    assert sorted(a.kind for a in steps[0].artifacts) == ["screenshot", "ui_dump"]
    listed = await client.scheduler.ListArtifacts(
        scheduler_pb2.ListArtifactsRequest(task_id=task.task_id)
    )
    assert len(listed.artifacts) == 2


async def test_a_session_reports_its_task_while_it_waits_with_the_pending_reason(
    farm: Farm,
) -> None:
    """THEN the first response is the queued task with why it waits; closing the stream
    before a phone was assigned withdraws it (cancelled) and nothing ran."""
    client = await farm.client()
    call = client.scheduler.OpenSession()
    await call.write(opening(selector=task_pb2.DeviceSelector(labels={"model": "Nowhere"})))
    first = (await asyncio.wait_for(call.read(), 10)).task
    assert first.status == task_pb2.TASK_STATUS_QUEUED
    assert first.pending_reason
    assert first.spec.WhichOneof("kind") == "session"
    await call.done_writing()
    final = await last_task(call)
    assert final.status == task_pb2.TASK_STATUS_CANCELLED and final.attempt == 0


async def test_an_idle_session_ends_failed_session_abandoned(farm: Farm) -> None:
    """THEN a client that sends nothing for the idle timeout gets the task failed,
    "session abandoned"."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = client.scheduler.OpenSession()
        await call.write(opening(idle=1.0))
        await dispatched(call)
        started = time.monotonic()
        final = await last_task(call)
    assert time.monotonic() - started >= 0.9
    assert final.status == task_pb2.TASK_STATUS_FAILED
    assert final.result.error == "session abandoned"


async def test_a_client_that_vanishes_ends_the_session_failed_abandoned(farm: Farm) -> None:
    """THEN the task ends failed, "session abandoned", and the phone is free again."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        call.cancel()
        await status_is(farm, task.task_id, "failed")
        assert (await get(client, task.task_id)).result.error == "session abandoned"
        device = (await farm.attempts(task.task_id))[0]["device_serial"]
        assert device == "sim-0"


async def test_a_client_that_cancels_its_call_is_never_taken_for_one_that_closed(
    farm: Farm,
) -> None:
    """THEN ten clients that vanish right after an answered action (gRPC may end their
    messages before it cancels their calls) all end their sessions failed, "session
    abandoned", none done."""
    client = await farm.client()
    task_ids = []
    async with running_agent(farm, SimulatedSource(1, delay=0.0)):
        for _ in range(10):
            call = client.scheduler.OpenSession()
            await call.write(opening())
            task_ids.append((await dispatched(call)).task_id)
            await call.write(act(tap(1, 2)))
            assert (await asyncio.wait_for(call.read(), 20)).step.step.status == OK
            call.cancel()
            await status_is(farm, task_ids[-1], "failed", "done")
    errors = [(await get(client, t)).result.error for t in task_ids]
    assert errors == ["session abandoned"] * 10


async def test_cancel_task_mid_session_ends_it_cancelled_at_the_next_action_boundary(
    farm: Farm,
) -> None:
    """THEN a running wait is interrupted, its step says cancelled, and the task ends
    cancelled."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        await call.write(act(wait_action(30)))
        await asyncio.sleep(0.3)
        started = time.monotonic()
        await cancel(client, task.task_id)
        step = (await asyncio.wait_for(call.read(), 20)).step.step
        assert step.status == task_pb2.STEP_STATUS_CANCELLED
        final = await last_task(call)
    assert time.monotonic() - started < 10
    assert final.status == task_pb2.TASK_STATUS_CANCELLED


async def test_the_hosts_lost_lease_ends_the_session_failed(database_url: str) -> None:
    """THEN the task ends failed, not cancelled, and is not requeued."""
    async with short_ttl_farm(database_url) as farm:
        client = await farm.client()
        async with running_agent(farm, SimulatedSource(1, delay=0.01)):
            call = client.scheduler.OpenSession()
            await call.write(opening())
            task = await dispatched(call)
            (attempt,) = await farm.attempts(task.task_id)
            await farm.expire_now(str(attempt["lease_id"]))
            final = await last_task(call)
    assert final.status == task_pb2.TASK_STATUS_FAILED
    assert final.attempt == 1


@pytest.mark.parametrize(
    ("first", "field"),
    [
        (scheduler_pb2.OpenSessionRequest(open=scheduler_pb2.SessionOpen()), "open.idle_timeout"),
        (act(tap()), "open"),
        (opening(idle=7200), "open.idle_timeout"),
        (opening(selector=task_pb2.DeviceSelector(labels={"model\n": "x"})), "open.selector"),
    ],
)
async def test_a_bad_first_message_is_invalid_argument_naming_the_field_and_creates_nothing(
    farm: Farm, first: scheduler_pb2.OpenSessionRequest, field: str
) -> None:
    """THEN INVALID_ARGUMENT names the field and no task was created."""
    client = await farm.client()
    call = client.scheduler.OpenSession()
    await call.write(first)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call.read(), 10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith(field)
    assert await task_count(client) == 0


async def test_a_session_task_cannot_be_submitted_as_an_ordinary_task(farm: Farm) -> None:
    """THEN SubmitTask refuses the session kind, naming spec.session."""
    client = await farm.client()
    spec = task_pb2.TaskSpec(session=task_pb2.Session(idle_timeout=seconds(5)))
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (caught.value.details() or "").startswith("spec.session")


async def test_a_session_past_its_longest_duration_ends_failed_deadline_exceeded(
    farm: Farm,
) -> None:
    """THEN the host stops it at the next action boundary: failed, "deadline exceeded"."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = client.scheduler.OpenSession()
        await call.write(opening(max_duration=seconds(1)))
        await dispatched(call)
        await call.write(act(tap(1, 2)))
        assert (await asyncio.wait_for(call.read(), 20)).step.step.status == OK
        final = await last_task(call)
    assert final.status == task_pb2.TASK_STATUS_FAILED
    assert "deadline" in final.result.error
    assert final.deadline.seconds == 1


def test_amc_shows_a_session_task_as_one() -> None:
    """THEN `amc get`/`amc list` summarise a session's spec as a session, not 0 actions."""
    spec = task_pb2.TaskSpec(session=task_pb2.Session(idle_timeout=seconds(30)))
    assert spec_summary(spec) == "interactive session (idle timeout 30s)"
