"""Replicas and presence: each replica's heartbeat, which replica holds a host's renewal
stream or a session's client call, where a phone to watch is, and the secret the replicas
prove themselves to one another with (replicas.sql)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from control_plane.domain import SessionLease, SessionRelay, TaskId
from control_plane.lifecycle import TaskStatus
from control_plane.store.database import Aggregate


class Replicas(Aggregate):
    async def replica_alive(self, replica: str, address: str | None = None) -> None:
        await self._db.fetch("replica_alive", replica, address)

    async def set_presence(self, replica: str, hosts: list[str], opened: list[bool]) -> None:
        await self._db.fetch("set_presence", replica, hosts, opened)

    async def replica_gone(self, replica: str) -> None:
        await self._db.fetch("replica_gone", replica)

    async def session_join(
        self, task_id: TaskId, lease_id: uuid.UUID, within: timedelta
    ) -> SessionLease | None:
        """A host's join of a session as the database sees it, with where its client's
        call is held (replicas.sql session_join, one statement); None: no such task."""
        row = await self._db.fetchrow("session_join", task_id, lease_id, within)
        if row is None:
            return None
        relay = None
        if row["replica_id"] is not None:
            relay = SessionRelay(row["replica_id"], row["address"], row["alive"])
        return SessionLease(
            session=row["session"],
            status=TaskStatus(row["status"]),
            task_attempt=row["task_attempt"],
            attempt=row["attempt"],
            host_id=row["host_id"],
            live=bool(row["live"]),
            relay=relay,
        )

    async def session_relay(
        self, task_id: TaskId, within: timedelta
    ) -> tuple[bool, str, SessionRelay | None] | None:
        """Whether the task is a session, who opened it, and where its client's call is
        held (replicas.sql session_relay); None: no such task."""
        row = await self._db.fetchrow("session_relay", task_id, within)
        if row is None:
            return None
        relay = None
        if row["replica_id"] is not None:
            relay = SessionRelay(row["replica_id"], row["address"], row["alive"])
        return bool(row["session"]), str(row["caller"]), relay

    async def screen_source(
        self, task_id: uuid.UUID | None, host_id: str, serial: str, within: timedelta
    ) -> dict[str, Any] | None:
        """Where a phone to watch is (replicas.sql screen_source), in one statement."""
        row = await self._db.fetchrow("screen_source", task_id, host_id, serial, within)
        return dict(row) if row is not None else None

    async def screen_attempt(self, task_id: uuid.UUID) -> dict[str, Any] | None:
        """A watched task's current attempt (replicas.sql screen_attempt); None: gone."""
        row = await self._db.fetchrow("screen_attempt", task_id)
        return dict(row) if row is not None else None

    async def replica_secret(self, candidate: bytes) -> bytes:
        """The farm's replica secret: `candidate` if there was none yet."""
        row = await self._db.fetchrow("replica_secret", candidate)
        assert row is not None
        return bytes(row["secret"])
