"""A session task on the host: its actions arrive one at a time from its client, relayed by
the control plane over a `Lease.SessionActions` call of its own.

The worker acknowledges the assignment as for any task, then `run_session` joins the
session under the attempt's lease and runs each action it is sent as one step (with the
screenshot and UI dump asked for after it), under the lease's StopToken: a cancel, a lost
lease, the deadline (the session's longest duration) or shutdown stops it at the next
action boundary, a running wait interrupted, exactly as in a TaskRunner. Each step goes
back at once with what was observed and the phone's screen size (the space of taps and UI
bounds); observations asked to be kept are uploaded as the task's artifacts before the step
is answered.

A session that names apps (`SessionOpen.apps`) has them installed first, before it joins
(its client waits as for any start), as its step 0 "apps": a failed install ends it failed,
and a stop during it (a cancel, a quarantine, the deadline) ends it in the words of any of
its steps; its actions' steps follow from 1.

The call is read all the time, an action running or not: the control plane ends it when
the client closed (reported done, never while an action runs), went idle (failed, "idle
timeout") or vanished (failed, "session abandoned"). A client that vanishes, or a relay
lost, trips the token (StopReason.ABANDONED) at once, so a running action stops and the
phone is freed without waiting for it. The returned RunResult holds every step, so the
task's history has them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
from typing import Any

import grpc
import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc, task_pb2
from amc_common.action_table import Action, InstallApp, Screenshot, UiDump
from amc_common.channel import write_unless_ended
from amc_common.statuses import Outcome
from amc_common.steps import label as step_label
from host_agent import artifact_upload
from host_agent.devices import Device, DeviceError
from host_agent.fencing import HeldLease
from host_agent.install import Library
from host_agent.results import RunResult, StepResult, StepStatus
from host_agent.runner import APPS_STEP, Marks, StepRunner, outcome_for
from host_agent.spec import InvalidSpec
from host_agent.stills import image_size
from host_agent.stop_token import Stopped, StopReason, StopToken
from host_agent.webdriver import WebDriverSession, w3c_error
from host_agent.wire import action_from_proto, step_to_proto

log = structlog.get_logger(__name__)
# What the report says of a session whose client left, or went idle (task.error).
ABANDONED = "session abandoned"
IDLE = "idle timeout"
# `wm size`'s answer: "Physical size: 1080x2400", then "Override size: …" when one is set.
_WM_SIZE = re.compile(r"(\d+)x(\d+)")
WM_SIZE_TIMEOUT = 5.0


@dataclasses.dataclass(frozen=True)
class SessionSettings:
    shell_timeout: float
    upload_timeout: float
    # The app library, for the install_app and push_file actions a session sends.
    library: Library | None = None
    # Told as each step begins and ends (the phone's log is marked there: host_agent.logcat).
    marks: Marks | None = None


class _Relay:
    """The control plane's side of the call, read as it comes: each action queued for the
    session (None once the client closed), and any other end recorded with the token
    tripped at once, so that a running action stops."""

    def __init__(self, call: Any, token: StopToken) -> None:
        self._call = call
        self._token = token
        self.actions: asyncio.Queue[task_pb2.SessionAction | None] = asyncio.Queue()
        # Why the session is over, when its client did not close it.
        self.ending: str | None = None

    async def read(self) -> None:
        try:
            while (message := await self._call.read()) is not grpc.aio.EOF:
                if message.WhichOneof("part") == "action":
                    self.actions.put_nowait(message.action)
                elif message.end == lease_pb2.SESSION_END_CLOSED:
                    self.actions.put_nowait(None)
                    return
                else:
                    self._over(IDLE if message.end == lease_pb2.SESSION_END_IDLE else ABANDONED)
                    return
            self._over("session relay ended")
        except grpc.aio.AioRpcError as exc:
            self._over(f"session relay lost: {exc.code().name}: {exc.details()}")

    def _over(self, why: str) -> None:
        self.ending = why
        self._token.trip(StopReason.ABANDONED)


class _ScreenSize:
    """The phone's screen in its own pixels: what the device says (a simulated phone), else
    the last screenshot's size (a real phone's screencap is full size), else `wm size`
    read once; (0, 0) when none of them is known."""

    def __init__(self, device: Device) -> None:
        self._device = device
        self._size: tuple[int, int] | None = None

    async def start(self) -> None:
        said = getattr(self._device, "screen_size", None)
        if said is not None:
            self._size = said()
            return
        try:
            answer = await self._device.shell("wm size", WM_SIZE_TIMEOUT)
        except DeviceError:
            return
        found = _WM_SIZE.findall(answer.output)
        if answer.exit_code == 0 and found:
            self._size = (int(found[-1][0]), int(found[-1][1]))

    def seen(self, screenshot: bytes | None) -> tuple[int, int]:
        if screenshot and getattr(self._device, "screen_size", None) is None:
            width, height, _ = image_size(screenshot)
            if width and height:
                self._size = (width, height)
        return self._size or (0, 0)


async def run_session(
    stub: lease_pb2_grpc.LeaseStub,
    lease: HeldLease,
    device: Device,
    token: StopToken,
    settings: SessionSettings,
    apps: tuple[InstallApp, ...] = (),
    webdriver: WebDriverSession | None = None,
) -> RunResult:
    """Run the session's actions until its client or the token ends it; its `apps` are
    installed first, as step 0, before it joins. A WebDriver session's commands go to
    `webdriver` (host_agent.webdriver)."""
    steps: list[StepResult] = []
    if token.reason is not None:
        return _stopped(token.reason, steps, "before the session started")
    runner = StepRunner(
        device,
        token,
        shell_default_timeout=settings.shell_timeout,
        library=settings.library,
        marks=settings.marks,
    )
    if apps:
        step, halted, lost = await runner.run_step(0, APPS_STEP, apps)
        steps.append(step)
        if halted is not None:
            return _stopped(halted, steps, f"during step 0 {APPS_STEP!r}")
        if lost:
            return RunResult(Outcome.FAILED, f"device lost: {step.error}", tuple(steps))
        if step.status is not StepStatus.OK:
            error = f"step 0 {APPS_STEP!r} failed: {step.error}"
            return RunResult(Outcome.FAILED, error, tuple(steps))
    call = stub.SessionActions()
    relay = _Relay(call, token)
    reader: asyncio.Task[None] | None = None
    screen = _ScreenSize(device)
    # scrcpy's server held for the session where the phone has one (host_agent.adb): its
    # input goes through the control socket once it is up, through `input` until then.
    held = contextlib.AsyncExitStack()
    holding = asyncio.create_task(_hold_control(device, held))
    try:
        join = lease_pb2.SessionJoin(
            task_id=lease.task_id, attempt=lease.attempt, lease_id=lease.lease_id
        )
        await _send(call, lease_pb2.SessionActionsRequest(join=join))
        reader = asyncio.create_task(relay.read())
        await token.race(screen.start())
        while True:
            action = await token.race(relay.actions.get())
            if action is None:
                return RunResult(Outcome.DONE, "", tuple(steps))
            if action.HasField("webdriver"):
                await _webdriver(call, webdriver, steps, action.webdriver)
                continue
            step, halted, lost = await _step(runner, len(steps), action)
            if halted is StopReason.ABANDONED:  # nobody to answer
                steps.append(dataclasses.replace(step, kept=()))
                return _ended(relay, steps)
            answer = await _observed(stub, lease, step, action.observe, screen, settings)
            steps.append(answer.step)
            await _send(call, lease_pb2.SessionActionsRequest(step=answer.pb))
            if halted is not None:
                return _stopped(halted, steps, f"during {step_label(step.index, step.name)}")
            if lost:
                return RunResult(Outcome.FAILED, f"device lost: {step.error}", tuple(steps))
    except Stopped as stop:
        if stop.reason is StopReason.ABANDONED:
            return _ended(relay, steps)
        return _stopped(stop.reason, steps, "waiting for the next action")
    finally:
        call.cancel()
        if reader is not None:
            reader.cancel()
        holding.cancel()
        with contextlib.suppress(BaseException):
            await holding
        await held.aclose()


async def _webdriver(
    call: Any,
    webdriver: WebDriverSession | None,
    steps: list[StepResult],
    command: task_pb2.WebDriverCommand,
) -> None:
    """A WebDriver command run as the session's next step, answered with Appium's reply (a
    part of a large body or answer is answered with no step of its own)."""
    step: StepResult | None
    if webdriver is None:
        error = "not a WebDriver session"
        step = StepResult(len(steps), "webdriver", StepStatus.FAILED, error=error)
        reply = w3c_error(400, "unknown command", error)
    else:
        step, reply = await webdriver.answer(len(steps), command)
    answered = task_pb2.SessionStep(webdriver=reply)
    if step is not None:
        steps.append(step)
        answered.step.CopyFrom(step_to_proto(step))
    await _send(call, lease_pb2.SessionActionsRequest(step=answered))


async def _hold_control(device: Device, held: contextlib.AsyncExitStack) -> None:
    hold = getattr(device, "hold_control", None)
    if hold is not None:
        await held.enter_async_context(hold())


async def _send(call: Any, request: lease_pb2.SessionActionsRequest) -> None:
    """A message to the control plane. A call it has ended refuses the write; the reader
    has its end (or sees it next), and the session ends by that."""
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
    screen: _ScreenSize,
    settings: SessionSettings,
) -> _Answer:
    """The step with what it saw: the last screenshot and UI dump it took, and the
    phone's screen size."""
    found = {k.kind: k.data for k in step.kept}
    if observe.keep and step.kept:
        step = await artifact_upload.upload_step(stub, step, lease, settings.upload_timeout)
    else:
        step = dataclasses.replace(step, kept=())
    pb = step_to_proto(step)
    for artifact in pb.artifacts:
        artifact.task_id, artifact.attempt = lease.task_id, lease.attempt
    width, height = screen.seen(found.get("screenshot"))
    fields: dict[str, Any] = {"screen_width": width, "screen_height": height}
    if "screenshot" in found:
        fields["screenshot_png"] = found["screenshot"]
    if "ui_dump" in found:
        fields["ui_dump_xml"] = found["ui_dump"].decode(errors="replace")
    return _Answer(step, task_pb2.SessionStep(step=pb, **fields))


def _ended(relay: _Relay, steps: list[StepResult]) -> RunResult:
    """The session its client left (or whose relay was lost): failed, saying which."""
    why = relay.ending or ABANDONED
    return RunResult(Outcome.FAILED, why, tuple(steps), StopReason.ABANDONED)


def _stopped(reason: StopReason, steps: list[StepResult], where: str) -> RunResult:
    outcome = outcome_for(False, False, reason)
    return RunResult(outcome, f"{reason.label}: {where}", tuple(steps), reason)
