"""The queue's counts and fair shares, and the farm's gauges (their statements in
queue.sql and queue.count.sql, with the functions they call: amc_count_queue,
amc_device_use, amc_forget_queue_groups, ...)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from control_plane.domain import (
    DeviceMatch,
    FairShare,
    FairShareEvent,
    FarmGauges,
    KeyLoad,
    Principal,
    QueueGroup,
    QueueWait,
    ShareChange,
    TaskId,
)
from control_plane.store.database import Aggregate
from control_plane.store.rows import act


class Queue(Aggregate):
    async def groups(self, limit: int) -> tuple[list[QueueWait], int, datetime | None]:
        """The queue as last counted: the `limit` largest selectors, the queued total, and
        when it was counted (None: not yet)."""
        rows = await self._db.fetch("queue_groups", limit)
        groups = [
            QueueWait(
                r["selector_serial"],
                r["selector_labels"] or {},
                r["n"],
                r["oldest"],
                DeviceMatch.of(r["devices"] or {}),
            )
            for r in rows
        ]
        if not rows:
            row = await self._db.fetchrow("queue_counted_at")
            return [], 0, row["counted_at"] if row else None
        return groups, int(rows[0]["total"]), rows[0]["counted_at"]

    async def count_queue(self, every: timedelta, connected_within: timedelta) -> int | None:
        """Count the queue into queue_group_stats unless it was counted less than `every`
        ago or another replica is counting it; the tasks queued, or None if it did not."""
        row = await self._db.fetchrow("count_queue", every, connected_within)
        return None if row is None else int(row["queued"])

    async def fair_shares(
        self, limit: int, key: str | None = None
    ) -> tuple[list[FairShare], datetime | None]:
        """The fairness keys with tasks queued or running or a share set (or only `key`),
        most queued first, at most `limit`; and when the queue was counted (None: not yet)."""
        rows = await self._db.fetch("fair_shares", key, limit)
        shares = [
            FairShare(
                r["fairness_key"],
                r["weight"],
                r["max_devices"],
                int(r["queued"]),
                int(r["running"]),
                r["oldest"],
                r["updated_at"],
            )
            for r in rows
        ]
        if not rows:
            row = await self._db.fetchrow("queue_counted_at")
            return [], row["counted_at"] if row else None
        return shares, rows[0]["counted_at"]

    async def set_fair_share(
        self, key: str, change: ShareChange, actor: Principal, reason: str
    ) -> int | None:
        """Set the key's share as `change` says, recorded as done by `actor` because
        `reason`; the cap it had before (None: none)."""
        row = await self._db.fetchrow(
            "set_fair_share",
            key,
            change.weight,
            change.max_devices,
            change.clear_cap,
            actor.caller,
            actor.name,
            reason,
        )
        assert row is not None
        cap: int | None = row["cap_before"]
        return cap

    async def fair_share_events(self, key: str, limit: int) -> list[FairShareEvent]:
        """The key's latest `limit` changes of its share, newest first."""
        rows = await self._db.fetch("fair_share_events", key, limit)
        return [FairShareEvent(r["weight"], r["max_devices"], act(r)) for r in rows]

    async def fair_share_heads(
        self, key: str, limit: int
    ) -> list[tuple[TaskId, str | None, dict[str, str]]]:
        """The key's first `limit` queued tasks in dispatch order: (id, serial, labels)."""
        rows = await self._db.fetch("fair_share_heads", key, limit)
        return [(TaskId(r["task_id"]), r["selector_serial"], r["selector_labels"]) for r in rows]

    async def forget_queue_groups(self, idle: timedelta, limit: int) -> int:
        """Forget up to `limit` queue groups with no task queued or running, made more than
        `idle` ago; how many went."""
        row = await self._db.fetchrow("forget_queue_groups", idle, limit)
        assert row is not None
        return int(row[0])

    async def farm_gauges(self, connected_within: timedelta, selectors: int) -> FarmGauges:
        """The farm-wide figures of the metrics, in one round trip: the queue in at most
        `selectors` groups plus one for the rest."""
        row = await self._db.fetchrow("farm_gauges", connected_within, selectors)
        assert row is not None
        return FarmGauges(
            tasks={k: int(v) for k, v in row["tasks"].items()},
            hosts_connected=int(row["hosts_connected"]),
            devices={(d["state"], bool(d["busy"])): int(d["n"]) for d in row["devices"]},
            queue=[
                QueueGroup(q["serial"], q["labels"], int(q["n"]), float(q["oldest"]))
                for q in row["queue"]
            ],
            keys=[
                KeyLoad(k["key"], int(k["queued"]), int(k["running"]), k["oldest"])
                for k in row["keys"]
            ],
            counted_ago=row["counted_ago"],
            conditions={c[0]: int(c[1]) for c in row["health"]},
            battery=_spread([c[2:6] for c in row["health"]]),
            temperature=_spread([c[6:10] for c in row["health"]]),
        )


def _spread(parts: list[list[Any]]) -> tuple[float, float, float] | None:
    """(min, mean, max) over the conditions' (min, sum, count, max); None when nothing was
    probed."""
    probed = [p for p in parts if p[2]]
    if not probed:
        return None
    total = sum(float(p[1]) for p in probed) / sum(int(p[2]) for p in probed)
    return min(float(p[0]) for p in probed), total, max(float(p[3]) for p in probed)
