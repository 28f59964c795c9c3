"""The queue: its groups as counted, fair shares and their caps, the farm's gauges, and
what a queued task's pending reason is made of."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from control_plane.domain.tasks import (
    Task,
)
from control_plane.domain.tokens import Act

# What keeps a device from a queued task whose selector matches it, as amc_device_use
# (store/queue.count.sql) names it, the first that applies; a device held by its
# condition is `held:` and the condition (`held:charging_hold`).
HELD = "held:"
USES = ("host_draining", "host_cordoned", "cordoned", "offline", "busy", "idle")


@dataclass(frozen=True)
class DeviceMatch:
    """The devices a selector matches, by what keeps each from a queued task (the first
    that applies): its host is draining, its host is cordoned, it is cordoned, offline
    (not `device`, or its host not connected), held by its condition (charging, too hot,
    ...), busy; the rest are idle. GetTask reads it live and GetQueue as last counted,
    from the same classification (amc_device_use), so both say the same."""

    host_draining: int = 0
    host_cordoned: int = 0
    cordoned: int = 0
    offline: int = 0
    busy: int = 0
    idle: int = 0
    # Connected, not cordoned, but held by their condition: (condition, devices), most first.
    held_by: tuple[tuple[str, int], ...] = ()

    @classmethod
    def of(cls, uses: Mapping[str, int]) -> DeviceMatch:
        """From amc_device_use's counts (use -> devices); a use it does not know is counted
        as offline (never as idle)."""
        counts = dict.fromkeys(USES, 0)
        held: dict[str, int] = {}
        for use, n in uses.items():
            if use.startswith(HELD):
                held[use.removeprefix(HELD)] = held.get(use.removeprefix(HELD), 0) + int(n)
            else:
                counts["offline" if use not in counts else use] += int(n)
        ranked = tuple(sorted(held.items(), key=lambda item: (-item[1], item[0])))
        return cls(**counts, held_by=ranked)

    @property
    def held(self) -> int:
        return sum(n for _, n in self.held_by)

    @property
    def total(self) -> int:
        return (
            self.host_draining
            + self.host_cordoned
            + self.cordoned
            + self.offline
            + self.held
            + self.busy
            + self.idle
        )


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
    """Queued tasks of one selector, and the devices that selector matches (as counted)."""

    serial: str | None
    labels: dict[str, str]
    count: int
    oldest_at: datetime
    match: DeviceMatch

    @property
    def devices_unavailable(self) -> int:
        """Matching devices neither idle nor busy."""
        return self.match.total - self.match.idle - self.match.busy


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
