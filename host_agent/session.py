"""A session task on the host: its actions arrive one at a time from its client, relayed by
the control plane over a `Lease.SessionActions` call of its own.

The worker acknowledges the assignment as for any task, then `run_session` joins the
session under the attempt's lease and runs each action it is sent as one step (with the
screenshot and UI dump asked for after it), under the lease's StopToken: a cancel, a lost
lease, the deadline (the session's longest duration) or shutdown stops it at the next
action boundary, a running wait interrupted, exactly as in a TaskRunner. Each step goes
back at once with what was observed; observations asked to be kept are uploaded as the
task's artifacts before the step is answered. The control plane ends the call when the
client closed (reported done) or left (failed, "session abandoned"); the returned
RunResult holds every step, so the task's history has them all.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc
import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc, task_pb2
from amc_common.action_table import Action, Screenshot, UiDump
from amc_common.channel import write_unless_ended
from amc_common.statuses import Outcome
from host_agent import artifact_upload
from host_agent.devices import Device
from host_agent.fencing import HeldLease
from host_agent.results import RunResult, StepResult, StepStatus
from host_agent.runner import StepRunner, outcome_for
from host_agent.spec import InvalidSpec
from host_agent.stop_token import Stopped, StopReason, StopToken
from host_agent.wire import action_from_proto, step_to_proto

log = structlog.get_logger(__name__)
ABANDONED = "session abandoned"


@dataclasses.dataclass(frozen=True)
class SessionSettings:
    shell_timeout: float
    upload_timeout: float


async def run_session(
    stub: lease_pb2_grpc.LeaseStub,
    lease: HeldLease,
    device: Device,
    token: StopToken,
    settings: SessionSettings,
) -> RunResult:
    """Run the session's actions until its client or the token ends it."""
    if token.reason is not None:
        return _stopped(token.reason, [], "before the session started")
    call = stub.SessionActions()
    runner = StepRunner(device, token, shell_default_timeout=settings.shell_timeout)
    steps: list[StepResult] = []
    try:
        join = lease_pb2.SessionJoin(
            task_id=lease.task_id, attempt=lease.attempt, lease_id=lease.lease_id
        )
        await _send(call, lease_pb2.SessionActionsRequest(join=join))
        while True:
            try:
                message = await token.race(call.read())
            except Stopped as stop:
                return _stopped(stop.reason, steps, "waiting for the next action")
            except grpc.aio.AioRpcError as exc:
                if token.reason is not None:  # stopped first (a cancel seen): that wins
                    return _stopped(token.reason, steps, "waiting for the next action")
                why = f"session relay lost: {exc.code().name}: {exc.details()}"
                return RunResult(Outcome.FAILED, why, tuple(steps))
            if message is grpc.aio.EOF:
                if token.reason is not None:
                    return _stopped(token.reason, steps, "waiting for the next action")
                return RunResult(Outcome.FAILED, "session relay ended", tuple(steps))
            if message.WhichOneof("part") == "end":
                if message.end == lease_pb2.SESSION_END_CLOSED:
                    return RunResult(Outcome.DONE, "", tuple(steps))
                return RunResult(Outcome.FAILED, ABANDONED, tuple(steps))
            step, halted, lost = await _step(runner, len(steps), message.action)
            answer = await _observed(stub, lease, step, message.action.observe, settings)
            steps.append(answer.step)
            await _send(call, lease_pb2.SessionActionsRequest(step=answer.pb))
            if halted is not None:
                return _stopped(halted, steps, f"during step {step.index} {step.name!r}")
            if lost:
                return RunResult(Outcome.FAILED, f"device lost: {step.error}", tuple(steps))
    finally:
        call.cancel()


async def _send(call: Any, request: lease_pb2.SessionActionsRequest) -> None:
    """A message to the control plane. A call it has ended (the client left while a step
    ran) refuses the write; the next read says how it ended, and the session ends by that."""
    if not await write_unless_ended(call, request):
        log.info("session call ended before a write")


async def _step(
    runner: StepRunner, index: int, pb: task_pb2.SessionAction
) -> tuple[StepResult, StopReason | None, bool]:
    try:
        action = action_from_proto(pb.action)
    except InvalidSpec as exc:
        kind = pb.action.WhichOneof("kind") or "action"
        return StepResult(index, kind, StepStatus.FAILED, error=str(exc)), None, False
    actions: tuple[Action, ...] = (action,)
    if pb.observe.screenshot:
        actions += (Screenshot(),)
    if pb.observe.ui_dump:
        actions += (UiDump(),)
    return await runner.run_step(index, action.kind, actions)


@dataclasses.dataclass(frozen=True)
class _Answer:
    step: StepResult  # as the report will carry it: no bytes
    pb: task_pb2.SessionStep


async def _observed(
    stub: lease_pb2_grpc.LeaseStub,
    lease: HeldLease,
    step: StepResult,
    observe: task_pb2.Observe,
    settings: SessionSettings,
) -> _Answer:
    """The step with what it saw: the last screenshot and UI dump it took."""
    found = {k.kind: k.data for k in step.kept}
    if observe.keep and step.kept:
        step = await artifact_upload.upload_step(stub, step, lease, settings.upload_timeout)
    else:
        step = dataclasses.replace(step, kept=())
    pb = step_to_proto(step)
    for artifact in pb.artifacts:
        artifact.task_id, artifact.attempt = lease.task_id, lease.attempt
    fields: dict[str, Any] = {}
    if "screenshot" in found:
        fields["screenshot_png"] = found["screenshot"]
    if "ui_dump" in found:
        fields["ui_dump_xml"] = found["ui_dump"].decode(errors="replace")
    return _Answer(step, task_pb2.SessionStep(step=pb, **fields))


def _stopped(reason: StopReason, steps: list[StepResult], where: str) -> RunResult:
    outcome = outcome_for(False, False, reason)
    return RunResult(outcome, f"{reason.label}: stopped {where}", tuple(steps), reason)
