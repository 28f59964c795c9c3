"""The hot statements' plans, checked in every state of the statistics (issue 41.2): each
one reaches its rows by key, through the index it must use, with a custom plan and with
the generic plan a prepared statement (and every PL/pgSQL statement) switches to.

What runs: each probe calls the store's own method (store_on: the real statements and
their arguments) in a transaction that is rolled back, with auto_explain logging the plan
of every statement it ran, the ones inside the PL/pgSQL and SQL functions too, to the
client (auto_explain.log_level = notice), once with plan_cache_mode = force_custom_plan
and once with force_generic_plan. In each state of plan_state.py (fresh, history without
ANALYZE, analysed, stale), on a connection of its own (a new plan cache).

What a plan must not do (`problems`), on the tables that grow with the farm or its
history (BIG):
  * a Seq Scan;
  * an index scan whose Index Cond does not fix the index's first column (= or = ANY):
    that reads the whole index (e.g. every live attempt, every queued task);
  * an index not meant for the hot path (sweeps', listings', retention's: NOT_HOT);
  * a Sort over a queue read that no Limit bounds below it (sorting a group's backlog
    instead of reading its head in index order);
  * a Nested Loop rescanning a CTE per outer row (quadratic in the batch: the plan
    auto_explain logs is the one that ran, with its loops);
  * a filter `= ANY ($n)` on a big table's rows: an array parameter is searched one
    element at a time per row (only a constant array is hashed), so n keys against m
    rows cost n x m;
and every probe must have planned the statements its path runs (`Probe.must_plan`), so
that a check cannot pass by not looking.

tests/test_query_plans.py runs the check beside AMC_PLAN_HISTORY finished tasks (a size
that shows the same flips in seconds); `make bench` runs that test beside 1,000,000 (its
`plans` workload), with the sweeps' and gauges' statements too.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg

from control_plane.domain import LeaseId, NewTask, Report, TaskId
from control_plane.lifecycle import Outcome
from control_plane.store import Store, migrate
from tests.support import plan_state
from tests.support.plan_state import LEASE_TTL, SPEC, STEP, Live, connect, store_on

# The tables that grow with the tasks, their history or the farm's phones. (queue_groups
# and fair_shares hold a row per selector or fairness key in use, hosts one per host, each
# read by its key: the planner scans one only while it is a few pages.)
BIG = {"tasks", "attempts", "attempt_steps", "task_events", "devices", "session_relays"}
# Indexes of the sweeps, the listings and retention: a hot statement that reads one has
# flipped.
NOT_HOT = {
    "tasks_listing", "tasks_by_host", "tasks_finished", "tasks_queue_deadline",
    "attempts_deadline",
}  # fmt: skip
# Indexes in queue order whose key (a group, a fairness key, a priority) may hold a
# backlog: read in index order under a Limit, never sorted whole.
QUEUES = {"tasks_dispatch", "tasks_fair_queue", "tasks_running_tags"}
MODES = {"custom": "force_custom_plan", "generic": "force_generic_plan"}
AUTO_EXPLAIN = {
    "auto_explain.log_min_duration": "0",
    "auto_explain.log_nested_statements": "on",
    "auto_explain.log_format": "json",
    "auto_explain.log_level": "notice",
    # Rows and loops as they ran (no timing: it costs, and says nothing about a shape).
    "auto_explain.log_analyze": "on",
    "auto_explain.log_timing": "off",
}


@dataclass(frozen=True)
class Probe:
    name: str
    call: Callable[[Store, Live], Awaitable[object]]
    # Text each of which some planned statement holds: the path was taken.
    must_plan: tuple[str, ...]
    # A sweep's or a gauge's: it reads what is in flight whole by design (a partial index
    # read whole, the devices counted); only a scan of what grows with the history is wrong.
    background: bool = False


def _ids(held: list[Any]) -> list[str]:
    return [str(a.lease_id) for a in held]


def _report(a: Any) -> Report:
    return Report(TaskId(a.task_id), a.attempt, LeaseId(a.lease_id), Outcome.DONE, STEP, "")


def _rack_task(live: Live, i: int) -> NewTask:
    return NewTask(SPEC, selector_labels={"rack": live.rack(i)})


def _acquire(host: Callable[[Live], str], offer: bool = False) -> Callable[[Store, Live], Any]:
    def call(s: Store, lv: Live) -> Awaitable[object]:
        offered = [str(lv.offered)] if offer else []
        return s.leases.acquire(host(lv), ["d0"], LEASE_TTL, offered)

    return call


def _renew(host: Callable[[Live], str]) -> Callable[[Store, Live], Any]:
    def call(s: Store, lv: Live) -> Awaitable[object]:
        held = lv.leases[host(lv)]
        return s.leases.renew(host(lv), _ids(held), LEASE_TTL)

    return call


def _keep_steps(host: Callable[[Live], str]) -> Callable[[Store, Live], Any]:
    """A replica's bulk write of step progress: a step of each of the host's leases."""

    def call(s: Store, lv: Live) -> Awaitable[object]:
        held = lv.leases[host(lv)]
        return s.leases.keep_steps(
            [TaskId(a.task_id) for a in held], [a.attempt for a in held], [1] * len(held),
            [STEP] * len(held),
        )  # fmt: skip

    return call


def _report_all(k: int, first_only: bool = False) -> Callable[[Store, Live], Any]:
    def call(s: Store, lv: Live) -> Awaitable[object]:
        held = lv.leases[lv.busy(k)]
        return s.leases.report_many(
            lv.busy(k), [_report(a) for a in held[: 1 if first_only else None]]
        )

    return call


def _give_back(k: int, lost: bool) -> Callable[[Store, Live], Any]:
    def call(s: Store, lv: Live) -> Awaitable[object]:
        lease = lv.leases[lv.busy(k)][0].lease_id
        if lost:
            return s.leases.device_lost(lv.busy(k), lease, "gone", 2)
        return s.leases.release(lv.busy(k), lease, "drain")

    return call


def _submit(n: int) -> Callable[[Store, Live], Any]:
    return lambda s, lv: s.tasks.submit_many("plans", [_rack_task(lv, i + 7) for i in range(n)])


def _cancel(s: Store, lv: Live) -> Awaitable[object]:
    return s.tasks.cancel(lv.leases[lv.busy(5)][0].task_id, "plan check")


ASSIGNS = "INSERT INTO attempts"
REPORTS = "SET status = p_outcome"
PROBES = (
    Probe("acquire, work queued", _acquire(lambda lv: lv.waiting(50)),
          (ASSIGNS, "FROM tasks tk WHERE tk.group_id")),
    Probe("acquire, work queued under a capped key", _acquire(lambda lv: lv.waiting(5)),
          (ASSIGNS, "pg_advisory_xact_lock")),
    Probe("acquire, nothing for it (a re-poll)", _acquire(lambda lv: lv.busy(0)),
          ("FROM queue_groups q",)),
    Probe("acquire, woken by an offer", _acquire(lambda lv: lv.waiting(5), offer=True),
          (ASSIGNS, "FROM unnest($4::uuid[])")),
    Probe("renew, 3 leases", _renew(lambda lv: lv.busy(0)), ("UPDATE attempts a SET",)),
    Probe("step progress: a bulk write, 3 steps", _keep_steps(lambda lv: lv.busy(0)),
          ("INSERT INTO attempt_steps",)),
    Probe("step progress: a bulk write, 1,000 steps", _keep_steps(lambda lv: lv.big),
          ("INSERT INTO attempt_steps",)),
    Probe("renew, an acknowledgement", _renew(lambda lv: lv.unacked),
          ("SET status = 'dispatched'", "FROM task_events e")),
    Probe("renew, 1,000 leases of one host", _renew(lambda lv: lv.big),
          ("UPDATE attempts a SET",)),
    Probe("report, one result", _report_all(11, first_only=True), (REPORTS,)),
    Probe("report, one result under a capped key", _report_all(1, first_only=True),
          (REPORTS, "pg_notify('amc_queued'")),
    Probe("report, three results", _report_all(2), (REPORTS,)),
    Probe("submit, one task", _submit(1), ("INSERT INTO tasks", "amc_fair_frontier(p_priority)")),
    Probe("submit, 50 tasks", _submit(50), ("INSERT INTO tasks",)),
    Probe("give back: release", _give_back(3, lost=False), ("status = v_to",)),
    Probe("give back: device lost", _give_back(4, lost=True), ("status = v_to",)),
    Probe("cancel, a running task", _cancel, ("SET cancel_requested_at = now()",)),
    # Sweeps and gauges, each replica's, every few seconds.
    Probe("sweep: leases run out", lambda s, lv: s.leases.expire(100),
          ("att.lease_expires_at <= now()",), background=True),
    Probe("sweep: deadlines overrun", lambda s, lv: s.leases.end_overrun(timedelta(seconds=15)),
          ("att.deadline_at <=",), background=True),
    Probe("sweep: queue timeouts", lambda s, lv: s.tasks.time_out_queued(100),
          ("tk.queue_deadline <= now()",), background=True),
    Probe("sweep: idle queue groups forgotten",
          lambda s, lv: s.queue.forget_queue_groups(timedelta(0), 100),
          ("FROM queue_groups q WHERE q.created_at",), background=True),
    Probe("the queue counted",
          lambda s, lv: s.queue.count_queue(timedelta(0), timedelta(minutes=1)),
          ("count(*)::integer AS n",), background=True),
    Probe("the farm's gauges", lambda s, lv: s.queue.farm_gauges(timedelta(minutes=1), 10),
          ("AS hosts_connected",), background=True),
)  # fmt: skip
# What grows with the history: a sweep or a gauge must never scan it (checked beside this
# many finished tasks or more).
HISTORY_TABLES = {"tasks", "attempts", "attempt_steps", "task_events"}
BACKGROUND_FROM = 500_000


class _Rollback(Exception):
    pass


async def capture(
    conn: asyncpg.Connection, mode: str, run: Callable[[Store], Awaitable[object]]
) -> list[dict[str, Any]]:
    """The plans (auto_explain's JSON) of every statement `run` sent or ran nested, in
    `mode`, in a transaction rolled back after."""
    messages: list[str] = []

    def listen(_conn: object, message: Any) -> None:
        messages.append(message.message)

    # The statement's own plan is logged when its portal closes: at the next statement of
    # the transaction, here the rollback. So the listener stays until after it.
    conn.add_log_listener(listen)
    try:
        async with conn.transaction():
            await conn.execute(f"SET LOCAL plan_cache_mode = {MODES[mode]}")
            for name, value in AUTO_EXPLAIN.items():
                await conn.execute(f"SET LOCAL {name} = '{value}'")
            await run(store_on(conn))
            raise _Rollback
    except _Rollback:
        pass
    finally:
        await asyncio.sleep(0)  # the listener is called soon, not at once
        conn.remove_log_listener(listen)
    plans = []
    for message in messages:
        _, found, body = message.partition("plan:\n")
        if found:
            plans.append(json.loads(body))
    return plans


# -- the rules -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Indexes:
    """Each index's table and first column (from the catalog)."""

    table: dict[str, str]
    first: dict[str, str]

    @classmethod
    async def read(cls, conn: asyncpg.Connection) -> Indexes:
        rows = await conn.fetch(
            "SELECT c.relname AS index, t.relname AS table, a.attname AS first"
            " FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_class t ON t.oid = i.indrelid"
            " LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]"
            " WHERE t.relnamespace = 'public'::regnamespace"
        )
        return cls({r["index"]: r["table"] for r in rows}, {r["index"]: r["first"] for r in rows})


def nodes(
    node: dict[str, Any], stop: Callable[[dict[str, Any]], bool] | None = None
) -> Iterator[dict[str, Any]]:
    """The node and those under it, not descending below a node `stop` accepts."""
    yield node
    if stop is not None and stop(node):
        return
    for child in node.get("Plans", []):
        yield from nodes(child, stop)


def statement(plan: dict[str, Any]) -> str:
    text = " ".join(line.split("--")[0] for line in plan.get("Query Text", "").splitlines())
    return " ".join(text.split())


def _scans(node: dict[str, Any], ix: Indexes) -> tuple[str | None, str | None]:
    index = node.get("Index Name")
    table = node.get("Relation Name") or (ix.table.get(index) if index else None)
    return table, index


def problems(plan: dict[str, Any], ix: Indexes, background: bool = False) -> list[str]:
    if background:
        return [
            f"Seq Scan on {node['Relation Name']}"
            for node in nodes(plan["Plan"])
            if node["Node Type"] == "Seq Scan" and node.get("Relation Name") in HISTORY_TABLES
        ]
    out = []
    for node in nodes(plan["Plan"]):
        kind = node["Node Type"]
        table, index = _scans(node, ix)
        if table not in BIG:
            continue
        if kind == "Seq Scan":
            out.append(f"Seq Scan on {table}")
        if index is None:
            continue
        if index in NOT_HOT:
            out.append(f"reads {index} (not a hot path's index)")
        first = ix.first.get(index)
        cond = node.get("Index Cond", "")
        if first and not re.search(rf"\({re.escape(first)} = ", cond):
            out.append(
                f"{kind} of {index} not by its first column {first}: the whole index"
                + (f" ({cond})" if cond else "")
            )
        if re.search(r"= ANY \(\$\d+", node.get("Filter", "")):
            out.append(
                f"{table} rows filtered by an array parameter ({node['Filter'][:90]}):"
                " one element at a time per row"
            )
    for node in nodes(plan["Plan"]):
        if node["Node Type"] == "Sort":
            below = nodes(node, stop=lambda n: n["Node Type"] == "Limit")
            for n in below:
                if n.get("Index Name") in QUEUES:
                    out.append(
                        f"sorts what {n['Index Name']} holds for its key (no Limit below the Sort)"
                    )
        if node["Node Type"] == "Nested Loop":
            inner = [c for c in node.get("Plans", []) if c.get("Parent Relationship") == "Inner"]
            if (
                inner
                and inner[0]["Node Type"] == "CTE Scan"
                and inner[0].get("Actual Loops", 1) > 1
            ):
                out.append(
                    f"rescans CTE {inner[0].get('CTE Name')} per outer row"
                    f" ({inner[0]['Actual Loops']:.0f} times)"
                )
    return out


# -- the check -----------------------------------------------------------------------------


def probes(history: int) -> tuple[Probe, ...]:
    """The hot statements' probes; with a history of BACKGROUND_FROM finished tasks or more,
    the sweeps' and gauges' too (beside a smaller one the planner rightly scans a table that
    is mostly live rows)."""
    return PROBES if history >= BACKGROUND_FROM else tuple(p for p in PROBES if not p.background)


async def check_state(dsn: str, live: Live, history: int) -> dict[str, Any]:
    """Every probe in both modes: {probe: {mode: {"statements": n, "problems": [...]}}}."""
    conn = await connect(dsn)
    try:
        await conn.execute("LOAD 'auto_explain'")
        ix = await Indexes.read(conn)
        out: dict[str, Any] = {}
        for probe in probes(history):
            out[probe.name] = {}
            for mode in MODES:
                plans = await capture(conn, mode, lambda s, p=probe: p.call(s, live))
                ours = [p for p in plans if any(t in json.dumps(p["Plan"]) for t in BIG)]
                found = [
                    f"{statement(p)[:100]}: {problem}"
                    for p in ours
                    for problem in problems(p, ix, probe.background)
                ]
                texts = " ".join(statement(p) for p in plans)
                found += [f"did not plan {want!r}" for want in probe.must_plan if want not in texts]
                out[probe.name][mode] = {"statements": len(ours), "problems": found}
        return out
    finally:
        await conn.close()


async def run(
    dsn: str, history: int, say: Callable[[str], None] = print, hosts: int = plan_state.HOSTS
) -> dict[str, Any]:
    """The four states in order, on the database `dsn` (empty; migrated here), with a live
    set of `hosts` hosts."""
    await migrate(dsn)
    conn = await connect(dsn)
    out: dict[str, Any] = {"history": history, "hosts": hosts, "states": {}, "seconds": {}}
    started = time.monotonic()
    try:
        await plan_state.hold_statistics(conn)
        t0 = time.monotonic()
        live = await plan_state.build_live(conn, "p1", hosts)
        out["seconds"]["live"] = time.monotonic() - t0

        async def state(name: str, current: Live) -> None:
            t0 = time.monotonic()
            out["states"][name] = await check_state(dsn, current, history)
            out["seconds"][f"check {name}"] = time.monotonic() - t0
            n = sum(len(m["problems"]) for p in out["states"][name].values() for m in p.values())
            say(f"  {name}: {n} problems")

        await state("fresh", live)
        say(f"  loading {history:,} finished tasks (one INSERT ... SELECT, no ANALYZE)")
        out["seconds"]["history"] = await plan_state.load_history(conn, history)
        await state("history, no ANALYZE", live)
        t0 = time.monotonic()
        await conn.execute("ANALYZE")
        out["seconds"]["analyze"] = time.monotonic() - t0
        await state("analyzed", live)
        await plan_state.finish_live(conn)
        await conn.execute("ANALYZE")
        stale = await plan_state.build_live(conn, "p2", hosts)
        await state("stale (analyzed before a burst)", stale)
    finally:
        await conn.close()
    out["seconds"]["total"] = time.monotonic() - started
    out["problems"] = [
        f"{state} / {probe} / {mode}: {p}"
        for state, probes in out["states"].items()
        for probe, modes in probes.items()
        for mode, found in modes.items()
        for p in found["problems"]
    ]
    return out
