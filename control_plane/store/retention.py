"""Retention's batches: old terminal tasks deleted, long-unseen hosts forgotten
(retention.sql; control_plane/retention.py runs them)."""

from __future__ import annotations

from datetime import timedelta

from control_plane.domain import Removed
from control_plane.store.database import Aggregate


class Retention(Aggregate):
    async def delete_old_tasks(self, finished_before: timedelta, limit: int) -> Removed:
        """One batch: up to `limit` terminal tasks that finished more than `finished_before`
        ago, oldest first, with their attempts and events. Nothing when another replica is
        running a retention batch."""
        row = await self._db.fetchrow("delete_old_tasks", finished_before, limit)
        assert row is not None
        return Removed(
            tasks=row["tasks"],
            attempts=row["attempts"],
            task_events=row["task_events"],
            artifacts=row["artifacts"],
        )

    async def delete_old_cleaning_events(self, older_than: timedelta, limit: int) -> Removed:
        """One batch: up to `limit` `cleaning` host events (the steps of the hosts' cleans
        between leases) recorded more than `older_than` ago, oldest first. Nothing when
        another replica is running a retention batch."""
        row = await self._db.fetchrow("delete_old_cleaning_events", older_than, limit)
        assert row is not None
        return Removed(cleaning_events=row["cleaning_events"])

    async def forget_hosts(self, unseen_for: timedelta, limit: int, reason: str) -> Removed:
        """One batch: up to `limit` hosts not seen for `unseen_for` that hold no lease, with
        their devices, each recorded as removed by retention because `reason`. Nothing when
        another replica is running a retention batch."""
        row = await self._db.fetchrow("forget_hosts", unseen_for, limit, reason)
        assert row is not None
        return Removed(hosts=row["hosts"], devices=row["devices"])
