"""Artifacts: the files the steps kept, as announced and as stored."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import NewType

from control_plane.domain.tasks import (
    LeaseId,
    TaskId,
)

ArtifactId = NewType("ArtifactId", uuid.UUID)


@dataclass(frozen=True)
class ArtifactFile:
    """What a kept file is: the attempt and the action that kept it, its size and digest."""

    task_id: TaskId
    attempt: int
    step_index: int
    action_index: int
    step_name: str
    # amc_common.action_table.KEEPS: "screenshot" or "ui_dump".
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
