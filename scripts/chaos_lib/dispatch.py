"""Invariant 7, dispatch liveness: no task stays queued while a host that can take it sits
parked. Checked after the run, for the fleet's hosts (their Acquire calls are recorded).

A fleet host *sits parked* from the moment it sends an Acquire until the answer comes. Its
phone `s` is *idle* while PostgreSQL has no attempt holding it. A task *could go there*
while it is queued and its selector (serial, labels) fits `s`, whose labels are the host's
and the phone's own as the control plane registered them. Any such overlap must end within
`bound` seconds: the task is taken (by that host or another), or the phone takes other
work, or the Acquire returns and the next one takes it. Two ways to break it, told apart:

- `offered`: the parked Acquire named `s` among its idle serials. Targeted dispatch had
  to wake it (a queued task wakes a parked Acquire it fits, on whichever replica that is
  parked); if it did not, the overlap lasts until the Acquire's own deadline (60 s).
- `not offered`: `s` became idle after the Acquire was sent (its task ended meanwhile), so
  the host did not name it and the control plane cannot hand it out until the host asks
  again; the host should have, once its phone was free.

What the faults excuse, and how:

- time does not count while PostgreSQL is down, nor for `PG_SLACK` seconds after both
  replicas serve again (their listeners reconnect, then wake every parked Acquire);
- time does not count on a host while a fault has it cut off (its proxy cut, its process
  killed or stopped), nor for `HOST_SLACK` seconds after the fault is undone;
- a task that entered the queue within `HINT_WINDOW` seconds before a replica was killed
  may have been committed by that replica, whose notification to the other one (its
  offer) then died with it: nothing wakes the other replica's parked Acquires for it, and
  it waits for their deadline. Its `offered` bound is the Acquire's wait plus `bound`;
  such spans are counted apart (`excused: offer may have died with its replica`).

Nothing else is excused: e.g. a phone that PostgreSQL frees (an expired lease of a host
that restarted) while its host is parked offering it must still be found by the tasks
that fit it.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from chaos_lib.evidence import AcquireCall, Evidence, ReplicaLine

PG_SLACK = 5.0
# Faults during which no replica can reach a writable database for a while (each excused
# everywhere until it is over, and PG_SLACK more).
DATABASE_OUTAGES = ("pg_restart", "pg_failover", "pg_conn_fill")
HOST_SLACK = 2.0
HINT_WINDOW = 2.0
HOST_FAULTS = frozenset({"agent_kill", "agent_freeze", "proxy_cut", "fleet_kill", "fleet_freeze"})
EXAMPLES = 5

Span = tuple[float, float]


@dataclass(frozen=True)
class FaultWindow:
    kind: str
    hosts: tuple[str, ...]  # empty: not a host fault
    started_at: float
    healed_at: float | None
    recovered_at: float | None


@dataclass
class Strand:
    task_id: str
    selector: str
    host: str
    serial: str
    offered: bool  # did the parked Acquire name the phone?
    start: float
    end: float
    bound: float
    excused: str
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Piece:
    """A clean stretch of a fleet phone idle while its host sat parked."""

    start: float
    end: float
    call: AcquireCall
    offered: bool


Device = tuple[str, str]  # (host, serial)


@dataclass
class DispatchCheck:
    evidence: Evidence
    fleet_hosts: set[str]
    faults: list[FaultWindow]
    bound: float
    selector_kinds: dict[str, str]  # task_id -> kind, from the workload
    stats: Counter[str] = field(default_factory=Counter)
    strands: list[Strand] = field(default_factory=list)
    # "offered"/"not offered" -> selector kind -> longest overlap (clean spans only)
    longest: dict[str, dict[str, float]] = field(default_factory=dict)
    _end: float = 0.0
    _starts: dict[Device, list[float]] = field(default_factory=dict)
    _queued_by: dict[str, list[tuple[float, str]]] = field(default_factory=dict)

    def run(self) -> list[Strand]:
        """The overlaps that outlasted their bound (the violations)."""
        ev = self.evidence
        if not self.fleet_hosts:
            return []
        self._end = max(
            [c.ended for c in ev.acquires]
            + [e["at"] for events in ev.events.values() for e in events]
            + [0.0]
        )
        devices = {
            (d["host_id"], d["serial"]): d for d in ev.devices if d["host_id"] in self.fleet_hosts
        }
        pieces = self._parked_pieces(devices)
        self._starts = {key: [p.start for p in mine] for key, mine in pieces.items()}
        self._queued_by = _queue_entries(ev.replica_lines)
        matches = _Matcher(devices)
        kills = sorted(f.started_at for f in self.faults if f.kind == "replica_kill")
        self.longest = {"offered": {}, "not offered": {}}
        for task_id, t in ev.tasks.items():
            candidates = matches(t["selector_serial"], t["selector_labels"] or {})
            if not candidates:
                continue
            kind = self.selector_kinds.get(task_id, "?")
            for q0, q1 in _queued_spans(ev.events.get(task_id, []), self._end):
                self.stats["queued spans checked"] += 1
                hint = _near_before(kills, q0, HINT_WINDOW)
                if hint:
                    self.stats["queued spans excused: offer may have died with its replica"] += 1
                for offered in (True, False):
                    worst = self._worst(pieces, candidates, q0, q1, offered)
                    if worst is None:
                        continue
                    start, end, key, piece = worst
                    excused = hint and offered
                    bound = self.bound + (piece.call.wait if excused else 0.0)
                    if not excused:
                        mine = self.longest["offered" if offered else "not offered"]
                        mine[kind] = max(mine.get(kind, 0.0), end - start)
                    if end - start <= bound:
                        continue
                    strand = Strand(
                        task_id,
                        kind,
                        key[0],
                        key[1],
                        offered,
                        start,
                        end,
                        bound,
                        "offer may have died with its replica" if excused else "",
                    )
                    strand.detail = self._explain(strand, t, q0, q1, piece.call)
                    self.strands.append(strand)
                    break  # one per span: the control plane's, if both
        self.stats["fleet acquire calls"] = len(ev.acquires)
        return self.strands

    # -- parked time -------------------------------------------------------------------------

    def _parked_pieces(self, devices: Mapping[Device, Any]) -> dict[Device, list[Piece]]:
        """Per fleet phone: the clean stretches its host sat parked with it idle, in order."""
        held: dict[Device, list[Span]] = defaultdict(list)
        for a in self.evidence.attempts.values():
            end = a["ended_at"] if a["ended_at"] is not None else self._end
            held[(a["host_id"], a["device_serial"])].append((a["created_at"], end))
        everywhere = [
            (f.started_at, (f.recovered_at or f.healed_at or self._end) + PG_SLACK)
            for f in self.faults
            if f.kind in DATABASE_OUTAGES
        ]
        on_host: dict[str, list[Span]] = defaultdict(list)
        for f in self.faults:
            if f.kind in HOST_FAULTS:
                for host in f.hosts:
                    on_host[host].append((f.started_at, (f.healed_at or self._end) + HOST_SLACK))
        phones: dict[str, list[str]] = defaultdict(list)
        for host, serial in devices:
            phones[host].append(serial)
        pieces: dict[Device, list[Piece]] = defaultdict(list)
        for call in self.evidence.acquires:
            self.stats[f"fleet acquire calls: {call.code}"] += 1
            for serial in phones.get(call.host, ()):
                key = (call.host, serial)
                offered = serial in call.serials
                cut = [*held.get(key, ()), *everywhere, *on_host.get(call.host, ())]
                for x0, x1 in _subtract((call.sent, call.ended), cut):
                    pieces[key].append(Piece(x0, x1, call, offered))
                    word = "offered" if offered else "not offered"
                    self.stats[f"parked idle phone-seconds, {word} (clean)"] += round(x1 - x0)
        for key in pieces:
            pieces[key].sort(key=lambda p: p.start)
        return pieces

    def _worst(
        self,
        pieces: Mapping[Device, list[Piece]],
        candidates: Iterable[Device],
        q0: float,
        q1: float,
        offered: bool,
    ) -> tuple[float, float, Device, Piece] | None:
        """The longest overlap of [q0, q1) with a parked stretch of a phone that fits."""
        best = None
        for key in candidates:
            mine = pieces.get(key)
            if not mine:
                continue
            # One Acquire per host at a time: a phone's stretches are disjoint and in order.
            i = max(0, bisect.bisect_right(self._starts[key], q0) - 1)
            for piece in mine[i:]:
                if piece.start >= q1:
                    break
                if piece.offered != offered:
                    continue
                start, end = max(piece.start, q0), min(piece.end, q1)
                if end > start and (best is None or end - start > best[1] - best[0]):
                    best = (start, end, key, piece)
        return best

    # -- what a violation says ---------------------------------------------------------------

    def _explain(
        self, s: Strand, t: dict[str, Any], q0: float, q1: float, call: AcquireCall
    ) -> dict[str, Any]:
        ev = self.evidence
        events = ev.events.get(s.task_id, [])
        left = next((e for e in events if e["at"] >= q1 and e["from_status"] == "queued"), None)
        entered = next((e for e in reversed(events) if e["at"] <= q0 + 1e-6), None)
        freed = [
            a
            for a in ev.attempts.values()
            if (a["host_id"], a["device_serial"]) == (s.host, s.serial)
            and a["ended_at"] is not None
            and call.sent < a["ended_at"] <= s.start + 0.001
        ]
        warnings = [
            _line(r)
            for r in ev.replica_lines
            if r.level in ("warning", "error", "critical") and s.start - 3 <= r.at <= s.start + 1
        ]
        return {
            "selector": {"serial": t["selector_serial"], "labels": t["selector_labels"]},
            "queued": [round(q0, 3), round(q1, 3)],
            "entered_queue_by": entered["kind"] if entered else None,
            "queued_by_replica": _replica_of(self._queued_by, s.task_id, q0),
            "left_queue_by": (
                f"{left['kind']} {left.get('detail') or ''}".strip() if left else "still queued"
            ),
            "acquire": {
                "sent": round(call.sent, 3),
                "answered": round(call.ended, 3),
                "serials": list(call.serials),
                "code": call.code,
                "took": list(call.took),
            },
            "phone_freed_while_parked": [
                {
                    "task_id": a["task_id"],
                    "attempt": a["attempt"],
                    "state": a["state"],
                    "ended_at": round(a["ended_at"], 3),
                }
                for a in freed
            ],
            "replica_warnings_around_start": warnings[:10],
        }

    def summary(self, violations: int) -> dict[str, Any]:
        ev = self.evidence
        pickup: dict[str, list[float]] = defaultdict(list)
        for task_id, events in ev.events.items():
            spans = _queued_spans(events, self._end)
            assigned = next((e for e in events if e["kind"] == "assign"), None)
            if spans and assigned is not None:
                kind = self.selector_kinds.get(task_id, "?")
                pickup[kind].append(assigned["at"] - spans[0][0])
        assigns = [r for r in ev.replica_lines if r.event == "task assigned"]
        crossed = sum(
            1
            for r in assigns
            if (q := _replica_of(self._queued_by, str(r.fields.get("task_id")), r.at, before=True))
            and q != r.replica
        )
        return {
            "fleet_hosts": len(self.fleet_hosts),
            "bound_s": self.bound,
            "violations": violations,
            "stranded_over_bound": [
                {
                    "task_id": s.task_id,
                    "host": s.host,
                    "serial": s.serial,
                    "offered": s.offered,
                    "from": round(s.start, 3),
                    "seconds": round(s.seconds, 3),
                    "bound_s": round(s.bound, 3),
                    "excused": s.excused,
                }
                for s in sorted(self.strands, key=lambda s: -s.seconds)[:20]
            ],
            "longest_clean_overlap_s": {
                cause: {k: round(v, 3) for k, v in sorted(by_kind.items())}
                for cause, by_kind in self.longest.items()
            },
            "first_pickup_s": {k: _quantiles(v) for k, v in sorted(pickup.items())},
            "assigned_by_another_replica_than_queued": crossed,
            "assignments_logged": len(assigns),
            "details": dict(sorted(self.stats.items())),
        }


class _Matcher:
    """Fleet phones a selector fits (cached by selector)."""

    def __init__(self, devices: Mapping[tuple[str, str], Any]) -> None:
        self._devices = devices
        self._cache: dict[tuple[str | None, tuple[tuple[str, str], ...]], list[tuple[str, str]]]
        self._cache = {}

    def __call__(self, serial: str | None, labels: Mapping[str, str]) -> list[tuple[str, str]]:
        key = (serial, tuple(sorted(labels.items())))
        if key not in self._cache:
            self._cache[key] = [
                k
                for k, d in self._devices.items()
                if d["state"] == "device"
                and (serial is None or d["serial"] == serial)
                and all((d["labels"] or {}).get(n) == v for n, v in labels.items())
            ]
        return self._cache[key]


def _queued_spans(events: list[dict[str, Any]], end: float) -> list[Span]:
    """[entered, left) for every stretch the task spent queued."""
    spans, since = [], None
    for e in events:
        if e["to_status"] == "queued" and since is None:
            since = e["at"]
        elif e["to_status"] != "queued" and since is not None:
            spans.append((since, e["at"]))
            since = None
    if since is not None:
        spans.append((since, end))
    return spans


def _subtract(span: Span, cuts: Iterable[Span]) -> list[Span]:
    pieces = [span]
    for c0, c1 in cuts:
        out = []
        for p0, p1 in pieces:
            if c1 <= p0 or c0 >= p1:
                out.append((p0, p1))
                continue
            if c0 > p0:
                out.append((p0, c0))
            if c1 < p1:
                out.append((c1, p1))
        pieces = out
    return pieces


def _near_before(times: list[float], t: float, window: float) -> bool:
    """Is there a time in [t, t + window]: a kill shortly after t."""
    i = bisect.bisect_left(times, t)
    return i < len(times) and times[i] <= t + window


def _queue_entries(lines: list[ReplicaLine]) -> dict[str, list[tuple[float, str]]]:
    """task_id -> [(when, replica)] of the lines saying a replica queued it (submitted, or
    requeued by an expiry or a release)."""
    out: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for r in lines:
        if r.event == "task assigned":
            continue
        if r.event.startswith("lease") and r.fields.get("to") != "queued":
            continue
        for task_id in r.fields.get("task_ids") or [r.fields.get("task_id")]:
            if task_id:
                out[str(task_id)].append((r.at, r.replica))
    return out


def _replica_of(
    entries: Mapping[str, list[tuple[float, str]]], task_id: str, at: float, before: bool = False
) -> str | None:
    """The replica that logged queuing `task_id` closest to `at` (before it, if asked)."""
    best: tuple[float, str] | None = None
    for when, replica in entries.get(task_id, ()):
        if before and when > at + 0.5:
            continue
        gap = abs(when - at)
        if best is None or gap < best[0]:
            best = (gap, replica)
    return best[1] if best else None


def _line(r: ReplicaLine) -> dict[str, Any]:
    keep = {k: v for k, v in r.fields.items() if k not in ("level",)}
    return {"replica": r.replica, "at": round(r.at, 3), "event": r.event[:200], **keep}


def _quantiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    if not values:
        return {}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    return {
        "n": len(values),
        "p50": round(q[49], 3),
        "p99": round(q[98], 3),
        "max": round(values[-1], 3),
    }


def fault_windows(faults: Iterable[Any], hosts_of: Callable[[str], list[str]]) -> list[FaultWindow]:
    return [
        FaultWindow(
            f.kind,
            tuple(hosts_of(f.target)) if f.kind in HOST_FAULTS else (),
            f.started_at,
            f.healed_at,
            f.recovered_at,
        )
        for f in faults
    ]
