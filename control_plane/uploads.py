"""A host's `Lease.UploadArtifact` call on the wire: the header first, then the chunks,
kept through `Artifacts`; a refusal counted by why, with what the host still sends read
and dropped so that it reads the refusal as its call's status. How the bytes are received
and checked, and kept, is control_plane.artifacts'."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import structlog

from amc.v1 import lease_pb2, task_pb2
from control_plane import errors, metrics, validate_lease
from control_plane.artifacts import Artifacts, UploadMemory, receive
from control_plane.convert import artifact_from_pb, artifact_to_pb
from control_plane.errors import AmcError, InvalidArgument
from control_plane.rpc import check_decoded, first_message

log = structlog.get_logger(__name__)
# How long a refused upload's remaining messages are read and dropped before the answer.
DRAIN_SECONDS = 2.0
# A refused upload's error (by its branch of the error tree) -> how the metrics count it.
_UPLOAD_REFUSALS: dict[type[AmcError], str] = {
    errors.ResourceExhausted: "too_large",
    errors.DataLoss: "damaged",
    errors.FailedPrecondition: "refused",
    errors.PermissionDenied: "refused",
    errors.InvalidArgument: "invalid",
    errors.UploadsBusy: "busy",
}

Requests = AsyncIterator[lease_pb2.UploadArtifactRequest]


async def upload(
    requests: Requests,
    host_id: str | None,
    artifacts: Artifacts,
    memory: UploadMemory,
    max_bytes: int,
) -> task_pb2.Artifact:
    """Receive one upload of `host_id` (at most `max_bytes`) and keep it."""
    received = 0
    try:
        first = await first_message(requests, "header", "required: the first message is the header")
        validate_lease.artifact_header(first.header, max_bytes)
        new = artifact_from_pb(first.header)
        with memory.reserve(new.size_bytes):
            data = await receive(new, chunks(requests))
            received = len(data)
            artifact, stored = await artifacts.put(host_id, new, data)
    except AmcError as exc:
        refusal = next((r for c, r in _UPLOAD_REFUSALS.items() if isinstance(exc, c)), None)
        if refusal is not None:
            _count_upload(refusal, received)
        await drain(requests)
        raise
    _count_upload("stored" if stored else "repeated", received if stored else 0)
    log.info(
        "artifact stored" if stored else "artifact already stored",
        task_id=str(new.task_id),
        attempt=new.attempt,
        step=new.step_index,
        kind=new.kind,
        size=new.size_bytes,
    )
    return artifact_to_pb(artifact)


async def chunks(requests: AsyncIterator[Any]) -> AsyncIterator[bytes]:
    """The bytes of an upload after its header (an artifact's, or the app library's: any
    request whose `part` oneof is a header, then chunks)."""
    index = 0
    async for request in requests:
        index += 1
        check_decoded(request)
        if request.WhichOneof("part") != "chunk":
            raise InvalidArgument(f"message {index}", "only the first message is a header")
        if len(request.chunk) > validate_lease.MAX_ARTIFACT_CHUNK:
            raise InvalidArgument(
                f"message {index}.chunk", f"larger than {validate_lease.MAX_ARTIFACT_CHUNK} bytes"
            )
        yield request.chunk


async def drain(requests: AsyncIterator[Any]) -> None:
    """Read what the host is still sending (for a short while), so that it reads our
    refusal as its call's status; a client whose writes the server cut off sees only
    gRPC's "Internal error from Core"."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in requests:
                pass


def _count_upload(result: str, size: int) -> None:
    metrics.ARTIFACT_UPLOADS.labels(result).inc()
    if size:
        metrics.ARTIFACT_BYTES.labels("stored" if result == "stored" else "refused").inc(size)
