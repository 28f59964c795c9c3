"""Interactive sessions (issue 23): Scheduler.OpenSession through the real API, relayed to a
real host agent on simulated phones over Lease.SessionActions."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import grpc
import pytest

from amc.v1 import scheduler_pb2, task_pb2
from amc_cli.render import spec_summary
from control_plane.rendezvous import Relay
from host_agent.simulated import SimulatedSource
from tests.support import Clients, Farm, eventually, seconds, tap, wait_action
from tests.support.agent import cancel, get, running_agent, short_ttl_farm, status_is

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
OK = task_pb2.STEP_STATUS_OK
DISPATCHED = task_pb2.TASK_STATUS_DISPATCHED
DONE = task_pb2.TASK_STATUS_DONE


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
    """The final response's task, and the stream ends OK after it once the client closed
    its side."""
    response = await asyncio.wait_for(call.read(), 20)
    assert response is not grpc.aio.EOF and response.HasField("task"), response
    await call.done_writing()
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
    # The two observations kept, and the session's phone log (kept with its last step).
    assert sorted(a.kind for a in listed.artifacts) == ["logcat", "screenshot", "ui_dump"]


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


async def test_an_idle_session_ends_failed_idle_timeout(farm: Farm) -> None:
    """THEN a client that sends nothing for the idle timeout gets the task failed,
    "idle timeout"."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = client.scheduler.OpenSession()
        await call.write(opening(idle=1.0))
        await dispatched(call)
        started = time.monotonic()
        final = await last_task(call)
    assert time.monotonic() - started >= 0.9
    assert final.status == task_pb2.TASK_STATUS_FAILED
    assert final.result.error == "idle timeout"


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


async def test_a_client_that_says_close_has_its_session_ended_done_at_once(farm: Farm) -> None:
    """THEN a `close` after an answered action is answered by the finished task, done (no
    grace, as a mere end of the client's messages waits, in case it is a vanished
    client's), and the stream then ends OK with the client's side still open."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.0)):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        await call.write(act(tap(1, 2)))
        assert (await asyncio.wait_for(call.read(), 20)).step.step.status == OK
        await call.write(scheduler_pb2.OpenSessionRequest(close=scheduler_pb2.SessionClose()))
        response = await asyncio.wait_for(call.read(), 20)
        assert response.HasField("task"), response
        assert (response.task.task_id, response.task.status) == (task.task_id, DONE)
        assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK
    steps = (await get(client, task.task_id)).result.steps
    assert [(s.name, s.status) for s in steps] == [("tap", OK)]


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
        (opening(request_id="two words"), "open.request_id"),
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
        # Long enough for the tap to be answered on a loaded machine (with 1 s, the
        # deadline could pass before the tap and the test read the end for its step).
        await call.write(opening(max_duration=seconds(3)))
        await dispatched(call)
        await call.write(act(tap(1, 2)))
        assert (await asyncio.wait_for(call.read(), 20)).step.step.status == OK
        final = await last_task(call)
    assert final.status == task_pb2.TASK_STATUS_FAILED
    assert "deadline" in final.result.error
    assert final.deadline.seconds == 3


def test_amc_shows_a_session_task_as_one() -> None:
    """THEN `amc get`/`amc list` summarise a session's spec as a session, not 0 actions."""
    spec = task_pb2.TaskSpec(session=task_pb2.Session(idle_timeout=seconds(30)))
    assert spec_summary(spec) == "interactive session (idle timeout 30s)"


def relay_of(farm: Farm, task_id: str) -> Relay:
    """The session's relay in the replica's hub (its client is connected there)."""
    assert farm.plane is not None
    relay = farm.plane.hub.sessions.get(uuid.UUID(task_id))
    assert relay is not None
    return relay


async def test_a_malformed_action_is_refused_and_the_session_goes_on(farm: Farm) -> None:
    """THEN tap(x=-1) and a second opening are each answered `refused` INVALID_ARGUMENT
    with the validator's one line, nothing ran, and the next action runs as step 0 of a
    session that ends done."""
    client = await farm.client()
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        await call.write(act(tap(-1, 5)))
        refused = (await asyncio.wait_for(call.read(), 20)).refused
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert refused.message == "action.action.tap.x: must be between 0 and 100000"
        await call.write(opening())
        refused = (await asyncio.wait_for(call.read(), 20)).refused
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert refused.message.startswith("open:")
        await call.write(act(tap(1, 2)))
        step = (await asyncio.wait_for(call.read(), 20)).step.step
        assert (step.index, step.name, step.status) == (0, "tap", OK)
        await call.done_writing()
        final = await last_task(call)
    assert final.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in final.result.steps] == ["tap"]
    assert [(a.action, a.args) for a in source.actions] == [("tap", {"x": 1, "y": 2})]
    assert final.task_id == task.task_id


async def test_an_action_before_the_phone_is_ready_is_refused_and_the_session_waits_on(
    farm: Farm,
) -> None:
    """THEN an action sent while the task is queued is answered `refused`
    FAILED_PRECONDITION, the task stays queued (not withdrawn), and the stream goes on."""
    client = await farm.client()
    call = client.scheduler.OpenSession()
    await call.write(opening(selector=task_pb2.DeviceSelector(labels={"model": "Nowhere"})))
    queued = (await asyncio.wait_for(call.read(), 10)).task
    await call.write(act(tap()))
    refused = (await asyncio.wait_for(call.read(), 10)).refused
    assert refused.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert "DISPATCHED" in refused.message
    assert await farm.status(queued.task_id) == "queued"
    await call.done_writing()
    final = await last_task(call)
    assert final.status == task_pb2.TASK_STATUS_CANCELLED and final.attempt == 0


async def test_actions_sent_without_waiting_run_in_order_each_answered_in_turn(
    farm: Farm,
) -> None:
    """THEN five taps written back to back are five steps, answered in the order sent."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        await dispatched(call)
        for i in range(5):
            await call.write(act(tap(i, i)))
        steps = [(await asyncio.wait_for(call.read(), 20)).step.step for _ in range(5)]
        await call.done_writing()
        final = await last_task(call)
    assert [(s.index, s.status) for s in steps] == [(i, OK) for i in range(5)]
    assert final.status == task_pb2.TASK_STATUS_DONE


async def test_a_client_pipelining_thousands_of_actions_is_read_one_at_a_time(
    farm: Farm,
) -> None:
    """THEN while a 3-second wait runs, a client writing 4,000 actions of 16 KB each has at
    most one of them read into the replica (the inbox holds at most one): the rest wait in
    its own call, behind gRPC's flow control."""
    client = await farm.client()
    big = act(task_pb2.Action(input_text=task_pb2.InputText(text="x" * (16 * 1024))))
    async with running_agent(farm, SimulatedSource(1, delay=0.0)):
        call = client.scheduler.OpenSession()
        await call.write(opening(idle=60))
        task = await dispatched(call)
        relay = relay_of(farm, task.task_id)
        await call.write(act(wait_action(3)))
        written = 0

        async def flood() -> None:
            nonlocal written
            for _ in range(4000):
                await call.write(big)
                written += 1

        writer = asyncio.create_task(flood())
        most = 0
        answer = asyncio.ensure_future(call.read())
        while not answer.done():
            most = max(most, relay.unanswered)
            await asyncio.wait({answer}, timeout=0.02)
        assert answer.result().step.step.name == "wait"
        assert most <= 1, f"{most} client messages held in the replica"
        assert not writer.done() and written < 4000
        writer.cancel()
        call.cancel()


async def test_a_session_no_phone_can_take_says_why_from_its_first_response(
    farm: Farm,
) -> None:
    """THEN on a farm whose phones have other labels, the first response is the queued
    task saying that no registered device matches (as `amc submit` warns), and a queue
    timeout ends the wait: the last response is the task failed, "queue timeout"."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(2, delay=0.01)):
        await eventually(lambda: farm_devices(farm), what="the phones registered")
        call = client.scheduler.OpenSession()
        await call.write(
            opening(
                selector=task_pb2.DeviceSelector(labels={"model": "Nowhere"}),
                queue_timeout=seconds(1),
            )
        )
        first = (await asyncio.wait_for(call.read(), 10)).task
        assert first.status == task_pb2.TASK_STATUS_QUEUED
        assert first.pending_reason == "no registered device matches model=Nowhere"
        final = await last_task(call)
    assert final.status == task_pb2.TASK_STATUS_FAILED
    assert final.result.error.startswith("queue timeout")


async def farm_devices(farm: Farm) -> int:
    assert farm.db is not None
    return int(await farm.db.fetchval("SELECT count(*) FROM devices"))


async def test_every_step_of_a_session_says_the_phones_screen_size(farm: Farm) -> None:
    """THEN a tap's step and a screenshot's both carry the phone's screen in its own pixels
    (1080 x 2400 on a simulated phone), though the screenshot is drawn at 360 x 800."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = client.scheduler.OpenSession()
        await call.write(opening())
        await dispatched(call)
        await call.write(act(tap(1, 2)))
        first = (await asyncio.wait_for(call.read(), 20)).step
        await call.write(act(tap(3, 4), screenshot=True))
        second = (await asyncio.wait_for(call.read(), 20)).step
        await call.done_writing()
        await last_task(call)
    assert (first.screen_width, first.screen_height) == (1080, 2400)
    assert (second.screen_width, second.screen_height) == (1080, 2400)
    assert second.screenshot_png[16:24] == (360).to_bytes(4, "big") + (800).to_bytes(4, "big")
