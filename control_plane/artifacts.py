"""Artifacts: the files steps kept (a screenshot's PNG, a ui_dump's XML) — how an upload is
received and checked, and the one small interface behind which their bytes are kept.

An upload is read whole before anything is written (at most the configured limit, 10 MiB
by default, and at most what its header announced: refused as soon as more arrives; the
uploads a replica holds at once are bounded by `UploadMemory`), its size and SHA-256
checked against the header, and then kept in one call that is fenced like a report (only
under the live lease of the task's current attempt, as its host). So a refused upload
stores nothing, and a kept one is whole.

`Artifacts` is what the servicers use; `PostgresArtifacts` keeps the bytes in PostgreSQL
(chunked bytea rows deleted with their task). An S3-compatible store would be a second
implementation of the same four methods: docs/architecture.md says what it would take.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Protocol

from prometheus_client import Gauge

from control_plane import errors, metrics
from control_plane.domain import ArtifactId, ArtifactInfo, NewArtifact, TaskId
from control_plane.store import Store

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
# What one bytea row holds, and so what one message of GetArtifact carries.
CHUNK = 256 * 1024
# Chunks read from the database per round trip while streaming one back (2 MiB).
READ_AHEAD = 8
# ListArtifacts answers at most this many.
MAX_LISTED = 1000


class Artifacts(Protocol):
    """Where artifacts are kept."""

    async def put(
        self, host_id: str | None, new: NewArtifact, data: bytes
    ) -> tuple[ArtifactInfo, bool]:
        """Keep `data` (checked against `new` already) under the lease `new` names, as
        `host_id` (None: any host): (the artifact, whether this call stored it; False when
        the same one was stored before). Raises the fencing refusals; stores nothing then."""
        ...

    async def list(self, task_id: TaskId) -> list[ArtifactInfo]:
        """The task's artifacts by attempt, step and action (TaskNotFound if no task)."""
        ...

    async def get(self, task_id: TaskId, artifact_id: ArtifactId) -> ArtifactInfo: ...

    def read(self, artifact: ArtifactInfo) -> AsyncIterator[bytes]:
        """The artifact's bytes, in order, a chunk at a time."""
        ...


class PostgresArtifacts:
    """Artifacts in PostgreSQL: a row each, the bytes in CHUNK-sized bytea rows."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def put(
        self, host_id: str | None, new: NewArtifact, data: bytes
    ) -> tuple[ArtifactInfo, bool]:
        chunks = [data[i : i + CHUNK] for i in range(0, len(data), CHUNK)]
        artifact_id = ArtifactId(uuid.uuid4())
        return await self._store.artifacts.put_artifact(host_id, new, artifact_id, chunks)

    async def list(self, task_id: TaskId) -> list[ArtifactInfo]:
        return await self._store.artifacts.list_artifacts(task_id, MAX_LISTED)

    async def get(self, task_id: TaskId, artifact_id: ArtifactId) -> ArtifactInfo:
        return await self._store.artifacts.get_artifact(task_id, artifact_id)

    def read(self, artifact: ArtifactInfo) -> AsyncIterator[bytes]:
        return read_chunks(
            lambda first, limit: self._store.artifacts.artifact_chunks(
                artifact.artifact_id, first, limit
            )
        )


class UploadMemory:
    """What the uploads being received on this replica may hold at once (`what`: artifacts
    in memory; the app library's, spooled to disk): each reserves its header's size before
    its first byte is read, and a reservation past the budget is refused UNAVAILABLE (the
    caller tries again shortly), so a burst of uploads cannot take a replica's memory or
    disk. `gauge` shows what is held."""

    def __init__(
        self, budget: int, what: str = "artifacts", gauge: Gauge = metrics.ARTIFACT_UPLOAD_MEMORY
    ) -> None:
        self.budget = budget
        self.held = 0
        self._what = what
        self._gauge = gauge

    @contextlib.contextmanager
    def reserve(self, size: int) -> Iterator[None]:
        if self.held + size > self.budget:
            raise errors.UploadsBusy(
                f"this replica is receiving {self.held} bytes of {self._what} already (its"
                f" budget is {self.budget}); nothing was stored: try again shortly"
            )
        self.held += size
        self._gauge.set(self.held)
        try:
            yield
        finally:
            self.held -= size
            self._gauge.set(self.held)


async def checked(size: int, sha256: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The chunks of an upload as they arrive, checked against its header
    (ChecksumMismatch): refused as soon as more than `size` bytes arrive (so what the upload
    reserved bounds what it holds), and at the end when the size or SHA-256 of what arrived
    is not the header's."""
    received = 0
    digest = hashlib.sha256()
    async for chunk in chunks:
        if received + len(chunk) > size:
            raise errors.ChecksumMismatch(
                f"more than the header's {size} bytes sent; nothing was stored"
            )
        received += len(chunk)
        digest.update(chunk)
        yield chunk
    if received != size:
        raise errors.ChecksumMismatch(
            f"received {received} bytes, the header said {size}; nothing was stored"
        )
    if digest.digest() != sha256:
        raise errors.ChecksumMismatch(
            f"the bytes received have sha256 {digest.hexdigest()}, the header said"
            f" {sha256.hex()}; nothing was stored"
        )


async def receive(new: NewArtifact, chunks: AsyncIterator[bytes]) -> bytes:
    """All the bytes of an upload, checked against its header (`checked`)."""
    received = bytearray()
    async for chunk in checked(new.size_bytes, new.sha256, chunks):
        received += chunk
    return bytes(received)


async def read_chunks(
    fetch: Callable[[int, int], Awaitable[list[tuple[int, bytes]]]],
) -> AsyncIterator[bytes]:
    """Bytes kept in chunk rows, in order: `fetch(first, limit)` reads up to `limit` rows
    from chunk `first` on (READ_AHEAD per round trip)."""
    seq = 0
    while True:
        rows = await fetch(seq, READ_AHEAD)
        for _, data in rows:
            yield data
        if len(rows) < READ_AHEAD:
            return
        seq = rows[-1][0] + 1
