"""A phone's life on this host, in one place: ready → leased → cleaning → ready, or
quarantined on the way (the recovery ladder, an operator's release).

    Stage       a phone is in it when                        it leaves it when
    READY       its last clean passed (or it is not cleaned) a worker starts on it
    LEASED      a task or a session runs on it               the lease ends, however
    CLEANING    its lease ended (a device_lost give-back     its clean passes: READY;
                too: the clean waits for it to answer);      fails or runs past its
                the agent sees it for the first time (its    timeout: quarantined (and
                baseline is recorded)                        CLEANING still, owing it)
    QUARANTINED the recovery ladder holds it (host_agent.     the ladder brings it back,
                recovery): infrastructure failures, or a     each step followed by the
                clean that failed                            clean it owes (`settle`);
                                                             an operator releases it
    RETIRED     its pool stopped it (an emulator idle past   a new instance answers as
                its pool's idle period: host_agent.          its serial (`fresh`): it
                emulator_pool), from READY only              is cleaned first (SEEN)

The phones a host runs itself (an emulator pool) ask this module as their `PoolHost`
(host_agent.devices): `ready`, `retire`, `fresh`, and `lost` for one whose process died
(its task stopped and given back as device_lost first, then it waits for the new instance
to answer and is cleaned, as any phone lost mid-lease is); `broken` for one that would not
start again (quarantined: the ladder's reboot starts it afresh, its clean follows).

MOVES is the cycle's table (READY, LEASED, CLEANING); a quarantine lies over it: a held
phone keeps its place in the cycle (a leased one has its task stopped first, by the
ladder's vacate) and is QUARANTINED to everyone until the ladder or an operator lets it go.
Only a READY phone is offered work (Agent's idle phones, Offering's withheld ones), and the
control plane, which takes only `ready` phones, has it `cleaning` from the lease's end
(the report asks it: `cleans`) until the clean's report. So no lease starts on a phone
whose last clean did not pass, on either side.

A clean is its source's `Cleaner` (host_agent.devices: a phone over adb is cleaned by shell
commands, an emulator would load a snapshot), as the phone's pool's profile asks
(host_agent.clean_profile), run under the profile's timeout; each step is timed and told to
the control plane with the phone's next report (a `cleaning` host event each). A clean that
passed is told at once, `ready`: its steps had the phone answer, so its last probe's facts
(battery, temperature, storage, when read in the last two probe intervals) stand for a new
probe (HealthMonitor.tell_soon); one that failed is quarantined, as before. The clean of
an emulator of this host's pool after a run that is reported starts as the report goes
(`run_over`: its snapshot load and the report's round trip overlap), but its outcome (ready,
or the quarantine) waits for the report's end (`lease_ended`), so the control plane hears
the result first; a phone's clean starts after the report.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import structlog

from host_agent import metrics
from host_agent.baselines import Baselines
from host_agent.clean_profile import CleanProfile
from host_agent.config import AgentSettings
from host_agent.devices import CleanedStep, DeviceError, DeviceSource
from host_agent.health import HealthMonitor
from host_agent.life_conditions import Overrides
from host_agent.probe import Reading, probe
from host_agent.recovery import Recovery
from host_agent.stop_token import StopReason

log = structlog.get_logger(__name__)

# How long a phone that was lost is waited for between looks, at most.
ANSWER_POLL_CAP = 10.0
QUARANTINE_STOP = "device quarantined: stopping its task"
# Stops a phone's task (if it runs one) for a reason, and returns once its lease is given
# back (the agent's).
Vacate = Callable[[str, StopReason, str], Awaitable[None]]


class Registered(Protocol):
    """What the phones' life asks of their registration (host_agent.registration)."""

    def labels(self, serial: str) -> Mapping[str, str]: ...

    async def refresh(self) -> None: ...


class Stage(enum.Enum):
    READY = "ready"
    LEASED = "leased"
    CLEANING = "cleaning"
    QUARANTINED = "quarantined"
    RETIRED = "retired"


class Move(enum.Enum):
    SEEN = "seen"  # the agent sees the phone for the first time
    LEASE = "lease"  # a worker started on it
    END = "end"  # its lease ended, whatever its outcome
    PASSED = "passed"  # its clean passed
    RELEASED = "released"  # an operator released it (it cleans first if it owes a clean)
    RETIRE = "retire"  # its pool stops it (host_agent.emulator_pool)
    LOST = "lost"  # it went away while ready (its process died): cleaned once it answers


# The cycle; a quarantine lies over it (see the module docstring).
MOVES: dict[tuple[Stage, Move], Stage] = {
    (Stage.READY, Move.SEEN): Stage.CLEANING,
    (Stage.READY, Move.LEASE): Stage.LEASED,
    (Stage.LEASED, Move.END): Stage.CLEANING,
    (Stage.CLEANING, Move.PASSED): Stage.READY,
    (Stage.CLEANING, Move.RELEASED): Stage.CLEANING,
    (Stage.READY, Move.RELEASED): Stage.READY,
    (Stage.LEASED, Move.RELEASED): Stage.LEASED,
    (Stage.READY, Move.RETIRE): Stage.RETIRED,
    (Stage.RETIRED, Move.SEEN): Stage.CLEANING,
    (Stage.READY, Move.LOST): Stage.CLEANING,
}


class DeviceLife:
    """Every phone's stage, and the cleans between its leases (see the module docstring)."""

    def __init__(
        self,
        source: DeviceSource,
        settings: AgentSettings,
        health: HealthMonitor,
        changed: asyncio.Event,
        registration: Registered,
        vacate: Vacate,
    ) -> None:
        """`changed` is set when a phone may have become offerable or not; `registration`
        knows a phone's labels (its pool's match) and registers the phones again; `vacate`
        returns once a phone's task is stopped (for the reason given) and its lease given
        back (before the ladder reconnects or reboots it, or a lost emulator restarts)."""
        self._source = source
        self.profiles = settings.clean_profile
        self._baselines = Baselines(settings.clean_baselines)
        self._health = health
        self._changed = changed
        self._labels = registration.labels
        self.recovery = Recovery(
            self._probe,
            self._hold_changed,
            reconnect=getattr(source, "reconnect_device", None),
            reboot=getattr(source, "reboot_device", None),
            vacate=lambda serial: vacate(serial, StopReason.QUARANTINED, QUARANTINE_STOP),
            settle=self.settle,
            settings=settings.recovery,
        )
        self._vacate = vacate
        self._refresh = registration.refresh
        self._stages: dict[str, Stage] = {}
        self._why: dict[str, str] = {}  # why a phone is cleaning (its condition's reason)
        self._failure: dict[str, str] = {}  # what its last clean failed at
        self._first: set[str] = set()  # seen, and no clean of it has passed yet
        self._leases: dict[str, int] = {}  # leases since its last reboot
        self._cleans: dict[str, asyncio.Task[None]] = {}
        self._reported: dict[str, asyncio.Event] = {}  # set when its run's report is done
        self._pooled: set[str] = set()  # run by this host (an emulator pool's instances)
        self.overrides = Overrides(self)

    # -- what the session asks ----------------------------------------------------------

    def stage(self, serial: str) -> Stage:
        if serial in self.recovery.held:
            return Stage.QUARANTINED
        return self._stages.get(serial, Stage.READY)

    def withheld(self) -> set[str]:
        """The phones no Acquire may offer (quarantined, owing a clean, or retired)."""
        out = {s for s, stage in self._stages.items() if stage in (Stage.CLEANING, Stage.RETIRED)}
        return set(self.recovery.held) | out

    def profile(self, serial: str) -> CleanProfile:
        return self.profiles.for_device(serial, self._labels(serial))

    def cleans(self, serial: str) -> bool:
        """Whether `serial` is cleaned after its leases (its report says so)."""
        return self.profile(serial).enabled

    # -- moves ----------------------------------------------------------------------------

    def seen(self, serials: list[str]) -> None:
        """The phones a registration listed: those seen for the first time are cleaned
        before their first lease (their baselines recorded), unless held."""
        for serial in serials:
            if serial in self._stages:
                continue
            self._stages[serial] = Stage.READY
            if self.cleans(serial):
                self._first.add(serial)
                why = "before its first lease on this host agent"
                self._move(serial, Move.SEEN, why, wait=True)

    def leased(self, serial: str) -> None:
        self._move(serial, Move.LEASE)

    def when_run_over(self, serial: str, task_id: str) -> Callable[[], None] | None:
        """What its worker calls as its run's report starts: the lease ends (its clean
        starts) now, its clean's outcome waits for `lease_ended`. None: not cleaned, or
        not an emulator of this host's (a phone's clean, a few adb commands, gains little
        from the overlap, and its `cleaning` told apart from the report cost 4-5 commits a
        task more: the lifecycle bench's tasks/s fell from 352 to 196)."""
        if not self.cleans(serial) or serial not in self._pooled:
            return None

        def run_over() -> None:
            self.lease_ended(serial, task_id, False)
            self._reported[serial] = asyncio.Event()

        return run_over

    def lease_ended(self, serial: str, task_id: str, lost: bool) -> None:
        """Its lease ended (`lost`: given back as device_lost), its result's report done:
        cleaned next, before it is offered again. Called before the session counts it idle."""
        if (reported := self._reported.pop(serial, None)) is not None:
            reported.set()  # ended as the report started (when_run_over)
            return
        self._leases[serial] = self._leases.get(serial, 0) + 1
        if not self.cleans(serial):
            self._stages[serial] = Stage.READY
            return
        self._move(serial, Move.END, f"after task {task_id}", wait=lost)

    def release(self, serial: str) -> None:
        """An operator released `serial` from quarantine: one that owes a clean is
        cleaned first (its report says `cleaning`), the others are probed (recovery)."""
        owes = self.stage(serial) is Stage.QUARANTINED and self._own(serial) is Stage.CLEANING
        if owes:
            self._why[serial] = "after its release from quarantine"
        self.recovery.release(serial)
        self._move(serial, Move.RELEASED)
        if owes:
            self._start(serial, wait=False)

    # -- a pool's phones (PoolHost) -------------------------------------------------------

    def ready(self, serial: str) -> bool:
        return self.stage(serial) is Stage.READY

    def retire(self, serial: str) -> bool:
        if self.stage(serial) is not Stage.READY:
            return False
        self._move(serial, Move.RETIRE)
        self._changed.set()
        return True

    def fresh(self, serial: str) -> None:
        self._pooled.add(serial)
        self._stages.setdefault(serial, Stage.RETIRED)
        if self._own(serial) is not Stage.RETIRED:
            return
        if not self.cleans(serial):
            self._stages[serial] = Stage.READY
            return
        self._first.add(serial)
        self._move(serial, Move.SEEN, "before its first lease: a new emulator", wait=True)

    async def lost(self, serial: str, why: str) -> None:
        own = self._own(serial)
        if own is Stage.LEASED:  # its lease ends given back: cleaned once it answers
            await self._vacate(serial, StopReason.DEVICE_LOST, f"device lost: {why}")
        elif own is Stage.READY and serial not in self.recovery.held:
            self._move(serial, Move.LOST, f"its emulator starts again: {why}", wait=True)
            self._changed.set()

    def broken(self, serial: str, why: str) -> None:
        self.recovery.quarantine(serial, why)

    async def changed(self) -> None:
        await self._refresh()

    async def settle(self, serial: str) -> bool:
        """The recovery ladder's question after a step (the phone answers again): may it
        take work? Yes, unless it owes a clean and that clean fails."""
        running = self._cleans.get(serial)
        if running is not None and not running.done():
            await asyncio.wait([running])
        if self._own(serial) is not Stage.CLEANING:
            return True
        return await self._clean(serial)

    async def close(self) -> None:
        for task in self._cleans.values():
            task.cancel()
        await asyncio.gather(*self._cleans.values(), return_exceptions=True)

    async def _probe(self, serial: str) -> Reading:
        return await probe(self._source.device(serial), self._health.timeout)

    def _hold_changed(self, serial: str) -> asyncio.Task[None]:
        """The ladder took `serial` in or out of service: offered (or not) at once, and its
        condition told now."""
        self._changed.set()
        return self._health.tell_soon(serial)

    def _own(self, serial: str) -> Stage:
        return self._stages.get(serial, Stage.READY)

    def _move(self, serial: str, move: Move, why: str = "", *, wait: bool = False) -> None:
        was = self._own(serial)
        to = MOVES.get((was, move))
        if to is None:
            raise AssertionError(f"{serial}: no move {move.value} from {was.value}")
        self._stages[serial] = to
        if to is Stage.CLEANING and was is not Stage.CLEANING:
            self._why[serial] = why
            if serial not in self.recovery.held:  # else the ladder settles it
                self._start(serial, wait=wait)

    # -- the clean --------------------------------------------------------------------------

    def _start(self, serial: str, *, wait: bool) -> None:
        running = self._cleans.get(serial)
        if running is None or running.done():
            self._cleans[serial] = asyncio.ensure_future(self._cleaning(serial, wait))

    async def _cleaning(self, serial: str, wait: bool) -> None:
        if wait and not await self._answers(serial):
            return  # held meanwhile: the ladder settles it
        if serial in self.recovery.held:
            return
        if not await self._clean(serial) and serial not in self.recovery.held:
            failed = self._failure.get(serial, "")
            self.recovery.quarantine(serial, f"clean failed: {failed}")

    async def _answers(self, serial: str) -> bool:
        """Until the phone answers (a probe: booted); False if it was held meanwhile."""
        why, pause = self._why[serial], 1.0
        while serial not in self.recovery.held:
            try:
                device = self._source.device(serial)
                if (await probe(device, self._health.timeout)).boot_completed:
                    self._why[serial] = why
                    return True
            except DeviceError:
                pass
            if self._why[serial] == why:  # told once, while it waits
                self._why[serial] = f"{why}; waits for the phone to answer"
                self._health.tell_soon(serial)
            await asyncio.sleep(pause)
            pause = min(pause * 2, ANSWER_POLL_CAP)
        return False

    async def _clean(self, serial: str) -> bool:
        """One clean of `serial`, as its profile asks, its steps queued for its next
        report; whether it passed (then it is READY, and told so now)."""
        profile = self.profile(serial)
        due = profile.reboot_every > 0 and self._leases.get(serial, 0) >= profile.reboot_every
        cleaner = self._source.cleaner(serial, profile, self._baselines)
        steps = cleaner.steps(first=serial in self._first, reboot=due)
        done: list[CleanedStep] = []
        began = time.monotonic()
        name, step_began = (steps[0][0] if steps else "clean"), began
        try:
            async with asyncio.timeout(profile.timeout):
                for name, run in steps:
                    step_began = time.monotonic()
                    detail = await run()
                    done.append(CleanedStep(name, detail, time.monotonic() - step_began, True))
        except TimeoutError:
            why = f"timed out: the clean ran past its {profile.timeout:g}s"
            done.append(CleanedStep(name, why, time.monotonic() - step_began, False))
        except DeviceError as exc:
            why = str(exc) or type(exc).__name__
            done.append(CleanedStep(name, why, time.monotonic() - step_began, False))
        took = time.monotonic() - began
        if (reported := self._reported.get(serial)) is not None:
            await reported.wait()  # the result is told before the phone's ready (or held)
        passed = all(step.ok for step in done)
        metrics.CLEAN_SECONDS.labels("passed" if passed else "failed").observe(took)
        self._health.cleaned(serial, done)
        if not passed:
            self._failure[serial] = f"{done[-1].name}: {done[-1].detail}"
            log.warning("clean failed", device=serial, step=done[-1].name, why=done[-1].detail)
            return False
        log.info("cleaned", device=serial, seconds=round(took, 3), steps=len(done))
        self._first.discard(serial)
        if due:
            self._leases[serial] = 0
        self._move(serial, Move.PASSED)
        if serial not in self.recovery.held:  # else the ladder tells it, as it lets go
            # Its steps had it answer: told ready now, on its last probe's reading when
            # that is recent (no second probe); a clean of no steps saw nothing of it.
            await self._health.tell_soon(serial, answered=began if done else None)
            self._changed.set()
        return True

    def cleaning_reason(self, serial: str) -> str | None:
        """Why `serial` is cleaning (its condition's reason); None when it is not."""
        return self._why.get(serial, "") if self._own(serial) is Stage.CLEANING else None
