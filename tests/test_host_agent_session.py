"""run_session against session calls the control plane ends: while a step's answer is being
written, and while a step runs. The call here stands in for grpc.aio's (the edge): it raises
on a write as grpc.aio does once the call is over, and delivers the control plane's
messages when the test says."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from amc.v1 import lease_pb2, task_pb2
from amc_common.statuses import Outcome
from host_agent.fencing import HeldLease
from host_agent.results import StepStatus
from host_agent.session import ABANDONED, SessionSettings, run_session
from host_agent.simulated import PHONE_SIZE, SimulatedSource
from tests.support import eventually, seconds

SETTINGS = SessionSettings(shell_timeout=5, upload_timeout=5)
END_ABANDONED = lease_pb2.SessionActionsResponse(end=lease_pb2.SESSION_END_ABANDONED)


def action(pb: task_pb2.Action, **observe: bool) -> lease_pb2.SessionActionsResponse:
    return lease_pb2.SessionActionsResponse(
        action=task_pb2.SessionAction(action=pb, observe=task_pb2.Observe(**observe))
    )


class Call:
    """The control plane's messages, read as the test puts them; a step's write fails as
    `refusal` says (None: it is taken)."""

    def __init__(self, refusal: BaseException | None = None) -> None:
        self.refusal = refusal
        self.written: list[lease_pb2.SessionActionsRequest] = []
        self.messages: asyncio.Queue[Any] = asyncio.Queue()
        self.step_written = asyncio.Event()
        self.cancelled = False

    async def write(self, request: lease_pb2.SessionActionsRequest) -> None:
        if request.HasField("step"):
            self.step_written.set()
            if self.refusal is not None:
                raise self.refusal
        self.written.append(request)

    async def read(self) -> Any:
        return await self.messages.get()

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class Stub:
    def __init__(self, call: Call) -> None:
        self.call = call

    def SessionActions(self) -> Call:
        return self.call


async def run(call: Call, source: SimulatedSource) -> Any:
    lease = HeldLease("lease-1", "task-1", 1, deadline=time.monotonic() + 60)
    return await run_session(
        Stub(call),  # type: ignore[arg-type]
        lease,
        source.device("sim-0"),
        lease.token,
        SETTINGS,
    )


@pytest.mark.parametrize(
    "refusal",
    [
        asyncio.InvalidStateError("RPC already finished."),
        grpc.aio.AioRpcError(
            grpc.StatusCode.INTERNAL,
            grpc.aio.Metadata(),
            grpc.aio.Metadata(),
            "Internal error from Core",
        ),
    ],
    ids=["invalid-state", "grpc-internal"],
)
async def test_a_session_its_client_left_while_a_step_was_answered_ends_abandoned_with_the_step(
    refusal: BaseException,
) -> None:
    """THEN the step's write that finds the call over does not take the worker down (which
    would give the lease back as a host error): the session ends failed, abandoned, with
    the step it ran."""
    source = SimulatedSource(1)
    call = Call(refusal)
    call.messages.put_nowait(action(task_pb2.Action(tap=task_pb2.Tap(x=1, y=2))))
    running = asyncio.create_task(run(call, source))
    await asyncio.wait_for(call.step_written.wait(), 10)
    call.messages.put_nowait(END_ABANDONED)
    result = await asyncio.wait_for(running, 10)
    assert result.outcome is Outcome.FAILED and result.error == ABANDONED
    assert [s.name for s in result.steps] == ["tap"]
    assert [r.WhichOneof("part") for r in call.written] == ["join"]
    assert call.cancelled
    assert [a.action for a in source.actions] == ["tap"]


async def test_a_client_that_leaves_while_a_wait_runs_stops_it_at_once() -> None:
    """THEN the 30-second wait is interrupted as soon as the end arrives: the session ends
    failed, "session abandoned", within a second, its wait step (if it had begun)
    recorded as interrupted and no answer written for it (nobody is there to read it)."""
    source = SimulatedSource(1)
    call = Call()
    wait = task_pb2.Action(wait=task_pb2.Wait(duration=seconds(30)))
    call.messages.put_nowait(action(wait))
    running = asyncio.create_task(run(call, source))
    await eventually(call.messages.empty, what="the wait taken")
    started = time.monotonic()
    call.messages.put_nowait(END_ABANDONED)
    result = await asyncio.wait_for(running, 10)
    assert time.monotonic() - started < 1.0
    assert result.outcome is Outcome.FAILED and result.error == ABANDONED
    assert all(s.name == "wait" and s.status is StepStatus.FAILED for s in result.steps)
    assert all("interrupted: session abandoned" in s.error for s in result.steps)
    assert [r.WhichOneof("part") for r in call.written] == ["join"]


async def test_every_step_says_the_phones_screen_size_in_its_own_pixels() -> None:
    """THEN a step with a screenshot and one without both carry the phone's screen size
    (a simulated phone's screenshots are drawn at a third of it)."""
    source = SimulatedSource(1)
    call = Call()
    call.messages.put_nowait(action(task_pb2.Action(tap=task_pb2.Tap(x=1, y=2))))
    call.messages.put_nowait(action(task_pb2.Action(tap=task_pb2.Tap(x=3, y=4)), screenshot=True))
    running = asyncio.create_task(run(call, source))
    await eventually(lambda: len(call.written) == 3, what="both steps answered")
    call.messages.put_nowait(lease_pb2.SessionActionsResponse(end=lease_pb2.SESSION_END_CLOSED))
    result = await asyncio.wait_for(running, 10)
    assert result.outcome is Outcome.DONE
    answers = [r.step for r in call.written[1:]]
    assert [(a.screen_width, a.screen_height) for a in answers] == [PHONE_SIZE, PHONE_SIZE]
    assert answers[1].screenshot_png and not answers[0].screenshot_png
