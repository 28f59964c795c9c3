"""Health probes: what each phone's condition is, read on a schedule and told to the control
plane when it changes.

    HealthMonitor.run()        every `interval` (jittered, each host's first round at a random
     │                         offset, so hosts started together do not probe together)
     ├─ probe() per phone      at once, each bounded by `timeout` (host_agent.probe: three
     │                         reads sent together); reads only, so a phone running a task
     │                         is probed too (cheap and safe: no action of the task is
     │                         touched)
     ├─ judge()                the condition, with hysteresis (held below `battery_low` %
     │                         until `battery_resume` %, above `too_hot` °C until below
     │                         `cool_again` °C, with less free storage than `storage_low`
     │                         until more than `storage_resume`)
     └─ send()                 the conditions that changed (or whose facts moved enough),
                               in one ReportDeviceHealth call for the host; nothing when
                               nothing changed. A failed send is tried again between the
                               rounds, from RESEND_AFTER seconds with backoff (tenacity),
                               with what has changed by then.

The control plane gives work only to phones whose last reported condition is READY.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import structlog

from host_agent import metrics
from host_agent.devices import CleanedStep, Device, DeviceError, DeviceLost
from host_agent.probe import Reading, probe
from host_agent.retry import retrying

log = structlog.get_logger(__name__)

# A report of unchanged condition is still sent when a fact moved this much since the last.
BATTERY_STEP = 5
TEMPERATURE_STEP = 2.0
# A failed send is tried again after this long, doubling up to RESEND_CAP, until it goes
# through (or the next round sends what changed anyway).
RESEND_AFTER = 0.2
RESEND_CAP = 5.0
# A phone that just answered (its clean passed) is told with its last probe's reading when
# that found it booted at most this many probe intervals before (else it is probed first).
READING_KEPT = 2


class Condition(enum.Enum):
    READY = "ready"
    CHARGING_HOLD = "charging_hold"
    TOO_HOT = "too_hot"
    UNRESPONSIVE = "unresponsive"
    BOOTING = "booting"
    RECOVERING = "recovering"
    QUARANTINED = "quarantined"
    OFFLINE = "offline"
    LOW_STORAGE = "low_storage"
    CLEANING = "cleaning"


@dataclass(frozen=True)
class Thresholds:
    """When a phone is held, and when it is let go again (hysteresis: a phone at the edge
    does not flap)."""

    battery_low: int = 20
    battery_resume: int = 40
    too_hot: float = 45.0
    cool_again: float = 40.0
    # Free bytes on /data.
    storage_low: int = 1 << 30
    storage_resume: int = 2 << 30


@dataclass(frozen=True)
class Health:
    """A phone's condition, why, and the facts behind it; `cleaned`: the steps of a clean
    between leases that ended since the last report, sent with it (not part of what
    changed)."""

    condition: Condition
    reason: str = ""
    battery_percent: int | None = None
    temperature_celsius: float | None = None
    charging: bool | None = None
    cleaned: tuple[CleanedStep, ...] = ()

    def worth_sending(self, last: Health | None) -> bool:
        """Changed enough since `last` (what the control plane was told) to tell it again."""
        if last is None or (self.condition, self.reason) != (last.condition, last.reason):
            return True
        return _moved(self.battery_percent, last.battery_percent, BATTERY_STEP) or _moved(
            self.temperature_celsius, last.temperature_celsius, TEMPERATURE_STEP
        )


def _moved(now: float | None, then: float | None, step: float) -> bool:
    if now is None or then is None:
        return now is not then
    return abs(now - then) >= step


def judge(last: Health | None, seen: Reading | DeviceError, t: Thresholds) -> Health:
    """The condition a probe's outcome puts a phone in, given what it was before."""
    if isinstance(seen, DeviceLost):
        return Health(Condition.OFFLINE, str(seen))
    if isinstance(seen, DeviceError):
        return Health(Condition.UNRESPONSIVE, str(seen) or type(seen).__name__)
    if not seen.boot_completed:
        return Health(Condition.BOOTING, "sys.boot_completed is not 1")
    facts = Health(
        Condition.READY, "", seen.battery_percent, seen.temperature_celsius, seen.charging
    )
    was = last.condition if last is not None else None

    def held(condition: Condition, reason: str) -> Health:
        return replace(facts, condition=condition, reason=reason)

    hot = seen.temperature_celsius
    if hot is not None and (hot > t.too_hot or (was is Condition.TOO_HOT and hot >= t.cool_again)):
        return held(
            Condition.TOO_HOT,
            f"battery above {t.too_hot:g} °C; held until below {t.cool_again:g} °C",
        )
    level = seen.battery_percent
    if level is not None and (
        level < t.battery_low or (was is Condition.CHARGING_HOLD and level < t.battery_resume)
    ):
        return held(
            Condition.CHARGING_HOLD,
            f"battery below {t.battery_low} %; held until {t.battery_resume} %",
        )
    free = seen.free_bytes
    if free is not None and (
        free < t.storage_low or (was is Condition.LOW_STORAGE and free <= t.storage_resume)
    ):
        return held(
            Condition.LOW_STORAGE,
            f"free storage {size_text(free)} below {size_text(t.storage_low)}; "
            f"held until above {size_text(t.storage_resume)}",
        )
    return facts


def size_text(size: int) -> str:
    """1.5 GB, 300 MB: a size as an operator reads it (powers of 1024)."""
    if size >= 1 << 30:
        return f"{size / (1 << 30):.3g} GB"
    return f"{size / (1 << 20):.3g} MB"


# -- the schedule ----------------------------------------------------------------------------

Send = Callable[[list[tuple[str, Health]]], Awaitable[None]]


class HealthMonitor:
    """Probes the phones `serials()` names every `interval`; `send` gets what changed."""

    def __init__(
        self,
        devices: Callable[[str], Device],
        send: Send,
        *,
        interval: float = 10.0,
        timeout: float = 5.0,
        thresholds: Thresholds | None = None,
    ) -> None:
        self._devices = devices
        self._send = send
        self.interval = interval
        self.timeout = timeout
        self.thresholds = thresholds or Thresholds()
        # What the last probe found (and when: time.monotonic()), and what the control
        # plane was last told.
        self.health: dict[str, Health] = {}
        self._read_at: dict[str, float] = {}
        self._told: dict[str, Health] = {}
        # Phones whose condition is set elsewhere (quarantined, recovering: recovery.py;
        # cleaning: device_life.py): not probed, reported as they are here.
        self.overrides: Mapping[str, Health] = {}
        # The steps of cleans that ended, by phone, to send with its next report.
        self._cleaned: dict[str, list[CleanedStep]] = {}
        # Called when a probe finds a phone newly unresponsive: an infrastructure failure.
        self.on_failure: Callable[[str, str], None] = lambda serial, why: None
        self._telling: set[asyncio.Task[None]] = set()
        self._tell_lock = asyncio.Lock()
        # Set while the control plane lacks something the last send failed to tell it.
        self._unsent = asyncio.Event()

    def forget_told(self) -> None:
        """The control plane may know nothing of what it was told (the host registered
        again): tell it everything at the next round."""
        self._told.clear()

    async def run(self, serials: Callable[[], Sequence[str]]) -> None:
        await self._between_rounds(random.uniform(0, self.interval))
        while True:
            await self.round(serials())
            await self._between_rounds(self.interval * random.uniform(0.9, 1.1))

    async def _between_rounds(self, pause: float) -> None:
        """Wait `pause` seconds; a send that fails meanwhile is tried again (the next round
        sends what changed in any case)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(pause):
                while True:
                    await self._unsent.wait()
                    await self._resend()

    async def _resend(self) -> None:
        """Send what the control plane was not told until it goes through, with backoff;
        an error that trying again cannot change waits for the next round."""
        tries = retrying("device conditions", log, initial=RESEND_AFTER, cap=RESEND_CAP)
        try:
            async for attempt in tries:
                with attempt:
                    await self._tell_changed()
        except Exception as exc:
            log.warning("device conditions refused; sent again next round", error=str(exc))
            self._unsent.clear()

    def cleaned(self, serial: str, steps: Sequence[CleanedStep]) -> None:
        """A clean of `serial` ended with `steps`: its next report carries them, and is
        sent whether its condition changed or not (the control plane set it `cleaning` as
        the lease ended, unknown to the host)."""
        self._cleaned.setdefault(serial, []).extend(steps)
        self._told.pop(serial, None)

    def tell_soon(self, serial: str, *, answered: float | None = None) -> asyncio.Task[None]:
        """`serial`'s override changed: send it now, not at the next round (a phone whose
        override ended is probed first, so what is sent is what it is now). `answered`:
        the phone just answered (a clean that passed, begun at that time.monotonic()), so
        a probe that found it booted within READING_KEPT intervals before stands for a new
        one. The sending, to wait for."""
        task = asyncio.ensure_future(self.recheck(serial, answered=answered))
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)
        return task

    async def recheck(self, serial: str, *, answered: float | None = None) -> None:
        """Probe `serial` now (unless an override holds it, or it `answered` since a
        reading that stands: tell_soon) and send what changed."""
        if serial not in self.overrides and not self._stands(serial, answered):
            self.health[serial] = await self._probe(serial)
        await self.tell()

    def _stands(self, serial: str, answered: float | None) -> bool:
        last, at = self.health.get(serial), self._read_at.get(serial)
        if answered is None or last is None or at is None:
            return False
        if last.condition in (Condition.UNRESPONSIVE, Condition.OFFLINE, Condition.BOOTING):
            return False
        return at >= answered - READING_KEPT * self.interval

    async def round(self, serials: Sequence[str]) -> None:
        """Probe every phone in `serials` at once; send what changed."""
        gone = set(self.health) - set(serials) - set(self.overrides)
        for serial in gone:
            del self.health[serial]
            self._read_at.pop(serial, None)
            self._told.pop(serial, None)
        probed = [s for s in serials if s not in self.overrides]
        found = await asyncio.gather(*(self._probe(s) for s in probed))
        for serial, health in zip(probed, found, strict=True):
            last = self.health.get(serial)
            if health.condition is Condition.UNRESPONSIVE and (
                last is None or last.condition is not Condition.UNRESPONSIVE
            ):
                self.on_failure(serial, health.reason)
            if last is None or last.condition is not health.condition:
                log.info(
                    "device condition",
                    device=serial,
                    condition=health.condition.value,
                    was=last.condition.value if last else None,
                    reason=health.reason,
                )
            self.health[serial] = health
        metrics.probed(
            {
                s: (h.condition.value, h.battery_percent, h.temperature_celsius)
                for s, h in self.health.items()
            },
            gone,
        )
        await self.tell()

    async def tell(self) -> None:
        """Send the conditions that changed since the control plane was last told; if that
        fails, `run` tries again soon."""
        try:
            await self._tell_changed()
        except Exception as exc:  # a transport error: sent again (_between_rounds)
            log.warning("device conditions not sent; will retry", error=str(exc))

    async def _tell_changed(self) -> None:
        async with self._tell_lock:
            now = {**self.health, **self.overrides}
            cleaned = {s: tuple(steps) for s, steps in self._cleaned.items() if s in now}
            changed = [
                (s, replace(h, cleaned=cleaned.get(s, ())))
                for s, h in now.items()
                if s in cleaned or h.worth_sending(self._told.get(s))
            ]
            if changed:
                try:
                    await self._send(changed)
                except BaseException:
                    self._unsent.set()
                    raise
                self._told.update(changed)
                for serial, steps in cleaned.items():
                    del self._cleaned[serial][: len(steps)]
                    if not self._cleaned[serial]:
                        del self._cleaned[serial]
            self._unsent.clear()

    async def _probe(self, serial: str) -> Health:
        try:
            seen: Reading | DeviceError = await probe(self._devices(serial), self.timeout)
        except DeviceError as exc:
            seen = exc
        self._read_at[serial] = time.monotonic()
        return judge(self.health.get(serial), seen, self.thresholds)
