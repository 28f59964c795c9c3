"""Quarantine and recovery: a phone that keeps failing for reasons that are not its tasks'
is taken out of service and the host tries to bring it back.

    Recovery.failure(serial, why)     an infrastructure failure (its run lost the phone, a
     │                                probe found it unresponsive); K of them within the
     │                                window (3 in 10 minutes by default) quarantine it
    Recovery.quarantine(serial, why)  at once (its clean between leases failed)
     └─ the ladder, in a task of its own, each step reported as the phone's condition (and
        so recorded by the control plane as a `recovery` event of this host):
          1. reconnect: probe it again (a read: a task running on the phone goes on)
          2. `adb reconnect` (when the source can)
          3. reboot, and wait for sys.boot_completed (at most `boot_timeout`)
          after each: answering and booted, and `settle` passes (the clean it owes, if
          it owes one: host_agent.device_life) → back in service (the failures
          forgotten); otherwise, after the last, it stays quarantined, for an operator
        with a pause between steps that doubles (`backoff`), one ladder at a time per phone.

A held phone (quarantined or recovering) takes no new work: the host offers it in no
Acquire from the moment it is held, whatever the control plane has heard. Nothing disturbs
a leased phone but through its lease: a phone that answers again at step 1 keeps its task
(nothing was done to it); one that does not has its task stopped and the lease given back
as device_lost (`vacate`, the host session's) before steps 2 and 3 touch it. A phone that
does not answer cannot run its task anyway, so the task is not left waiting for it.

A quarantine outlives the agent: the control plane records it (the reports), tells it back
at registration, and an agent that has just started holds those phones (`adopt`) until an
operator releases them, without a ladder of its own.

While quarantined or recovering, the phone's condition is this module's, not the probes':
`HealthMonitor` leaves it alone (no probe) and reports what `Recovery.held` says.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from host_agent import metrics
from host_agent.devices import DeviceError
from host_agent.health import Condition, Health
from host_agent.probe import Reading

log = structlog.get_logger(__name__)

Step = Callable[[str], Awaitable[None]]
Probe = Callable[[str], Awaitable[Reading]]

WAITS = "waits for an operator"
FAILED = f"recovery failed: {WAITS}"
ADOPTED = f"quarantined before the host agent restarted: {WAITS}"


@dataclass(frozen=True)
class RecoverySettings:
    """This many infrastructure failures of a phone within `window` seconds take it out of
    service (0: never) and start its recovery ladder, whose steps pause `backoff` seconds,
    doubling; a reboot may take `boot_timeout`."""

    failures: int = 3
    window: float = 600.0
    backoff: float = 5.0
    boot_timeout: float = 120.0


class Recovery:
    """Counts each phone's infrastructure failures and runs its recovery ladder."""

    def __init__(
        self,
        probe: Probe,
        report: Callable[[str], Awaitable[None] | None],
        *,
        reconnect: Step | None = None,
        reboot: Step | None = None,
        vacate: Step | None = None,
        settle: Callable[[str], Awaitable[bool]] | None = None,
        settings: RecoverySettings | None = None,
    ) -> None:
        self._probe = probe
        self._report = report  # tells the control plane now (HealthMonitor.tell_soon)
        self._reconnect = reconnect
        self._reboot = reboot
        # Returns once the phone holds no lease (its task stopped and given back).
        self._vacate = vacate
        # After a step, the phone answering: whether it may take work again (its clean).
        self._settle = settle
        self.settings = settings or RecoverySettings()
        self._failures: dict[str, deque[float]] = {}
        # The phones this module holds, and the condition to report for each.
        self.held: dict[str, Health] = {}
        self._ladders: dict[str, asyncio.Task[bool]] = {}
        self.outcomes: list[tuple[str, bool]] = []  # (serial, recovered), for tests and logs

    def failure(self, serial: str, why: str) -> None:
        """One infrastructure failure of `serial`; the K-th in the window quarantines it."""
        if serial in self.held or self.settings.failures <= 0:  # 0: quarantine is off
            return
        now = time.monotonic()
        seen = self._failures.setdefault(serial, deque())
        seen.append(now)
        while seen and seen[0] < now - self.settings.window:
            seen.popleft()
        log.info("infrastructure failure", device=serial, why=why, count=len(seen))
        if len(seen) >= self.settings.failures:
            self.quarantine(
                serial, f"{len(seen)} infrastructure failures in {self.settings.window:g}s: {why}"
            )

    def quarantine(self, serial: str, why: str) -> None:
        """Take `serial` out of service now, for `why`, and start its ladder."""
        if serial in self.held:
            return
        self._hold(serial, Condition.QUARANTINED, why)
        metrics.QUARANTINES.inc()
        self._ladders[serial] = asyncio.ensure_future(self._ladder(serial))

    def adopt(self, serial: str, recorded: Health) -> None:
        """The control plane records `serial` as quarantined or recovering (`recorded`, as
        a previous run of this agent reported it): held quarantined, for an operator (no
        ladder: the one that was running ended with that agent)."""
        if serial in self.held:
            return
        waits = recorded.condition is Condition.QUARANTINED and recorded.reason.endswith(WAITS)
        reason = recorded.reason if waits else ADOPTED
        self.held[serial] = Health(Condition.QUARANTINED, reason)
        log.warning(
            "device quarantined before the agent started",
            device=serial,
            was=f"{recorded.condition.value}: {recorded.reason}",
        )

    def release(self, serial: str) -> None:
        """An operator released `serial` from quarantine (from the centre): its ladder, if
        one is running, is stopped, its failures are forgotten and its hold ends; it is
        probed and its condition told at once (ready, unless the probe finds it sick)."""
        ladder = self._ladders.pop(serial, None)
        if ladder is not None:
            ladder.cancel()
        self._failures.pop(serial, None)
        held = self.held.pop(serial, None)
        log.info(
            "device released by an operator",
            device=serial,
            was=held.condition.value if held else None,
        )
        self._report(serial)

    async def close(self) -> None:
        for ladder in self._ladders.values():
            ladder.cancel()
        await asyncio.gather(*self._ladders.values(), return_exceptions=True)

    def _hold(self, serial: str, condition: Condition, reason: str) -> Awaitable[None] | None:
        self.held[serial] = Health(condition, reason)
        log.warning("device " + condition.value, device=serial, reason=reason)
        return self._report(serial)

    async def _ladder(self, serial: str) -> bool:
        steps: list[tuple[str, Step | None]] = [
            ("reconnect", None),
            ("adb reconnect", self._reconnect),
            ("reboot", self._reboot),
        ]
        pause = self.settings.backoff
        recovered = False
        for number, (name, action) in enumerate(steps, start=1):
            if number > 1 and action is None:
                continue
            await asyncio.sleep(pause)
            pause *= 2
            if action is not None and self._vacate is not None:
                await self._vacate(serial)  # nothing disturbs a leased phone
            told = self._hold(serial, Condition.RECOVERING, f"step {number}: {name}")
            if told is not None:
                await asyncio.shield(told)  # each step told (a recovery event) before taken
            if await self._try(serial, name, action):
                recovered = True
                break
        self.outcomes.append((serial, recovered))
        metrics.RECOVERIES.labels("recovered" if recovered else "failed").inc()
        del self._ladders[serial]
        if recovered:
            self._failures.pop(serial, None)
            del self.held[serial]
            log.info("device recovered", device=serial)
            self._report(serial)
        else:
            self._hold(serial, Condition.QUARANTINED, FAILED)
        return recovered

    async def _try(self, serial: str, name: str, action: Step | None) -> bool:
        """Run one step, then see whether the phone answers, has booted and settles."""
        try:
            if action is not None:
                await action(serial)
            deadline = time.monotonic() + (self.settings.boot_timeout if name == "reboot" else 0)
            while True:
                try:
                    if (await self._probe(serial)).boot_completed:
                        return self._settle is None or await self._settle(serial)
                except DeviceError:
                    pass
                if time.monotonic() >= deadline:
                    return False
                await asyncio.sleep(min(1.0, self.settings.backoff))
        except DeviceError as exc:
            log.info("recovery step failed", device=serial, step=name, error=str(exc))
            return False
