"""The host session: offers this host's phones to the control plane and starts a worker
for each assignment it is given.

    run()
     ├─ register (retried until accepted: registration.py), then READY=1 to systemd
     └─ one TaskGroup
         ├─ LeaseKeeper.run()      the renewal stream and self-fencing (leases.py)
         ├─ Registration.refresh_loop()
         │                         inventory every `inventory_interval`; re-register on
         │                         change (registration.py)
         ├─ HealthMonitor.run()    every phone probed every `probe_interval`; conditions
         │                         that changed sent in one ReportDeviceHealth (health.py)
         ├─ Notifier.pings()       WATCHDOG=1 pings, if systemd asked for them
         ├─ Screencaster.run()     the ScreenFrames call, opened when the renewal stream
         │                         asks (a viewer waits): watched phones' frames (screencast.py)
         ├─ LogFeed.run()          the LogLines call, likewise: followed runs' log lines
         ├─ Offering.run()         Acquire long polls covering every idle phone but the
         │                         withheld: quarantined or cleaning (offering.py; one
         │                         refused as unregistered: register again, ask again)
         └─ _work() per assignment: a Worker (worker.py): acknowledge (first renewal) → run
                                    → report or release → forget; then the books here,
                                    and the phone's clean (device_life.py) before it is
                                    offered again

Messages become domain values (and back) in wire.py; this module and the worker see
the domain `HeldAssignment`, not `lease_pb2.Assignment`.

A phone the recovery ladder holds (recovery.py) is offered no work from the moment it is
held; an assignment for it that was already on its way is given back (device_lost) unrun.
Before the ladder reconnects or reboots a phone that runs a task, `_vacate` stops the task
and waits until its lease is given back (device_lost).

Drain (`stop()`, i.e. SIGTERM): no new Acquire (one in flight is cancelled); running tasks
get `drain_timeout` to finish and report as usual; then their tokens trip SHUTDOWN, the
runners stop at the next step boundary and those leases are given back with ReleaseLease,
*not* reported FAILED, so the control plane requeues the tasks at once. A second `stop()`
cuts the grace period short.

Drain from the centre (`amc hosts drain`: a push on the renewal stream, see
`LeaseKeeper`): running tasks finish and report as usual, and the agent stays connected
instead of exiting (a unit with Restart= would only start it again); the control plane's
uncordon ends it. Its idle phones stay offered: the control plane gives a drained
(cordoned) host no queued work, only an operator's maintenance session on one of its
phones (SessionOpen.maintenance: to look at a phone of a host taken out of service).
Reports and releases run shielded and are awaited before `run()` returns, so a
cancellation cannot lose them half-way.
"""

from __future__ import annotations

import asyncio
from collections import deque

import grpc
import structlog

from amc.v1 import lease_pb2_grpc
from amc_common.statuses import Outcome
from amc_common.systemd import Notifier
from host_agent import appium, devices, metrics
from host_agent.app_cache import AppCache
from host_agent.config import AgentSettings, app_cache_dir
from host_agent.device_life import DeviceLife, Stage
from host_agent.devices import DeviceSource
from host_agent.fencing import HeldLease, Timing
from host_agent.health import Health, HealthMonitor
from host_agent.leases import LeaseKeeper
from host_agent.library import HostLibrary
from host_agent.log_feed import LogFeed
from host_agent.offering import Offering
from host_agent.registration import CALL_TIMEOUT, Registration
from host_agent.reporting import FinalCalls, ResultBatcher, release_lease
from host_agent.screencast import Screencaster
from host_agent.stop_token import Stopped, StopReason, StopToken
from host_agent.wire import HeldAssignment, health_request
from host_agent.worker import Finished, Tools, Worker

log = structlog.get_logger(__name__)

# How many finished attempts `Agent.finished` remembers (for tests and debugging).
FINISHED_KEPT = 256


class Agent:
    """The host session: registration, inventory, the watchdog, the acquire loop, the drain.
    Owns the LeaseKeeper and the ResultBatcher its workers share."""

    def __init__(
        self,
        settings: AgentSettings,
        source: DeviceSource,
        channel: grpc.aio.Channel,
        notifier: Notifier | None = None,
    ) -> None:
        self.settings = settings
        self._source = source
        self._channel = channel
        self._stub = lease_pb2_grpc.LeaseStub(channel)
        self._results = ResultBatcher(self._stub)
        self._notifier = notifier or Notifier(address="")
        self._log = log.bind(host_id=settings.host_id)
        self._registration = Registration(settings, source, self._stub, self._registered, self._log)
        self.keeper: LeaseKeeper | None = None
        # The live screens (set once registered).
        self.screens: Screencaster | None = None
        self.finished: deque[Finished] = deque(maxlen=FINISHED_KEPT)
        self.registered = asyncio.Event()
        self._busy: dict[str, asyncio.Task[None]] = {}
        # The task attempt each busy phone runs (serial -> (task_id, attempt)): said with
        # each of its screen frames, and cleared before the phone is offered again.
        self._running: dict[str, tuple[str, int]] = {}
        # The live tails of the runs' logs (host_agent.log_feed).
        self.logs = LogFeed(self._stub, settings.host_id, settings.log_linger, self._running)
        # The lease of each busy phone's task (its token stops it for the ladder).
        self._leases: dict[str, HeldLease] = {}
        # Every phone a registration of this process listed: the control plane's record
        # of a quarantine is taken only for a phone this agent has no view of yet.
        self._seen: set[str] = set()
        # Tripped (SHUTDOWN) by stop(): races the registration and the Acquire long poll.
        self._draining = StopToken()
        self._hurry = asyncio.Event()
        self._changed = asyncio.Event()
        self._offering = Offering(
            settings, self._stub, self._registration, self._changed, self._log
        )
        self._final = FinalCalls()
        self._tools: Tools | None = None
        # Drained from the centre: take no new work, keep running and connected.
        self.drained_by_centre = False
        self.health = HealthMonitor(
            source.device,
            self._send_health,
            interval=settings.probe_interval,
            timeout=settings.probe_timeout,
            thresholds=settings.thresholds,
        )
        # Each phone's stage (ready, leased, cleaning, quarantined): its cleans, and its
        # quarantine and recovery ladder (self.recovery).
        self.life = DeviceLife(
            source, settings, self.health, self._changed, self._registration, self._vacate
        )
        self.recovery = self.life.recovery
        self.health.overrides = self.life.overrides
        self.health.on_failure = self.recovery.failure

    # -- lifecycle -------------------------------------------------------------------------

    def stop(self) -> None:
        """Begin draining; called again, stop running tasks without waiting any longer."""
        if self._draining.trip(StopReason.SHUTDOWN):
            self._log.info("stop requested: draining", running=len(self._busy))
            self._changed.set()
        else:
            self._log.info("second stop request: ending the grace period")
            self._hurry.set()

    async def run(self) -> None:
        """Serve until stop() and the drain are through. Raises if the agent cannot go on."""
        # Every task started from here on (renewal stream, workers) logs the host id.
        structlog.contextvars.bind_contextvars(host_id=self.settings.host_id)
        try:
            timing = await self._draining.race(self._registration.until_accepted())
        except Stopped:
            self._log.info("stopped before the first registration")
            return
        self.screens = Screencaster(
            self._stub,
            self.settings.host_id,
            self._source.device,
            self.settings.screen_max_fps,
            self.settings.screen_max_rate,
            self.settings.screen_linger,
            self._running.get,
            self.settings.screen_video_max_fps,
        )
        keeper = self.keeper = LeaseKeeper(
            self._stub,
            self.settings.host_id,
            timing,
            on_drain=self._drain_from_centre,
            on_release=self.life.release,
            on_screen=self.screens.want,
            on_logs=self.logs.want,
            channel=self._channel,
            may_move=(self.screens.closed, self.logs.closed),
            pools=devices.pools(self._source),
        )
        cache = AppCache(app_cache_dir(self.settings), self.settings.app_cache_size)
        self._tools = Tools(
            self.settings,
            self._stub,
            keeper,
            self._results,
            self._source,
            self._final,
            self.screens,
            HostLibrary(self._stub, cache),
            self.logs,
            appium.servers(self.settings.appium, self.settings.appium_caps),
        )
        self._notifier.ready(self._status())
        try:
            async with asyncio.TaskGroup() as group:
                background = [
                    group.create_task(keeper.run(), name="renewal stream"),
                    group.create_task(self._registration.refresh_loop(), name="inventory"),
                    group.create_task(self.health.run(self._registration.online), name="probes"),
                    group.create_task(self._notifier.pings(), name="watchdog"),
                    group.create_task(self.screens.run(), name="live screens"),
                    group.create_task(self.logs.run(), name="live logs"),
                    group.create_task(devices.pools(self._source).run(self.life), name="pools"),
                ]
                await self._offering.run(
                    self._idle_serials,
                    self.life.withheld,
                    lambda received_at, found: self._start_all(group, found, received_at),
                    lambda: self._draining.tripped,
                )
                await self._drain()
                for task in background:
                    task.cancel()
        finally:
            await self.life.close()
            await self.recovery.close()
            await self._final.wait()
            if self._tools.appium is not None:
                await self._tools.appium.close()
        self._log.info("host agent stopped")

    def _drain_from_centre(self, drain: bool) -> None:
        if drain == self.drained_by_centre:
            return
        self.drained_by_centre = drain
        if drain:
            self._log.info(
                "drain requested by the control plane: finishing running tasks, taking no new"
                " work but an operator's maintenance session",
                running=len(self._busy),
            )
        else:
            self._log.info("drain ended by the control plane: taking work again")
        self._changed.set()
        self._notifier.status(self._status())

    async def _drain(self) -> None:
        workers = set(self._busy.values())
        self._notifier.stopping(f"draining: {len(workers)} task(s) running")
        if workers:
            self._log.info(
                "draining", running=len(workers), drain_timeout=self.settings.drain_timeout
            )
            await self._grace(workers)
        remaining = [w for w in workers if not w.done()]
        if remaining:
            assert self.keeper is not None
            self._log.info("drain timeout: stopping running tasks", running=len(remaining))
            for lease in self.keeper.held():
                lease.token.trip(StopReason.SHUTDOWN)
            await asyncio.wait(remaining)

    async def _grace(self, workers: set[asyncio.Task[None]]) -> None:
        """Until every worker is done, the drain timeout passes, or stop() comes again."""
        all_done = asyncio.ensure_future(asyncio.wait(workers))
        hurry = asyncio.ensure_future(self._hurry.wait())
        try:
            await asyncio.wait(
                (all_done, hurry),
                timeout=self.settings.drain_timeout,
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            # Cancelling asyncio.wait() leaves the workers themselves running.
            all_done.cancel()
            hurry.cancel()
            await asyncio.gather(all_done, hurry, return_exceptions=True)

    def _status(self) -> str:
        online = len(self._registration.online())
        drained = ", drained by the control plane" if self.drained_by_centre else ""
        return f"{online} device(s) online, {len(self._busy)} task(s) running{drained}"

    # -- registration (registration.py) ----------------------------------------------------

    def _registered(self, timing: Timing, quarantined: list[tuple[str, Health]]) -> None:
        if self.keeper is not None:
            self.keeper.timing = timing
        # Quarantined before this agent started (its previous run): held until released.
        listed = {d.serial for d in self._registration.inventory}
        for serial, recorded in quarantined:
            if serial in listed and serial not in self._seen:
                self.recovery.adopt(serial, recorded)
        self._seen |= listed
        # Seen for the first time: cleaned (its baseline recorded) before its first lease.
        self.life.seen(sorted(listed))
        # A registration may have made the devices anew (a host forgotten and back): the
        # next probe round tells the control plane every condition again.
        self.health.forget_told()
        self.registered.set()
        self._changed.set()
        self._notifier.status(self._status())

    # -- health ----------------------------------------------------------------------------

    async def _vacate(self, serial: str, reason: StopReason, why: str) -> None:
        """Before the ladder disturbs `serial` (or a lost emulator is started again): stop
        the task it runs, if any, and return once the worker has given its lease back."""
        while (work := self._busy.get(serial)) is not None:
            lease = self._leases.get(serial)
            if lease is not None:
                lease.stop(reason, why)
            await asyncio.wait([work])

    async def _send_health(self, changed: list[tuple[str, Health]]) -> None:
        request = health_request(self.settings.host_id, changed)
        await self._stub.ReportDeviceHealth(request, timeout=CALL_TIMEOUT)

    # -- taking work -----------------------------------------------------------------------

    def _idle_serials(self) -> list[str]:
        """The phones to offer: the ready ones (not leased, cleaning or quarantined), also
        while the control plane drains this host (it then gives them an operator's
        maintenance session, nothing else)."""
        ready = self.life.stage
        return [s for s in self._registration.online() if ready(s) is Stage.READY]

    def _start_all(
        self, group: asyncio.TaskGroup, found: list[HeldAssignment], received_at: float
    ) -> None:
        for assignment in found:
            self._start(group, assignment, received_at)

    def _start(self, group: asyncio.TaskGroup, a: HeldAssignment, received_at: float) -> None:
        assert self.keeper is not None and self._tools is not None
        lease = self.keeper.new_lease(a.lease_id, a.task_id, a.attempt, a.valid_for, received_at)
        if a.device_serial in self._busy:
            # The control plane hands out one task per device; never run two on one phone.
            self._log.error(
                "assignment for a busy device; giving it back",
                device=a.device_serial,
                task_id=a.task_id,
            )
            group.create_task(
                self._final.run(
                    release_lease(self._stub, a.lease_id, "device already busy on this host")
                )
            )
            return
        if (stage := self.life.stage(a.device_serial)) is not Stage.READY:
            # Offered before it was held (the control plane had not heard): never run.
            self._log.warning(
                f"assignment for a {stage.value} device; giving it back",
                device=a.device_serial,
                task_id=a.task_id,
            )
            held = self.life.overrides.get(a.device_serial)
            why = f"host: device {stage.value} before the task started: {held and held.reason}"
            group.create_task(
                self._final.run(release_lease(self._stub, a.lease_id, why, device_lost=True))
            )
            return
        self.life.leased(a.device_serial)
        ran = self.life.when_run_over(a.device_serial, a.task_id)  # cleaned as it reports
        worker = Worker(self._tools, a, lease, cleans=self.life.cleans(a.device_serial), ran=ran)
        self._running[a.device_serial] = (a.task_id, a.attempt)
        self._leases[a.device_serial] = lease
        self._busy[a.device_serial] = group.create_task(
            self._work(worker), name=f"task {a.task_id} attempt {a.attempt}"
        )
        self._notifier.status(self._status())

    async def _work(self, worker: Worker) -> None:
        """One worker's run, and the books: what finished, the metric, the busy device,
        the phone's clean (or, not cleaned, its probe) before it is offered again."""
        a, ended = worker.assignment, False
        try:
            finished = await worker.run()
            self.finished.append(finished)
            outcome = finished.result.outcome.name.lower() if finished.result else "none"
            metrics.TASKS.labels(how=finished.ending.value, outcome=outcome).inc()
            lost = finished.result is not None and finished.result.device_lost
            if finished.result is not None and lost:
                self.recovery.failure(finished.device, finished.result.error)
            self.life.lease_ended(a.device_serial, a.task_id, lost)
            ended = True
            if lost and not self.life.cleans(a.device_serial):
                # Probed (and its condition told) before it is offered again: the task it
                # gave back must not come straight back to it while it does not answer.
                await self.health.recheck(finished.device)
            if finished.result is not None and finished.result.outcome is not Outcome.DONE:
                # A failed run may mean the phone went away: look before offering it again.
                await self._registration.refresh()
        finally:
            if not ended:
                self.life.lease_ended(a.device_serial, a.task_id, False)
            self._running.pop(worker.assignment.device_serial, None)
            self._leases.pop(worker.assignment.device_serial, None)
            self._busy.pop(worker.assignment.device_serial, None)
            self._changed.set()
            self._notifier.status(self._status())
