"""Domain values <-> amc.v1 messages. Only the gRPC layer uses this."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar, cast

from google.protobuf import duration_pb2, timestamp_pb2
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from amc.v1 import admin_pb2, lease_pb2, scheduler_pb2, task_pb2
from amc_common.action_table import KEEPS
from amc_common.device_conditions import CONDITIONS
from amc_common.device_selector import HOST_LABEL
from amc_common.steps import default_name
from control_plane.domain import (
    Act,
    ArtifactInfo,
    Assignment,
    AttemptInfo,
    CleanStep,
    DeviceHealth,
    DeviceInfo,
    FairShare,
    FairShareEvent,
    HostEvent,
    HostInfo,
    LeaseId,
    NewArtifact,
    Progress,
    QueueWait,
    Role,
    StepProgress,
    Task,
    TaskEvent,
    TaskId,
    TokenInfo,
)
from control_plane.lifecycle import Outcome, TaskStatus

Name = TypeVar("Name", bound=str)
Value = TypeVar("Value", bound=int)


def _by_name(enum: type[Value], prefix: str, names: Iterable[Name]) -> dict[Name, Value]:
    """Each name to the proto enum value `PREFIX_NAME`: the protos spell our values so."""
    values = cast(EnumTypeWrapper, enum)
    return {name: cast(Value, values.Value(f"{prefix}_{name.upper()}")) for name in names}


STATUS_TO_PB = _by_name(task_pb2.TaskStatus, "TASK_STATUS", TaskStatus)
STATUS_FROM_PB = {v: k for k, v in STATUS_TO_PB.items()}
OUTCOME_FROM_PB = {v: k for k, v in _by_name(lease_pb2.Outcome, "OUTCOME", Outcome).items()}
ROLE_TO_PB = _by_name(admin_pb2.Role, "ROLE", Role)
ROLE_FROM_PB = {v: k for k, v in ROLE_TO_PB.items()}
DEVICE_STATE_TO_PB = _by_name(
    scheduler_pb2.DeviceState, "DEVICE_STATE", ("device", "offline", "unauthorized", "gone")
)
DEVICE_STATE_FROM_PB = {v: k for k, v in DEVICE_STATE_TO_PB.items()}
CONDITION_TO_PB = _by_name(scheduler_pb2.DeviceCondition, "DEVICE_CONDITION", CONDITIONS)
CONDITION_FROM_PB = {v: k for k, v in CONDITION_TO_PB.items()}
# What ArtifactFile (domain) and ArtifactHeader / Artifact (messages) call alike.
ARTIFACT_FACTS = ("attempt", "step_index", "action_index", "step_name", "kind", "size_bytes")
# What DeviceInfo (domain) and Device / DeviceInfo (messages) call alike.
DEVICE_FACTS = ("serial", "model", "manufacturer", "sdk", "abi")
ATTEMPT_STATE_TO_PB = _by_name(
    scheduler_pb2.AttemptState,
    "ATTEMPT_STATE",
    ("active", "done", "failed", "cancelled", "expired", "released"),
)


def _same(value: object, *names: str) -> dict[str, Any]:
    """The fields a message and a domain value share, by name, copied as they are."""
    return {name: getattr(value, name) for name in names}


def _times(value: object, *names: str) -> dict[str, timestamp_pb2.Timestamp | None]:
    """The datetime fields of a domain value as message timestamps, by name."""
    return {name: timestamp(getattr(value, name)) for name in names}


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def duration(value: timedelta) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(value)
    return d


def task_to_pb(task: Task) -> task_pb2.Task:
    pb = task_pb2.Task(
        task_id=str(task.task_id),
        request_id=task.request_id or "",
        status=STATUS_TO_PB[task.status],
        priority=task.priority,
        max_attempts=task.max_attempts,
        metadata=task.metadata,
        attempt=task.attempt,
        host_id=task.host_id or "",
        device_serial=task.device_serial or "",
        cancel_reason=task.cancel_reason or "",
        selector=task_pb2.DeviceSelector(
            serial=task.selector_serial or "", labels=task.selector_labels
        ),
        **_times(task, "created_at", "updated_at", "cancel_requested_at", "finished_at"),
        pending_reason=task.pending_reason,
        fairness_key=task.fairness_key,
        submitted_by=task.submitted_by,
    )
    if task.queue_timeout is not None:
        pb.queue_timeout.FromTimedelta(task.queue_timeout)
    if task.deadline is not None:
        pb.deadline.FromTimedelta(task.deadline)
    pb.spec.ParseFromString(task.spec)
    if task.result is not None:
        pb.result.ParseFromString(task.result)
    if task.error and not pb.result.error:
        pb.result.error = task.error
    if task.progress is not None:
        _progress_to_pb(pb, task.progress)
    return pb


def _progress_to_pb(pb: task_pb2.Task, progress: Progress) -> None:
    """The running task's steps so far and the step it runs now (from its spec: the step
    after the last one that ended, unless that one ended the run)."""
    out = pb.progress
    for raw in progress.steps:
        out.steps.add().ParseFromString(raw)
    spec = pb.spec
    steps: list[tuple[str, bool]] = []  # (name, continue_on_error)
    if spec.HasField("workflow"):
        steps = [
            (s.name or default_name(i), s.continue_on_error)
            for i, s in enumerate(spec.workflow.steps)
        ]
    elif spec.HasField("actions"):
        steps = [(a.WhichOneof("kind") or "", False) for a in spec.actions.actions]
    if spec.apps and steps:  # installed first, as a step of their own
        steps.insert(0, ("apps", False))
    out.step_count = len(steps)
    if progress.acknowledged_at is None:
        return
    since = progress.acknowledged_at
    index = 0
    if out.steps:
        last = out.steps[-1]
        goes_on = last.status == task_pb2.STEP_STATUS_OK or (
            last.status == task_pb2.STEP_STATUS_FAILED
            and last.index < len(steps)
            and steps[last.index][1]
        )
        if not goes_on:
            return
        index = last.index + 1
        if last.HasField("started_at"):
            since = last.started_at.ToDatetime(UTC) + last.duration.ToTimedelta()
    if index >= len(steps):
        return
    out.running_index, out.running_name = index, steps[index][0]
    out.running_since.FromDatetime(since)


def assignment_to_pb(a: Assignment, valid_for: timedelta) -> lease_pb2.Assignment:
    pb = lease_pb2.Assignment(
        task_id=str(a.task_id),
        attempt=a.attempt,
        lease_id=str(a.lease_id),
        device_serial=a.device_serial,
        valid_for=duration(valid_for),
        deadline=duration(a.deadline) if a.deadline is not None else None,
    )
    pb.spec.ParseFromString(a.spec)
    return pb


def device_from_pb(
    d: lease_pb2.DeviceInfo, host_id: str, host_labels: dict[str, str]
) -> DeviceInfo:
    """The labels a selector matches: host labels, then the device's facts and own labels,
    then `host_id` (its host's id, which nothing overrides: a serial is unique on its host
    only, so serial and host_id name one phone of the farm)."""
    facts = {
        "model": d.model,
        "manufacturer": d.manufacturer,
        "abi": d.abi,
        "sdk": str(d.sdk) if d.sdk else "",
    }
    labels = {
        **host_labels,
        **{k: v for k, v in facts.items() if v},
        **dict(d.labels),
        HOST_LABEL: host_id,
    }
    return DeviceInfo(
        state=DEVICE_STATE_FROM_PB.get(d.state, "offline"),
        labels=labels,
        **_same(d, *DEVICE_FACTS),
    )


def steps_from_pb(items: Iterable[lease_pb2.StepProgress]) -> list[StepProgress]:
    """Steps sent with a renewal, which the gRPC edge has validated
    (validate_lease.step_progress)."""
    return [
        StepProgress(
            str(uuid.UUID(p.lease_id)), p.step.index, p.step.SerializeToString(deterministic=True)
        )
        for p in items
    ]


def health_from_pb(h: lease_pb2.DeviceHealth) -> DeviceHealth:
    """A device's reported condition the gRPC edge has validated (validate_lease.device_health)."""
    return DeviceHealth(
        h.serial,
        CONDITION_FROM_PB[h.condition],
        h.reason,
        h.battery_percent if h.HasField("battery_percent") else None,
        h.temperature_celsius if h.HasField("temperature_celsius") else None,
        h.charging if h.HasField("charging") else None,
        cleaned=tuple(
            CleanStep(s.name, s.detail, s.took.ToTimedelta().total_seconds(), s.ok)
            for s in h.cleaned
        ),
    )


def held_to_pb(h: DeviceHealth) -> lease_pb2.DeviceHealth:
    """A device's recorded condition told back to its host (RegisterHostResponse)."""
    return lease_pb2.DeviceHealth(
        serial=h.serial, condition=CONDITION_TO_PB[h.condition], reason=h.reason
    )


def _health_to_pb(h: DeviceHealth | None) -> dict[str, Any]:
    """The Device fields of a device's condition (none set for a device never probed)."""
    if h is None:
        return {}
    fields: dict[str, Any] = {
        "condition": CONDITION_TO_PB[h.condition],
        "condition_reason": h.reason,
        "battery_percent": h.battery_percent,
        "temperature_celsius": h.temperature_celsius,
        "charging": h.charging,
        "probed_at": timestamp(h.probed_at) if h.probed_at else None,
    }
    return {k: v for k, v in fields.items() if v is not None}


def host_to_pb(h: HostInfo) -> scheduler_pb2.Host:
    return scheduler_pb2.Host(
        host_id=h.host_id,
        labels=h.labels,
        connected=h.connected,
        last_seen_at=timestamp(h.last_seen_at),
        devices=[
            scheduler_pb2.Device(
                state=DEVICE_STATE_TO_PB.get(d.state, scheduler_pb2.DEVICE_STATE_UNSPECIFIED),
                labels=d.labels,
                task_id=str(d.task_id) if d.task_id else "",
                **_same(d, *DEVICE_FACTS),
                cordoned=d.cordoned,
                **_health_to_pb(d.health),
            )
            for d in h.devices
        ],
        cordoned=h.cordoned,
        draining=h.draining,
    )


def _act_to_pb(act: Act) -> dict[str, Any]:
    """Who, why and when, as the event messages (HostEvent, FairShareEvent) carry them."""
    return {**_same(act, "actor", "actor_name", "reason"), "at": timestamp(act.at)}


def host_event_to_pb(e: HostEvent) -> admin_pb2.HostEvent:
    return admin_pb2.HostEvent(kind=e.kind, serial=e.serial or "", **_act_to_pb(e.act))


def attempt_to_pb(a: AttemptInfo) -> scheduler_pb2.TaskAttempt:
    return scheduler_pb2.TaskAttempt(
        lease_id=str(a.lease_id),
        state=ATTEMPT_STATE_TO_PB.get(a.state, scheduler_pb2.ATTEMPT_STATE_UNSPECIFIED),
        **_same(a, "attempt", "host_id", "device_serial"),
        **_times(a, "created_at", "acknowledged_at", "ended_at", "cancel_requested_at"),
    )


def event_to_pb(e: TaskEvent) -> scheduler_pb2.TaskEvent:
    unset = task_pb2.TASK_STATUS_UNSPECIFIED
    return scheduler_pb2.TaskEvent(
        event_id=e.event_id,
        kind=e.kind,
        at=timestamp(e.at),
        attempt=e.attempt,
        from_status=STATUS_TO_PB[e.from_status] if e.from_status else unset,
        to_status=STATUS_TO_PB[e.to_status] if e.to_status else unset,
        detail=e.detail,
    )


def queue_group_to_pb(g: QueueWait, because: str) -> scheduler_pb2.QueueGroup:
    """A selector's queued tasks; `because`: why they wait (pending.explain's words)."""
    return scheduler_pb2.QueueGroup(
        selector=task_pb2.DeviceSelector(serial=g.serial or "", labels=g.labels),
        count=g.count,
        oldest_queued_at=timestamp(g.oldest_at),
        devices_idle=g.match.idle,
        devices_busy=g.match.busy,
        devices_unavailable=g.devices_unavailable,
        waiting_because=because,
    )


def token_to_pb(t: TokenInfo) -> admin_pb2.TokenInfo:
    return admin_pb2.TokenInfo(
        token_id=str(t.token_id),
        name=t.name,
        role=ROLE_TO_PB[t.role],
        host_id=t.host_id or "",
        created_at=timestamp(t.created_at),
        revoked_at=timestamp(t.revoked_at),
        team=t.team,
    )


def fair_share_to_pb(f: FairShare) -> admin_pb2.FairShare:
    return admin_pb2.FairShare(
        **_same(f, "fairness_key", "weight", "max_devices", "queued", "running"),
        oldest_queued_at=timestamp(f.oldest_at),
        updated_at=timestamp(f.updated_at),
    )


def fair_share_event_to_pb(e: FairShareEvent) -> admin_pb2.FairShareEvent:
    return admin_pb2.FairShareEvent(**_same(e, "weight", "max_devices"), **_act_to_pb(e.act))


def artifact_from_pb(h: lease_pb2.ArtifactHeader) -> NewArtifact:
    """An upload's header the gRPC edge has validated (validate_lease.artifact_header)."""
    return NewArtifact(
        task_id=TaskId(uuid.UUID(h.task_id)),
        lease_id=LeaseId(uuid.UUID(h.lease_id)),
        sha256=bytes.fromhex(h.sha256),
        **_same(h, *ARTIFACT_FACTS),
    )


def artifact_to_pb(a: ArtifactInfo) -> task_pb2.Artifact:
    return task_pb2.Artifact(
        artifact_id=str(a.artifact_id),
        task_id=str(a.task_id),
        content_type=KEEPS.get(a.kind, "application/octet-stream"),
        sha256=a.sha256.hex(),
        created_at=timestamp(a.created_at),
        **_same(a, *ARTIFACT_FACTS),
    )
