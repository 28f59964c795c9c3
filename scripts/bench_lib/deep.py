"""Workload 8, deep (issue 20): the fleet's load (fleet.py) on a database that holds what a
farm accumulates: a backlog of queued tasks no host can take, and a history of finished
tasks with their attempts and events; beside the same load on an empty database.

In a database of its own (`amc_deep`, same server), in this order:

1. empty: the fleet load at --deep-hosts hosts on the fresh database (migrated by the
   replica that serves it); in a run whose fleet workload already ran that load (the
   same hosts on one replica, the same windows, no condition-change window), that run is
   this one's empty run, not run twice: the database is migrated and step 2 follows (the
   deep run's baseline is then the fleet's database, a few thousand finished tasks).
2. history: --deep-history finished tasks, each with its attempts (one; two, the first
   expired, for one task in 20) and events (submit, assign, acknowledge, report; expired
   and the second attempt's too), written by INSERT ... SELECT generate_series in chunks
   of HISTORY_CHUNK (one transaction each), not by RPC: selectors for the racks of the deep
   hosts (as the fleet's), finished over the last --deep-history-days days, 4 % failed. The
   newest CHURN_SHARE of it is written in flight (dispatched, its attempt active) and then
   reported done/failed by one UPDATE each, as a burst of reports would leave it: dead
   rows in tasks and attempts and dead entries in their indexes. No VACUUM, no ANALYZE:
   autovacuum finds it as it would.
3. backlog: --deep-queued tasks for racks no host has, over --deep-selectors selectors,
   through SubmitTasks in batches of 500 (4 calls in flight) on a replica of the database:
   the real submit path (queue groups, fair tags, submit events).
4. deep: the same fleet load at --deep-hosts hosts, then at --deep-big-hosts, on it.

pg_stat_user_tables of the hot tables (dead rows, last autovacuum and autoanalyze) is read
after each step. Targets (issue 20): deep pickup p50 <= 8 ms and p99 <= 20 ms; control-plane
and PostgreSQL CPU per task <= 1.5x the empty run's; at --deep-big-hosts p99 <= 50 ms.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import grpc

from amc.v1 import scheduler_pb2, task_pb2
from amc_testing.host import Outcome, RunResult, StepResult, StepStatus, report_request
from bench_lib import fleet, pgstats, stack
from bench_lib.client import Client, bounded, key_actions
from bench_lib.stats import summarize

DATABASE = "amc_deep"
PREFIX = "deep"  # host ids deep-h00042, racks deep-rack00042: the same farm in every run
HISTORY_CHUNK = 100_000
CHURN_SHARE = 0.1
BACKLOG_BATCH = 500  # SubmitTasks' limit
BACKLOG_CALLS = 4

# Issue 20's targets.
PICKUP_P50_MS, PICKUP_P99_MS = 8.0, 20.0
# GetQueue and GetTask (with its pending reason) with the backlog queued: calls of each,
# one at a time, and their target.
READ_CALLS = 200
READ_P99_MS = 50.0
CPU_GROWTH = 1.5
BIG_P99_MS = 50.0


@dataclass(frozen=True)
class Options:
    fleet: fleet.Options  # the load: rate, window, waits (its `hosts` is not used)
    hosts: int = 1000
    big_hosts: int = 5000  # 0: no run at that size
    queued: int = 100_000
    history: int = 1_000_000
    selectors: int = 200
    history_days: float = 14.0
    # The fleet's run of the same load, when it ran (empty_from_fleet): the empty run.
    empty: dict[str, Any] | None = None


async def run(
    st: stack.Stack,
    opt: Options,
    say: Callable[[str], None],
    out: dict[str, Any] | None = None,
    saved: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Into `out` as it goes (`saved` after each step): a run that fails is recorded with
    its error and the next one goes on."""
    dsn = await st.create_database(DATABASE)
    out = {} if out is None else out
    out.update(
        {
            "settings": {
                **fleet.settings(opt.fleet),
                "hosts": opt.hosts,
                "big_hosts": opt.big_hosts,
                "queued": opt.queued,
                "history": opt.history,
                "selectors": opt.selectors,
                "history_days": opt.history_days,
                "history_chunk": HISTORY_CHUNK,
                "churn_share": CHURN_SHARE,
            },
            "tables": {},
            # When autovacuum and autoanalyze finished on a hot table during the deep runs,
            # seconds after the backlog was in; and when each run's window began and ended.
            "autovacuum_log": [],
        }
    )
    runs: list[dict[str, Any]] = []
    out["runs"] = runs

    async def one(label: str, hosts: int) -> None:
        say(f"deep: {label}, {hosts} hosts x {opt.fleet.devices} devices")
        began = time.time()
        result = await fleet.run_one_kept(
            st, opt.fleet, hosts, 1, say, name=f"deep-{label}-{hosts}", dsn=dsn, prefix=PREFIX
        )
        result["database"] = label
        result["began_at"], result["ended_at"] = began, time.time()
        runs.append(result)
        fleet.say_run(result, say)
        out["tables"][f"after {label} {hosts}"] = await pgstats.table_stats(dsn)
        out["targets"] = judge(runs, opt, out.get("backlog", {}).get("reads"))
        out["verified"] = all(r.get("verified") for r in runs)
        saved()

    if opt.empty is not None:
        say(f"deep: empty, {opt.hosts} hosts: the fleet's run of that load (not run twice)")
        runs.append({**opt.empty, "database": "empty", "from_fleet": True})
        out["targets"] = judge(runs, opt)
        out["verified"] = all(r.get("verified") for r in runs)
        # The schema, as the empty run's replica would have migrated it.
        replica = await st.start_replica("deep-migrate", opt.fleet.lease_ttl, dsn=dsn)
        replica.child.stop()
    else:
        await one("empty", opt.hosts)
    say(f"deep: history, {opt.history:,} finished tasks by bulk SQL (no VACUUM, no ANALYZE)")
    out["history"] = await load_history(dsn, opt, say)
    out["tables"]["after history"] = await pgstats.table_stats(dsn)
    saved()
    say(f"deep: backlog, {opt.queued:,} tasks for racks no host has, SubmitTasks x 500")
    out["backlog"] = await load_backlog(st, dsn, opt)
    say(
        f"  {out['backlog']['submitted']:,} queued in {out['backlog']['seconds']:.0f}s"
        f" ({out['backlog']['per_s']:,.0f}/s)"
    )
    out["tables"]["before deep runs"] = await pgstats.table_stats(dsn)
    saved()
    backlog_in = time.time()
    watch = asyncio.ensure_future(watch_autovacuum(dsn, backlog_in, out["autovacuum_log"]))
    try:
        await one("deep", opt.hosts)
        if opt.big_hosts:
            await one("deep", opt.big_hosts)
    finally:
        watch.cancel()
    out["backlog"]["still_queued"] = await count_backlog(dsn)
    out["targets"] = judge(runs, opt, out["backlog"].get("reads"))
    out["verified"] = all(r.get("verified") for r in runs)
    return out


WATCH_EVERY = 2.0


async def watch_autovacuum(dsn: str, since: float, log: list[dict[str, Any]]) -> None:
    """Every WATCH_EVERY s: a line in `log` for each autovacuum or autoanalyze of a hot
    table that finished since the last look (its end, seconds after `since`)."""
    seen: dict[tuple[str, str], Any] = {}
    first = True
    while True:
        try:
            stats = await pgstats.table_stats(dsn)
        except (OSError, asyncpg.PostgresError):
            stats = {}
        for table, row in stats.items():
            for kind in ("last_autovacuum", "last_autoanalyze"):
                at = row.get(kind)
                if at is not None and seen.get((table, kind)) != at:
                    seen[(table, kind)] = at
                    if not first:
                        log.append(
                            {
                                "table": table,
                                "kind": kind.removeprefix("last_"),
                                "after_backlog_s": round(at.timestamp() - since, 1),
                            }
                        )
        first = False
        await asyncio.sleep(WATCH_EVERY)


def empty_from_fleet(
    fleet_runs: list[dict[str, Any]], opt: fleet.Options, hosts: int
) -> dict[str, Any] | None:
    """The fleet's run that is the deep workload's empty run: `hosts` hosts on one replica,
    judged, with no condition-change window (deep has none), and the deep runs' load
    (`opt`: rate, window, waits, steps; the fleet's 1 % condition changes through its
    submit window cost no measurable CPU per task: 9.25 / 6.30 ms against the deep empty
    run's 9.35 / 5.88 in the same run). None: the deep workload runs its own."""
    run = fleet.find(fleet_runs, hosts, 1)
    if run is None or "churn" in run.get("idle", {}):
        return None
    same = (
        run.get("acquire_wait_s") == opt.acquire_wait
        and run.get("short_wait_s") == opt.short_wait
        and run["submit"].get("submit_schedule_s") == run["submit"]["tasks"] / opt.rate
        and run["submit"]["tasks"] == round(opt.rate * opt.seconds)
    )
    return run if same else None


def find(runs: list[dict[str, Any]], database: str, hosts: int) -> dict[str, Any] | None:
    """That run, if it ran whole (one that failed or did not reach its load is not judged)."""
    for r in runs:
        if r["database"] == database and r["hosts"] == hosts and fleet.judged(r):
            return r
    return None


def cpu_ratio(run: dict[str, Any], base: dict[str, Any], proc: str) -> float:
    key = f"{proc}_cpu_ms_per_task"
    return float(run["submit"][key] / base["submit"][key]) if base["submit"][key] else 0.0


def judge(
    runs: list[dict[str, Any]], opt: Options, reads: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Each target: met (True/False) or None when the run it needs was not made."""
    empty = find(runs, "empty", opt.hosts)
    deep = find(runs, "deep", opt.hosts)
    big = find(runs, "deep", opt.big_hosts) if opt.big_hosts else None

    def pickup(run: dict[str, Any] | None, p50: float | None, p99: float) -> bool | None:
        if run is None or not run["submit"]["pickup_ms"].get("n"):
            return None
        sub = run["submit"]
        p = sub["pickup_ms"]
        return bool(
            sub["done"] == sub["tasks"]
            and (p50 is None or p["p50"] <= p50)
            and p["p99"] <= p99
            and fleet.repolls_covered(run) is not False
        )

    def cpu(proc: str) -> bool | None:
        if deep is None or empty is None:
            return None
        return cpu_ratio(deep, empty, proc) <= CPU_GROWTH

    return {
        "deep_pickup": pickup(deep, PICKUP_P50_MS, PICKUP_P99_MS),
        "deep_control_plane_cpu_per_task": cpu("control_plane"),
        "deep_postgres_cpu_per_task": cpu("postgres"),
        "deep_big_pickup_p99": pickup(big, None, BIG_P99_MS),
        "deep_reads_p99": reads_met(reads),
    }


def reads_met(reads: dict[str, Any] | None) -> bool | None:
    if not reads or not reads["get_queue_ms"].get("n"):
        return None
    return bool(
        reads["get_queue_ms"]["p99"] <= READ_P99_MS
        and reads["get_task_ms"]["p99"] <= READ_P99_MS
        and reads["pending_reasons"] == reads["calls"]
    )


# -- the history: bulk SQL -----------------------------------------------------------------

# Per history task i (0 .. n-1; $3 = n): its host h (of $4 hosts), attempts (2 for one in 20,
# the first expired after a 15-s lease), and times in seconds from its creation: queued q,
# first assignment at q, the last at q + (attempts - 1) * (15 + q), acknowledged 5 ms
# later, run 1-30 s. Created evenly over $5 days, the newest 10 minutes ago.
_BASE = """
    SELECT i,
           md5('amc-bench-history-' || i)::uuid AS task_id,
           (i * 7919) % $4::integer AS h,
           CASE WHEN i % 20 = 3 THEN 2 ELSE 1 END AS n_att,
           CASE WHEN i % 25 = 7 THEN 'failed' ELSE 'done' END AS outcome,
           now() - make_interval(secs => $5::float8 * 86400 * ($3::bigint - i) / $3 + 600)
               AS created,
           (i % 50) * 0.004::float8 AS q,
           1 + (i % 30) AS run_s,
           i >= $9::bigint AS in_flight,
           $7::bytea AS spec, $8::bytea AS result
    FROM generate_series($1::bigint, $2::bigint - 1) AS i
"""

_TIMES = (
    """
    SELECT b.*,
           b.created + make_interval(secs => b.q) AS first_at,
           b.created + make_interval(secs => b.q + (b.n_att - 1) * (15 + b.q)) AS last_at,
           b.created + make_interval(secs => b.q + (b.n_att - 1) * (15 + b.q) + 0.005
                                     + b.run_s) AS finished,
           $6::text || '-h' || lpad(b.h::text, 5, '0') AS host,
           $6 || '-rack' || lpad(b.h::text, 5, '0') AS rack,
           'd' || (b.i % 4) AS serial,
           $6 || '-h' || lpad(((b.h + 1) % $4)::text, 5, '0') AS first_host
    FROM ("""
    + _BASE
    + """) b
"""
)

HISTORY_TASKS = (
    """
INSERT INTO tasks (task_id, caller, request_id, status, spec, selector_labels, priority,
                   max_attempts, attempt, host_id, device_serial, result, error, created_at,
                   updated_at, finished_at, fairness_key, fair_tag)
SELECT t.task_id, 'bench-history', 'history-' || t.i,
       CASE WHEN t.in_flight THEN 'dispatched' ELSE t.outcome END,
       t.spec, jsonb_build_object('rack', t.rack), 0, t.n_att + 1, t.n_att, t.host, t.serial,
       CASE WHEN t.in_flight THEN NULL ELSE t.result END,
       CASE WHEN t.outcome = 'failed' AND NOT t.in_flight THEN 'step 0 failed: simulated'
            ELSE '' END,
       t.created, CASE WHEN t.in_flight THEN t.last_at ELSE t.finished END,
       CASE WHEN t.in_flight THEN NULL ELSE t.finished END,
       'default', t.i::float8 / $3
FROM ("""
    + _TIMES
    + """) t
ORDER BY t.i
"""
)

HISTORY_ATTEMPTS = (
    """
INSERT INTO attempts (task_id, attempt, lease_id, host_id, device_serial, state,
                      lease_expires_at, acknowledged_at, outcome, reported_at, created_at,
                      ended_at)
SELECT t.task_id, a, md5('amc-bench-lease-' || t.i || '-' || a)::uuid,
       CASE WHEN a < t.n_att THEN t.first_host ELSE t.host END, t.serial,
       CASE WHEN a < t.n_att THEN 'expired' WHEN t.in_flight THEN 'active' ELSE t.outcome END,
       CASE WHEN a < t.n_att THEN t.first_at + interval '15 s'
            WHEN t.in_flight THEN now() + interval '1 hour' ELSE t.finished END,
       CASE WHEN a < t.n_att THEN t.first_at ELSE t.last_at END + interval '5 ms',
       CASE WHEN a < t.n_att OR t.in_flight THEN NULL ELSE t.outcome END,
       CASE WHEN a < t.n_att OR t.in_flight THEN NULL ELSE t.finished END,
       CASE WHEN a < t.n_att THEN t.first_at ELSE t.last_at END,
       CASE WHEN a < t.n_att THEN t.first_at + interval '15 s'
            WHEN t.in_flight THEN NULL ELSE t.finished END
FROM ("""
    + _TIMES
    + """) t
CROSS JOIN LATERAL generate_series(1, t.n_att) AS a
ORDER BY t.i, a
"""
)

# submit; per attempt assign and acknowledge; expired for an earlier attempt; the report
# (written later for the tasks in flight: HISTORY_REPORTS).
HISTORY_EVENTS = (
    """
INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail, at)
SELECT e.task_id, e.attempt, e.kind, e.from_status, e.to_status, e.detail, e.at
FROM ("""
    + _TIMES
    + """) t
CROSS JOIN LATERAL (
    SELECT t.task_id, 0 AS attempt, 'submit' AS kind, NULL AS from_status,
           'queued' AS to_status, '' AS detail, t.created AS at, 0 AS ord
    UNION ALL
    SELECT t.task_id, a, 'assign', 'queued', 'assigned',
           CASE WHEN a < t.n_att THEN t.first_host ELSE t.host END || '/' || t.serial,
           CASE WHEN a < t.n_att THEN t.first_at ELSE t.last_at END, 3 * a - 2
    FROM generate_series(1, t.n_att) a
    UNION ALL
    SELECT t.task_id, a, 'acknowledge', 'assigned', 'dispatched', '',
           CASE WHEN a < t.n_att THEN t.first_at ELSE t.last_at END + interval '5 ms', 3 * a - 1
    FROM generate_series(1, t.n_att) a
    UNION ALL
    SELECT t.task_id, 1, 'expired', 'dispatched', 'queued', 'lease expired',
           t.first_at + interval '15 s', 3
    WHERE t.n_att = 2
    UNION ALL
    SELECT t.task_id, t.n_att, 'report', 'dispatched', t.outcome,
           CASE WHEN t.outcome = 'failed' THEN 'step 0 failed: simulated' ELSE '' END,
           t.finished, 3 * t.n_att + 1
    WHERE NOT t.in_flight
) e
ORDER BY t.i, e.ord
"""
)

# The newest slice, written in flight, reported now: tasks and attempts updated in place.
HISTORY_REPORTS = (
    """
WITH t AS ("""
    + _TIMES
    + """), tk AS (
    UPDATE tasks x SET status = t.outcome, result = t.result, finished_at = t.finished,
           updated_at = t.finished,
           error = CASE WHEN t.outcome = 'failed' THEN 'step 0 failed: simulated' ELSE '' END
    FROM t WHERE x.task_id = t.task_id
), att AS (
    UPDATE attempts x SET state = t.outcome, outcome = t.outcome, reported_at = t.finished,
           ended_at = t.finished, lease_expires_at = t.finished
    FROM t WHERE x.task_id = t.task_id AND x.attempt = t.n_att
)
INSERT INTO task_events (task_id, attempt, kind, from_status, to_status, detail, at)
SELECT t.task_id, t.n_att, 'report', 'dispatched', t.outcome,
       CASE WHEN t.outcome = 'failed' THEN 'step 0 failed: simulated' ELSE '' END, t.finished
FROM t ORDER BY t.i
"""
)


def _result_bytes() -> bytes:
    """What a one-step run that went well reports (as the fleet's hosts report it)."""
    step = StepResult(0, "key", StepStatus.OK, datetime.now(UTC), timedelta(0))
    request = report_request(
        RunResult(Outcome.DONE, "", (step,)), task_id="", attempt=1, lease_id=""
    )
    return bytes(request.result.SerializeToString(deterministic=True))


async def load_history(dsn: str, opt: Options, say: Callable[[str], None]) -> dict[str, Any]:
    n = opt.history
    hosts = max(opt.hosts, opt.big_hosts, 1)
    churn_from = n - int(n * CHURN_SHARE)
    spec = key_actions(1).SerializeToString(deterministic=True)
    result = _result_bytes()
    conn = await asyncpg.connect(dsn)
    started = time.monotonic()
    chunks = []
    try:
        for lo in range(0, n, HISTORY_CHUNK):
            hi = min(n, lo + HISTORY_CHUNK)
            args = (lo, hi, n, hosts, opt.history_days, PREFIX, spec, result, churn_from)
            t0 = time.monotonic()
            async with conn.transaction():
                for statement in (HISTORY_TASKS, HISTORY_ATTEMPTS, HISTORY_EVENTS):
                    await conn.execute(statement, *args)
            chunks.append(time.monotonic() - t0)
        t0 = time.monotonic()
        if churn_from < n:
            async with conn.transaction():
                args = (churn_from, n, n, hosts, opt.history_days, PREFIX, spec, result, churn_from)
                await conn.execute(HISTORY_REPORTS, *args)
        reports_s = time.monotonic() - t0
        counts = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM tasks WHERE caller = 'bench-history') AS tasks,"
            " (SELECT count(*) FROM tasks WHERE caller = 'bench-history'"
            "   AND status NOT IN ('done', 'failed')) AS not_finished,"
            " (SELECT count(*) FROM attempts) AS attempts,"
            " (SELECT count(*) FROM task_events) AS events"
        )
    finally:
        await conn.close()
    seconds = time.monotonic() - started
    say(f"  {n:,} tasks in {seconds:.0f}s (reports of the newest {n - churn_from:,}:"
        f" {reports_s:.1f}s)")  # fmt: skip
    return {
        "tasks": n,
        "in_flight_then_reported": n - churn_from,
        "seconds": seconds,
        "chunk_seconds": chunks,
        "reports_seconds": reports_s,
        "counts": dict(counts) if counts else {},
    }


# -- the backlog: SubmitTasks --------------------------------------------------------------


def backlog_selector(k: int) -> task_pb2.DeviceSelector:
    """Selector k of the backlog: a rack no host has; one in four also names the pool."""
    labels = {"rack": f"absent-rack{k:04d}"}
    if k % 4 == 3:
        labels["pool"] = "fleet"
    return task_pb2.DeviceSelector(labels=labels)


async def load_backlog(st: stack.Stack, dsn: str, opt: Options) -> dict[str, Any]:
    spec = key_actions(1)
    selectors = [backlog_selector(k) for k in range(max(1, opt.selectors))]
    replica = await st.start_replica("deep-backlog-cp", opt.fleet.lease_ttl, dsn)
    client = Client.connect(replica.address)
    submitted = 0
    failed: list[str] = []
    sample: list[str] = []  # a task of each batch, for the GetTask reads

    def batch(lo: int, hi: int) -> Callable[[], Any]:
        async def call() -> None:
            nonlocal submitted
            request = scheduler_pb2.SubmitTasksRequest(
                tasks=[
                    scheduler_pb2.SubmitTaskRequest(
                        spec=spec,
                        selector=selectors[i % len(selectors)],
                        max_attempts=1,
                        request_id=f"backlog-{i}",
                    )
                    for i in range(lo, hi)
                ]
            )
            try:
                answer = await client.scheduler.SubmitTasks(request, timeout=120)
            except grpc.aio.AioRpcError as exc:
                failed.append(f"{exc.code().name}: {exc.details()}")
                return
            submitted += len(answer.tasks)
            sample.append(answer.tasks[len(answer.tasks) // 2].task_id)

        return call

    started = time.monotonic()
    try:
        calls = [
            batch(lo, min(opt.queued, lo + BACKLOG_BATCH))
            for lo in range(0, opt.queued, BACKLOG_BATCH)
        ]
        await bounded(calls, BACKLOG_CALLS)
        seconds = time.monotonic() - started
        if failed:
            raise RuntimeError(f"backlog: {len(failed)} SubmitTasks failed, e.g. {failed[0]}")
        reads = await measure_reads(client, sample)
    finally:
        await client.close()
        replica.child.stop()
    return {
        "submitted": submitted,
        "selectors": len(selectors),
        "seconds": seconds,
        "per_s": submitted / seconds if seconds else 0.0,
        "reads": reads,
    }


async def measure_reads(client: Client, tasks: list[str]) -> dict[str, Any]:
    """GetQueue and GetTask (each backlog task's pending reason says why it waits), one call
    at a time, READ_CALLS each, with the backlog queued: their round trips in ms."""
    queue_ms: list[float] = []
    task_ms: list[float] = []
    reasons = 0
    for i in range(READ_CALLS):
        t0 = time.perf_counter()
        await client.scheduler.GetQueue(scheduler_pb2.GetQueueRequest(), timeout=30)
        queue_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        task = await client.scheduler.GetTask(
            scheduler_pb2.GetTaskRequest(task_id=tasks[i % len(tasks)]), timeout=30
        )
        task_ms.append((time.perf_counter() - t0) * 1e3)
        reasons += bool(task.pending_reason)
    return {
        "get_queue_ms": summarize(queue_ms),
        "get_task_ms": summarize(task_ms),
        "pending_reasons": reasons,
        "calls": READ_CALLS,
    }


async def count_backlog(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT count(*) FROM tasks WHERE status = 'queued' AND request_id LIKE 'backlog-%'"
            )
        )
    finally:
        await conn.close()
