"""The queue: its groups as counted, fair shares and their caps, the farm's gauges, and
what a queued task's pending reason is made of."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from control_plane.domain.tasks import (
    Task,
)
from control_plane.domain.tokens import Act


@dataclass(frozen=True)
class DeviceMatch:
    """The devices a selector matches, by what keeps each from a queued task (the first
    that applies): its host is cordoned, it is cordoned, offline, held by its condition
    (charging, too hot, ...), busy; the rest are idle."""

    total: int
    host_cordoned: int
    cordoned: int
    offline: int
    busy: int
    # Connected, not cordoned, but held by their condition: one condition per device.
    held_by: tuple[str, ...] = ()

    @property
    def held(self) -> int:
        return len(self.held_by)


@dataclass(frozen=True)
class KeyCap:
    """A capped fairness key: its cap of phones and how many its tasks hold now."""

    max_devices: int
    running: int


@dataclass(frozen=True)
class TaskRead:
    """A task as one statement read it; a queued one with what its pending reason is made
    of: the devices its selector matches and its fairness key's cap (None: no cap)."""

    task: Task
    match: DeviceMatch | None = None
    cap: KeyCap | None = None


@dataclass(frozen=True)
class QueueGroup:
    """Queued tasks of one selector; serial and labels None: the groups summed as `other`."""

    serial: str | None
    labels: dict[str, str] | None
    count: int
    oldest_seconds: float


@dataclass(frozen=True)
class QueueWait:
    """Queued tasks of one selector, and the devices that selector matches."""

    serial: str | None
    labels: dict[str, str]
    count: int
    oldest_at: datetime
    devices_idle: int
    devices_busy: int
    devices_unavailable: int

    @property
    def because(self) -> str:
        if self.devices_idle:
            return (
                f"{self.devices_idle} matching device(s) idle: being dispatched, or their"
                " host is not asking for work"
            )
        if self.devices_busy:
            return f"all {self.devices_busy} matching device(s) are busy"
        if self.devices_unavailable:
            return (
                f"the {self.devices_unavailable} matching device(s) are offline, unauthorized,"
                " gone, cordoned or on a disconnected or cordoned host"
            )
        return "no device matches the selector"


@dataclass(frozen=True)
class KeyLoad:
    """A fairness key's tasks for the metrics: queued as last counted, running now, and
    the oldest queued one's wait (seconds; None: none queued)."""

    key: str
    queued: int
    running: int
    oldest_seconds: float | None


@dataclass(frozen=True)
class FarmGauges:
    tasks: dict[str, int]
    hosts_connected: int
    # (state, busy) -> devices
    devices: dict[tuple[str, bool], int]
    queue: list[QueueGroup]
    keys: list[KeyLoad] = field(default_factory=list)
    # How long ago the queue was counted (None: never).
    counted_ago: float | None = None
    # Online devices by condition; battery (%) and temperature (°C) as (min, mean, max)
    # over those probed (None: none was).
    conditions: dict[str, int] = field(default_factory=dict)
    battery: tuple[float, float, float] | None = None
    temperature: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class FairShare:
    """A fairness key's share of the phones (weight; cap, None: none) and its tasks:
    queued as last counted (since `oldest_at`), running now. `updated_at` None: no
    operator set it (the defaults)."""

    fairness_key: str
    weight: int = 1
    max_devices: int | None = None
    queued: int = 0
    running: int = 0
    oldest_at: datetime | None = None
    updated_at: datetime | None = None


@dataclass(frozen=True)
class ShareChange:
    """What SetFairShare asks: a weight (None: as it is), a cap (None: as it is), or no
    cap (`clear_cap`)."""

    weight: int | None = None
    max_devices: int | None = None
    clear_cap: bool = False


@dataclass(frozen=True)
class FairShareEvent:
    """A change of a key's share: the share it left, who made it and why."""

    weight: int
    max_devices: int | None
    act: Act
