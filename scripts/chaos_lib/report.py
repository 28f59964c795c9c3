"""`chaos-results.json` and the table printed at the end of a run."""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from chaos_lib.evidence import Evidence, task_result
from chaos_lib.faults import Fault
from chaos_lib.invariants import NAMES


def task_summary(ev: Evidence, stats: Counter[str]) -> dict[str, Any]:
    by_status = Counter(t["status"] for t in ev.tasks.values())
    failed_by_cause = Counter(
        _failure_cause(t) for t in ev.tasks.values() if t["status"] == "failed"
    )
    attempts = Counter(a["state"] for a in ev.attempts.values())
    return {
        "submitted": len(ev.tasks),
        "by_status": dict(sorted(by_status.items())),
        "failed_by_cause": dict(failed_by_cause),
        "attempts": sum(attempts.values()),
        "attempts_by_end": dict(sorted(attempts.items())),
        "retried": sum(1 for t in ev.tasks.values() if t["attempt"] > 1),
        "cancel_requested": sum(
            1 for t in ev.tasks.values() if t["cancel_requested_at"] is not None
        ),
        "details": dict(sorted(stats.items())),
    }


def notable(ev: Evidence) -> dict[str, Any]:
    """Outcomes no invariant forbids that an operator would still want to hear about."""
    lost = [
        {"task_id": task_id, "attempt": t["attempt"], "max_attempts": t["max_attempts"]}
        for task_id, t in ev.tasks.items()
        if t["status"] == "failed"
        and _failure_cause(t) == "lease lost"
        and t["attempt"] < t["max_attempts"]
    ]
    return {
        "failed_by_own_lease_lost_report_with_attempts_left": {
            "count": len(lost),
            "why": "the host fenced itself (deadline passed without renewal) and reported "
            "FAILED while the control plane still held its lease live, so the task failed "
            "instead of being requeued by the expiry",
            "examples": lost[:5],
        }
    }


def _failure_cause(t: dict[str, Any]) -> str:
    result = task_result(t)
    error = (result.error if result is not None else "") or t["error"]
    if error.startswith("lease expired") or error.startswith("lease released"):
        return "attempts exhausted (lease ran out)"
    if error.startswith("step "):
        return "a step failed (on purpose)"
    return error.split(":")[0] or "unknown"


def fault_summary(faults: list[Fault], kinds: tuple[str, ...]) -> dict[str, Any]:
    return {
        kind: {
            "count": sum(1 for f in faults if f.kind == kind),
            "errors": [f.error for f in faults if f.kind == kind and f.error],
            "events": [f.to_json() for f in faults if f.kind == kind],
        }
        for kind in kinds
    }


def process_errors(logs: dict[str, Path]) -> dict[str, dict[str, int]]:
    """Error-level lines the processes logged themselves, counted by their first line."""
    found: dict[str, dict[str, int]] = {}
    for name, path in logs.items():
        counts: Counter[str] = Counter()
        text = path.read_text(errors="replace") if path.exists() else ""
        for line in text.splitlines():
            with contextlib.suppress(ValueError, AttributeError):
                record = json.loads(line)
                if record.get("level") in ("error", "critical"):
                    first = str(record.get("event")).splitlines()[0]
                    counts[re.sub(r"\d+", "N", first)[:100]] += 1
        if counts:
            found[name] = dict(counts)
    return found


def write(path: Path, results: dict[str, Any]) -> None:
    path.write_text(json.dumps(results, indent=2, sort_keys=False, default=str) + "\n")


def table(results: dict[str, Any]) -> str:
    s, t = results["summary"], results["tasks"]
    lines = [
        "",
        f"chaos run: {s['duration_s']:.0f}s of faults, {s['wall_s']:.0f}s in all, seed {s['seed']}"
        f" — {'PASSED' if s['passed'] else 'FAILED'}",
        "",
        f"tasks      {t['submitted']} submitted  "
        + "  ".join(f"{k} {v}" for k, v in t["by_status"].items())
        + f"  (retried {t['retried']}, cancel requested {t['cancel_requested']})",
        f"attempts   {t['attempts']}  "
        + "  ".join(f"{k} {v}" for k, v in t["attempts_by_end"].items()),
        *_workload_lines(results.get("config") or {}),
        *_dispatch_lines(results.get("dispatch") or {}),
        *_screen_lines(results.get("screens") or {}),
        *_door_lines(results.get("doors") or {}),
        *_emulator_lines(results.get("emulators") or {}),
        *_webdriver_lines(results.get("webdriver") or {}),
        "",
        f"{'fault':<14}{'n':>4}  recovery (s: min / median / max)",
    ]
    for kind, info in results["faults"].items():
        rec = results["recovery"].get(kind, {})
        shown = [
            f"{m} {v['min']:.2f}/{v['median']:.2f}/{v['max']:.2f}"
            for m, v in rec.items()
            if m not in ("frozen_s", "cut_s")
        ]
        lines.append(f"{kind:<14}{info['count']:>4}  " + ("; ".join(shown) or "-"))
    lines += ["", f"{'invariant':<64}{'violations':>10}"]
    for n, info in results["violations"].items():
        lines.append(f"{n}. {NAMES[int(n)]:<61}{info['count']:>10}")
        for check, count in info["by_check"].items():
            lines.append(f"     {check[:70]:<70} {count}")
    if s["problems"]:
        lines += ["", "harness problems:"] + [f"  - {p}" for p in s["problems"]]
    lines.append("")
    return "\n".join(lines)


def _screen_lines(v: dict[str, Any]) -> list[str]:
    if not v.get("watches"):
        return []
    ends = "  ".join(f"{k} {n}" for k, n in v["watches_by_end"].items())
    return [
        f"screens    {v['watches']} watches of {v['tasks_watched']} tasks, {v['frames']} frames,"
        f" {v.get('relays_between_replicas', 0)} relays between replicas  (ended: {ends})"
    ]


def _door_lines(v: dict[str, Any]) -> list[str]:
    if not v.get("doors"):
        return []
    ends = "  ".join(f"{k} {n}" for k, n in v.get("ends", {}).items())
    return [
        f"adb doors  {v['doors']} doors, {v['opened']} opened, {v['door_streams_on_phones']}"
        f" streams on phones; last write {v['latest_write_after_lease_end_s']}s after a lease"
        f" end, hung up {v['latest_hang_up_after_task_end_s']}s after a session's end at most"
        f"; {v.get('asked_as_the_run_ended', 0)} stopped or cancelled as the run ended"
        f"  (ended: {ends})"
    ]


def _emulator_lines(v: dict[str, Any]) -> list[str]:
    if not v.get("faults"):
        return []
    faults = "  ".join(f"{k} {n} ({v['fired'].get(k, 0)} fired)" for k, n in v["faults"].items())
    d = v.get("details", {})
    given_back = sum(n for k, n in d.items() if k.startswith("tasks given back as device_lost"))
    under = d.get("deaths under a task's attempt", 0)
    starts = "  ".join(f"{k} {n}" for k, n in v.get("tasks_by_start_snapshot", {}).items())
    return [
        f"emulators  faults: {faults}",
        f"           tasks by start snapshot: {starts}; {d.get('double: loading', 0)} loads,"
        f" {d.get('double: died', 0)} deaths ({under} under a task, {given_back} of those given"
        f" back and done), {d.get('instances started afresh', 0)} started afresh,"
        f" {d.get('double: refused to start', 0)} starts refused,"
        f" {v.get('released_by_operator', 0)} released by the operator; below the pool's"
        f" minimum {v.get('longest_below_min_s', 0):.1f}s at most;"
        f" {d.get('instances ready at the quiesce', 0)} ready at the quiesce",
    ]


def _webdriver_lines(v: dict[str, Any]) -> list[str]:
    if "skipped" in v:
        return [f"webdriver  skipped: {v['skipped']}"]
    if not v.get("sessions"):
        return []
    ends = "  ".join(f"{k} {n}" for k, n in v.get("ends", {}).items())
    return [
        f"webdriver  {v['sessions']} sessions, {v['created']} created,"
        f" {v['commands_answered_ok']} commands answered OK; on the hosts"
        f" {v['appium_sessions_on_hosts']} Appium sessions, {v['appium_commands_on_hosts']}"
        f" commands, the last {v['latest_appium_command_after_lease_end_s']}s after a lease"
        f" end at most  (ended: {ends})"
    ]


def _workload_lines(c: dict[str, Any]) -> list[str]:
    if not c.get("tasks_by_team"):
        return []
    teams = "  ".join(
        f"{team} {n} (weight {c.get('fair_shares', {}).get(team, 1)})"
        for team, n in sorted(c["tasks_by_team"].items())
    )
    return [
        f"workload   by team: {teams}; {c.get('unmatched_backlog', 0)} of them the backlog"
        " for racks no host has (queued through the faults, cancelled at the quiesce)"
    ]


def _dispatch_lines(d: dict[str, Any]) -> list[str]:
    if not d.get("fleet_hosts"):
        return []
    pickup = "  ".join(
        f"{kind} {q.get('p50', 0):.2f}/{q.get('p99', 0):.2f}/{q.get('max', 0):.2f}"
        for kind, q in d["first_pickup_s"].items()
        if q
    )
    longest = {
        cause: max(by_kind.values(), default=0.0)
        for cause, by_kind in d["longest_clean_overlap_s"].items()
    }
    details = d["details"]
    excused = details.get("queued spans excused: offer may have died with its replica", 0)
    return [
        f"dispatch   {d['fleet_hosts']} fleet hosts; {details.get('fleet acquire calls', 0)} "
        f"Acquire calls; {d['assigned_by_another_replica_than_queued']} of "
        f"{d['assignments_logged']} assignments by another replica than queued the task",
        f"           queued while a fitting phone idled on a parked host: longest "
        f"{longest.get('offered', 0):.2f}s offered by its Acquire, "
        f"{longest.get('not offered', 0):.2f}s not (bound {d['bound_s']:.0f}s; {excused} "
        f"spans excused by a replica kill); over the bound {d['violations']}",
        f"           first pickup s (p50/p99/max) by selector: {pickup}",
    ]
