"""Rows into domain values, and batches into statement arguments: what several of the
store's aggregates read or send the same way."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import asyncpg

from control_plane.domain import Act, Expiry, LeaseId, Progress, Task, TaskId
from control_plane.lifecycle import TaskStatus


def as_is(row: asyncpg.Record | Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The columns a domain value takes as they are, by name."""
    return {name: row[name] for name in names}


# The columns of `tasks` that Task takes as they are.
_TASK_COLUMNS = (
    "request_id", "selector_serial", "priority", "max_attempts", "attempt", "host_id",
    "device_serial", "cancel_requested_at", "cancel_reason", "error", "created_at",
    "updated_at", "finished_at", "queue_timeout", "deadline", "fairness_key",
)  # fmt: skip


def task(row: asyncpg.Record | dict[str, Any]) -> Task:
    return Task(
        task_id=TaskId(row["task_id"]),
        status=TaskStatus(row["status"]),
        spec=bytes(row["spec"]),
        selector_labels=row["selector_labels"] or {},
        metadata=row["metadata"] or {},
        result=bytes(row["result"]) if row["result"] is not None else None,
        submitted_by=row["caller_name"] or row["caller"],
        **as_is(row, *_TASK_COLUMNS),
    )


def with_progress(row: asyncpg.Record) -> Task:
    """A task read with its progress columns (read_tasks): a running one carries it."""
    read = task(row)
    if row["p_steps"] is None:
        return read
    steps = tuple(bytes(s) for s in row["p_steps"])
    return dataclasses.replace(read, progress=Progress(steps, row["p_acknowledged_at"]))


def expiry(row: asyncpg.Record) -> Expiry:
    return Expiry(
        TaskId(row["task_id"]),
        row["attempt"],
        LeaseId(row["lease_id"]),
        row["host_id"],
        TaskStatus(row["to_status"]),
        row["selector_serial"],
        row["selector_labels"] or {},
    )


def act(row: asyncpg.Record) -> Act:
    """Who, why and when, from an event row's columns of the same names."""
    return Act(**as_is(row, "actor", "actor_name", "reason", "at"))


def when(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def columns(rows: Sequence[Any], *fields: str) -> list[list[Any]]:
    """One list per field, in the order of `rows`: how a batch goes into `unnest(...)`."""
    return [[getattr(row, f) for row in rows] for f in fields]
