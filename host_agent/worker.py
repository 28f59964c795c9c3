"""One assignment, start to end: acknowledge (first renewal) → run → report, or give the
lease back → `Finished`.

The session (`host_agent.agent`) starts one `Worker` per assignment it is given, in a task of
its own, and keeps the books (which device is busy, what finished). The worker sees the
domain `HeldAssignment` (host_agent.wire), never a protobuf message, and whatever happens it
ends with the lease forgotten by the keeper and a final word sent: a report, a release, or
nothing when the lease was already dead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc
from amc_common.statuses import Outcome
from host_agent import artifact_upload, devices, logcat, recording
from host_agent.adb_door import door_served
from host_agent.appium import AppiumServers
from host_agent.config import AgentSettings
from host_agent.devices import Device, DeviceError, DeviceLost, DeviceSource
from host_agent.fencing import HeldLease, RenewalResult
from host_agent.install import Library
from host_agent.leases import LeaseKeeper
from host_agent.log_feed import LogFeed
from host_agent.logcat import Capture
from host_agent.recording import Recorder
from host_agent.reporting import FinalCalls, ResultBatcher, release_lease
from host_agent.results import Kept, RunResult
from host_agent.retry import Delivery, RetryPolicy
from host_agent.runner import outcome_for, run
from host_agent.screencast import Screencaster
from host_agent.session import SessionSettings, run_session
from host_agent.spec import InvalidSpec, Session, TaskSpec
from host_agent.stop_token import StopReason, StopToken
from host_agent.webdriver import WebDriverSession
from host_agent.wire import HeldAssignment, report_request, step_to_proto

log = structlog.get_logger(__name__)


class Ending(enum.Enum):
    """What the agent did with an attempt it was given."""

    REPORTED = "reported"  # sent a result (see `delivery` for whether it was accepted)
    RELEASED = "released"  # gave the lease back unreported (shutdown, never acknowledged)
    DROPPED = "dropped"  # did nothing: the lease was already dead when acknowledged


@dataclass(frozen=True)
class Finished:
    """What became of an attempt: how it ended, what its run made (None when none ended)
    and how the last call about it went, the report or the release (None: no call)."""

    lease: HeldLease
    device: str
    ending: Ending
    result: RunResult | None = None
    delivery: Delivery[Any] | None = None


@dataclass(frozen=True)
class Tools:
    """What every worker of one host shares: the session's connections and settings."""

    settings: AgentSettings
    stub: lease_pb2_grpc.LeaseStub
    keeper: LeaseKeeper
    results: ResultBatcher
    source: DeviceSource
    # Reports and releases go through here, so the session awaits them before it returns.
    final: FinalCalls
    # The live screens, for a task's screen recording (None: no recording).
    screens: Screencaster | None = None
    # The app library, for install_app, push_file and a spec's apps (None: they fail).
    library: Library | None = None
    # The live tails of the runs' logs (None: no live tail; the logs are kept all the same).
    logs: LogFeed | None = None
    # The Appium servers of WebDriver sessions (None: no --appium; their sessions fail).
    appium: AppiumServers | None = None


class Worker:
    """Runs one assignment under its lease; `run()` once."""

    def __init__(
        self,
        tools: Tools,
        assignment: HeldAssignment,
        lease: HeldLease,
        *,
        cleans: bool = False,
        ran: Callable[[], None] | None = None,
    ) -> None:
        self._tools = tools
        self.assignment = assignment
        self.lease = lease
        # The host cleans the phone after the lease: its report or release says so, and the
        # control plane marks the device `cleaning` as the lease ends (host_agent.device_life).
        self._cleans = cleans
        # Called once the run is over and its result is to be reported (the phone is no
        # longer needed): its clean may start while the report goes (host_agent.agent).
        self._ran = ran
        self._log = log.bind(host_id=tools.settings.host_id)
        # time.monotonic() when the run must have ended (the task's deadline), if it has one.
        self._run_ends: float | None = None

    async def run(self) -> Finished:
        """Acknowledge, run, report or release. Never raises for a failure of its own."""
        a = self.assignment
        # Bound in this task's context only, so the runner's log lines carry them too.
        structlog.contextvars.bind_contextvars(
            device=a.device_serial, task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id
        )
        try:
            return await self._attempt()
        except Exception:
            # A bug here must not take the other devices' tasks down with it.
            self._log.exception("task worker failed; giving the lease back")
            delivery = await self._tools.final.run(self._release("host agent error"))
            return self._finished(Ending.RELEASED, None, delivery)
        finally:
            self._tools.keeper.forget(self.lease.lease_id)

    async def _attempt(self) -> Finished:
        lease, final = self.lease, self._tools.final
        answer = await self._tools.keeper.acknowledge(lease)
        if answer is not None and answer.result is RenewalResult.CONFLICT:
            self._log.warning("lease already lost at acknowledgement; dropping the task")
            return self._finished(Ending.DROPPED)
        reason = lease.token.reason
        if reason is StopReason.LEASE_LOST or reason is StopReason.SHUTDOWN:
            # No answer in time, or shutting down: nothing ran, so give the task back rather
            # than fail it.
            why = f"stopped before the first step: {reason.label}"
            delivery = await final.run(self._release(why))
            return self._finished(Ending.RELEASED, None, delivery)
        # With the token tripped CANCELLED already (by the acknowledgement or a push), the
        # runner skips every step and the device is never touched: the report says CANCELLED.
        result = await self._execute(lease.token)
        a = self.assignment
        if result.stop_reason is StopReason.SHUTDOWN:
            delivery = await final.run(self._release(StopReason.SHUTDOWN.label))
            return self._finished(Ending.RELEASED, result, delivery)
        quarantined = result.stop_reason is StopReason.QUARANTINED
        if result.stop_reason is StopReason.DEVICE_LOST or (
            quarantined and not isinstance(a.spec, Session)
        ):
            # Stopped so that the recovery ladder may reconnect or reboot the phone (or
            # because the phone went away): given back as a lost phone's task is. (A session
            # stopped for a quarantine ends failed: its client is attached to this phone.)
            said = "device quarantined" if quarantined else "device lost"
            self._log.warning(f"{said}; giving the task back", error=result.error)
            delivery = await final.run(self._release(result.error, device_lost=True))
            return self._finished(Ending.RELEASED, result, delivery)
        if result.device_lost and result.stop_reason is None:
            # The phone went away: not the task's failure. Given back as such, the control
            # plane runs it again on another phone (its infrastructure-retry budget), or
            # cancels it if a cancel came first, or fails it once the budget is spent.
            self._log.warning("device lost mid-run; giving the task back", error=result.error)
            delivery = await final.run(self._release(result.error, device_lost=True))
            return self._finished(Ending.RELEASED, result, delivery)
        if result.stop_reason is StopReason.LEASE_LOST and result.outcome is not Outcome.DONE:
            # We fenced ourselves before the control plane's expiry. A FAILED report landing
            # in that window would be accepted and fail a task that should be requeued (or
            # cancelled, if a cancel came meanwhile). Give the lease back first so the
            # control plane applies its expiry rules; the FAILED report that follows is then
            # refused as stale, which is expected.
            await final.run(self._release(StopReason.LEASE_LOST.label))
        if self._ran is not None and not result.device_lost:
            self._ran()
        carried: list[lease_pb2.KeptFile] = []
        if result.stop_reason is not StopReason.LEASE_LOST:
            carried_bytes = self._tools.keeper.timing.kept_max_bytes
            if carried_bytes > 0:
                result, carried = artifact_upload.carried(result, carried_bytes)
            # Before the report, while the lease is live: after it, the lease is over.
            budget, late = self._upload_budget()
            result = await artifact_upload.upload_kept(
                self._tools.stub, result, self.lease, budget, late
            )
        request = report_request(
            result,
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            cleans=self._cleans,
            kept=carried,
        )
        policy = RetryPolicy(total=self._tools.settings.report_timeout)
        delivery = await final.run(self._tools.results.report(request, policy))
        if carried and delivery.code is grpc.StatusCode.INVALID_ARGUMENT:
            # Refused for the files it carried: the result goes again without them.
            request = artifact_upload.without_carried(request, delivery.details or "")
            delivery = await final.run(self._tools.results.report(request, policy))
        return self._finished(Ending.REPORTED, result, delivery)

    async def _execute(self, token: StopToken) -> RunResult:
        spec = self.assignment.spec
        if isinstance(spec, InvalidSpec):
            return RunResult(
                outcome_for(False, True, token.reason), f"invalid task spec: {spec}", ()
            )
        deadline = self.assignment.deadline
        self._log.info("running task", kind=spec.kind, deadline=deadline)
        if deadline is not None:
            # The deadline stops the run as a cancel would (at the next step boundary, waits
            # interrupted), with a reason of its own: reported FAILED, "deadline exceeded".
            # Counted from when the acknowledgement was sent, so never later than the
            # control plane's count from when it recorded it.
            self._run_ends = (self.lease.acknowledged_at or time.monotonic()) + deadline
            token.trip_at(self._run_ends, StopReason.DEADLINE, self._deadline_passed)
        device = self._tools.source.device(self.assignment.device_serial)
        kept = self._recording()
        # The phone's log, kept for the attempt (host_agent.logcat), its lines followed live.
        capture = logcat.capture_for(device, device.serial, self._tools.settings.logcat_max_bytes)
        try:
            with self._recorded(kept), self._followed(capture):
                if capture is not None:
                    await capture.start()
                result = await self._run(spec, device, token, capture)
                if capture is not None:
                    result = await capture.finish(result)
        finally:
            token.disarm(StopReason.DEADLINE)
            if capture is not None:
                capture.close()
        if kept is not None:
            result = _with_recording(result, kept)
        self._log.info(
            "task finished",
            outcome=result.outcome.value,
            stop_reason=result.stop_reason.value if result.stop_reason else None,
            error=result.error,
        )
        return result

    def _recording(self) -> Recorder | None:
        asked = self.assignment.record_screen
        if asked is None or self._tools.screens is None:
            return None
        fps, frames = asked
        limit = self._tools.settings.screen_record_max_bytes
        return Recorder(recording.settings_from(fps, frames, limit))

    @contextlib.contextmanager
    def _recorded(self, kept: Recorder | None) -> Iterator[None]:
        if kept is None or self._tools.screens is None:
            yield
            return
        serial = self.assignment.device_serial
        with self._tools.screens.watch(serial, kept.settings.fps, kept.add, video=kept.video):
            yield

    @contextlib.contextmanager
    def _followed(self, capture: Capture | None) -> Iterator[None]:
        if self._tools.logs is None:
            yield
            return
        with self._tools.logs.attach(self.assignment.task_id, self.assignment.attempt, capture):
            yield

    async def _run(
        self, spec: TaskSpec, device: Device, token: StopToken, marks: Capture | None
    ) -> RunResult:
        settings = self._tools.settings
        library = self._tools.library
        failed = await self._prepare(spec.start_snapshot)
        if failed is not None:
            return failed
        if isinstance(spec, Session):
            options = SessionSettings(
                settings.shell_timeout, settings.upload_timeout, library, marks
            )
            stub, source = self._tools.stub, self._tools.source
            wd = None
            if spec.webdriver:
                wd = WebDriverSession(self._tools.appium, device.serial, token)
            try:
                async with door_served(stub, self.lease, source, device.serial, spec.adb):
                    return await run_session(
                        stub, self.lease, device, token, options, spec.apps, wd
                    )
            finally:
                if wd is not None:  # the Appium session deleted however the session ended
                    await wd.close()
        # Each step as it ends goes with the lease's next renewal (progress).
        lease_id, keeper = self.lease.lease_id, self._tools.keeper
        return await run(
            spec,
            device,
            token,
            shell_default_timeout=settings.shell_timeout,
            on_step=lambda step: keeper.progress(lease_id, step_to_proto(step)),
            library=library,
            marks=marks,
        )

    async def _prepare(self, snapshot: str) -> RunResult | None:
        """The phone brought to the snapshot the task starts from (an emulator's: its
        source's `prepare`) before the first action; a failure ends the run (a phone that
        could not be brought there is given back as lost)."""
        try:
            done = await devices.prepare(
                self._tools.source, self.assignment.device_serial, snapshot
            )
        except DeviceError as exc:
            error = f"start snapshot {snapshot}: {exc}"
            return RunResult(Outcome.FAILED, error, (), device_lost=isinstance(exc, DeviceLost))
        if done:
            self._log.info("phone prepared", did=done)
        return None

    def _deadline_passed(self) -> None:
        a = self.assignment
        self._log.warning(
            "task deadline passed: stopping at the next step boundary",
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            deadline=a.deadline,
        )

    def _upload_budget(self) -> tuple[float, str]:
        """How long the kept files may take to upload, and what to say of one that missed.

        The deadline covers the run. The control plane ends an attempt one lease TTL after
        its deadline, so a run that ended in time has that TTL for its uploads and its
        report: the uploads get what is left of it less two fencing margins (the report's
        share), and never more than --upload-timeout.
        """
        budget = self._tools.settings.upload_timeout
        late = f"uploads took longer than {budget:g}s"
        if self._run_ends is None:
            return budget, late
        timing = self._tools.keeper.timing
        grace_left = self._run_ends + timing.ttl - 2 * timing.margin - time.monotonic()
        if grace_left >= budget:
            return budget, late
        return max(0.0, grace_left), "no time left before the deadline's grace (one lease TTL) ends"

    async def _release(self, why: str, *, device_lost: bool = False) -> Delivery[Any]:
        policy = RetryPolicy(total=self._tools.settings.release_timeout)
        return await release_lease(
            self._tools.stub,
            self.lease.lease_id,
            f"host: {why}",
            policy,
            device_lost=device_lost,
            cleans=self._cleans,
        )

    def _finished(
        self,
        ending: Ending,
        result: RunResult | None = None,
        delivery: Delivery[Any] | None = None,
    ) -> Finished:
        return Finished(self.lease, self.assignment.device_serial, ending, result, delivery)


def _with_recording(result: RunResult, kept: Recorder) -> RunResult:
    """The run's screen recording kept with its last step (to be uploaded with its files)."""
    recorded = kept.kept()
    if recorded is None or not result.steps:
        return result
    kind, data, held = recorded
    last = result.steps[-1]
    last = dataclasses.replace(
        last,
        kept=(*last.kept, Kept(kind, data, recording.ACTION_INDEX)),
        data={**last.data, kind: held},
    )
    return dataclasses.replace(result, steps=(*result.steps[:-1], last))
