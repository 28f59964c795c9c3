"""Samples PostgreSQL while the run goes on, for what only shows between transitions.

Each sample is one read-only snapshot (REPEATABLE READ), so everything it sees was committed
together: a device reserved without an active attempt there (invariant 5), an active
attempt without its reservation, a task with two active attempts or whose status
disagrees with its attempts (invariant 1: one task, one state). It also keeps the counts
by status that pace the submitter and tell the quiesce when nothing is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import asyncpg

CHECKS: dict[str, tuple[int, str]] = {
    # name: (invariant, query returning the offending rows)
    "device reserved without an active attempt on it": (
        5,
        """SELECT d.host_id, d.serial, d.task_id::text FROM devices d
           WHERE d.task_id IS NOT NULL AND NOT EXISTS (
               SELECT 1 FROM attempts a WHERE a.task_id = d.task_id AND a.host_id = d.host_id
                 AND a.device_serial = d.serial AND a.state = 'active')""",
    ),
    "active attempt whose device is not reserved for it": (
        5,
        """SELECT a.task_id::text, a.attempt, a.host_id, a.device_serial FROM attempts a
           WHERE a.state = 'active' AND NOT EXISTS (
               SELECT 1 FROM devices d WHERE d.host_id = a.host_id
                 AND d.serial = a.device_serial AND d.task_id = a.task_id)""",
    ),
    "task with more than one active attempt": (
        4,
        """SELECT task_id::text, count(*) AS active FROM attempts WHERE state = 'active'
           GROUP BY task_id HAVING count(*) > 1""",
    ),
    "active attempt on a task not in flight or not current": (
        1,
        """SELECT t.task_id::text, t.status, t.attempt, a.attempt AS active_attempt
           FROM tasks t JOIN attempts a ON a.task_id = t.task_id AND a.state = 'active'
           WHERE t.status NOT IN ('assigned', 'dispatched') OR a.attempt <> t.attempt""",
    ),
    "task in flight without an active current attempt": (
        1,
        """SELECT t.task_id::text, t.status, t.attempt FROM tasks t
           WHERE t.status IN ('assigned', 'dispatched') AND NOT EXISTS (
               SELECT 1 FROM attempts a WHERE a.task_id = t.task_id
                 AND a.attempt = t.attempt AND a.state = 'active')""",
    ),
}

ONLINE = "SELECT count(*) FROM devices WHERE state = 'device'"
COUNTS = "SELECT status, count(*) AS n FROM tasks GROUP BY status"
BUSY = """SELECT (SELECT count(*) FROM attempts WHERE state = 'active') AS active,
                 (SELECT count(*) FROM devices WHERE task_id IS NOT NULL) AS reserved"""


@dataclass
class Finding:
    invariant: int
    check: str
    row: dict[str, Any]
    at: float


@dataclass
class Monitor:
    dsn: str
    interval: float = 0.5
    counts: dict[str, int] = field(default_factory=dict)
    busy: tuple[int, int] = (0, 0)
    samples: int = 0
    failed_samples: int = 0
    findings: list[Finding] = field(default_factory=list)
    _seen: set[tuple[str, str]] = field(default_factory=set)
    _conn: asyncpg.Connection | None = None
    last_sample_at: float = 0.0

    @property
    def backlog(self) -> int | None:
        if not self.counts and not self.samples:
            return None
        return sum(self.counts.get(s, 0) for s in ("queued", "assigned", "dispatched"))

    @property
    def settled(self) -> bool:
        return self.samples > 0 and self.backlog == 0 and self.busy == (0, 0)

    async def run(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(self.interval)

    async def sample(self) -> bool:
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self.dsn, timeout=3)
            async with asyncio.timeout(5):
                await self._sample(self._conn)
        except (
            OSError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
            asyncpg.TargetServerAttributeNotMatched,  # mid-failover: no primary yet
            TimeoutError,
        ):
            self.failed_samples += 1
            await self.close()
            return False
        self.samples += 1
        self.last_sample_at = time.time()
        return True

    async def _sample(self, conn: asyncpg.Connection) -> None:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            at = time.time()
            for name, (invariant, query) in CHECKS.items():
                for row in await conn.fetch(query):
                    key = (name, repr(tuple(row.values())))
                    if key not in self._seen:
                        self._seen.add(key)
                        self.findings.append(Finding(invariant, name, dict(row), at))
            self.counts = {r["status"]: r["n"] for r in await conn.fetch(COUNTS)}
            busy = await conn.fetchrow(BUSY)
            assert busy is not None
            self.busy = (busy["active"], busy["reserved"])

    async def wait_settled(self, within: float) -> bool:
        """Until two samples in a row see nothing queued or in flight and no device held."""
        deadline = time.monotonic() + within
        calm = 0
        while time.monotonic() < deadline:
            calm = calm + 1 if await self.sample() and self.settled else 0
            if calm >= 2:
                return True
            await asyncio.sleep(0.5)
        return False

    async def wait_devices(self, want: int, within: float = 60.0) -> None:
        """Until `want` devices are registered online (every agent is up)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            with contextlib.suppress(
                OSError, asyncpg.PostgresError, asyncpg.TargetServerAttributeNotMatched
            ):
                conn = await asyncpg.connect(self.dsn, timeout=3)
                try:
                    n = await conn.fetchval(ONLINE)
                finally:
                    await conn.close()
                if n >= want:
                    return
            await asyncio.sleep(0.3)
        raise RuntimeError(f"the agents did not register {want} devices within {within:.0f}s")

    async def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                await self._conn.close(timeout=1)
            self._conn = None
