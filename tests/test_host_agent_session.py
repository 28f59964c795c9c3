"""run_session against a session call the control plane ends while a step runs. The call
here stands in for grpc.aio's (the edge): it raises on a write as grpc.aio does once the
call is over, then reads its last message."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from amc.v1 import lease_pb2, task_pb2
from amc_common.statuses import Outcome
from host_agent.fencing import HeldLease
from host_agent.session import ABANDONED, SessionSettings, run_session
from host_agent.simulated import SimulatedSource


class EndedWhileAStepRan:
    """Sends one tap, then the end (the client left) before the step's answer is written,
    whose write then fails as `refusal` says."""

    def __init__(self, refusal: BaseException) -> None:
        self.refusal = refusal
        self.written: list[lease_pb2.SessionActionsRequest] = []
        self.messages = [
            lease_pb2.SessionActionsResponse(
                action=task_pb2.SessionAction(action=task_pb2.Action(tap=task_pb2.Tap(x=1, y=2)))
            ),
            lease_pb2.SessionActionsResponse(end=lease_pb2.SESSION_END_ABANDONED),
        ]
        self.cancelled = False

    async def write(self, request: lease_pb2.SessionActionsRequest) -> None:
        if request.HasField("step"):
            raise self.refusal
        self.written.append(request)

    async def read(self) -> Any:
        return self.messages.pop(0) if self.messages else grpc.aio.EOF

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class Stub:
    def __init__(self, call: EndedWhileAStepRan) -> None:
        self.call = call

    def SessionActions(self) -> EndedWhileAStepRan:
        return self.call


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
async def test_a_session_its_client_left_while_a_step_ran_ends_abandoned_with_the_step(
    refusal: BaseException,
) -> None:
    """THEN the step's write that finds the call over does not take the worker down (which
    would give the lease back as a host error): the session ends failed, abandoned, with
    the step it ran."""
    source = SimulatedSource(1)
    call = EndedWhileAStepRan(refusal)
    lease = HeldLease("lease-1", "task-1", 1, deadline=time.monotonic() + 60)
    result = await run_session(
        Stub(call),  # type: ignore[arg-type]
        lease,
        source.device("sim-0"),
        lease.token,
        SessionSettings(shell_timeout=5, upload_timeout=5),
    )
    assert result.outcome is Outcome.FAILED and result.error == ABANDONED
    assert [s.name for s in result.steps] == ["tap"]
    assert [r.WhichOneof("part") for r in call.written] == ["join"]
    assert call.cancelled
    assert [a.action for a in source.actions] == ["tap"]
