"""Artifacts: the files the steps kept, stored in chunks under their lease (artifacts.sql;
amc_put_artifact above its statements there)."""

from __future__ import annotations

import asyncpg

from control_plane import errors
from control_plane.domain import ArtifactId, ArtifactInfo, NewArtifact, TaskId
from control_plane.store.database import Aggregate
from control_plane.store.rows import as_is


class Artifacts(Aggregate):
    async def put_artifact(
        self, host_id: str | None, new: NewArtifact, artifact_id: ArtifactId, chunks: list[bytes]
    ) -> tuple[ArtifactInfo, bool]:
        """Keep the artifact under its lease (host_id None: any host's): (the artifact
        stored, whether this call stored it). Refusals raise; nothing is stored then."""
        row = await self._db.fetchrow(
            "put_artifact",
            host_id,
            new.task_id,
            new.attempt,
            new.lease_id,
            artifact_id,
            new.step_index,
            new.action_index,
            new.step_name,
            new.kind,
            new.size_bytes,
            new.sha256,
            chunks,
        )
        assert row is not None
        code = row["code"]
        if code in ("stored", "repeated"):
            return _artifact(row), code == "stored"
        where = f"task {new.task_id} attempt {new.attempt}"
        if code == "other_host":
            raise errors.NotLeaseHolder(
                f"lease {new.lease_id} belongs to another host; nothing was stored"
            )
        if code == "stale":
            raise errors.LeaseNotCurrent(
                f"{where} is no longer current (lease ended, expired or replaced);"
                " nothing was stored"
            )
        if code == "different":
            raise errors.DifferentArtifactStored(
                f"{where} step {new.step_index} action {new.action_index} already has a"
                " different artifact stored; it stands"
            )
        raise errors.LeaseNotCurrent(
            f"lease {new.lease_id} is not the lease of {where}; nothing was stored"
        )

    async def list_artifacts(self, task_id: TaskId, limit: int) -> list[ArtifactInfo]:
        rows = await self._db.fetch("list_artifacts", task_id, limit)
        if not rows:
            raise errors.TaskNotFound(f"no task {task_id}")
        return [_artifact(r) for r in rows if r["artifact_id"] is not None]

    async def get_artifact(self, task_id: TaskId, artifact_id: ArtifactId) -> ArtifactInfo:
        row = await self._db.fetchrow("get_artifact", task_id, artifact_id)
        if row is None:
            raise errors.ArtifactNotFound(f"task {task_id} has no artifact {artifact_id}")
        return _artifact(row)

    async def artifact_chunks(
        self, artifact_id: ArtifactId, first: int, limit: int
    ) -> list[tuple[int, bytes]]:
        """Up to `limit` chunks of the artifact from chunk `first` on, in order."""
        rows = await self._db.fetch("artifact_chunks", artifact_id, first, limit)
        return [(r["seq"], bytes(r["data"])) for r in rows]


_ARTIFACT_COLUMNS = (
    "attempt", "step_index", "action_index", "step_name", "kind", "size_bytes", "created_at",
)  # fmt: skip


def _artifact(row: asyncpg.Record) -> ArtifactInfo:
    return ArtifactInfo(
        artifact_id=ArtifactId(row["artifact_id"]),
        task_id=TaskId(row["task_id"]),
        sha256=bytes(row["sha256"]),
        **as_is(row, *_ARTIFACT_COLUMNS),
    )
