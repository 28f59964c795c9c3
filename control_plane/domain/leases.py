"""Leases: what Acquire assigns, renewals, reports and how leases end, and the
notices a replica pushes onto a host's renewal stream."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

from control_plane.domain.tasks import (
    LeaseId,
    Task,
    TaskId,
)
from control_plane.lifecycle import Outcome, ReportCode, TaskStatus


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
class StepProgress:
    """A step that ended, as a host sends it with a renewal of its lease (its lease id as
    the host sent it, like the renewal's)."""

    lease_id: str
    index: int
    step: bytes


@dataclass(frozen=True)
class Report:
    task_id: TaskId
    attempt: int
    lease_id: LeaseId
    outcome: Outcome
    result: bytes
    error: str
    # Its host cleans the phone next: the device's condition becomes `cleaning` with it.
    cleans: bool = False
    # Small files the run kept, stored with the result when it is recorded.
    kept: tuple[KeptFile, ...] = ()


@dataclass(frozen=True)
class KeptFile:
    """A file carried with a report (ReportResultRequest.kept), with the artifact id the
    control plane gave it (listed in the result's step before the report is sent on)."""

    artifact_id: uuid.UUID
    step_index: int
    action_index: int
    step_name: str
    kind: str
    sha256: bytes
    data: bytes


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
class Recorded:
    """A report's answer: the task, and the attempt's cancel timing for the metrics."""

    code: ReportCode  # RECORDED or REPEATED (the others are refusals)
    task: Task
    cancel_requested_at: datetime | None
    cancel_delivered_at: datetime | None
    # When the attempt started running (acknowledged, else assigned): for the run time.
    started_at: datetime | None = None


@dataclass(frozen=True)
class HostNotice:
    """What NOTIFY carries to the replica that holds a host's renewal stream, for that
    host: the hub pushes it onto the host's streams (Hub.host_stream)."""

    host_id: str


@dataclass(frozen=True)
class CancelNotice(HostNotice):
    """A cancellation recorded for a lease, as NOTIFY carries it to the stream's replica."""

    lease_id: LeaseId
    task_id: TaskId
    attempt: int
    requested_epoch: float = 0.0


@dataclass(frozen=True)
class DrainNotice(HostNotice):
    """A host drained from the centre (`drain`), or uncordoned after it, for its stream."""

    drain: bool


@dataclass(frozen=True)
class ReleaseNotice(HostNotice):
    """A device of the host released from quarantine from the centre, for its stream."""

    serial: str


@dataclass(frozen=True)
class ScreenNotice(HostNotice):
    """A viewer on this replica waits for one of the host's phones and the host has no
    ScreenFrames call here: its stream asks it to open one. Not carried by NOTIFY: the
    viewer waits on the replica holding the host's stream (control_plane.screens)."""


@dataclass(frozen=True)
class LogsNotice(HostNotice):
    """A reader on this replica follows one of the host's attempts' logs and the host has
    no LogLines call here: its stream asks it to open one (control_plane.logs)."""


@dataclass(frozen=True)
class StreamState(HostNotice):
    """What the database says a host's renewal stream should have been pushed, read when
    the stream opens and after its replica's LISTEN connection reconnected (notices sent
    while it was down are lost): the host's drain, the devices released from quarantine
    that the host has not reported on since, and the cancels requested on its live leases
    and not delivered yet."""

    draining: bool = False
    released: tuple[str, ...] = ()
    cancels: tuple[CancelNotice, ...] = ()


# Every notice a host's renewal stream may be pushed (one home for the union).
Notice = CancelNotice | DrainNotice | LogsNotice | ReleaseNotice | ScreenNotice | StreamState
