"""One fake host of the fleet workload: what host_agent.agent.Agent and LeaseKeeper do on the
wire, without running anything on a phone.

    RegisterHost(host_id, {pool, rack}, 4 devices)
    one RenewLeases stream, for good: one request opens it; then every renew interval a
        request naming every held lease (none held: nothing, as the agent), and at once one
        naming the leases not acknowledged yet when an assignment arrives
    one Acquire(idle serials, wait 60 s: the agent's default; or the `acquire_wait` given)
        parked at a time, again as soon as it returns
    a ScreenFrames call only when asked (host_agent.screencast.Screencaster): a push with
        `screen_wanted` on the renewal stream opens it (one request naming the host); the
        watched sets the control plane sends are read and dropped, no frame goes up, and
        it is closed after SCREEN_LINGER with nothing watched (or by stop()). Nobody
        watches a bench host's phones, so none is ever opened: an idle host holds no call
    a workflow assignment (the load's busy phones, issue 27.8, when `step_every` > 0): a
        step "ends" every `step_every` seconds, sent with the lease's next renewal as the
        agent sends its progress, until the task's cancel reaches the host (then reported
        CANCELLED)
    condition changes (issue 22, once `churn()` is called with a share > 0): a share of the
        host's phones a minute (a Poisson process per host, from a random point, so that
        hosts never change in step) turn not ready (too hot or charging hold); the host's
        probe round (every PROBE_ROUND s, each host at its own phase) sends what changed
        in one Lease.ReportDeviceHealth, and a phone turned not ready is ready again at the
        first round at least one round later, so the phones are held only a short while
    any other assignment: acknowledge (its first renewal, answered RENEWED) -> hold the phone for
        `work_seconds` (0: none; the flood's one-second tasks) -> report DONE through the
        agent's own ResultBatcher (results ending together go in one ReportResults) -> the
        device is idle again

All of it is in this class, so that a change of the lease protocol (e.g. a batched report
RPC) changes one place: `_report` is where results leave the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
from google.protobuf import duration_pb2

from amc.v1 import lease_pb2, lease_pb2_grpc, scheduler_pb2, task_pb2
from amc_testing.host import (
    Outcome,
    ResultBatcher,
    RetryPolicy,
    RunResult,
    StepResult,
    StepStatus,
    report_request,
)

# host_agent's defaults: AgentSettings.acquire_wait, registration.CALL_TIMEOUT.
ACQUIRE_WAIT = 60.0
CALL_TIMEOUT = 10.0
# How long an assignment may wait for its acknowledgement's answer before the host gives up
# on it (the agent fences by the lease deadline; here it is an error to count).
ACK_TIMEOUT = 30.0
REPORT_POLICY = RetryPolicy(total=CALL_TIMEOUT, call_timeout=CALL_TIMEOUT)
# The agent's probe interval (AgentSettings.probe_interval): a round sends what changed.
PROBE_ROUND = 10.0
# (condition, reason, battery %, °C) of a phone turned not ready.
NOT_READY = (
    (scheduler_pb2.DEVICE_CONDITION_TOO_HOT, "temperature 46.0 °C above 45 °C", 60, 46.0),
    (scheduler_pb2.DEVICE_CONDITION_CHARGING_HOLD, "battery 19 % below 20 %", 19, 35.0),
)
# After a failed Acquire or a broken stream (not expected in a run): wait, then again.
RETRY_AFTER = 0.5
# host_agent.screencast.SCREEN_LINGER: a ScreenFrames call with nothing watched this long
# is closed.
SCREEN_LINGER = 30.0


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


@dataclass
class Counters:
    """What went wrong, over all hosts (a clean run has only zeros)."""

    acquire_errors: int = 0
    stream_errors: int = 0
    report_errors: int = 0
    conflicts: int = 0
    ack_timeouts: int = 0
    health_errors: int = 0
    screen_errors: int = 0
    # ScreenFrames calls open now (a call counts from its first answer: the control plane
    # holds the host's feed).
    screen_calls: int = 0
    # Issue 22: ReportDeviceHealth calls and the phones' condition changes they carried,
    # by phase.
    health_reports: dict[str, int] = field(default_factory=dict)
    health_changes: dict[str, int] = field(default_factory=dict)
    # Busy phones (workflow tasks sending step progress) running now; steps sent in all.
    busy: int = 0
    steps_sent: int = 0
    # "<phase> <what> <code>" -> count; the phase is the load client's (connect, idle, ...).
    by_kind: dict[str, int] = field(default_factory=dict)
    last_error: str = ""
    phase: str = "connect"
    # How long the failed calls had run (Acquire).
    failed_after_s: list[float] = field(default_factory=list)
    # Acquire calls answered, and those answered empty (a long poll that ran out: the
    # host asks again at once, a re-poll), by phase.
    acquires: dict[str, int] = field(default_factory=dict)
    repolls: dict[str, int] = field(default_factory=dict)

    def answered(self, assignments: int) -> None:
        self.acquires[self.phase] = self.acquires.get(self.phase, 0) + 1
        if not assignments:
            self.repolls[self.phase] = self.repolls.get(self.phase, 0) + 1

    def error(self, what: str, exc: BaseException, after: float | None = None) -> None:
        setattr(self, what, getattr(self, what) + 1)
        if after is not None:
            self.failed_after_s.append(round(after, 3))
        code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else type(exc).__name__
        kind = f"{self.phase} {what} {code}"
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        details = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        self.last_error = f"{kind}: {details}"[:500]

    def total(self) -> int:
        return sum(
            (self.acquire_errors, self.stream_errors, self.report_errors, self.conflicts,
             self.ack_timeouts, self.health_errors, self.screen_errors)
        )  # fmt: skip

    def reported(self, changes: int) -> None:
        self.health_reports[self.phase] = self.health_reports.get(self.phase, 0) + 1
        self.health_changes[self.phase] = self.health_changes.get(self.phase, 0) + changes


# on_assigned(task_id, monotonic time the Acquire answer arrived); on_done(task_id, time).
Observer = Callable[[str, float], None]


@dataclass(eq=False)
class _Lease:
    assignment: lease_pb2.Assignment
    answered: asyncio.Future[int] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


class FleetHost:
    def __init__(
        self,
        host_id: str,
        labels: dict[str, str],
        channel: grpc.aio.Channel,
        *,
        devices: int,
        counters: Counters,
        on_assigned: Observer,
        on_done: Observer,
        acquire_wait: float = ACQUIRE_WAIT,
        work_seconds: float = 0.0,
        step_every: float = 3.0,
    ) -> None:
        self.host_id = host_id
        self.step_every = step_every
        # Steps that ended, not sent yet (they go with their lease's next renewal); the
        # running workflows' leases, each with its next step's index.
        self._steps: list[lease_pb2.StepProgress] = []
        self._workflows: dict[str, int] = {}
        self.acquire_wait = acquire_wait
        self.work_seconds = work_seconds
        self.labels = labels
        self.serials = [f"d{i}" for i in range(devices)]
        self._stub = lease_pb2_grpc.LeaseStub(channel)
        self._results = ResultBatcher(self._stub)
        self._counters = counters
        self._on_assigned = on_assigned
        self._on_done = on_done
        self._interval = 5.0  # replaced by RegisterHost's answer
        self._busy: set[str] = set()
        self._held: dict[str, _Lease] = {}
        self._seq = itertools.count(1)
        self._wake = asyncio.Event()  # a new lease to acknowledge
        self._idle_again = asyncio.Event()  # a device became idle
        self._screen_wanted = asyncio.Event()  # pushed screen_wanted: open the screen call
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        # (from, until) on the monotonic clock of each span a phone of this host was said
        # not ready (until: inf while it still is): a task for this host's rack may wait
        # for the phone rather than for AMC.
        self.not_ready: list[list[float]] = []

    def had_phone_not_ready(self, start: float, end: float) -> bool:
        """A phone of this host was not ready at some time in [start, end]."""
        return any(f <= end and u >= start for f, u in self.not_ready)

    async def register(self) -> None:
        devices = [
            lease_pb2.DeviceInfo(
                serial=s,
                state=scheduler_pb2.DEVICE_STATE_DEVICE,
                model="Simulated",
                manufacturer="AMC",
                sdk=34,
                abi="x86_64",
            )
            for s in self.serials
        ]
        request = lease_pb2.RegisterHostRequest(
            host_id=self.host_id, labels=self.labels, devices=devices
        )
        answer = await self._stub.RegisterHost(request, timeout=60)
        self._interval = answer.renew_interval.ToTimedelta().total_seconds() or self._interval

    def start(self) -> None:
        """The renewal stream, the Acquire loop and the ScreenFrames call (when asked),
        until stop()."""
        self._spawn(self._stream_loop())
        self._spawn(self._acquire_loop())
        self._spawn(self._screen_loop())
        if self.step_every > 0:
            self._spawn(self._step_loop())

    def churn(self, share: float) -> None:
        """From now on, `share` of the phones a minute change condition (issue 22)."""
        if share > 0:
            self._spawn(self._condition_loop(len(self.serials) * share / 60.0))

    async def stop(self) -> None:
        self._stopping = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- taking work -----------------------------------------------------------------------

    async def _acquire_loop(self) -> None:
        wait = _duration(self.acquire_wait)
        while not self._stopping:
            self._idle_again.clear()
            idle = [s for s in self.serials if s not in self._busy]
            if not idle:
                await self._idle_again.wait()
                continue
            request = lease_pb2.AcquireRequest(host_id=self.host_id, idle_serials=idle, wait=wait)
            called = time.monotonic()
            try:
                answer = await self._stub.Acquire(request, timeout=self.acquire_wait + CALL_TIMEOUT)
            except grpc.aio.AioRpcError as exc:
                if self._stopping:
                    return
                self._counters.error("acquire_errors", exc, time.monotonic() - called)
                await asyncio.sleep(RETRY_AFTER)
                continue
            received = time.monotonic()
            self._counters.answered(len(answer.assignments))
            for a in answer.assignments:
                self._on_assigned(a.task_id, received)
                self._busy.add(a.device_serial)
                self._spawn(self._work(a))

    async def _work(self, a: lease_pb2.Assignment) -> None:
        lease = _Lease(a)
        self._held[a.lease_id] = lease
        self._wake.set()
        try:
            try:
                result = await asyncio.wait_for(asyncio.shield(lease.answered), ACK_TIMEOUT)
            except TimeoutError:
                self._counters.ack_timeouts += 1
                return
            if result != lease_pb2.RENEWAL_RESULT_RENEWED:
                self._counters.conflicts += 1
                return
            if a.spec.HasField("workflow"):
                await self._run_workflow(a, lease)
                return
            if self.work_seconds > 0:
                await asyncio.sleep(self.work_seconds)
            if await self._report(a):
                self._on_done(a.task_id, time.monotonic())
        finally:
            self._held.pop(a.lease_id, None)
            self._busy.discard(a.device_serial)
            self._idle_again.set()

    async def _run_workflow(self, a: lease_pb2.Assignment, lease: _Lease) -> None:
        """A phone running a long workflow (its steps come from the host's `_step_loop`),
        until the task's cancel arrives; then reported CANCELLED."""
        self._counters.busy += 1
        self._workflows[a.lease_id] = 0
        try:
            await lease.cancelled.wait()
            self._workflows.pop(a.lease_id, None)
            await self._report(a, Outcome.CANCELLED)
        finally:
            self._workflows.pop(a.lease_id, None)
            self._counters.busy -= 1

    async def _step_loop(self) -> None:
        """Every `step_every` seconds (from a random point of the first period, so the
        hosts' steps spread) a step of each running workflow ends: queued to go with the
        next renewal. One timer per host, and one message built per step, so that playing
        thousands of phones costs the load client little."""
        await asyncio.sleep(random.uniform(0, self.step_every))
        while not self._stopping:
            now = datetime.now(UTC)
            for lease_id, index in list(self._workflows.items()):
                step = task_pb2.StepResult(
                    index=index, name=f"step {index}", status=task_pb2.STEP_STATUS_OK
                )
                step.started_at.FromDatetime(now - timedelta(seconds=self.step_every))
                step.duration.FromTimedelta(timedelta(seconds=self.step_every))
                self._steps.append(lease_pb2.StepProgress(lease_id=lease_id, step=step))
                self._workflows[lease_id] = index + 1
            await asyncio.sleep(self.step_every)

    async def _condition_loop(self, rate: float) -> None:
        """Condition changes at `rate` a second (exponential gaps), sent by probe rounds:
        each round that saw a change sends all of the round's changes in one call."""
        rng = random.Random()
        round_at = time.monotonic() + rng.uniform(0, PROBE_ROUND)  # this host's phase
        next_change = time.monotonic() + rng.expovariate(rate)
        held: dict[str, float] = {}  # not ready -> from when it is ready again
        spans: dict[str, list[float]] = {}  # its span in self.not_ready
        while not self._stopping:
            due = min([next_change, *held.values()])
            if due > round_at:
                round_at += math.ceil((due - round_at) / PROBE_ROUND) * PROBE_ROUND
            await asyncio.sleep(max(0.0, round_at - time.monotonic()))
            changed: list[lease_pb2.DeviceHealth] = []
            for serial, ready_at in list(held.items()):
                if ready_at <= round_at:
                    del held[serial]
                    span = spans.pop(serial)
                    span[1] = time.monotonic()
                    changed.append(
                        lease_pb2.DeviceHealth(
                            serial=serial,
                            condition=scheduler_pb2.DEVICE_CONDITION_READY,
                            battery_percent=60,
                            temperature_celsius=35.0,
                        )
                    )
            while next_change <= round_at:
                next_change += rng.expovariate(rate)
                ready = [s for s in self.serials if s not in held]
                if not ready:
                    continue
                serial = rng.choice(ready)
                held[serial] = round_at + PROBE_ROUND
                spans[serial] = [time.monotonic(), math.inf]
                self.not_ready.append(spans[serial])
                condition, reason, battery, celsius = rng.choice(NOT_READY)
                changed.append(
                    lease_pb2.DeviceHealth(
                        serial=serial,
                        condition=condition,
                        reason=reason,
                        battery_percent=battery,
                        temperature_celsius=celsius,
                    )
                )
            if changed:
                request = lease_pb2.ReportDeviceHealthRequest(host_id=self.host_id, devices=changed)
                try:
                    await self._stub.ReportDeviceHealth(request, timeout=CALL_TIMEOUT)
                    self._counters.reported(len(changed))
                except grpc.aio.AioRpcError as exc:
                    if self._stopping:
                        return
                    self._counters.error("health_errors", exc)
            round_at += PROBE_ROUND

    async def _report(self, a: lease_pb2.Assignment, outcome: Outcome = Outcome.DONE) -> bool:
        """Where results leave the host: as the agent does, through its ResultBatcher."""
        now = datetime.now(UTC)
        step = StepResult(0, "key", StepStatus.OK, now, timedelta(0))
        request = report_request(
            RunResult(outcome, "", (step,)),
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
        )
        delivery = await self._results.report(request, REPORT_POLICY)
        if not delivery.accepted:
            self._counters.error(
                "report_errors", RuntimeError(f"{delivery.code}: {delivery.details}")
            )
            return False
        return True

    # -- the ScreenFrames call -------------------------------------------------------------

    async def _screen_loop(self) -> None:
        """As the agent's Screencaster: the call opened with the host's id when the renewal
        stream asks for it; what it is sent (the phones watched) is read and dropped; closed
        once nothing has been watched for SCREEN_LINGER."""
        while not self._stopping:
            await self._screen_wanted.wait()
            self._screen_wanted.clear()
            call = self._stub.ScreenFrames()
            opened = False
            try:
                await call.write(lease_pb2.ScreenFramesRequest(host_id=self.host_id))
                watched = False
                while True:
                    try:
                        async with asyncio.timeout(None if watched else SCREEN_LINGER):
                            message = await call.read()
                    except TimeoutError:
                        break  # nothing watched for the linger: closed, as the agent
                    if message is grpc.aio.EOF:
                        if not self._stopping:
                            self._counters.error(
                                "screen_errors",
                                RuntimeError("the control plane ended the screen call"),
                            )
                        break
                    watched = bool(message.watched)
                    if not opened:
                        opened = True
                        self._counters.screen_calls += 1
            except grpc.aio.AioRpcError as exc:
                if not self._stopping:
                    self._counters.error("screen_errors", exc)
            finally:
                if opened:
                    self._counters.screen_calls -= 1
                call.cancel()
            if not self._stopping:
                await asyncio.sleep(RETRY_AFTER)

    # -- the renewal stream ----------------------------------------------------------------

    async def _stream_loop(self) -> None:
        while not self._stopping:
            call = self._stub.RenewLeases()
            reader = asyncio.ensure_future(self._read(call))
            sender = asyncio.ensure_future(self._send(call))
            try:
                done, _ = await asyncio.wait((reader, sender), return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    exc = task.exception() or RuntimeError("the control plane ended the stream")
                    if not self._stopping:
                        self._counters.error("stream_errors", exc)
            finally:
                for task in (reader, sender):
                    task.cancel()
                await asyncio.gather(reader, sender, return_exceptions=True)
                call.cancel()
            if not self._stopping:
                await asyncio.sleep(RETRY_AFTER)

    async def _send(self, call: grpc.aio.StreamStreamCall) -> None:
        # As LeaseKeeper: a wake-up sends the leases still waiting for their first answer;
        # every interval, all of them; none held: nothing, after the request that opens it.
        next_full = 0.0
        opened = False
        while True:
            self._wake.clear()
            full = time.monotonic() >= next_full
            ids = [i for i, lease in self._held.items() if full or not lease.answered.done()]
            if ids or not opened:
                opened = True
                # The steps of the leases it renews go with it (LeaseKeeper._send).
                sent = set(ids)
                steps = [p for p in self._steps if p.lease_id in sent]
                if steps:
                    self._steps = [p for p in self._steps if p.lease_id not in sent]
                    self._counters.steps_sent += len(steps)
                await call.write(
                    lease_pb2.RenewLeasesRequest(
                        host_id=self.host_id, lease_ids=ids, seq=next(self._seq), steps=steps
                    )
                )
            if full:
                next_full = time.monotonic() + self._interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, next_full - time.monotonic())):
                    await self._wake.wait()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        while (response := await call.read()) is not grpc.aio.EOF:
            assert isinstance(response, lease_pb2.RenewLeasesResponse)
            if response.push and response.screen_wanted:  # a viewer waits (none in a bench)
                self._screen_wanted.set()
            for state in response.leases:
                lease = self._held.get(state.lease_id)
                if lease is None:
                    continue
                if state.cancel_pending:  # the end of a busy phone's task
                    lease.cancelled.set()
                if not response.push and not lease.answered.done():
                    lease.answered.set_result(state.result)
