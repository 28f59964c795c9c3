"""The small files a report carries (ReportResultRequest.kept): a run's phone log, mostly,
which would otherwise cost its own UploadArtifact call and transaction before the report.

At the gRPC edge they are checked (`check`: at most MAX_KEPT_BYTES in all, each naming a
step of the result and an action no other artifact of that step has); then each is given
its artifact id and listed in its step's StepResult.artifacts (`listed`, `report_from_pb`),
so the result stored reads as if the file had been uploaded first. The store keeps them in
the report's own statement, only when the result is recorded (store/leases.sql:
report_results); a report refused or repeated stores none, so a retried report never keeps
a file twice.
"""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime

from google.protobuf import timestamp_pb2

from amc.v1 import lease_pb2, task_pb2
from amc_common.action_table import KEEPS
from control_plane.convert import OUTCOME_FROM_PB
from control_plane.domain import KeptFile, LeaseId, Report, TaskId
from control_plane.errors import InvalidArgument
from control_plane.validate import MAX_ACTIONS

# What the files of one report may hold in all: one stored chunk (artifacts.CHUNK) at
# most, so each is kept in one row; larger files are uploaded (UploadArtifact).
MAX_KEPT_BYTES = 64 * 1024
# How many files one report may carry.
MAX_KEPT = 16


def kept_max_bytes(max_artifact_bytes: int) -> int:
    """What a report's files may hold in all on a control plane whose artifacts may hold
    `max_artifact_bytes` each (RegisterHostResponse.kept_max_bytes)."""
    return min(MAX_KEPT_BYTES, max_artifact_bytes)


def check(r: lease_pb2.ReportResultRequest, max_bytes: int, where: str = "") -> None:
    """`r.kept` as ReportResult takes it (at most `max_bytes` in all: kept_max_bytes);
    `where` prefixes the field names (in a batch)."""
    if not r.kept:
        return
    field = f"{where}kept"
    if len(r.kept) > MAX_KEPT:
        raise InvalidArgument(field, f"more than {MAX_KEPT} files")
    size = sum(len(k.data) for k in r.kept)
    if size > max_bytes:
        raise InvalidArgument(
            field,
            f"{size} bytes in all; at most {max_bytes} go with a report here (upload larger"
            " files with UploadArtifact before it)",
        )
    taken = {s.index: {a.action_index for a in s.artifacts} for s in r.result.steps}
    for i, k in enumerate(r.kept):
        at = f"{field}[{i}]"
        if k.kind not in KEEPS:
            raise InvalidArgument(f"{at}.kind", f"must be one of {', '.join(KEEPS)}")
        if not 0 <= k.action_index < MAX_ACTIONS:
            raise InvalidArgument(f"{at}.action_index", f"must be between 0 and {MAX_ACTIONS - 1}")
        actions = taken.get(k.step_index)
        if actions is None:
            raise InvalidArgument(f"{at}.step_index", f"no step {k.step_index} in the result")
        if k.action_index in actions:
            raise InvalidArgument(
                f"{at}.action_index",
                f"step {k.step_index} has an artifact of action {k.action_index} already",
            )
        actions.add(k.action_index)


def listed(r: lease_pb2.ReportResultRequest) -> tuple[task_pb2.TaskResult, tuple[KeptFile, ...]]:
    """The result with each carried file listed in its step, and the files to store; `r`
    as `check` passed it. Without files, the result as it came."""
    if not r.kept:
        return r.result, ()
    result = task_pb2.TaskResult()
    result.CopyFrom(r.result)
    steps = {s.index: s for s in result.steps}
    now = timestamp_pb2.Timestamp()
    now.FromDatetime(datetime.now(UTC))
    task_id = str(uuid.UUID(r.task_id))
    files = []
    for k in r.kept:
        step = steps[k.step_index]
        kept = KeptFile(
            uuid.uuid4(),
            k.step_index,
            k.action_index,
            step.name,
            k.kind,
            hashlib.sha256(k.data).digest(),
            k.data,
        )
        step.artifacts.append(
            task_pb2.Artifact(
                artifact_id=str(kept.artifact_id),
                task_id=task_id,
                attempt=r.attempt,
                step_index=k.step_index,
                step_name=step.name,
                action_index=k.action_index,
                kind=k.kind,
                content_type=KEEPS[k.kind],
                size_bytes=len(k.data),
                sha256=kept.sha256.hex(),
                created_at=now,
            )
        )
        files.append(kept)
    return result, tuple(files)


def report_from_pb(r: lease_pb2.ReportResultRequest) -> Report:
    """A result the gRPC edge has validated (validate_lease.report), the files it carries
    listed in their steps."""
    result, kept = listed(r)
    return Report(
        TaskId(uuid.UUID(r.task_id)),
        r.attempt,
        LeaseId(uuid.UUID(r.lease_id)),
        OUTCOME_FROM_PB[r.outcome],
        result.SerializeToString(deterministic=True),
        r.result.error,
        r.cleans,
        kept,
    )
