"""Checks on what hosts send (amc.v1.Lease's requests), at the gRPC edge: an inventory
and device conditions, an Acquire's serials and wait, renewals and their steps, results,
an upload's header, a session's join. Each problem names its field; the limits and the
rules every field follows are control_plane.validate's."""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import TypeVar

from google.protobuf import duration_pb2

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_common import action_table
from amc_common.action_table import MAX_TEXT
from control_plane import report_files
from control_plane.errors import ArtifactTooLarge, InvalidArgument
from control_plane.validate import (
    MAX_ACTIONS,
    MAX_DEVICES,
    MAX_KEY,
    MAX_LEASES_PER_RENEWAL,
    MAX_REPORTS,
    MAX_SERIALS,
    MAX_SPEC_BYTES,
    MAX_STEP_BYTES,
    MAX_VALUE,
    identifier,
    lease_id,
    printable,
    string_map,
    task_id,
    text,
)

T = TypeVar("T")


def each(items: Sequence[T], field: str, most: int, what: str) -> Iterator[tuple[str, T]]:
    """The items of the repeated `field` (at most `most` of them, `what` they are), each
    with its own field name."""
    if len(items) > most:
        raise InvalidArgument(field, f"more than {most} {what}")
    for i, item in enumerate(items):
        yield f"{field}[{i}]", item


# A step's warnings (lines of the phone's log): at most this many, each this long.
MAX_WARNINGS, MAX_WARNING = 20, 1024


def result(r: task_pb2.TaskResult, field: str = "result") -> None:
    if r.ByteSize() > MAX_SPEC_BYTES:
        raise InvalidArgument(field, f"larger than {MAX_SPEC_BYTES} bytes")
    text(r.error, f"{field}.error", limit=MAX_TEXT)
    for i, step in enumerate(r.steps):
        warnings(step, f"{field}.steps[{i}]")


def warnings(step: task_pb2.StepResult, field: str) -> None:
    for where, warning in each(step.warnings, f"{field}.warnings", MAX_WARNINGS, "warnings"):
        text(warning, where, limit=MAX_WARNING)


def serials(values: object, field: str) -> list[str]:
    items = list(values)  # type: ignore[call-overload]
    return [identifier(s, where) for where, s in each(items, field, MAX_SERIALS, "serials")]


def device(d: lease_pb2.DeviceInfo, field: str) -> None:
    identifier(d.serial, f"{field}.serial")
    for fact in ("model", "manufacturer", "abi"):  # label values too (convert.device_from_pb)
        text(getattr(d, fact), f"{field}.{fact}", limit=MAX_KEY)
        printable(getattr(d, fact), f"{field}.{fact}")
    if not 0 <= d.sdk <= 1000:
        raise InvalidArgument(f"{field}.sdk", "must be between 0 and 1000")
    string_map(dict(d.labels), f"{field}.labels")


MAX_POOLS = 32


def pools(items: Sequence[lease_pb2.EmulatorPool]) -> list[tuple[str, dict[str, str]]]:
    """A host's emulator pools (RenewLeasesRequest.pools): named, with their labels."""
    return [
        (identifier(p.name, f"{where}.name"), string_map(dict(p.labels), f"{where}.labels"))
        for where, p in each(items, "pools", MAX_POOLS, "pools")
    ]


def device_health(items: Sequence[lease_pb2.DeviceHealth], field: str = "devices") -> None:
    """The conditions ReportDeviceHealth takes: known conditions, plausible facts."""
    for where, h in each(items, field, MAX_DEVICES, "devices"):
        identifier(h.serial, f"{where}.serial")
        if h.condition == scheduler_pb2.DEVICE_CONDITION_UNSPECIFIED:
            raise InvalidArgument(f"{where}.condition", "required")
        if h.condition not in scheduler_pb2.DeviceCondition.values():
            raise InvalidArgument(f"{where}.condition", f"unknown value {h.condition}")
        text(h.reason, f"{where}.reason", limit=MAX_VALUE)
        if h.HasField("battery_percent") and not 0 <= h.battery_percent <= 100:
            raise InvalidArgument(f"{where}.battery_percent", "must be between 0 and 100")
        if h.HasField("temperature_celsius") and not -100 <= h.temperature_celsius <= 200:
            raise InvalidArgument(f"{where}.temperature_celsius", "must be between -100 and 200")
        clean_steps(h.cleaned, f"{where}.cleaned")


# The steps of one clean a report may carry (a clean has five at most; an emulator's one).
MAX_CLEAN_STEPS = 20
MAX_STEP_NAME = 64


def clean_steps(steps: Sequence[lease_pb2.CleanStep], field: str) -> None:
    """A device's clean steps: named, one line each, a duration from 0 to a day."""
    for where, step in each(steps, field, MAX_CLEAN_STEPS, "steps"):
        text(step.name, f"{where}.name", required=True, limit=MAX_STEP_NAME)
        printable(step.name, f"{where}.name")
        text(step.detail, f"{where}.detail", limit=MAX_VALUE)
        printable(step.detail, f"{where}.detail")
        took = step.took.seconds + step.took.nanos / 1e9
        if not 0 <= took <= 86400:
            raise InvalidArgument(f"{where}.took", "must be between 0 and 1 day")


OUTCOMES = (lease_pb2.OUTCOME_DONE, lease_pb2.OUTCOME_FAILED, lease_pb2.OUTCOME_CANCELLED)


def report(r: lease_pb2.ReportResultRequest, kept_max: int, where: str = "") -> None:
    """A result as ReportResult takes it, its files at most `kept_max` bytes in all;
    `where` prefixes the field names (in a batch)."""
    task_id(r.task_id, f"{where}task_id")
    lease_id(r.lease_id, f"{where}lease_id")
    if r.attempt < 1:
        raise InvalidArgument(f"{where}attempt", "must be 1 or more")
    if r.outcome not in OUTCOMES:
        raise InvalidArgument(
            f"{where}outcome", "must be OUTCOME_DONE, OUTCOME_FAILED or OUTCOME_CANCELLED"
        )
    result(r.result, f"{where}result")
    report_files.check(r, kept_max, where)


def reports(
    items: Sequence[lease_pb2.ReportResultRequest], kept_max: int, field: str = "results"
) -> None:
    for where, r in each(items, field, MAX_REPORTS, "results"):
        report(r, kept_max, f"{where}.")


def devices(items: Sequence[lease_pb2.DeviceInfo], field: str = "devices") -> None:
    """A host's inventory as RegisterHost takes it."""
    for where, d in each(items, field, MAX_DEVICES, "devices"):
        device(d, where)
    if len({d.serial for d in items}) != len(items):
        raise InvalidArgument(field, "a serial is listed twice")


def wait(d: duration_pb2.Duration, field: str = "wait") -> None:
    if d.seconds < 0 or d.nanos < 0:
        raise InvalidArgument(field, "must not be negative")


def lease_ids(values: Sequence[str], field: str = "lease_ids") -> None:
    if len(values) > MAX_LEASES_PER_RENEWAL:
        raise InvalidArgument(field, f"more than {MAX_LEASES_PER_RENEWAL}")


def step_progress(items: Sequence[lease_pb2.StepProgress], field: str = "steps") -> None:
    """The steps a renewal carries: each for a lease (a UUID), with its index, bounded."""
    for where, p in each(items, field, MAX_REPORTS, "steps"):
        lease_id(p.lease_id, f"{where}.lease_id")
        if p.step.index < 0:
            raise InvalidArgument(f"{where}.step.index", "must not be negative")
        if p.step.ByteSize() > MAX_STEP_BYTES:
            raise InvalidArgument(f"{where}.step", f"larger than {MAX_STEP_BYTES} bytes")
        text(p.step.error, f"{where}.step.error", limit=MAX_TEXT)
        warnings(p.step, f"{where}.step")


# An upload's chunks: at most this much each (gRPC's own message limit is 4 MiB).
MAX_ARTIFACT_CHUNK = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


def artifact_header(h: lease_pb2.ArtifactHeader, max_size: int, field: str = "header") -> None:
    """An upload's header. Past `max_size`: ArtifactTooLarge, before any byte is read."""
    task_id(h.task_id, f"{field}.task_id")
    lease_id(h.lease_id, f"{field}.lease_id")
    if h.attempt < 1:
        raise InvalidArgument(f"{field}.attempt", "must be 1 or more")
    if not 0 <= h.step_index < MAX_ACTIONS:
        raise InvalidArgument(f"{field}.step_index", f"must be between 0 and {MAX_ACTIONS - 1}")
    if not 0 <= h.action_index < MAX_ACTIONS:
        raise InvalidArgument(f"{field}.action_index", f"must be between 0 and {MAX_ACTIONS - 1}")
    text(h.step_name, f"{field}.step_name")
    if h.kind not in action_table.KEEPS:
        raise InvalidArgument(f"{field}.kind", f"must be one of {', '.join(action_table.KEEPS)}")
    if h.size_bytes < 0:
        raise InvalidArgument(f"{field}.size_bytes", "must not be negative")
    if h.size_bytes > max_size:
        raise ArtifactTooLarge(
            f"{field}.size_bytes: {h.size_bytes} bytes is over this control plane's limit of"
            f" {max_size} bytes per artifact; nothing was stored"
        )
    if not _SHA256.fullmatch(h.sha256):
        raise InvalidArgument(f"{field}.sha256", "must be 64 lowercase hex digits (SHA-256)")


def session_join(req: lease_pb2.SessionActionsRequest) -> lease_pb2.SessionJoin:
    if req.WhichOneof("part") != "join":
        raise InvalidArgument("join", "required: the first message joins the session")
    task_id(req.join.task_id, "join.task_id")
    lease_id(req.join.lease_id, "join.lease_id")
    return req.join
