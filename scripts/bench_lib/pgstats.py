"""What the benchmark reads straight from PostgreSQL: the cluster's cost counters, the
server's settings, and the rows that prove a run did what it claims."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import asyncpg

# Backends publish their statistics at most about once a second, and when idle.
STATS_SETTLE = 1.2

SETTINGS = (
    "server_version",
    "fsync",
    "synchronous_commit",
    "wal_sync_method",
    "full_page_writes",
    "shared_buffers",
    "max_connections",
    "commit_delay",
)


async def settings(dsn: str) -> dict[str, str]:
    conn = await asyncpg.connect(dsn)
    try:
        return {name: await conn.fetchval(f"SHOW {name}") for name in SETTINGS}
    finally:
        await conn.close()


async def counters(dsn: str, settle: float = STATS_SETTLE) -> dict[str, int]:
    """Committed transactions (all databases), WAL bytes written, WAL fsyncs."""
    await asyncio.sleep(settle)
    conn = await asyncpg.connect(dsn)
    try:
        row = await conn.fetchrow(
            "SELECT (SELECT sum(xact_commit) FROM pg_stat_database)::bigint AS commits,"
            " pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal_bytes,"
            " (SELECT coalesce(sum(fsyncs), 0) FROM pg_stat_io WHERE object = 'wal')::bigint"
            "   AS wal_fsyncs"
        )
        return dict(row)
    finally:
        await conn.close()


def per_item(before: dict[str, int], after: dict[str, int], items: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in before:
        out[key] = after[key] - before[key]
        out[f"{key}_per_task"] = (after[key] - before[key]) / items if items else 0.0
    return out


class Db:
    """One connection for the benchmark's own reads (never on a hot path of the system)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    @classmethod
    async def connect(cls, dsn: str) -> Db:
        return cls(await asyncpg.connect(dsn))

    async def close(self) -> None:
        await self.conn.close()

    async def count_done(self, since: datetime) -> int:
        return int(
            await self.conn.fetchval(
                "SELECT count(*) FROM tasks WHERE status = 'done' AND created_at >= $1", since
            )
        )

    async def terminate_listeners(self) -> int:
        """End every LISTEN connection on the database, as a failover would: how many."""
        return int(
            await self.conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND (query LIKE 'LISTEN %' OR query LIKE '%pg_listening_channels%')"
            )
        )

    async def now(self) -> datetime:
        value: datetime = await self.conn.fetchval("SELECT now()")
        return value

    async def lifecycle_check(self, task_ids: Sequence[uuid.UUID]) -> dict[str, Any]:
        """Every task done exactly once: one attempt each, that attempt done, one report."""
        row = await self.conn.fetchrow(
            """
            SELECT count(*) AS tasks,
                   count(*) FILTER (WHERE t.status = 'done') AS done,
                   min(t.created_at) AS first_created,
                   max(t.finished_at) AS last_finished,
                   (SELECT count(*) FROM attempts a WHERE a.task_id = ANY ($1)) AS attempts,
                   (SELECT count(*) FROM attempts a
                     WHERE a.task_id = ANY ($1) AND a.state = 'done') AS attempts_done,
                   (SELECT count(*) FROM task_events e
                     WHERE e.task_id = ANY ($1) AND e.to_status = 'done') AS done_events
            FROM tasks t WHERE t.task_id = ANY ($1)
            """,
            list(task_ids),
        )
        return dict(row)

    async def attempt_times(self, task_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Any]:
        """Per task: when it was created, acknowledged (dispatched), cancel requested and
        delivered, and finished — the database's clock, for the latency splits."""
        rows = await self.conn.fetch(
            """
            SELECT t.task_id, t.status, t.created_at, t.finished_at, t.device_serial,
                   a.created_at AS assigned_at, a.acknowledged_at,
                   a.cancel_requested_at, a.cancel_delivered_at
            FROM tasks t JOIN attempts a ON a.task_id = t.task_id AND a.attempt = t.attempt
            WHERE t.task_id = ANY ($1)
            """,
            list(task_ids),
        )
        return {r["task_id"]: r for r in rows}


# The tables the hot paths read and write, whose dead rows and statistics the deep workload
# follows (did autovacuum keep up?).
HOT_TABLES = ("tasks", "attempts", "task_events", "devices", "hosts", "queue_groups")


async def table_stats(dsn: str, tables: Sequence[str] = HOT_TABLES) -> dict[str, dict[str, Any]]:
    """pg_stat_user_tables for `tables`: live and dead rows, changes since the last analyze
    and inserts since the last vacuum, when autovacuum and autoanalyze last ran and how
    often; and the table's size with its indexes."""
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            """
            SELECT relname, n_live_tup, n_dead_tup, n_mod_since_analyze, n_ins_since_vacuum,
                   last_autovacuum, last_autoanalyze, last_vacuum, last_analyze,
                   autovacuum_count, autoanalyze_count,
                   pg_total_relation_size(relid) AS total_bytes
            FROM pg_stat_user_tables WHERE relname = ANY ($1)
            ORDER BY relname
            """,
            list(tables),
        )
    finally:
        await conn.close()
    return {r["relname"]: {k: v for k, v in dict(r).items() if k != "relname"} for r in rows}


async def checkpoint(dsn: str) -> None:
    """Everything written so far flushed to the data files (a bulk load's writes are then
    not flushed under the next workload's measure)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CHECKPOINT", timeout=600)
    finally:
        await conn.close()
