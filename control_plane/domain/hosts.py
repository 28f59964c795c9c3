"""Hosts and their devices: what a host registers, its devices' health, its events."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from control_plane.domain.tasks import (
    TaskId,
)
from control_plane.domain.tokens import Act


@dataclass(frozen=True)
class DeviceInfo:
    serial: str
    state: str
    model: str = ""
    manufacturer: str = ""
    sdk: int = 0
    abi: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    task_id: TaskId | None = None
    cordoned: bool = False
    health: DeviceHealth | None = None


@dataclass(frozen=True)
class CleanStep:
    """A step of a host's clean of a device between leases, as it ended."""

    name: str
    detail: str
    seconds: float
    ok: bool

    def event_reason(self) -> str:
        """How its `cleaning` host event reads: `uninstall (310 ms): removed 1:
        com.a`, `reboot (24.1 s): rebooted`, `uninstall failed (20 ms): …`."""
        failed = "" if self.ok else " failed"
        detail = f": {self.detail}" if self.detail else ""
        took = f"{self.seconds * 1000:.0f} ms" if self.seconds < 1 else f"{self.seconds:.1f} s"
        return f"{self.name}{failed} ({took}){detail}"


@dataclass(frozen=True)
class DeviceHealth:
    """A device's condition as its host last reported it, and the facts behind it (None:
    not read). `probed_at` is the control plane's time of the report (None: never).
    `cleaned`: the steps of a clean that ended since the host's last report of it."""

    serial: str
    condition: str = "ready"
    reason: str = ""
    battery_percent: int | None = None
    temperature_celsius: float | None = None
    charging: bool | None = None
    probed_at: datetime | None = None
    cleaned: tuple[CleanStep, ...] = ()


@dataclass(frozen=True)
class HostInfo:
    host_id: str
    labels: dict[str, str]
    connected: bool
    last_seen_at: datetime
    devices: list[DeviceInfo]
    cordoned: bool = False
    draining: bool = False


@dataclass(frozen=True)
class HostEvent:
    """What an operator did to a host or one of its devices (`serial` set)."""

    kind: str
    serial: str | None
    act: Act
