"""The hot statements' plans cannot flip: acquire, renew (with step progress), report,
submit and give-back, with a custom plan and with the generic plan a prepared statement
switches to, each reach their rows by key through the index they must use, on a fresh
database, beside a history of finished tasks loaded without ANALYZE, after ANALYZE, and
with statistics taken before a burst of work (tests/support/plans.py says what is
checked; make bench runs this test beside 1,000,000 finished tasks).

The history here is AMC_PLAN_HISTORY finished tasks (20,000 unless set): the plans that
flipped did so at every size from 10,000 to 1,000,000 finished tasks, because what makes
them flip is the statistics (none yet, or taken when nothing was queued or running) and the
generic plan's guess of ten keys per array, not the history's size. A small history is the
stricter case where it matters at all: beside 1,000,000 finished tasks a full scan of a
partial index costs the planner more, and fewer plans flipped there than at 10,000. The
live work is AMC_PLAN_HOSTS hosts (300 unless set, as in make bench): the old statements
flipped the same with 300 hosts as with 1,000 (102 and 103 problems).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support import plans

HISTORY = int(os.environ.get("AMC_PLAN_HISTORY", "20000"))
HOSTS = int(os.environ.get("AMC_PLAN_HOSTS", "300"))
# make bench's plans workload runs this test beside 1,000,000 finished tasks and reads what
# it found from here.
RESULTS = os.environ.get("AMC_PLAN_RESULTS")
STATES = {"fresh", "history, no ANALYZE", "analyzed", "stale (analyzed before a burst)"}


@pytest.mark.timeout(300 + HISTORY // 1000)
async def test_hot_statements_reach_their_rows_by_key_whatever_the_statistics_say(
    database_url: str,
) -> None:
    """THEN in every state of the statistics and in both plan modes, no hot statement scans
    a table that grows, reads an index whole, sorts a queue or filters its rows by an array
    parameter, and each probe planned the statements of its path."""
    result = await plans.run(database_url, HISTORY, say=lambda _: None, hosts=HOSTS)
    if RESULTS:
        await asyncio.to_thread(Path(RESULTS).write_text, json.dumps(result, default=str))
    assert set(result["states"]) == STATES
    for probes in result["states"].values():
        assert set(probes) == {p.name for p in plans.probes(HISTORY)}
        for modes in probes.values():
            assert set(modes) == set(plans.MODES)
            assert all(m["statements"] > 0 for m in modes.values())
    assert result["problems"] == [], "\n".join(result["problems"])


# -- the rules, on plans written out -------------------------------------------------------

IX = plans.Indexes(
    table={
        "tasks_pkey": "tasks",
        "tasks_dispatch": "tasks",
        "tasks_running_tags": "tasks",
        "attempts_lease_id_key": "attempts",
        "attempts_by_host": "attempts",
        "tasks_listing": "tasks",
    },
    first={
        "tasks_pkey": "task_id",
        "tasks_dispatch": "group_id",
        "tasks_running_tags": "priority",
        "attempts_lease_id_key": "lease_id",
        "attempts_by_host": "host_id",
        "tasks_listing": "created_at",
    },
)


def _plan(node: dict[str, Any]) -> dict[str, Any]:
    return {"Query Text": "SELECT 1", "Plan": node}


def _scan(index: str, cond: str = "", kind: str = "Index Scan", **more: Any) -> dict[str, Any]:
    node: dict[str, Any] = {"Node Type": kind, "Index Name": index, **more}
    if kind != "Bitmap Index Scan":
        node["Relation Name"] = IX.table[index]
    if cond:
        node["Index Cond"] = cond
    return node


def test_a_probe_by_key_is_what_a_hot_statement_may_do() -> None:
    """THEN index scans whose condition fixes the index's first column pass, a queue read in
    index order under its Limit too (sorting what several such reads return is fine)."""
    probe = _scan("attempts_lease_id_key", "(lease_id = ANY ($2))")
    assert plans.problems(_plan(probe), IX) == []
    head = {"Node Type": "Limit", "Plans": [_scan("tasks_dispatch", "(group_id = q.group_id)")]}
    merge = {"Node Type": "Sort", "Plans": [{"Node Type": "Nested Loop", "Plans": [head]}]}
    assert plans.problems(_plan(merge), IX) == []


def test_every_way_a_plan_flips_is_named() -> None:
    """THEN a Seq Scan on a table that grows, an index read whole (no condition, or one on a
    later column: PostgreSQL 18 skip-scans it), an index of the sweeps, a sort of what a
    queue index holds, a CTE rescanned per row and an array parameter searched per row are
    each a problem, said in words."""
    cases = {
        "Seq Scan on tasks": {"Node Type": "Seq Scan", "Relation Name": "tasks"},
        "not by its first column host_id": _scan("attempts_by_host", kind="Bitmap Index Scan"),
        "not by its first column group_id": _scan("tasks_dispatch", "(task_id = ANY ($19))"),
        "not a hot path's index": _scan("tasks_listing", "(created_at = $1)"),
        "sorts what tasks_running_tags holds": {
            "Node Type": "Sort",
            "Plans": [_scan("tasks_running_tags", "(priority = 0)")],
        },
        "rescans CTE held per outer row (1000 times)": {
            "Node Type": "Nested Loop",
            "Plans": [
                {"Node Type": "Function Scan", "Parent Relationship": "Outer"},
                {
                    "Node Type": "CTE Scan",
                    "CTE Name": "held",
                    "Parent Relationship": "Inner",
                    "Actual Loops": 1000.0,
                },
            ],
        },
        "filtered by an array parameter": _scan(
            "attempts_by_host", "(host_id = $1)", Filter="(lease_id = ANY ($2))"
        ),
    }
    for words, node in cases.items():
        found = plans.problems(_plan(node), IX)
        assert any(words in p for p in found), (words, found)
    once = cases["rescans CTE held per outer row (1000 times)"]
    once["Plans"][1]["Actual Loops"] = 1.0  # one outer row: nothing rescanned
    assert plans.problems(_plan(once), IX) == []
