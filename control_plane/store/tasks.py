"""Tasks: submit, cancel and the queue-timeout sweep (their statements in tasks.sql), and
the reads of a task, its history and the task list."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from control_plane import errors
from control_plane.domain import (
    AttemptInfo,
    CancelNotice,
    DeviceMatch,
    KeyCap,
    LeaseId,
    NewTask,
    Task,
    TaskEvent,
    TaskHistory,
    TaskId,
    TaskRead,
)
from control_plane.lifecycle import CancelCode, TaskStatus
from control_plane.store.database import Aggregate, Database
from control_plane.store.grouped import GroupCommit
from control_plane.store.rows import columns, task, when, with_progress


class Tasks(Aggregate):
    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._group: GroupCommit[tuple[str, str, NewTask], tuple[Task, bool]] = GroupCommit(
            self._submit_rows
        )

    async def submit(
        self, caller: str, new: NewTask, *, name: str = "", relay: str | None = None
    ) -> tuple[Task, bool]:
        """Queue a task; returns (task, created). An existing request_id returns its task.
        `relay`: a session's, the replica holding its client's call (session_relays)."""
        (answer,) = await self.submit_many(caller, [new], name=name, relay=relay)
        return answer

    async def submit_many(
        self, caller: str, news: list[NewTask], *, name: str = "", relay: str | None = None
    ) -> list[tuple[Task, bool]]:
        """Queue tasks with one statement (so all or none), in order; (task, created) for
        each, in order. An existing request_id returns its task. `name`: the caller's
        token's name, kept with the tasks (Task.submitted_by)."""
        answers = await self._submit_rows([(caller, name, new) for new in news], relay)
        for answer in answers:
            if isinstance(answer, Exception):
                raise answer
        return [a for a in answers if not isinstance(a, Exception)]

    async def submit_grouped(
        self, caller: str, new: NewTask, *, name: str = ""
    ) -> tuple[Task, bool]:
        """Queue one task, written with the others submitted on this replica meanwhile (a
        group commit: store/grouped.py); answered after its commit, with its own task or
        its own error."""
        return await self._group((caller, name, new))

    async def _submit_rows(
        self, rows: Sequence[tuple[str, str, NewTask]], relay: str | None = None
    ) -> list[tuple[Task, bool] | Exception]:
        """Queue (caller, caller's token name, task) rows with one statement; each row's
        (task, created), or its own error."""
        news = [new for _, _, new in rows]
        ids = [uuid.uuid4() for _ in news]
        found = await self._db.fetch(
            "submit_tasks",
            [caller for caller, _, _ in rows],
            ids,
            *columns(
                news,
                "request_id",
                "spec",
                "selector_serial",
                "selector_labels",
                "priority",
                "max_attempts",
                "metadata",
                "queue_timeout",
                "deadline",
                "fairness_key",
            ),
            relay,
            [new.maintenance for new in news],
            [name for _, name, _ in rows],
        )
        created = {row["task_id"]: task(row) for row in found}
        existing: dict[tuple[str, str], Task] = {}
        if len(created) < len(news):
            # Request ids used before (maybe by a call that committed since the statement's
            # snapshot, or by an earlier row of the same statement): the tasks they made.
            keys = [
                (c, n.request_id)
                for (c, _, n), i in zip(rows, ids, strict=True)
                if i not in created and n.request_id is not None
            ]
            for row in await self._db.fetch(
                "tasks_by_request", [c for c, _ in keys], [r for _, r in keys]
            ):
                existing[row["caller"], row["request_id"]] = task(row)
        out: list[tuple[Task, bool] | Exception] = []
        for task_id, (caller, _, new) in zip(ids, rows, strict=True):
            if task_id in created:
                out.append((created[task_id], True))
            elif new.request_id is not None and (caller, new.request_id) in existing:
                out.append((existing[caller, new.request_id], False))
            else:
                out.append(
                    errors.DatabaseUnavailable("request id is being created concurrently; retry")
                )
        return out

    async def open_sessions(self, caller: str) -> int:
        """How many sessions `caller` has queued or running (one indexed count)."""
        row = await self._db.fetchrow("open_sessions", caller)
        assert row is not None
        return int(row["count"])

    async def get_task(self, task_id: TaskId) -> Task:
        row = await self._db.fetchrow("get_task", task_id)
        if row is None:
            raise errors.TaskNotFound(f"no task {task_id}")
        return task(row)

    async def task_history(self, task_id: TaskId, after_event: int, limit: int) -> TaskHistory:
        """The task's attempts, and up to `limit` of its events after event `after_event`."""
        row = await self._db.fetchrow("task_history", task_id, after_event, limit)
        if row is None or not row["found"]:
            raise errors.TaskNotFound(f"no task {task_id}")
        return TaskHistory(
            [_attempt(a) for a in row["attempts"]], [_event(e) for e in row["events"]]
        )

    async def list_tasks(
        self,
        statuses: list[TaskStatus],
        host_id: str | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        selector_labels: dict[str, str] | None = None,
        pattern: str = "",
    ) -> list[Task]:
        """Newest first; `pattern` (LIKE, escaped) matches the id's start, or anywhere in
        the request id or metadata."""
        created, task_id = after if after else (None, None)
        rows = await self._db.fetch(
            "list_tasks",
            [str(s) for s in statuses],
            host_id,
            created,
            task_id,
            limit,
            selector_labels or {},
            pattern,
        )
        return [task(r) for r in rows]

    async def cancel(
        self, task_id: TaskId, reason: str
    ) -> tuple[CancelCode, Task, CancelNotice | None]:
        """Returns (code, task, notice); code is CANCELLED, REQUESTED or UNCHANGED (else it
        raises). A REQUESTED one's notice is for the host's stream: sent after the commit
        (Effects.cancelled), none is sent by the transaction."""
        row = await self._db.fetchrow("cancel_task", task_id, reason)
        assert row is not None
        code = CancelCode(row["code"])
        if code is CancelCode.NOT_FOUND:
            raise errors.TaskNotFound(f"no task {task_id}")
        cancelled = task(row)
        if code is CancelCode.TERMINAL:
            raise errors.TaskAlreadyTerminal(
                f"task {task_id} is already {cancelled.status}; a finished task cannot be cancelled"
            )
        notice = None
        if code is CancelCode.REQUESTED and cancelled.host_id is not None:
            notice = CancelNotice(
                cancelled.host_id,
                LeaseId(row["cancel_lease"]),
                cancelled.task_id,
                cancelled.attempt,
                row["cancel_epoch"],
            )
        return code, cancelled, notice

    async def time_out_queued(self, limit: int = 100) -> list[Task]:
        """Fail up to `limit` queued tasks whose queue timeout ran out (one statement)."""
        return [task(r) for r in await self._db.fetch("time_out_queued", limit)]

    async def read_tasks(
        self, task_ids: Sequence[TaskId], connected_within: timedelta, *, explain: bool = True
    ) -> list[TaskRead]:
        """The tasks (those that exist): each running one with its progress, each queued
        one (unless not `explain`) with the devices its selector matches, by what keeps
        them from it, and its key's cap. One statement, so one snapshot (a phone that took
        the task is never counted busy with it)."""
        rows = await self._db.fetch("read_tasks", list(task_ids), connected_within, explain)
        return [
            TaskRead(
                with_progress(r),
                None if r["m_devices"] is None else DeviceMatch.of(r["m_devices"]),
                None
                if r["cap_max_devices"] is None
                else KeyCap(r["cap_max_devices"], int(r["cap_running"])),
            )
            for r in rows
        ]


def _attempt(a: dict[str, Any]) -> AttemptInfo:
    return AttemptInfo(
        attempt=a["attempt"],
        host_id=a["host_id"],
        device_serial=a["device_serial"],
        lease_id=LeaseId(uuid.UUID(a["lease_id"])),
        state=a["state"],
        created_at=datetime.fromisoformat(a["created_at"]),
        acknowledged_at=when(a["acknowledged_at"]),
        ended_at=when(a["ended_at"]),
        cancel_requested_at=when(a["cancel_requested_at"]),
    )


def _event(e: dict[str, Any]) -> TaskEvent:
    return TaskEvent(
        event_id=e["event_id"],
        attempt=e["attempt"],
        kind=e["kind"],
        from_status=TaskStatus(e["from_status"]) if e["from_status"] else None,
        to_status=TaskStatus(e["to_status"]) if e["to_status"] else None,
        detail=e["detail"],
        at=datetime.fromisoformat(e["at"]),
    )
