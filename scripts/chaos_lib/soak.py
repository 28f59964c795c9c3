"""The soak's summary over time (`make soak`: the chaos run at fleet size, for long): the
control-plane replicas' memory (RSS, sampled from /proc) and the pickup latency (from the
moment a task and the phone that took it were both free until its host acknowledged the
attempt, from the database's record; see `pickups`) per window of the run, and the
replicas' memory growth after the first window.

Pickups are also summarised without the ones a fault may have slowed: those whose wait
overlapped a fault on the whole farm (a replica or the database) or on their own host,
from its start until PASS seconds after it was over.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import asyncpg

from chaos_lib.evidence import Evidence
from chaos_lib.farm import Farm
from chaos_lib.faults import Fault

# Seconds after a fault is over during which pickups still count as "around" it.
PASS = 10.0
FARM_FAULTS = ("replica_kill", "pg_restart", "pg_failover", "pg_terminate", "pg_conn_fill")


@dataclass(frozen=True)
class Sample:
    at: float
    replica: str
    pid: int
    rss_mib: float
    # The hosts whose renewal streams the replica held (the database's hosts.replica_id),
    # None if the database did not answer: a replica's memory follows its hosts, and the
    # run moves them (a killed replica's hosts reconnect to the other one and stay).
    hosts: int | None = None


# The hosts each live replica (by address) holds the renewal streams of.
HELD = """
SELECT r.address, count(*)::int AS hosts
FROM hosts h JOIN replicas r ON r.replica_id = h.replica_id
GROUP BY r.address
"""


class Sampler:
    """Every `every` seconds, the RSS of each live replica process and its hosts."""

    def __init__(self, farm: Farm, every: float = 10.0) -> None:
        self.farm = farm
        self.every = every
        self.samples: list[Sample] = []
        self._conn: asyncpg.Connection | None = None

    async def run(self) -> None:
        try:
            while True:
                now = time.time()
                held = await self._held()
                for r in self.farm.replicas:
                    if r.proc is not None and r.alive:
                        rss = _rss_mib(r.proc.pid)
                        if rss is not None:
                            hosts = None if held is None else held.get(r.address, 0)
                            self.samples.append(Sample(now, r.name, r.proc.pid, rss, hosts))
                await asyncio.sleep(self.every)
        finally:
            if self._conn is not None:
                self._conn.terminate()

    async def _held(self) -> dict[str, int] | None:
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self.farm.dsn, timeout=2)
            rows = await self._conn.fetch(HELD, timeout=2)
        except (OSError, asyncpg.PostgresError, TimeoutError):
            if self._conn is not None:
                self._conn.terminate()
            self._conn = None  # the database is away (a fault): no count this time
            return None
        return {r["address"]: r["hosts"] for r in rows}


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class Pickup:
    start: float  # when the task and the phone that took it were both free
    assigned: float  # the attempt's creation (the control plane chose the phone)
    acked: float  # the host acknowledged the attempt
    host: str
    # The task was queued while its phone sat idle (the host's Acquire parked or on its
    # way), as in `make bench`'s pickup; else the phone came free while the task waited.
    to_idle_phone: bool

    @property
    def seconds(self) -> float:
        return max(0.0, self.acked - self.start)


def pickups(ev: Evidence) -> list[Pickup]:
    """Every acknowledged attempt's pickup, timed from when both the task and the phone
    that took it were free: the task's last entry into the queue, or the end of the
    phone's previous attempt if that was later. The time a task spent queued behind busy
    phones is the farm's capacity, not dispatch: the run keeps more work queued than it
    has phones."""
    freed: dict[tuple[str, int], float | None] = {}
    for mine in ev.by_phone().values():
        freed[(str(mine[0]["task_id"]), mine[0]["attempt"])] = 0.0  # free since the start
        for before, a in itertools.pairwise(mine):
            freed[(str(a["task_id"]), a["attempt"])] = before["ended_at"] or before["reported_at"]
    out = []
    for key, a in ev.attempts.items():
        acked = a["acknowledged_at"]
        phone_free = freed.get(key)
        if acked is None or phone_free is None:
            continue  # not acknowledged, or the phone's previous attempt never ended
        queued = [
            e["at"]
            for e in ev.events.get(key[0], [])
            if e["to_status"] == "queued" and e["at"] <= a["created_at"]
        ]
        if queued:
            start = max(max(queued), phone_free)
            out.append(
                Pickup(start, a["created_at"], acked, a["host_id"], max(queued) >= phone_free)
            )
    return out


@dataclass(frozen=True)
class Stall:
    """A replica's event loop ran a timer late (its log's "event loop stalled")."""

    at: float  # when the late timer ran (the stall ended)
    replica: str
    seconds: float


def stalls(logs: dict[str, Path]) -> list[Stall]:
    """Every "event loop stalled" line of the replicas' JSON logs."""
    out = []
    for replica, path in logs.items():
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if '"event loop stalled"' not in line:
                continue
            try:
                entry = json.loads(line)
                at = datetime.fromisoformat(entry["timestamp"].replace("Z", "+00:00"))
                out.append(Stall(at.timestamp(), replica, float(entry["seconds"])))
            except (ValueError, KeyError, TypeError):
                continue
    return out


def summary(
    samples: list[Sample],
    ev: Evidence,
    faults: list[Fault],
    hosts_of: Any,
    began: float,
    ended: float,
    window: float,
    loop_stalls: Sequence[Stall] = (),
) -> dict[str, Any]:
    spans = [
        (f.started_at, (f.recovered_at or f.healed_at or ended) + PASS, f.kind, f.target)
        for f in faults
    ]

    def overlapping(p: Pickup) -> list[tuple[str, str]]:
        return [
            (kind, target)
            for start, end, kind, target in spans
            if start <= p.acked and p.start <= end
        ]

    def around_fault(p: Pickup) -> bool:
        return any(
            kind in FARM_FAULTS or p.host in hosts_of(target) for kind, target in overlapping(p)
        )

    def after_farm_fault(p: Pickup) -> str | None:
        """The last fault of the whole farm (a replica, the database) over before `p`
        began, and how long before: what a slow pickup outside the faults' spans followed."""
        ends = [
            (f.recovered_at or f.healed_at or ended, f.kind)
            for f in faults
            if f.kind in FARM_FAULTS and (f.recovered_at or f.healed_at or ended) <= p.start
        ]
        if not ends:
            return None
        end, kind = max(ends)
        return f"{kind} over {p.start - end:.1f}s before"

    def stalled(p: Pickup) -> float:
        """The longest replica stall that ended while `p` waited."""
        return max((s.seconds for s in loop_stalls if p.start <= s.at <= p.acked), default=0.0)

    picked = pickups(ev)
    windows = []
    n = max(1, int((ended - began) // window + (1 if (ended - began) % window > 1 else 0)))
    for i in range(n):
        lo, hi = began + i * window, min(began + (i + 1) * window, ended)
        mine = [p for p in picked if lo <= p.acked < hi]
        clean = [p for p in mine if not around_fault(p)]
        idle = [p for p in clean if p.to_idle_phone]
        # Idle-phone pickups that overlapped no fault at all, anywhere on the farm.
        untouched = [p for p in idle if not overlapping(p)]
        rss = [s.rss_mib for s in samples if lo <= s.at < hi]
        mine_stalls = [s for s in loop_stalls if lo <= s.at < hi]
        windows.append(
            {
                "from_s": round(lo - began),
                "to_s": round(hi - began),
                "pickups": len(mine),
                "pickup_p50_ms": _ms(_quantile([p.seconds for p in mine], 0.5)),
                "pickup_p99_ms": _ms(_quantile([p.seconds for p in mine], 0.99)),
                "pickups_clear_of_faults": len(clean),
                "pickup_p99_clear_of_faults_ms": _ms(_quantile([p.seconds for p in clean], 0.99)),
                # The target's measure: clear of faults, to an idle phone (bench's pickup).
                "pickups_to_idle_phones_clear": len(idle),
                "pickup_to_idle_phone_p50_clear_ms": _ms(_quantile([p.seconds for p in idle], 0.5)),
                "pickup_to_idle_phone_p99_clear_ms": _ms(
                    _quantile([p.seconds for p in idle], 0.99)
                ),
                # Of those, the control plane's part: until the attempt was created.
                "assign_p99_clear_ms": _ms(
                    _quantile([max(0.0, p.assigned - p.start) for p in idle], 0.99)
                ),
                "pickups_to_idle_phones_no_fault": len(untouched),
                "pickup_to_idle_phone_p99_no_fault_ms": _ms(
                    _quantile([p.seconds for p in untouched], 0.99)
                ),
                # The five slowest of them, for a look at where the time went: the faults
                # elsewhere their wait overlapped, and the longest replica stall in it.
                "slowest_to_idle_phone_clear": [
                    {
                        "host": p.host,
                        "at_s": round(p.start - began, 1),
                        "assign_ms": _ms(max(0.0, p.assigned - p.start)),
                        "ack_ms": _ms(max(0.0, p.acked - p.assigned)),
                        "faults_elsewhere": [f"{k} {t}" for k, t in overlapping(p)],
                        "after_farm_fault": after_farm_fault(p),
                        "replica_stall_ms": _ms(stalled(p)),
                    }
                    for p in sorted(idle, key=lambda p: -p.seconds)[:5]
                ],
                "loop_stalls": len(mine_stalls),
                "loop_stall_max_ms": _ms(max((s.seconds for s in mine_stalls), default=None)),
                "faults": sum(1 for f in faults if lo <= f.started_at < hi),
                "rss_mib_max": round(max(rss), 1) if rss else None,
                "rss_mib_median": round(statistics.median(rss), 1) if rss else None,
            }
        )
    return {
        "window_s": window,
        "began_at": began,  # what the windows' and samples' seconds count from
        "windows": windows,
        "rss_growth": _growth(samples, began, window),
        # Every sample, for a look at when a replica grew: seconds into the run, replica,
        # pid, RSS in MiB, hosts held.
        "rss_samples": [
            [round(s.at - began, 1), s.replica, s.pid, round(s.rss_mib, 1), s.hosts]
            for s in samples
        ],
    }


def _growth(samples: list[Sample], began: float, window: float) -> dict[str, Any]:
    """Per replica process that lived past the first window: its median RSS over its last
    window against that over the window after the first (the warm-up left out), with the
    hosts it held then; and the same over the samples when it held (within 1 %) the most
    hosts it ever held, the first window's worth of them after the warm-up against the
    last: its growth at the same load."""
    out: dict[str, Any] = {}
    by_pid: dict[tuple[str, int], list[Sample]] = {}
    for s in samples:
        by_pid.setdefault((s.replica, s.pid), []).append(s)
    for (replica, pid), mine in sorted(by_pid.items()):
        base = [s for s in mine if began + window <= s.at < began + 2 * window]
        last_start = mine[-1].at - window
        last = [s for s in mine if s.at >= last_start and s.at >= began + 2 * window]
        if base and last:
            b = statistics.median(s.rss_mib for s in base)
            e = statistics.median(s.rss_mib for s in last)
            out[f"{replica} pid {pid}"] = {
                "baseline_mib": round(b, 1),
                "last_mib": round(e, 1),
                "growth_pct": round(100 * (e - b) / b, 1),
                "minutes": round((mine[-1].at - mine[0].at) / 60, 1),
                "hosts_baseline": _median([s.hosts for s in base]),
                "hosts_last": _median([s.hosts for s in last]),
                **_growth_at_most_hosts(mine, began + window, window),
            }
    return out


def _median(values: list[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _growth_at_most_hosts(mine: list[Sample], after: float, window: float) -> dict[str, Any]:
    counted = [s for s in mine if s.hosts is not None and s.at >= after]
    if not counted:
        return {}
    most = max(s.hosts or 0 for s in counted)
    full = [s for s in counted if (s.hosts or 0) >= 0.99 * most]
    first = [s.rss_mib for s in full if s.at < full[0].at + window]
    last = [s.rss_mib for s in full if s.at >= full[-1].at - window]
    if full[-1].at - full[0].at < 2 * window:
        return {"at_most_hosts": most, "at_most_hosts_span_min": None}
    b, e = statistics.median(first), statistics.median(last)
    out = {
        "at_most_hosts": most,
        "at_most_hosts_span_min": round((full[-1].at - full[0].at) / 60, 1),
        "at_most_hosts_first_mib": round(b, 1),
        "at_most_hosts_last_mib": round(e, 1),
        "at_most_hosts_growth_pct": round(100 * (e - b) / b, 1),
    }
    # The same with the hosts' own warm-up left out: hosts that came over mid-run (their
    # replica was killed) fill in their state for a few minutes, as every host does in
    # the run's first window. Shown beside the figure above, not instead of it.
    settled = [s.rss_mib for s in full if full[0].at + window <= s.at < full[0].at + 2 * window]
    if settled and full[-1].at - full[0].at >= 3 * window:
        m = statistics.median(settled)
        out["at_most_hosts_settled_mib"] = round(m, 1)
        out["at_most_hosts_settled_growth_pct"] = round(100 * (e - m) / m, 1)
    return out


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def table(result: dict[str, Any]) -> str:
    lines = [f"soak, per {result['window_s']:.0f} s window:"]
    lines.append(
        f"{'window':>12} {'pickups':>8} {'p50 ms':>8} {'p99 ms':>8} {'p99 clear':>10}"
        f" {'idle phone, clear: n':>21} {'p50':>6} {'p99':>6} {'assign p99':>10}"
        f" {'no fault: n':>11} {'p99':>6} {'faults':>7} {'stalls':>7} {'RSS MiB':>8}"
    )
    for w in result["windows"]:
        lines.append(
            f"{w['from_s']:>5}-{w['to_s']:<6} {w['pickups']:>8} {w['pickup_p50_ms']!s:>8}"
            f" {w['pickup_p99_ms']!s:>8} {w['pickup_p99_clear_of_faults_ms']!s:>10}"
            f" {w['pickups_to_idle_phones_clear']:>21}"
            f" {w['pickup_to_idle_phone_p50_clear_ms']!s:>6}"
            f" {w['pickup_to_idle_phone_p99_clear_ms']!s:>6} {w['assign_p99_clear_ms']!s:>10}"
            f" {w['pickups_to_idle_phones_no_fault']:>11}"
            f" {w['pickup_to_idle_phone_p99_no_fault_ms']!s:>6}"
            f" {w['faults']:>7} {w['loop_stalls']:>7} {w['rss_mib_max']!s:>8}"
        )
    for name, g in result["rss_growth"].items():
        lines.append(
            f"RSS {name}: {g['baseline_mib']} -> {g['last_mib']} MiB ({g['growth_pct']:+.1f} %),"
            f" holding {g.get('hosts_baseline')} -> {g.get('hosts_last')} hosts"
        )
        if g.get("at_most_hosts_growth_pct") is not None:
            lines.append(
                f"    at the {g['at_most_hosts']} hosts it held most (over"
                f" {g['at_most_hosts_span_min']} min): {g['at_most_hosts_first_mib']} ->"
                f" {g['at_most_hosts_last_mib']} MiB ({g['at_most_hosts_growth_pct']:+.1f} %)"
            )
        if g.get("at_most_hosts_settled_growth_pct") is not None:
            lines.append(
                f"    from {result['window_s']:.0f} s after it came to hold them:"
                f" {g['at_most_hosts_settled_mib']} -> {g['at_most_hosts_last_mib']} MiB"
                f" ({g['at_most_hosts_settled_growth_pct']:+.1f} %)"
            )
    return "\n".join(lines)
