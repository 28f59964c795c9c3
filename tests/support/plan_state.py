"""The database states in which the plan check (plans.py) runs the hot statements: a farm's
live work on a fresh database, then beside a history of finished tasks loaded with no
ANALYZE, then analysed, then with statistics gone stale.

The live work (`build_live`, through the store's own statements, so its rows are the
product's): `hosts` hosts (HOSTS unless said) of DEVICES phones, each host its own rack,
BUSY phones of each running a task (acknowledged, a step kept each; the last UNACKED
hosts' only assigned), one host holding BIG_LEASES leases (the renewal workload's host),
BACKLOG tasks queued over SELECTORS selectors no phone matches, and a task queued for each
of the first WAITING racks (an Acquire there finds work). The tasks of the first
CAPPED_RACKS racks and of the first CAPPED_RACKS busy hosts the probes use (`Live.busy`)
are a fairness key's with a cap (CAPPED, far from reached), so that the paths that count a
capped key's phones run too. Leases run LEASE_TTL, longer than any check.

The history (`load_history`): n finished tasks (4 % failed), each with its attempt and two
events (its submit and its report), by one INSERT ... SELECT generate_series per table in
one statement.

Stale (`finish_live`, then ANALYZE, then a second live set): the statistics say nothing is
queued or running, as right after a quiet spell, and a burst of work came since, which is
what the planner sees until autoanalyze comes round (up to a minute: issue 20's stale
head read, issue 41's slow renewals).

Autovacuum is turned off on the database's tables first (`hold_statistics`): each state
is what it says, not what autoanalyze made of it meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import asyncpg

from control_plane.domain import Assignment, DeviceInfo, NewTask
from control_plane.store import Store
from control_plane.store.database import Database

HOSTS = 1000
DEVICES = 4
BUSY = 3
UNACKED = 10
BIG_LEASES = 1000
BACKLOG = 20_000
SELECTORS = 200
WAITING = 100
CAPPED = "capped-team"
CAPPED_RACKS = 10
LEASE_TTL = timedelta(hours=6)
SPEC = b"\x0a\x00"  # a TaskSpec with an empty action list: what it holds does not matter here
STEP = b"\x08\x01"
CALLER = "plan-check"
SUBMIT_BATCH = 500
TABLES = (
    "tasks", "attempts", "attempt_steps", "task_events", "devices", "hosts", "queue_groups",
    "queue_group_stats", "fair_shares", "session_relays",
)  # fmt: skip


class OneConnection:
    """The store's pool, as one connection: its statements run in the caller's transaction
    (plans.py rolls each probe back)."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        return list(await self.conn.fetch(query, *args))

    async def fetchrow(self, query: str, *args: Any) -> asyncpg.Record | None:
        return await self.conn.fetchrow(query, *args)

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        yield self.conn


def store_on(conn: asyncpg.Connection) -> Store:
    return Store(Database(OneConnection(conn)))  # type: ignore[arg-type]


async def connect(dsn: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(dsn)
    # As the control plane's pool (store/database.py): jsonb as Python values.
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")
    return conn


async def hold_statistics(conn: asyncpg.Connection) -> None:
    for table in TABLES:
        await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")


@dataclass
class Live:
    """One live set's names, and what the probes act on."""

    prefix: str
    hosts: int = HOSTS
    leases: dict[str, list[Assignment]] = field(default_factory=dict)
    offered: uuid.UUID | None = None  # a task queued for rack 5

    def host(self, i: int) -> str:
        return f"{self.prefix}-h{i:04d}"

    def waiting(self, i: int) -> str:
        """Host i (< WAITING) has a task queued for its rack (under the capped key for i
        < CAPPED_RACKS)."""
        return self.host(i)

    def busy(self, k: int) -> str:
        """The k-th host from the middle: nothing queued for its rack, its busy phones'
        tasks under the capped key for k < CAPPED_RACKS."""
        return self.host(self.middle + k)

    @property
    def middle(self) -> int:
        return max(WAITING, self.hosts // 2)

    @property
    def unacked(self) -> str:
        return self.host(self.hosts - 1)

    def rack(self, i: int) -> str:
        return f"{self.prefix}-rack{i:04d}"

    @property
    def big(self) -> str:
        return f"{self.prefix}-renew"


async def build_live(conn: asyncpg.Connection, prefix: str, hosts: int = HOSTS) -> Live:
    if hosts < WAITING + 2 * CAPPED_RACKS + UNACKED:
        raise ValueError(f"the live set needs {WAITING + 2 * CAPPED_RACKS + UNACKED} hosts")
    st = store_on(conn)
    live = Live(prefix, hosts)
    for i in range(hosts):
        labels = {"pool": "fleet", "rack": live.rack(i), "host_id": live.host(i)}
        devices = [DeviceInfo(f"d{k}", "device", labels=labels) for k in range(DEVICES)]
        await st.hosts.register_host(live.host(i), labels, devices)
    labels = {"pool": live.big, "host_id": live.big}
    phones = [DeviceInfo(f"r{k}", "device", labels=labels) for k in range(BIG_LEASES)]
    await st.hosts.register_host(live.big, labels, phones)
    await conn.execute(
        "INSERT INTO fair_shares (fairness_key, weight, max_devices) VALUES ($1, 1, $2)"
        " ON CONFLICT DO NOTHING",
        CAPPED,
        hosts * DEVICES,
    )
    capped = range(live.middle, live.middle + CAPPED_RACKS)
    busy = [
        NewTask(
            SPEC,
            selector_serial=f"d{k}",
            selector_labels={"rack": live.rack(i)},
            fairness_key=CAPPED if i in capped else "",
        )
        for i in range(hosts)
        for k in range(1, BUSY + 1)
    ]
    await _submit(st, busy + [NewTask(SPEC, selector_labels={"pool": live.big})] * BIG_LEASES)
    serials = [f"d{k}" for k in range(1, BUSY + 1)]
    for i in range(hosts):
        live.leases[live.host(i)] = (
            await st.leases.acquire(live.host(i), serials, LEASE_TTL)
        ).assignments
    big = [p.serial for p in phones]
    live.leases[live.big] = (await st.leases.acquire(live.big, big, LEASE_TTL)).assignments
    for host, held in live.leases.items():
        if host in {live.host(i) for i in range(hosts - UNACKED, hosts)}:
            continue  # assigned, not acknowledged yet
        await st.leases.renew(host, [str(a.lease_id) for a in held], LEASE_TTL)
        if host != live.big:  # a step kept of each running task, as the replicas write them
            await st.leases.keep_steps(
                [a.task_id for a in held], [a.attempt for a in held], [0] * len(held),
                [STEP] * len(held),
            )  # fmt: skip
    backlog = [
        NewTask(SPEC, selector_labels={"rack": f"{prefix}-absent{k % SELECTORS:03d}"})
        for k in range(BACKLOG)
    ]
    waiting = [
        NewTask(
            SPEC,
            selector_labels={"rack": live.rack(i)},
            fairness_key=CAPPED if i < CAPPED_RACKS else "",
        )
        for i in range(WAITING)
    ]
    await _submit(st, backlog + waiting)
    live.offered = await conn.fetchval(
        "SELECT task_id FROM tasks WHERE status = 'queued' AND selector_labels = $1",
        {"rack": live.rack(5)},
    )
    return live


async def _submit(st: Store, tasks: list[NewTask]) -> None:
    for lo in range(0, len(tasks), SUBMIT_BATCH):
        await st.tasks.submit_many(CALLER, tasks[lo : lo + SUBMIT_BATCH])


# Task i of n: created over the last 14 days (the newest 10 minutes ago), on host i % 1,000,
# ran 10 s; 4 % failed. Its attempt ended with it; its events: submit and report.
HISTORY = """
WITH t AS (
    SELECT i, md5('plan-check-history-' || i)::uuid AS task_id,
           now() - make_interval(secs => 14 * 86400.0 * ($1::bigint - i) / $1 + 600) AS created,
           'history-h' || lpad((i % 1000)::text, 4, '0') AS host, 'd' || (i % 4) AS serial,
           CASE WHEN i % 25 = 7 THEN 'failed' ELSE 'done' END AS outcome
    FROM generate_series(0, $1::bigint - 1) AS i
), tk AS (
    INSERT INTO tasks (task_id, caller, request_id, status, spec, selector_labels,
                       max_attempts, attempt, host_id, device_serial, result, created_at,
                       updated_at, finished_at, fairness_key, fair_tag)
    SELECT task_id, 'plan-check-history', 'h-' || i, outcome, $2::bytea,
           jsonb_build_object('rack', 'history-rack' || lpad((i % 1000)::text, 4, '0')), 1, 1,
           host, serial, $2::bytea, created, created + interval '10 s',
           created + interval '10 s', 'default', i::float8 / $1
    FROM t
), att AS (
    INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_serial, state,
                          lease_expires_at, acknowledged_at, outcome, reported_at,
                          created_at, ended_at)
    SELECT task_id, 1, md5('plan-check-lease-' || i)::uuid, host, serial, outcome,
           created + interval '10 s', created + interval '1 s', outcome,
           created + interval '10 s', created, created + interval '10 s'
    FROM t
)
INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, at)
SELECT t.task_id, e.attempt, e.kind, e.from_status,
       CASE WHEN e.kind = 'report' THEN t.outcome ELSE e.to_status END, t.created + e.after
FROM t CROSS JOIN (VALUES (0, 'submit', NULL, 'queued', interval '0'),
                          (1, 'report', 'dispatched', NULL, interval '10 s'))
    AS e (attempt, kind, from_status, to_status, after)
"""


async def load_history(conn: asyncpg.Connection, n: int) -> float:
    """n finished tasks, no ANALYZE after; the seconds it took."""
    started = time.monotonic()
    if n > 0:
        await conn.execute(HISTORY, n, SPEC)
    return time.monotonic() - started


async def finish_live(conn: asyncpg.Connection) -> None:
    """Every task not finished ends (running: done; queued: cancelled), its attempt and
    phone with it: the farm went quiet."""
    await conn.execute(
        """
        WITH tk AS (
            UPDATE tasks SET status = CASE WHEN status = 'queued' THEN 'cancelled'
                                           ELSE 'done' END,
                             finished_at = now(), updated_at = now()
            WHERE status IN ('queued', 'assigned', 'dispatched')
            RETURNING task_id
        ), att AS (
            UPDATE attempts SET state = 'done', outcome = 'done', reported_at = now(),
                                ended_at = now()
            WHERE state = 'active'
        )
        UPDATE devices SET task_id = NULL WHERE task_id IN (SELECT task_id FROM tk)
        """
    )
