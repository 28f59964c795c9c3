"""What the checks read after the run: PostgreSQL's tables, each agent's action log (what
it sent to its phones, timestamped) and each agent's own JSON log (when its stop tokens
tripped, which reports were accepted or refused); with a fleet, each fleet host's Acquire
calls (who was parked with which idle phones, when) and the replicas' logs (which replica
queued and which assigned each task; their warnings).

Times are epoch seconds: PostgreSQL's `now()` and the agents' `time.time()` read the same
clock on this machine. `now()` is when the writing transaction *began*, so two transitions
that waited on each other's locks may carry times out of their commit order; the checks
order transitions by `event_id` where that matters.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg

from amc.v1 import task_pb2

TRIPS = {
    "cancellation requested: stopping at the next step boundary": "cancelled",
    "lease conflict: stop acting": "lease_lost",
    "lease deadline passed without renewal: stop acting": "lease_lost",
    "task deadline passed: stopping at the next step boundary": "deadline",
}


@dataclass
class Action:
    host: str
    serial: str
    action: str
    start: float
    end: float
    outcome: str
    # (task_id, attempt) when the agent's log names them (it did not when this was written).
    logged: tuple[str, int] | None = None
    # Filled by the checks: the attempt it belongs to, and its end as the phone saw it.
    task_id: str = ""
    attempt: int = 0
    effective_end: float = 0.0


@dataclass
class AgentEvent:
    host: str
    at: float
    event: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class AcquireCall:
    """One Acquire long poll of a fleet host, as the host saw it (wall clock)."""

    host: str
    serials: tuple[str, ...]
    wait: float
    sent: float
    ended: float
    code: str  # OK, or the gRPC code it failed with (CANCELLED: the host stopped it)
    took: tuple[str, ...]


@dataclass(frozen=True)
class ReplicaLine:
    replica: str
    at: float
    level: str
    event: str
    fields: dict[str, Any]


# The replica log lines the checks read: who queued and who assigned a task (dispatch),
# a screen relayed between replicas (live screens), and anything said at warning level or
# above.
REPLICA_EVENTS = frozenset(
    {
        "task submitted",
        "tasks submitted",
        "task assigned",
        "lease expired",
        "lease released",
        "screen relayed",
    }
)


ARTIFACTS = """
SELECT a.task_id, a.attempt, a.created_at, a.size_bytes,
       coalesce(sum(length(c.data)), 0) = a.size_bytes
       AND sha256(coalesce(string_agg(c.data, ''::bytea ORDER BY c.seq), ''::bytea)) = a.sha256
       AS whole
FROM artifacts a LEFT JOIN artifact_chunks c USING (artifact_id)
GROUP BY a.artifact_id
"""


@dataclass
class Evidence:
    tasks: dict[str, dict[str, Any]]
    attempts: dict[tuple[str, int], dict[str, Any]]
    events: dict[str, list[dict[str, Any]]]
    devices: list[dict[str, Any]]
    actions: list[Action]
    agent_events: list[AgentEvent]
    unparsed_log_lines: int = 0
    # (task_id, attempt) -> (first trip time, reason), from the agents' logs
    trips: dict[tuple[str, int], tuple[float, str]] = field(default_factory=dict)
    # (task_id, attempt) -> when its host's run ended ("task finished"), from the agents'
    # logs: the report can be recorded much later (retried while the database was away).
    finished: dict[tuple[str, int], float] = field(default_factory=dict)
    acquires: list[AcquireCall] = field(default_factory=list)
    replica_lines: list[ReplicaLine] = field(default_factory=list)
    # Every artifact stored: task_id, attempt, created_at, size_bytes, and whether its
    # chunks add up to exactly its bytes (`whole`: same length and sha256).
    artifacts: list[dict[str, Any]] = field(default_factory=list)
    # The commands of the hosts' cleans between leases (`clean` in the action logs), apart
    # from `actions`, which are the tasks' (chaos_lib/cleaning.py); an adb door's streams
    # (`adb`) are in neither: invariant 13 reads them (chaos_lib/doors.py).
    cleans: list[Action] = field(default_factory=list)

    def attempts_of(self, task_id: str) -> list[dict[str, Any]]:
        return sorted(
            (a for (t, _), a in self.attempts.items() if t == task_id), key=lambda a: a["attempt"]
        )

    def by_phone(self) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """The attempts on each phone (host, serial), in the order they began."""
        out: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for att in self.attempts.values():
            out.setdefault((att["host_id"], att["device_serial"]), []).append(att)
        for atts in out.values():
            atts.sort(key=lambda a: a["created_at"])
        return out


def attempt_at(atts: list[dict[str, Any]], at: float) -> dict[str, Any] | None:
    """The attempt of a phone's (in the order they began) that began last before `at`."""
    found = None
    for att in atts:
        if float(att["created_at"]) <= at:
            found = att
    return found


async def load(
    dsn: str,
    action_logs: dict[str, Path],
    agent_logs: dict[str, Path],
    acquire_logs: list[Path] | None = None,
    replica_logs: dict[str, Path] | None = None,
) -> Evidence:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            tasks = await conn.fetch("SELECT * FROM tasks")
            attempts = await conn.fetch("SELECT * FROM attempts")
            events = await conn.fetch("SELECT * FROM task_events ORDER BY event_id")
            devices = await conn.fetch("SELECT * FROM devices")
            artifacts = await conn.fetch(ARTIFACTS)
    finally:
        await conn.close()
    by_task: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        by_task[str(e["task_id"])].append(_row(e))
    agent_events, unparsed = _agent_events(agent_logs)
    logged = _actions(action_logs)
    evidence = Evidence(
        tasks={str(t["task_id"]): _row(t) for t in tasks},
        attempts={(str(a["task_id"]), a["attempt"]): _row(a) for a in attempts},
        events=dict(by_task),
        devices=[_row(d) for d in devices],
        actions=[a for a in logged if a.action not in ("clean", "adb")],
        cleans=[a for a in logged if a.action == "clean"],
        agent_events=agent_events,
        unparsed_log_lines=unparsed,
        acquires=_acquires(acquire_logs or []),
        replica_lines=_replica_lines(replica_logs or {}),
        artifacts=[_row(a) for a in artifacts],
    )
    for e in agent_events:
        reason = TRIPS.get(e.event)
        key = (str(e.fields.get("task_id")), int(e.fields.get("attempt") or 0))
        if reason and (key not in evidence.trips or e.at < evidence.trips[key][0]):
            evidence.trips[key] = (e.at, reason)
        if e.event == "task finished":
            evidence.finished.setdefault(key, e.at)
    return evidence


JSON_COLUMNS = frozenset({"selector_labels", "labels", "metadata"})


def _row(record: asyncpg.Record) -> dict[str, Any]:
    row = dict(record)
    for key, value in row.items():
        if isinstance(value, datetime):
            row[key] = value.timestamp()
        elif isinstance(value, timedelta):  # a task's deadline and queue timeout
            row[key] = value.total_seconds()
        elif key in JSON_COLUMNS and isinstance(value, str):
            row[key] = json.loads(value)  # jsonb comes back as text
        elif key in ("task_id", "lease_id", "event_id") and value is not None:
            row[key] = str(value) if key != "event_id" else value
    return row


def _actions(logs: dict[str, Path]) -> list[Action]:
    actions = []
    for host, path in logs.items():
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue  # empty, or cut short by a SIGKILL
            logged = (str(r["task_id"]), int(r["attempt"])) if r.get("task_id") else None
            actions.append(
                Action(
                    host,
                    r["serial"],
                    r["action"],
                    r["started_wall"],
                    r["ended_wall"],
                    r["outcome"],
                    logged,
                )
            )
    actions.sort(key=lambda a: a.start)
    return actions


def _acquires(paths: list[Path]) -> list[AcquireCall]:
    calls = []
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                r = json.loads(line)
                calls.append(
                    AcquireCall(
                        r["host"],
                        tuple(r["serials"]),
                        float(r["wait"]),
                        float(r["sent"]),
                        float(r["ended"]),
                        r["code"],
                        tuple(r["took"]),
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue  # cut short by a SIGKILL
    calls.sort(key=lambda c: c.sent)
    return calls


def _replica_lines(logs: dict[str, Path]) -> list[ReplicaLine]:
    lines = []
    for name, path in logs.items():
        if not path.exists():
            continue
        for text in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(text)
                level = str(record.get("level", ""))
                event = str(record["event"])
                if event not in REPLICA_EVENTS and level not in ("warning", "error", "critical"):
                    continue
                at = datetime.fromisoformat(record.pop("timestamp")).timestamp()
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            record.pop("event", None)
            lines.append(ReplicaLine(name, at, level, event, record))
    lines.sort(key=lambda r: r.at)
    return lines


def _agent_events(logs: dict[str, Path]) -> tuple[list[AgentEvent], int]:
    """By log name; a line naming its host_id (a fleet process's) is that host's."""
    events, unparsed = [], 0
    for name, path in logs.items():
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
                at = datetime.fromisoformat(record.pop("timestamp")).timestamp()
                event = record.pop("event")
            except (ValueError, KeyError, TypeError, AttributeError):
                unparsed += 1
                continue
            events.append(AgentEvent(str(record.get("host_id") or name), at, event, record))
    events.sort(key=lambda e: e.at)
    return events, unparsed


def task_result(row: dict[str, Any]) -> task_pb2.TaskResult | None:
    if row.get("result") is None:
        return None
    result = task_pb2.TaskResult()
    result.ParseFromString(bytes(row["result"]))
    return result


def last_step_window(result: task_pb2.TaskResult | None) -> tuple[float, float] | None:
    """(start, end) of the last step that ran, as the host timed it."""
    if result is None:
        return None
    ran = [s for s in result.steps if s.status != task_pb2.STEP_STATUS_SKIPPED]
    if not ran:
        return None
    step = ran[-1]
    start = step.started_at.seconds + step.started_at.nanos / 1e9
    return start, start + step.duration.seconds + step.duration.nanos / 1e9
