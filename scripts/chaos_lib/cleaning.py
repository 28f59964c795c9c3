"""Cleaning faults (issue 38) on the agents' simulated phones, and invariant 12: zero leases
starting on a phone whose last clean failed.

    clean_hang             the phone's clean hangs (its commands never answer): the clean
                           fails at the profile's timeout (CLEAN_TIMEOUT)
    clean_uninstall_fail   `pm uninstall` fails on the phone: the next clean that has a
                           package to remove (the workload's shell actions install some)
                           fails at its uninstall step

Each is set on a phone running a task where one does (so its clean comes soon), through
the agent's `--sim-faults` file (chaos_lib/phones.py's writer), for a few seconds; then
undone, and the phone seen back in service (released by the operator if its host left it
quarantined), as the phone faults are.

Invariant 12, from the database and the action logs (times: PostgreSQL's `now()` and the
agents' `time.time()`, one clock on this machine):

    a  no lease starts on a phone between a failed clean and the next clean of it that
       passed: a clean's steps reach the database in one report (`cleaning` host events
       with one `at`), failed if a step failed; the failure is counted from the end of the
       phone's last clean command before that report (the host withdraws the phone then,
       before the report is sent), and an attempt created after it and before the next
       passing clean's report breaks the invariant. One report may carry several cleans
       (those that ended while the reports were refused, the database away): they are
       told apart by their steps, in order (a failed step ends its clean; a step whose
       name the clean already had begins the next one), so a failed clean followed by one
       that passed, in one report, leaves the phone clean from that report on
    b  no task action on a phone while a clean of it runs (the action logs' `clean`
       commands against the task actions of the same phone)

What this cannot see: a clean that failed and whose report never reached the database
(its agent killed in between) is not in the evidence; its phone is cleaned again by the
next agent process before its first lease, whose report is. A clean whose commands were
never logged (one cut short before its first command) dates its failure by its report. A
failed clean that is not the last of its report is dated as that report's last clean (the
commands do not say which clean they were of), so a lease between two cleans of one report
would go unseen (the control plane leases a phone only after a report that says it is
ready, and that report carries every clean before it).
"""

from __future__ import annotations

import asyncio
import bisect
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from chaos_lib import phones
from chaos_lib.evidence import Action

KINDS = ("clean_hang", "clean_uninstall_fail")
# The agents' cleaning profile: a hung clean fails within seconds.
CLEAN_TIMEOUT = 4.0
PROFILE = f"defaults:\n  timeout: {CLEAN_TIMEOUT:g}s\n"


def write_profile(workdir: Path) -> Path:
    path = workdir / "clean-profile.yaml"
    path.write_text(PROFILE, "utf-8")
    return path


async def inject(
    fault: Any, faults: phones.PhoneFaults, operator: phones.Operator, rng: random.Random
) -> None:
    """Make one phone's cleans fail (fault.target: host/serial), undo it, see it back."""
    host, serial = fault.target.split("/", 1)
    entry = {"clean": "hang"} if fault.kind == "clean_hang" else {"uninstall": "fail"}
    fault.detail["fault"] = entry
    faults.set(host, serial, entry)
    await asyncio.sleep(rng.uniform(CLEAN_TIMEOUT + 2.0, CLEAN_TIMEOUT + 6.0))
    faults.clear(host, serial)
    fault.healed_at = time.time()
    if await operator.back_in_service(host, serial, phones.READY_WITHIN + 3 * CLEAN_TIMEOUT):
        fault.recovered_at = time.time()
        fault.detail["ready_again_s"] = round(fault.recovered_at - fault.healed_at, 3)
    else:
        fault.error = "not ready within the bound after the fault's end"
    fault.detail["released"] = operator.released[fault.target]


# -- invariant 12 ---------------------------------------------------------------------------


@dataclass
class CleanVerdict:
    violations: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class Record:
    """One report of a clean's steps: its phone, when it was recorded, whether it passed."""

    phone: str
    at: float
    passed: bool
    failed_step: str


async def records(dsn: str) -> list[Record]:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT host_id, serial, reason, extract(epoch FROM at)::float8 AS at"
            " FROM host_events WHERE kind = 'cleaning' ORDER BY event_id"
        )
    finally:
        await conn.close()
    grouped: dict[tuple[str, float], list[str]] = defaultdict(list)
    for r in rows:
        grouped[(phones.target(r["host_id"], r["serial"]), r["at"])].append(r["reason"])
    made = [
        Record(phone, at, not failed, failed)
        for (phone, at), reasons in grouped.items()
        for failed in split_cleans(reasons)
    ]
    return sorted(made, key=lambda r: r.at)  # stable: one report's cleans stay in order


def split_cleans(reasons: list[str]) -> list[str]:
    """The cleans of one report's steps (their events' reasons, in order), each as the
    reason of the step it failed at, "" if it passed: a failed step ends its clean, and a
    step whose name its clean already had begins the next one."""
    cleans: list[str] = []
    names: set[str] = set()
    for reason in reasons:
        head = reason.split(":", 1)[0]
        name = head.split(" ", 1)[0]
        if not cleans or cleans[-1] or name in names:  # none yet, the last failed, or anew
            cleans.append("")
            names = set()
        names.add(name)
        if " failed (" in head:
            cleans[-1] = reason
    return cleans


def check(
    cleans: list[Action],
    actions: list[Action],
    attempts: dict[tuple[str, int], dict[str, Any]],
    reported: list[Record],
) -> CleanVerdict:
    """Invariant 12 (see the module docstring) from the clean commands and task actions of
    the action logs, the attempts, and the cleans' reports."""
    verdict = CleanVerdict()
    starts: dict[str, list[float]] = defaultdict(list)
    for a in attempts.values():
        starts[phones.target(a["host_id"], a["device_serial"])].append(a["created_at"])
    commands: dict[str, list[Action]] = defaultdict(list)
    for c in cleans:
        commands[phones.target(c.host, c.serial)].append(c)
    verdict.stats["clean commands logged"] = len(cleans)
    by_phone: dict[str, list[Record]] = defaultdict(list)
    for r in reported:
        by_phone[r.phone].append(r)
        verdict.stats["cleans passed" if r.passed else "cleans failed"] += 1
    for phone, mine in by_phone.items():
        _no_lease_after_a_failure(phone, mine, commands[phone], sorted(starts[phone]), verdict)
    _no_action_during_a_clean(commands, actions, verdict)
    return verdict


def _no_lease_after_a_failure(
    phone: str,
    mine: list[Record],
    commands: list[Action],
    starts: list[float],
    verdict: CleanVerdict,
) -> None:
    began = [c.start for c in commands]
    for i, r in enumerate(mine):
        if r.passed:
            continue
        before = bisect.bisect_left(began, r.at) - 1
        failed_at = min(commands[before].end, r.at) if before >= 0 else r.at
        later = next((n.at for n in mine[i + 1 :] if n.passed), float("inf"))
        for at in starts:
            if failed_at < at < later:
                verdict.violations.append(
                    (
                        "a lease started on a phone whose last clean failed",
                        {
                            "phone": phone,
                            "failed_at": failed_at,
                            "reported_at": r.at,
                            "failed_step": r.failed_step,
                            "lease_started_at": at,
                            "next_clean_passed_at": later,
                        },
                    )
                )


def _no_action_during_a_clean(
    commands: dict[str, list[Action]], actions: list[Action], verdict: CleanVerdict
) -> None:
    """A phone's clean commands run one after another: of those begun before an action
    ended, only the last can still have been running when it began."""
    began = {phone: [c.start for c in mine] for phone, mine in commands.items()}
    for a in actions:
        phone = phones.target(a.host, a.serial)
        i = bisect.bisect_left(began.get(phone, []), a.effective_end or a.end) - 1
        if i < 0:
            continue
        c = commands[phone][i]
        if c.end > a.start:
            verdict.violations.append(
                (
                    "a task acted on a phone while it was being cleaned",
                    {
                        "phone": phone,
                        "action": a.action,
                        "acted": [a.start, a.end],
                        "clean_command": [c.start, c.end],
                    },
                )
            )


def summary(faults: list[Any], verdict: CleanVerdict) -> dict[str, Any]:
    return {
        "faults": {k: sum(1 for f in faults if f.kind == k) for k in KINDS},
        "ready_again_s": sorted(
            f.detail["ready_again_s"]
            for f in faults
            if f.kind in KINDS and "ready_again_s" in f.detail
        ),
        "details": dict(sorted(verdict.stats.items())),
        "violations": len(verdict.violations),
    }
