"""Values the control plane passes around. The spec and result are kept as the bytes the
gRPC edge gave us (serialized amc.v1 messages): the store never needs their insides."""

from __future__ import annotations

import enum
import uuid
from dataclasses import asdict, astuple, dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple, NewType

from control_plane.lifecycle import Outcome, ReportCode, TaskStatus

TaskId = NewType("TaskId", uuid.UUID)
LeaseId = NewType("LeaseId", uuid.UUID)


class Role(enum.StrEnum):
    CLIENT = "client"
    OPERATOR = "operator"
    HOST = "host"


@dataclass(frozen=True)
class Principal:
    """Who is calling. `token_id` is None when auth is off (--insecure)."""

    role: Role | None
    host_id: str | None = None
    token_id: uuid.UUID | None = None
    # The token's name, as its creator gave it (recorded with what an operator does).
    name: str = ""
    # The token's team: its tasks' fairness key unless they name one ("": 'default').
    team: str = ""

    @property
    def caller(self) -> str:
        return str(self.token_id) if self.token_id else "anonymous"


ANONYMOUS = Principal(role=None)


@dataclass(frozen=True)
class NewTask:
    spec: bytes
    request_id: str | None = None
    selector_serial: str | None = None
    selector_labels: dict[str, str] = field(default_factory=dict)
    priority: int = 0
    max_attempts: int = 3
    metadata: dict[str, str] = field(default_factory=dict)
    # None: no limit.
    queue_timeout: timedelta | None = None
    deadline: timedelta | None = None
    # Whose share of the phones it counts in; "": the default key ('default').
    fairness_key: str = ""


@dataclass(frozen=True)
class Task:
    task_id: TaskId
    request_id: str | None
    status: TaskStatus
    spec: bytes
    selector_serial: str | None
    selector_labels: dict[str, str]
    priority: int
    max_attempts: int
    metadata: dict[str, str]
    attempt: int
    host_id: str | None
    device_serial: str | None
    cancel_requested_at: datetime | None
    cancel_reason: str | None
    result: bytes | None
    error: str
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    queue_timeout: timedelta | None = None
    deadline: timedelta | None = None
    fairness_key: str = "default"
    # Why a queued task waits, computed on read (control_plane.pending); "" otherwise.
    pending_reason: str = ""
    # A running task's current attempt so far, as GetTask and WatchTask read it; None
    # otherwise (and once the task ends: its result is the record).
    progress: Progress | None = None


@dataclass(frozen=True)
class Progress:
    """What a running attempt's host reported of it so far: its steps as they ended
    (StepResult messages, by index), and when the attempt was acknowledged (None: not yet)."""

    steps: tuple[bytes, ...] = ()
    acknowledged_at: datetime | None = None


@dataclass(frozen=True)
class StepProgress:
    """A step that ended, as a host sends it with a renewal of its lease."""

    lease_id: str
    index: int
    step: bytes


@dataclass(frozen=True)
class AttemptInfo:
    """One attempt of a task, for its history. `state` is how it ended (active: running)."""

    attempt: int
    host_id: str
    device_serial: str
    lease_id: LeaseId
    state: str
    created_at: datetime
    acknowledged_at: datetime | None
    ended_at: datetime | None
    cancel_requested_at: datetime | None


@dataclass(frozen=True)
class TaskEvent:
    event_id: int
    attempt: int
    kind: str
    from_status: TaskStatus | None
    to_status: TaskStatus | None
    detail: str
    at: datetime


@dataclass(frozen=True)
class TaskHistory:
    attempts: list[AttemptInfo]
    events: list[TaskEvent]


@dataclass(frozen=True)
class Assignment:
    task_id: TaskId
    attempt: int
    lease_id: LeaseId
    device_serial: str
    spec: bytes
    queued_seconds: float = 0.0
    deadline: timedelta | None = None


class Renewal(NamedTuple):
    """A lease renewed (a lease asked about and not renewed is a conflict). A tuple: they
    come in bulk, in the order of amc_renew's columns."""

    lease_id: LeaseId
    cancel_pending: bool
    task_id: TaskId
    attempt: int
    # Set when this answer is the first to carry the pending cancel: requested -> now.
    delivery_seconds: float | None = None
    # This renewal was the host's acknowledgement (assigned -> dispatched).
    acknowledged: bool = False
    # With an acknowledgement: how long the task was queued before it (pickup latency).
    pickup_seconds: float | None = None


@dataclass(frozen=True)
class Report:
    task_id: TaskId
    attempt: int
    lease_id: LeaseId
    outcome: Outcome
    result: bytes
    error: str


@dataclass(frozen=True)
class Expiry:
    task_id: TaskId
    attempt: int
    lease_id: LeaseId
    host_id: str
    to_status: TaskStatus
    # The task's selector, to offer it again when it is requeued.
    selector_serial: str | None = None
    selector_labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Acquired:
    """What one Acquire round found: its assignments, and the devices left idle after it
    (serial, labels) that the replica indexes while the call waits; of the tasks it was
    offered, those queued when it looked (`queued`)."""

    assignments: list[Assignment]
    idle: list[tuple[str, dict[str, str]]]
    queued: frozenset[str] = frozenset()


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


# What a host's probes may say of a device (devices.condition); only 'ready' takes work.
CONDITIONS = (
    "ready",
    "charging_hold",
    "too_hot",
    "unresponsive",
    "booting",
    "recovering",
    "quarantined",
    "offline",
    "low_storage",
)


@dataclass(frozen=True)
class DeviceHealth:
    """A device's condition as its host last reported it, and the facts behind it (None:
    not read). `probed_at` is the control plane's time of the report (None: never)."""

    serial: str
    condition: str = "ready"
    reason: str = ""
    battery_percent: int | None = None
    temperature_celsius: float | None = None
    charging: bool | None = None
    probed_at: datetime | None = None


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
    actor: str
    actor_name: str
    reason: str
    at: datetime


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
class TokenInfo:
    token_id: uuid.UUID
    name: str
    role: Role
    host_id: str | None
    secret_hash: bytes
    created_at: datetime
    revoked_at: datetime | None
    team: str = ""


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
    actor: str
    actor_name: str
    reason: str
    at: datetime


@dataclass(frozen=True)
class KeyCap:
    """A capped fairness key: its cap of phones and how many its tasks hold now."""

    max_devices: int
    running: int


@dataclass(frozen=True)
class CancelNotice:
    """A cancellation recorded for a lease, as NOTIFY carries it to the stream's replica."""

    host_id: str
    lease_id: LeaseId
    task_id: TaskId
    attempt: int
    requested_epoch: float = 0.0


@dataclass(frozen=True)
class DrainNotice:
    """A host drained from the centre (`drain`), or uncordoned after it, for its stream."""

    host_id: str
    drain: bool


@dataclass(frozen=True)
class TaskRead:
    """A task as one statement read it; a queued one with what its pending reason is made
    of: the devices its selector matches and its fairness key's cap (None: no cap)."""

    task: Task
    match: DeviceMatch | None = None
    cap: KeyCap | None = None


@dataclass(frozen=True)
class ReleaseNotice:
    """A device of the host released from quarantine from the centre, for its stream."""

    host_id: str
    serial: str


@dataclass(frozen=True)
class Recorded:
    """A report's answer: the task, and the attempt's cancel timing for the metrics."""

    code: ReportCode  # RECORDED or REPEATED (the others are refusals)
    task: Task
    cancel_requested_at: datetime | None
    cancel_delivered_at: datetime | None
    # When the attempt started running (acknowledged, else assigned): for the run time.
    started_at: datetime | None = None


@dataclass(frozen=True)
class Removed:
    """Rows one retention batch deleted, by kind (the `kind` of amc_retention_removed_total)."""

    tasks: int = 0
    attempts: int = 0
    task_events: int = 0
    artifacts: int = 0
    hosts: int = 0
    devices: int = 0

    def __add__(self, other: Removed) -> Removed:
        return Removed(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def counts(self) -> dict[str, int]:
        return asdict(self)


ArtifactId = NewType("ArtifactId", uuid.UUID)


@dataclass(frozen=True)
class ArtifactFile:
    """What a kept file is: the attempt and the action that kept it, its size and digest."""

    task_id: TaskId
    attempt: int
    step_index: int
    action_index: int
    step_name: str
    # amc_common.actions.KEEPS: "screenshot" or "ui_dump".
    kind: str
    size_bytes: int
    sha256: bytes


@dataclass(frozen=True)
class NewArtifact(ArtifactFile):
    """An artifact as its host announces it (the upload's header), before its bytes; it
    is stored only under `lease_id`, the attempt's live lease."""

    lease_id: LeaseId


@dataclass(frozen=True)
class ArtifactInfo(ArtifactFile):
    """A stored artifact (without its bytes)."""

    artifact_id: ArtifactId
    created_at: datetime


@dataclass(frozen=True)
class SessionRelay:
    """Where a session's client call is held (session_relays): the replica, the address
    the other replicas reach it at (None: not said, or the replica's row is gone), and
    whether it heartbeat lately."""

    replica_id: str
    address: str | None
    alive: bool
