"""How long the farm took to get over each fault, from the faults' timeline and the
database's record of what happened around them.

    replica_kill  restart_to_serving_s  restart of the killed replica until it serves
                  work_gap_s            kill until the next transition anywhere (the other
                                        replica carrying the farm)
    pg_failover   promote_s             primary crashed until the standby was promoted
                                        (after every replica went NOT_SERVING)
                  serving_after_promotion_s  promotion until every replica serves again
                  work_resumed_s        promotion until the next transition committed
                  rejoin_s              the old primary rewound and streaming, synchronous
    pg_restart    outage_s              crash until PostgreSQL accepts connections again
                  recovery_s            back up until both replicas report SERVING
                  work_resumed_s        back up until the next transition committed
    agent_*       recovery_s            fault undone (restart, SIGCONT, heal) until the host
    proxy_cut                           (a fleet fault: the first of its hosts)
    fleet_*                             acknowledges a new assignment: working again
                  leases_reclaimed_s    fault until every lease the host held then ended
                                        (expired and swept, so its tasks moved on)

Faults may overlap (two at a time, on different targets): each fault's `overlapping`
lists the others that ran between its start and its recovery, whose time it includes.
"""

from __future__ import annotations

import statistics
from typing import Any

from chaos_lib.evidence import Evidence
from chaos_lib.faults import Fault

HOST_FAULTS = ("agent_kill", "agent_freeze", "proxy_cut", "fleet_kill", "fleet_freeze")


def measure(faults: list[Fault], ev: Evidence) -> None:
    """Adds the measurements to each fault's `detail`."""
    all_events = sorted(e["at"] for events in ev.events.values() for e in events)
    for f in faults:
        if f.healed_at is None:
            continue
        if f.kind in HOST_FAULTS:
            _host_fault(f, ev)
        elif f.kind == "replica_kill":
            f.detail["work_gap_s"] = _next_after(all_events, f.started_at)
        elif f.kind == "pg_failover":
            f.detail["work_resumed_s"] = _next_after(all_events, f.healed_at)
        elif f.kind == "pg_restart":
            if f.recovered_at is not None:
                f.detail["recovery_s"] = round(f.recovered_at - f.healed_at, 3)
            f.detail["work_resumed_s"] = _next_after(all_events, f.healed_at)
        f.detail["overlapping"] = _overlapping(f, faults)


def _overlapping(f: Fault, faults: list[Fault]) -> list[str]:
    """Other faults between this one's start and its recovery: its times include theirs."""
    assert f.healed_at is not None
    end = f.healed_at + float(f.detail.get("recovery_s") or 0.0)
    return [
        f"{g.kind} {g.target}"
        for g in faults
        if g is not f and g.started_at < end and (g.healed_at or end) > f.started_at
    ]


def _host_fault(f: Fault, ev: Evidence) -> None:
    assert f.healed_at is not None
    hosts = set(f.detail.get("hosts") or [f.target])
    atts = [a for a in ev.attempts.values() if a["host_id"] in hosts]
    acked = [
        a["acknowledged_at"]
        for a in atts
        if a["acknowledged_at"] is not None and a["acknowledged_at"] > f.healed_at
    ]
    if acked:
        f.detail["recovery_s"] = round(min(acked) - f.healed_at, 3)
    held = [
        a
        for a in atts
        if a["created_at"] < f.started_at
        and (a["ended_at"] is None or a["ended_at"] > f.started_at)
    ]
    f.detail["leases_held"] = len(held)
    ended = [a["ended_at"] for a in held if a["ended_at"] is not None]
    if held and len(ended) == len(held):
        f.detail["leases_reclaimed_s"] = round(max(ended) - f.started_at, 3)
        f.detail["held_attempts_ended"] = sorted({a["state"] for a in held})
    if f.kind in ("agent_freeze", "fleet_freeze"):
        late = [
            e
            for e in ev.agent_events
            if e.host in hosts
            and e.event == "report refused by the control plane"
            and f.started_at <= e.at <= f.healed_at + 30
            and (e.fields.get("task_id"), e.fields.get("attempt"))
            in {(a["task_id"], a["attempt"]) for a in held}
        ]
        f.detail["late_reports_refused"] = len(late)


def _next_after(times: list[float], t: float) -> float | None:
    later = [x for x in times if x > t]
    return round(min(later) - t, 3) if later else None


def summary(faults: list[Fault], kinds: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """Per kind and measurement: n, min, median, max (seconds)."""
    out: dict[str, dict[str, Any]] = {}
    for kind in kinds:
        mine = [f for f in faults if f.kind == kind]
        metrics: dict[str, list[float]] = {}
        for f in mine:
            for key, value in f.detail.items():
                if key.endswith("_s") and isinstance(value, int | float):
                    metrics.setdefault(key, []).append(float(value))
        out[kind] = {
            key: {
                "n": len(values),
                "min": round(min(values), 3),
                "median": round(statistics.median(values), 3),
                "max": round(max(values), 3),
            }
            for key, values in sorted(metrics.items())
        }
    return out
