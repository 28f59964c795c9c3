"""Uploads the files a run kept (screenshots, UI dumps) to the control plane, before its
result is reported, under the attempt's lease.

Each kept file goes in one UploadArtifact stream (a header with its size and SHA-256, then
the bytes in chunks), tried again on transient errors like a report (the control plane
answers a repeated upload with the artifact it stored). All of a run's uploads share one
time budget (the agent's --upload-timeout): past it, or when the control plane refuses
one, the step's `data` says why (`artifact_error`) and the report goes on without it. The
bytes are dropped from the result either way; what the report carries is the stored
artifacts' references (StepResult.artifacts).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Iterator

import grpc
import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc, task_pb2
from host_agent import metrics
from host_agent.fencing import HeldLease
from host_agent.results import Kept, RunResult, StepResult, StoredArtifact
from host_agent.retry import Delivery, RetryPolicy, call_with_retries

log = structlog.get_logger(__name__)

# Bytes per message of an upload.
CHUNK = 256 * 1024
# How many files one report may carry (ReportResultRequest.kept: the control plane's
# limit; what they may hold in all, it says at registration).
CARRIED_FILES = 16
# What a report carrying files may come to at most: below the control plane's 1 MiB
# message limit with room to spare (a result near it carries nothing and uploads all).
CARRYING_REPORT = 768 * 1024
# What a step adds to a report beyond its texts (index, status, times), and an artifact's
# reference, at most.
STEP_BYTES, ARTIFACT_BYTES = 64, 256
# What an upload is given at least, even when the budget is nearly spent: one try.
MIN_TRY = 1.0


async def upload_kept(
    stub: lease_pb2_grpc.LeaseStub,
    result: RunResult,
    lease: HeldLease,
    budget: float,
    late: str | None = None,
) -> RunResult:
    """`result` with every kept file uploaded (or the reason it was not, in its step's
    data) and no bytes left in it. `late` says why a file the budget left no time for was
    not kept (by default: the uploads took longer than the budget)."""
    if not any(step.kept for step in result.steps):
        return result
    deadline = time.monotonic() + budget
    late = late or f"uploads took longer than {budget:g}s"
    steps = [await _upload_step(stub, step, lease, deadline, late) for step in result.steps]
    return dataclasses.replace(result, steps=tuple(steps))


def carried(result: RunResult, budget: int) -> tuple[RunResult, list[lease_pb2.KeptFile]]:
    """`result` less the kept files that go with its report instead of being uploaded
    first (as many as fit in `budget` bytes, in step order: a run's phone log, mostly),
    and those files. One upload call and transaction less a run, and the report still
    batched with those of the host's other phones."""
    left = min(budget, CARRYING_REPORT - _size_bound(result))
    files: list[lease_pb2.KeptFile] = []
    steps = []
    for step in result.steps:
        kept = []
        for k in step.kept:
            if len(k.data) <= left and len(files) < CARRIED_FILES:
                left -= len(k.data)
                carry = lease_pb2.KeptFile(
                    step_index=step.index, action_index=k.action_index, kind=k.kind, data=k.data
                )
                files.append(carry)
            else:
                kept.append(k)
        steps.append(
            step if len(kept) == len(step.kept) else dataclasses.replace(step, kept=tuple(kept))
        )
    if not files:
        return result, files
    metrics.ARTIFACT_UPLOADS.labels("with_report").inc(len(files))
    return dataclasses.replace(result, steps=tuple(steps)), files


def _size_bound(result: RunResult) -> int:
    """More than `result` comes to in its report, its kept files left out (each may be
    uploaded and referenced instead)."""
    size = len(result.error.encode())
    for s in result.steps:
        texts = (s.name, s.output, s.error, *s.data.keys(), *s.data.values(), *s.warnings)
        size += STEP_BYTES + sum(len(t.encode()) + 4 for t in texts)
        size += ARTIFACT_BYTES * (len(s.artifacts) + len(s.kept))
    return size


def without_carried(
    request: lease_pb2.ReportResultRequest, why: str
) -> lease_pb2.ReportResultRequest:
    """`request` less the files it carried, each step that carried one saying why it was
    not kept (its `artifact_error`): for a control plane that refused them (its limit fell
    since it said it), so that the result itself is never lost for them."""
    bare = lease_pb2.ReportResultRequest()
    bare.CopyFrom(request)
    del bare.kept[:]
    steps = {s.index: s for s in bare.result.steps}
    for k in request.kept:
        step = steps.get(k.step_index)
        if step is None:
            continue
        key = next(
            key
            for i in range(len(step.data) + 1)
            if (key := "artifact_error" if i == 0 else f"artifact_error#{i}") not in step.data
        )
        step.data[key] = f"{k.kind} not kept: refused with the report: {why}"
        metrics.ARTIFACT_UPLOADS.labels("failed").inc()
    return bare


async def upload_step(
    stub: lease_pb2_grpc.LeaseStub, step: StepResult, lease: HeldLease, budget: float
) -> StepResult:
    """`step` with its kept files uploaded (as upload_kept does for a whole run)."""
    late = f"uploads took longer than {budget:g}s"
    return await _upload_step(stub, step, lease, time.monotonic() + budget, late)


async def _upload_step(
    stub: lease_pb2_grpc.LeaseStub, step: StepResult, lease: HeldLease, deadline: float, late: str
) -> StepResult:
    if not step.kept:
        return step
    stored: list[StoredArtifact] = []
    problems: list[str] = []
    for kept in step.kept:
        left = deadline - time.monotonic()
        if left <= 0:
            problems.append(f"{kept.kind} not kept: {late}")
            metrics.ARTIFACT_UPLOADS.labels("timeout").inc()
            continue
        answer = await _upload(stub, step, kept, lease, left)
        if isinstance(answer, StoredArtifact):
            stored.append(answer)
        else:
            problems.append(f"{kept.kind} not kept: {answer}")
    data = dict(step.data)
    for i, problem in enumerate(problems):
        data["artifact_error" if i == 0 else f"artifact_error#{i}"] = problem
    return dataclasses.replace(step, kept=(), artifacts=step.artifacts + tuple(stored), data=data)


async def _upload(
    stub: lease_pb2_grpc.LeaseStub, step: StepResult, kept: Kept, lease: HeldLease, left: float
) -> StoredArtifact | str:
    """The stored artifact, or why it is not."""
    header = lease_pb2.ArtifactHeader(
        task_id=lease.task_id,
        attempt=lease.attempt,
        lease_id=lease.lease_id,
        step_index=step.index,
        step_name=step.name,
        action_index=kept.action_index,
        kind=kept.kind,
        size_bytes=len(kept.data),
        sha256=hashlib.sha256(kept.data).hexdigest(),
    )
    bound = log.bind(task_id=lease.task_id, attempt=lease.attempt, step=step.index, kind=kept.kind)
    policy = RetryPolicy(total=max(left, MIN_TRY), call_timeout=max(left, MIN_TRY))
    delivery: Delivery[task_pb2.Artifact] = await call_with_retries(
        lambda timeout: stub.UploadArtifact(_messages(header, kept.data), timeout=timeout),
        policy,
        bound,
        "artifact upload",
        # Over the control plane's size limit: sending it again cannot help.
        final=frozenset({grpc.StatusCode.RESOURCE_EXHAUSTED}),
    )
    if delivery.response is None:
        metrics.ARTIFACT_UPLOADS.labels("failed").inc()
        code = delivery.code.name if delivery.code else "unknown"
        return f"upload failed: {code}: {delivery.details}".rstrip(": ")
    metrics.ARTIFACT_UPLOADS.labels("stored").inc()
    metrics.ARTIFACT_BYTES.inc(len(kept.data))
    a = delivery.response
    bound.info("artifact uploaded", artifact_id=a.artifact_id, size=a.size_bytes)
    return StoredArtifact(a.artifact_id, a.kind, kept.action_index, a.size_bytes, a.sha256)


def _messages(
    header: lease_pb2.ArtifactHeader, data: bytes
) -> Iterator[lease_pb2.UploadArtifactRequest]:
    yield lease_pb2.UploadArtifactRequest(header=header)
    for i in range(0, len(data), CHUNK):
        yield lease_pb2.UploadArtifactRequest(chunk=data[i : i + CHUNK])
