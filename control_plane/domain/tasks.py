"""Tasks: what a submit asks, a task as stored, its attempts, events and progress."""

from __future__ import annotations

import uuid
from dataclasses import asdict, astuple, dataclass, field
from datetime import datetime, timedelta
from typing import NewType

from control_plane.lifecycle import TaskStatus

TaskId = NewType("TaskId", uuid.UUID)


LeaseId = NewType("LeaseId", uuid.UUID)


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
    # An operator's maintenance session: it may take its cordoned phone (or a drained
    # host's).
    maintenance: bool = False


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
    # Who submitted it, as people read it: its token's name, else the token's id.
    submitted_by: str = ""


@dataclass(frozen=True)
class Progress:
    """What a running attempt's host reported of it so far: its steps as they ended
    (StepResult messages, by index), and when the attempt was acknowledged (None: not yet)."""

    steps: tuple[bytes, ...] = ()
    acknowledged_at: datetime | None = None


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
class SessionRelay:
    """Where a session's client call is held (session_relays): the replica, the address
    the other replicas reach it at (None: not said, or the replica's row is gone), and
    whether it heartbeat lately."""

    replica_id: str
    address: str | None
    alive: bool


@dataclass(frozen=True)
class SessionLease:
    """A host's join of a session as the database sees it (replicas.sql session_join): the
    task (a session or not, its status and attempt), the lease's attempt (None: no such
    lease of the task) and host, whether the lease is live by the database's clock, and
    where the session's client call is held (None: not recorded)."""

    session: bool
    status: TaskStatus
    task_attempt: int
    attempt: int | None
    host_id: str | None
    live: bool
    relay: SessionRelay | None


@dataclass(frozen=True)
class Removed:
    """Rows one retention batch deleted, by kind (the `kind` of amc_retention_removed_total)."""

    tasks: int = 0
    attempts: int = 0
    task_events: int = 0
    artifacts: int = 0
    hosts: int = 0
    devices: int = 0
    # Host events a host writes per lease (the steps of its cleans between leases).
    cleaning_events: int = 0

    def __add__(self, other: Removed) -> Removed:
        return Removed(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def counts(self) -> dict[str, int]:
        return asdict(self)
