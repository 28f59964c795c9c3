"""PostgreSQL access: the only module that imports asyncpg.

Every hot call (acquire, renew, report) is one statement, so one round trip. asyncpg
errors become domain errors here, and nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import asyncpg
import structlog
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from control_plane import errors
from control_plane.domain import (
    Acquired,
    ArtifactId,
    ArtifactInfo,
    Assignment,
    AttemptInfo,
    DeviceHealth,
    DeviceInfo,
    DeviceMatch,
    Expiry,
    FairShare,
    FairShareEvent,
    FarmGauges,
    HostEvent,
    HostInfo,
    KeyCap,
    KeyLoad,
    LeaseId,
    NewArtifact,
    NewTask,
    Principal,
    Progress,
    QueueGroup,
    QueueWait,
    Recorded,
    Removed,
    Renewal,
    Report,
    Role,
    SessionRelay,
    ShareChange,
    StepProgress,
    Task,
    TaskEvent,
    TaskHistory,
    TaskId,
    TaskRead,
    TokenInfo,
)
from control_plane.lifecycle import CancelCode, ReleaseCode, RemoveCode, ReportCode, TaskStatus
from control_plane.migrate import apply
from control_plane.sql import QUERIES as Q

log = structlog.get_logger(__name__)

Listener = Callable[[str, str], None]
T = TypeVar("T")

# SQLSTATE classes that mean "the database is not there right now": connection exceptions,
# operator intervention (shutdown, starting up), insufficient resources.
_UNAVAILABLE_CLASSES = ("08", "57", "53")
# Serialization failure and deadlock: the transaction was rolled back and may simply be run
# again. Every transition takes its rows in one order (schema.sql's lock order), so
# these should not happen; if they do, they are retried here, never reported as an outage.
_RETRIED_STATES = ("40001", "40P01")
# A write refused because the server is read-only: a standby, or a primary demoted by a
# failover. The connections there are dropped (Store) and the next ones find the primary.
READ_ONLY = "25006"
RETRIES = 5
# What a connection asks of the server it lands on when the URL names several hosts (or
# one behind a moving address): writable, so never a standby. A URL that says otherwise
# (its own target_session_attrs) is obeyed.
SESSION_ATTRS = "read-write"


@contextlib.contextmanager
def translated() -> Iterator[None]:
    try:
        yield
    except asyncpg.PostgresError as exc:
        state = getattr(exc, "sqlstate", "") or ""
        if state in _RETRIED_STATES:
            raise errors.Contended() from exc
        if state[:2] in _UNAVAILABLE_CLASSES or state == READ_ONLY:
            raise errors.DatabaseUnavailable() from exc
        if state[:2] == "22":  # data exception: a value PostgreSQL cannot hold
            raise errors.InvalidArgument("request", "a value cannot be stored") from exc
        raise
    except (
        OSError,
        asyncpg.InterfaceError,
        # No host is writable (mid-failover: TargetServerAttributeNotMatched), or a
        # connection was left in a state asyncpg cannot go on from (its backend terminated
        # in the middle of a call): the call may be made again.
        asyncpg.InternalClientError,
        TimeoutError,
    ) as exc:
        raise errors.DatabaseUnavailable() from exc


def read_only(error: BaseException) -> bool:
    """Whether `error` (or what it was raised from) is a write refused by a read-only server."""
    cause = error.__cause__ if isinstance(error, errors.DatabaseUnavailable) else error
    return getattr(cause, "sqlstate", None) == READ_ONLY


def session_attrs(dsn: str) -> dict[str, str]:
    """The connect options that make a connection land on the writable server only: none
    when the URL chooses for itself."""
    return {} if "target_session_attrs" in dsn else {"target_session_attrs": SESSION_ATTRS}


async def retried(operation: Callable[[], Awaitable[T]]) -> T:
    """Run one statement or transaction; a deadlock or serialization failure (rolled back,
    so nothing happened) runs it again, a few times, with jitter. Each call is made anew."""
    try:
        with translated():
            return await operation()
    except errors.Contended:
        pass
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(errors.Contended),
        stop=stop_after_attempt(RETRIES - 1),
        wait=wait_random_exponential(multiplier=0.005, max=0.2),
        reraise=True,
    ):
        with attempt, translated():
            return await operation()
    raise AssertionError("unreachable")  # pragma: no cover


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """No RESET ALL / UNLISTEN * / CLOSE ALL round trip on every release."""


async def connect_pool(dsn: str, *, min_size: int = 2, max_size: int = 20) -> asyncpg.Pool:
    with translated():
        return await asyncpg.create_pool(
            dsn,
            **session_attrs(dsn),
            min_size=min_size,
            max_size=max_size,
            init=_init_connection,
            reset=_keep_session,
            command_timeout=30,
            timeout=10,
        )


async def migrate(dsn: str) -> list[str]:
    with translated():
        conn = await asyncpg.connect(dsn, timeout=10, **session_attrs(dsn))
        try:
            return await apply(conn)
        finally:
            await conn.close()


def _as_is(row: asyncpg.Record | Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The columns a domain value takes as they are, by name."""
    return {name: row[name] for name in names}


# The columns of `tasks` that Task takes as they are.
_TASK_COLUMNS = (
    "request_id", "selector_serial", "priority", "max_attempts", "attempt", "host_id",
    "device_serial", "cancel_requested_at", "cancel_reason", "error", "created_at",
    "updated_at", "finished_at", "queue_timeout", "deadline", "fairness_key",
)  # fmt: skip


def _task(row: asyncpg.Record | dict[str, Any]) -> Task:
    return Task(
        task_id=TaskId(row["task_id"]),
        status=TaskStatus(row["status"]),
        spec=bytes(row["spec"]),
        selector_labels=row["selector_labels"] or {},
        metadata=row["metadata"] or {},
        result=bytes(row["result"]) if row["result"] is not None else None,
        **_as_is(row, *_TASK_COLUMNS),
    )


def _with_progress(row: asyncpg.Record) -> Task:
    """A task read with its progress columns (read_tasks): a running one carries it."""
    task = _task(row)
    if row["p_steps"] is None:
        return task
    steps = tuple(bytes(s) for s in row["p_steps"])
    return dataclasses.replace(task, progress=Progress(steps, row["p_acknowledged_at"]))


def _token(row: asyncpg.Record) -> TokenInfo:
    return TokenInfo(
        token_id=row["token_id"],
        name=row["name"],
        role=Role(row["role"]),
        host_id=row["host_id"],
        secret_hash=bytes(row["secret_hash"]),
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
        team=row["team"],
    )


class Store:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        # Connections were dropped for a read-only server and no ping found it writable yet.
        self.reconnecting = False

    @classmethod
    async def open(cls, dsn: str, **pool_options: int) -> Store:
        return cls(await connect_pool(dsn, **pool_options))

    async def close(self, timeout: float = 10.0) -> None:
        """Close the connections once released; past `timeout`, cut them: a stop must not
        hang on a connection that never comes back."""
        try:
            await asyncio.wait_for(self.pool.close(), timeout)
        except TimeoutError:
            self.pool.terminate()

    async def _fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        return await self._checked(lambda: self.pool.fetch(Q[name], *args))

    async def _fetchrow(self, name: str, *args: Any) -> asyncpg.Record | None:
        return await self._checked(lambda: self.pool.fetchrow(Q[name], *args))

    async def _checked(self, operation: Callable[[], Awaitable[T]]) -> T:
        try:
            return await retried(operation)
        except errors.DatabaseUnavailable as exc:
            if read_only(exc):
                await self.drop_connections()
            elif isinstance(exc.__cause__, asyncpg.InternalClientError):
                await self.pool.expire_connections()  # that one may be in the pool still
            raise

    async def drop_connections(self) -> None:
        """The server these connections reach is read-only (a demoted primary): each is
        closed when next released or idle, and the next ones find the writable server."""
        if not self.reconnecting:
            log.warning("database is read-only (failed over?); reconnecting")
        self.reconnecting = True
        await self.pool.expire_connections()

    async def ping(self) -> None:
        """The database answers, and writably: a read-only answer (the server became a
        standby) drops the connections, and the database counts as unavailable."""
        row = await self._fetchrow("ping")
        if row is not None and row["read_only"]:
            await self.drop_connections()
            raise errors.DatabaseUnavailable()
        self.reconnecting = False

    async def farm_gauges(self, connected_within: timedelta, selectors: int) -> FarmGauges:
        """The farm-wide figures of the metrics, in one round trip: the queue in at most
        `selectors` groups plus one for the rest."""
        row = await self._fetchrow("farm_gauges", connected_within, selectors)
        assert row is not None
        return FarmGauges(
            tasks={k: int(v) for k, v in row["tasks"].items()},
            hosts_connected=int(row["hosts_connected"]),
            devices={(d["state"], bool(d["busy"])): int(d["n"]) for d in row["devices"]},
            queue=[
                QueueGroup(q["serial"], q["labels"], int(q["n"]), float(q["oldest"]))
                for q in row["queue"]
            ],
            keys=[
                KeyLoad(k["key"], int(k["queued"]), int(k["running"]), k["oldest"])
                for k in row["keys"]
            ],
            counted_ago=row["counted_ago"],
            conditions={c[0]: int(c[1]) for c in row["health"]},
            battery=_spread([c[2:6] for c in row["health"]]),
            temperature=_spread([c[6:10] for c in row["health"]]),
        )

    # -- tasks -----------------------------------------------------------------------------

    async def submit(
        self, caller: str, new: NewTask, *, relay: str | None = None
    ) -> tuple[Task, bool]:
        """Queue a task; returns (task, created). An existing request_id returns its task.
        `relay`: a session's, the replica holding its client's call (session_relays)."""
        (answer,) = await self.submit_many(caller, [new], relay=relay)
        return answer

    async def submit_many(
        self, caller: str, news: list[NewTask], *, relay: str | None = None
    ) -> list[tuple[Task, bool]]:
        """Queue tasks with one statement (so all or none), in order; (task, created) for
        each, in order. An existing request_id returns its task."""
        ids = [uuid.uuid4() for _ in news]
        rows = await self._fetch(
            "submit_tasks",
            caller,
            ids,
            *_columns(
                news,
                "request_id",
                "spec",
                "selector_serial",
                "selector_labels",
                "priority",
                "max_attempts",
                "metadata",
                "queue_timeout",
                "deadline",
                "fairness_key",
            ),
            relay,
        )
        created = {row["task_id"]: _task(row) for row in rows}
        existing: dict[str, Task] = {}
        if len(created) < len(news):
            # Request ids used before (maybe by a call that committed since the statement's
            # snapshot): the tasks they made.
            again = [n.request_id for n in news if n.request_id is not None]
            for row in await self._fetch("tasks_by_request", caller, again):
                existing[row["request_id"]] = _task(row)
        out: list[tuple[Task, bool]] = []
        for task_id, new in zip(ids, news, strict=True):
            if task_id in created:
                out.append((created[task_id], True))
            elif new.request_id in existing:
                out.append((existing[new.request_id], False))
            else:
                raise errors.DatabaseUnavailable("request id is being created concurrently; retry")
        return out

    async def get_task(self, task_id: TaskId) -> Task:
        row = await self._fetchrow("get_task", task_id)
        if row is None:
            raise errors.TaskNotFound(f"no task {task_id}")
        return _task(row)

    async def task_history(self, task_id: TaskId, after_event: int, limit: int) -> TaskHistory:
        """The task's attempts, and up to `limit` of its events after event `after_event`."""
        row = await self._fetchrow("task_history", task_id, after_event, limit)
        if row is None or not row["found"]:
            raise errors.TaskNotFound(f"no task {task_id}")
        return TaskHistory(
            [_attempt(a) for a in row["attempts"]], [_event(e) for e in row["events"]]
        )

    async def list_tasks(
        self,
        statuses: list[TaskStatus],
        host_id: str | None,
        after: tuple[datetime, uuid.UUID] | None,
        limit: int,
        selector_labels: dict[str, str] | None = None,
        pattern: str = "",
    ) -> list[Task]:
        """Newest first; `pattern` (LIKE, escaped) matches the id's start, or anywhere in
        the request id or metadata."""
        created, task_id = after if after else (None, None)
        rows = await self._fetch(
            "list_tasks",
            [str(s) for s in statuses],
            host_id,
            created,
            task_id,
            limit,
            selector_labels or {},
            pattern,
        )
        return [_task(r) for r in rows]

    async def queue(self, limit: int) -> tuple[list[QueueWait], int, datetime | None]:
        """The queue as last counted: the `limit` largest selectors, the queued total, and
        when it was counted (None: not yet)."""
        rows = await self._fetch("queue_groups", limit)
        groups = [
            QueueWait(
                r["selector_serial"],
                r["selector_labels"] or {},
                r["n"],
                r["oldest"],
                r["idle"],
                r["busy"],
                r["unavailable"],
            )
            for r in rows
        ]
        if not rows:
            row = await self._fetchrow("queue_counted_at")
            return [], 0, row["counted_at"] if row else None
        return groups, int(rows[0]["total"]), rows[0]["counted_at"]

    async def cancel(self, task_id: TaskId, reason: str) -> tuple[CancelCode, Task]:
        """Returns (code, task); code is CANCELLED, REQUESTED or UNCHANGED (else it raises)."""
        row = await self._fetchrow("cancel_task", task_id, reason)
        assert row is not None
        code = CancelCode(row["code"])
        if code is CancelCode.NOT_FOUND:
            raise errors.TaskNotFound(f"no task {task_id}")
        task = _task(row)
        if code is CancelCode.TERMINAL:
            raise errors.TaskAlreadyTerminal(
                f"task {task_id} is already {task.status}; a finished task cannot be cancelled"
            )
        return code, task

    # -- leases ----------------------------------------------------------------------------

    async def acquire(
        self, host_id: str, serials: list[str], ttl: timedelta, offered: Sequence[str] = ()
    ) -> Acquired:
        """One Acquire round. With `offered` (the task ids it was woken for), the answer
        also says which of them were queued when the statement began (still one
        statement); ids that are not UUIDs are left out."""
        wanted = [t for t in map(_uuid_or_none, offered) if t is not None]
        if wanted:
            rows = await self._fetch("acquire_offered", host_id, serials, ttl, wanted)
            queued = frozenset(str(r["queued"]) for r in rows if r["queued"] is not None)
            rows = [r for r in rows if r["queued"] is None]
        else:
            rows = await self._fetch("acquire", host_id, serials, ttl)
            queued = frozenset()
        return Acquired(
            [
                Assignment(
                    TaskId(r["task_id"]),
                    r["attempt"],
                    LeaseId(r["lease_id"]),
                    r["device_serial"],
                    bytes(r["spec"]),
                    r["queued_seconds"] or 0.0,
                    r["deadline"],
                )
                for r in rows
                if r["task_id"] is not None
            ],
            [(r["device_serial"], r["labels"]) for r in rows if r["task_id"] is None],
            queued,
        )

    async def renew(
        self,
        host_id: str,
        lease_ids: list[str],
        ttl: timedelta,
        steps: Sequence[StepProgress] = (),
    ) -> list[Renewal]:
        """The leases renewed (`lease_ids` as text: as the hosts send them); any other lease
        asked about is a conflict. `steps` are kept for the leases renewed only (one
        statement either way)."""
        rows = await self._fetch(
            "renew_leases",
            host_id,
            lease_ids,
            ttl,
            [s.lease_id for s in steps],
            [s.index for s in steps],
            [s.step for s in steps],
        )
        return [Renewal._make(r) for r in rows if r["task_id"] is not None]

    async def report(self, host_id: str | None, report: Report) -> Recorded:
        """The answer's code is RECORDED or REPEATED; refusals raise."""
        (answer,) = await self.report_many(host_id, [report])
        if isinstance(answer, errors.AmcError):
            raise answer
        return answer

    async def report_many(
        self, host_id: str | None, reports: list[Report]
    ) -> list[Recorded | errors.AmcError]:
        """Results applied in one transaction, each as if alone; per result, in order, the
        answer (code RECORDED or REPEATED) or the refusal."""
        rows = await self._fetch(
            "report_results",
            host_id,
            *_columns(reports, "task_id", "attempt", "lease_id", "outcome", "result", "error"),
        )
        # A task that does not exist answers no row: not one of its attempts, so foreign.
        answers: list[Recorded | errors.AmcError] = [
            _report_refusal(ReportCode.FOREIGN, r) for r in reports
        ]
        for row in rows:
            if row["code"] is None:
                continue
            i, code = row["ord"] - 1, ReportCode(row["code"])
            if code in (ReportCode.RECORDED, ReportCode.REPEATED):
                answers[i] = Recorded(
                    code,
                    _task(row),
                    row["att_cancel_requested_at"],
                    row["att_cancel_delivered_at"],
                    row["att_started_at"],
                )
            else:
                answers[i] = _report_refusal(code, reports[i])
        return answers

    async def notify(self, batch: list[tuple[str, str]]) -> None:
        await self._fetch("notify", [c for c, _ in batch], [p for _, p in batch])

    async def mark_cancel_delivered(self, lease_id: LeaseId) -> None:
        await self._fetch("mark_cancel_delivered", lease_id)

    async def release(self, host_id: str | None, lease_id: LeaseId, reason: str) -> Expiry | None:
        """End the lease now, as its host (None: any); None if its attempt had ended."""
        row = await self._fetchrow("release_lease", host_id, lease_id, reason)
        assert row is not None
        code = ReleaseCode(row["code"])
        if code is ReleaseCode.FOREIGN:
            raise errors.LeaseConflict("no such lease for this host")
        return _expiry(row) if code is ReleaseCode.RELEASED else None

    async def device_lost(
        self, host_id: str | None, lease_id: LeaseId, detail: str, budget: int
    ) -> Expiry | None:
        """End the lease now because its phone was lost: the task is requeued within
        `budget` infrastructure retries; None if its attempt had ended."""
        row = await self._fetchrow("device_lost", host_id, lease_id, detail, budget)
        assert row is not None
        code = ReleaseCode(row["code"])
        if code is ReleaseCode.FOREIGN:
            raise errors.LeaseConflict("no such lease for this host")
        return _expiry(row) if code is ReleaseCode.RELEASED else None

    async def expire(self, limit: int = 100) -> list[Expiry]:
        return [_expiry(r) for r in await self._fetch("expire_leases", limit)]

    async def time_out_queued(self, limit: int = 100) -> list[Task]:
        """Fail up to `limit` queued tasks whose queue timeout ran out (one statement)."""
        return [_task(r) for r in await self._fetch("time_out_queued", limit)]

    async def end_overrun(self, grace: timedelta, limit: int = 100) -> list[Expiry]:
        """End up to `limit` live attempts that ran past their deadline by more than
        `grace` (one statement): the task fails "deadline exceeded" (or is cancelled, if a
        cancel was pending) and the lease ends."""
        return [_expiry(r) for r in await self._fetch("end_overrun", limit, grace)]

    # -- hosts -----------------------------------------------------------------------------

    async def register_host(
        self, host_id: str, labels: dict[str, str], devices: list[DeviceInfo]
    ) -> None:
        await self._fetch(
            "register_host",
            host_id,
            labels,
            *_columns(devices, "serial", "state", "model", "manufacturer", "sdk", "abi"),
            [json.dumps(d.labels) for d in devices],
        )

    async def set_device_health(self, host_id: str, health: list[DeviceHealth]) -> int:
        """Record the conditions host `host_id` reported for its own devices (others are
        ignored); how many of them turned ready."""
        row = await self._fetchrow(
            "set_device_health",
            host_id,
            *_columns(
                health,
                "serial",
                "condition",
                "reason",
                "battery_percent",
                "temperature_celsius",
                "charging",
            ),
        )
        return int(row["freed"]) if row is not None else 0

    async def replica_alive(self, replica: str, address: str | None = None) -> None:
        await self._fetch("replica_alive", replica, address)

    async def session_relay(self, task_id: TaskId, within: timedelta) -> SessionRelay | None:
        """The replica holding the session's client call, if one was recorded."""
        row = await self._fetchrow("session_relay", task_id, within)
        if row is None:
            return None
        return SessionRelay(row["replica_id"], row["address"], row["alive"])

    async def screen_source(
        self, task_id: uuid.UUID | None, host_id: str, serial: str, within: timedelta
    ) -> dict[str, Any] | None:
        """Where a phone to watch is (queries.sql screen_source), in one statement."""
        row = await self._fetchrow("screen_source", task_id, host_id, serial, within)
        return dict(row) if row is not None else None

    async def set_presence(self, replica: str, hosts: list[str], opened: list[bool]) -> None:
        await self._fetch("set_presence", replica, hosts, opened)

    async def replica_gone(self, replica: str) -> None:
        await self._fetch("replica_gone", replica)

    async def list_hosts(
        self, connected_within: timedelta, host_id: str | None = None
    ) -> list[HostInfo]:
        """Every host (or only `host_id`), with its devices."""
        rows = await self._fetch("list_hosts", connected_within, host_id)
        return [
            HostInfo(
                r["host_id"],
                r["labels"],
                r["connected"],
                r["last_seen_at"],
                [_device(d) for d in r["devices"]],
                r["cordoned"],
                r["draining"],
            )
            for r in rows
        ]

    async def get_host(self, connected_within: timedelta, host_id: str) -> HostInfo:
        hosts = await self.list_hosts(connected_within, host_id)
        if not hosts:
            raise errors.HostNotFound(f"no host '{host_id}'")
        return hosts[0]

    async def set_host_cordon(
        self, host_id: str, cordoned: bool, drain: bool, kind: str, actor: Principal, reason: str
    ) -> int:
        """Cordon (with `drain`: and drain) or uncordon the host, recorded as `kind`;
        the leases it holds now."""
        row = await self._fetchrow(
            "set_host_cordon", host_id, cordoned, drain, kind, actor.caller, actor.name, reason
        )
        if row is None:
            raise errors.HostNotFound(f"no host '{host_id}'")
        return int(row["leases"])

    async def set_device_cordon(
        self,
        host_id: str | None,
        serial: str,
        cordoned: bool,
        kind: str,
        actor: Principal,
        reason: str,
    ) -> str:
        """Cordon or uncordon one device; the host it is on. Without `host_id`, the serial
        must be on one host only."""
        row = await self._fetchrow(
            "set_device_cordon", host_id, serial, cordoned, kind, actor.caller, actor.name, reason
        )
        hosts: list[str] = list(row["hosts"]) if row else []
        if not hosts:
            where = f" on host '{host_id}'" if host_id else ""
            raise errors.DeviceNotFound(f"no device '{serial}'{where}")
        if len(hosts) > 1:
            raise errors.InvalidArgument(
                "host_id", f"device '{serial}' is on hosts {', '.join(hosts)}: name the host"
            )
        return hosts[0]

    async def release_device(
        self,
        host_id: str | None,
        serial: str,
        connected_within: timedelta,
        actor: Principal,
        reason: str,
    ) -> str:
        """Record an operator's release of a quarantined device; the host it is on (whose
        agent is then told). Without `host_id`, the serial must be on one host only."""
        row = await self._fetchrow(
            "release_device",
            host_id,
            serial,
            connected_within,
            actor.caller,
            actor.name,
            reason,
        )
        assert row is not None
        hosts: list[str] = list(row["hosts"])
        if not hosts:
            where = f" on host '{host_id}'" if host_id else ""
            raise errors.DeviceNotFound(f"no device '{serial}'{where}")
        if len(hosts) > 1:
            raise errors.InvalidArgument(
                "host_id", f"device '{serial}' is on hosts {', '.join(hosts)}: name the host"
            )
        if not row["released"]:
            if row["condition"] not in ("quarantined", "recovering"):
                raise errors.DeviceNotQuarantined(
                    f"device '{serial}' on host '{hosts[0]}' is not quarantined "
                    f"({row['condition']})"
                )
            raise errors.DeviceNotQuarantined(
                f"host '{hosts[0]}' is not connected: its agent holds the quarantine (a "
                "restarted agent probes its phones afresh)"
            )
        return hosts[0]

    async def remove_host(
        self, host_id: str, connected_within: timedelta, actor: Principal, reason: str
    ) -> None:
        """Forget a disconnected host that holds no lease, and its devices."""
        row = await self._fetchrow(
            "remove_host", host_id, connected_within, actor.caller, actor.name, reason
        )
        assert row is not None
        code, leases = RemoveCode(row["code"]), row["leases"]
        if code is RemoveCode.NOT_FOUND:
            raise errors.HostNotFound(f"no host '{host_id}'")
        if code is RemoveCode.CONNECTED:
            raise errors.HostInUse(
                f"host '{host_id}' is connected; stop its agent first (drain it to let its "
                "tasks finish)"
            )
        if code is RemoveCode.LEASES:
            raise errors.HostInUse(
                f"host '{host_id}' holds {leases} lease(s); they end when reported or expired"
            )

    async def host_draining(self, host_id: str) -> bool:
        row = await self._fetchrow("host_draining", host_id)
        return bool(row and row["draining"])

    async def host_events(self, host_id: str, limit: int) -> list[HostEvent]:
        """The host's latest `limit` events, newest first."""
        rows = await self._fetch("host_events", host_id, limit)
        return [
            HostEvent(r["kind"], r["serial"], r["actor"], r["actor_name"], r["reason"], r["at"])
            for r in rows
        ]

    async def read_tasks(
        self, task_ids: Sequence[TaskId], connected_within: timedelta
    ) -> list[TaskRead]:
        """The tasks (those that exist): each running one with its progress, each queued
        one with the devices its selector matches, by what keeps them from it, and its
        key's cap. One statement, so one snapshot (a phone that took the task is never
        counted busy with it)."""
        rows = await self._fetch("read_tasks", list(task_ids), connected_within)
        return [
            TaskRead(
                _with_progress(r),
                None
                if r["m_total"] is None
                else DeviceMatch(
                    r["m_total"],
                    r["m_host_cordoned"],
                    r["m_cordoned"],
                    r["m_offline"],
                    r["m_busy"],
                    tuple(sorted(r["m_held_by"] or ())),
                ),
                None
                if r["cap_max_devices"] is None
                else KeyCap(r["cap_max_devices"], int(r["cap_running"])),
            )
            for r in rows
        ]

    # -- the queue's counts and fair shares --------------------------------------------------

    async def count_queue(self, every: timedelta, connected_within: timedelta) -> int | None:
        """Count the queue into queue_group_stats unless it was counted less than `every`
        ago or another replica is counting it; the tasks queued, or None if it did not."""
        row = await self._fetchrow("count_queue", every, connected_within)
        return None if row is None else int(row["queued"])

    async def fair_shares(
        self, limit: int, key: str | None = None
    ) -> tuple[list[FairShare], datetime | None]:
        """The fairness keys with tasks queued or running or a share set (or only `key`),
        most queued first, at most `limit`; and when the queue was counted (None: not yet)."""
        rows = await self._fetch("fair_shares", key, limit)
        shares = [
            FairShare(
                r["fairness_key"],
                r["weight"],
                r["max_devices"],
                int(r["queued"]),
                int(r["running"]),
                r["oldest"],
                r["updated_at"],
            )
            for r in rows
        ]
        if not rows:
            row = await self._fetchrow("queue_counted_at")
            return [], row["counted_at"] if row else None
        return shares, rows[0]["counted_at"]

    async def set_fair_share(
        self, key: str, change: ShareChange, actor: Principal, reason: str
    ) -> int | None:
        """Set the key's share as `change` says, recorded as done by `actor` because
        `reason`; the cap it had before (None: none)."""
        row = await self._fetchrow(
            "set_fair_share",
            key,
            change.weight,
            change.max_devices,
            change.clear_cap,
            actor.caller,
            actor.name,
            reason,
        )
        assert row is not None
        cap: int | None = row["cap_before"]
        return cap

    async def fair_share_events(self, key: str, limit: int) -> list[FairShareEvent]:
        """The key's latest `limit` changes of its share, newest first."""
        rows = await self._fetch("fair_share_events", key, limit)
        return [
            FairShareEvent(
                r["weight"], r["max_devices"], r["actor"], r["actor_name"], r["reason"], r["at"]
            )
            for r in rows
        ]

    async def fair_share_heads(
        self, key: str, limit: int
    ) -> list[tuple[TaskId, str | None, dict[str, str]]]:
        """The key's first `limit` queued tasks in dispatch order: (id, serial, labels)."""
        rows = await self._fetch("fair_share_heads", key, limit)
        return [(TaskId(r["task_id"]), r["selector_serial"], r["selector_labels"]) for r in rows]

    async def forget_queue_groups(self, idle: timedelta, limit: int) -> int:
        """Forget up to `limit` queue groups with no task queued or running, made more than
        `idle` ago; how many went."""
        row = await self._fetchrow("forget_queue_groups", idle, limit)
        assert row is not None
        return int(row[0])

    # -- retention -------------------------------------------------------------------------

    async def delete_old_tasks(self, finished_before: timedelta, limit: int) -> Removed:
        """One batch: up to `limit` terminal tasks that finished more than `finished_before`
        ago, oldest first, with their attempts and events. Nothing when another replica is
        running a retention batch."""
        row = await self._fetchrow("delete_old_tasks", finished_before, limit)
        assert row is not None
        return Removed(
            tasks=row["tasks"],
            attempts=row["attempts"],
            task_events=row["task_events"],
            artifacts=row["artifacts"],
        )

    async def host_registered(self, host_id: str) -> bool:
        row = await self._fetchrow("host_registered", host_id)
        return bool(row and row["registered"])

    async def forget_hosts(self, unseen_for: timedelta, limit: int, reason: str) -> Removed:
        """One batch: up to `limit` hosts not seen for `unseen_for` that hold no lease, with
        their devices, each recorded as removed by retention because `reason`. Nothing when
        another replica is running a retention batch."""
        row = await self._fetchrow("forget_hosts", unseen_for, limit, reason)
        assert row is not None
        return Removed(hosts=row["hosts"], devices=row["devices"])

    # -- tokens ----------------------------------------------------------------------------

    async def create_token(
        self,
        token_id: uuid.UUID,
        name: str,
        role: Role,
        host_id: str | None,
        secret_hash: bytes,
        team: str = "",
    ) -> TokenInfo:
        row = await self._fetchrow(
            "create_token", token_id, name, str(role), host_id, secret_hash, team
        )
        assert row is not None
        return _token(row)

    async def get_token(self, token_id: uuid.UUID) -> TokenInfo | None:
        row = await self._fetchrow("get_token", token_id)
        return _token(row) if row else None

    async def revoke_token(self, token_id: uuid.UUID) -> TokenInfo:
        row = await self._fetchrow("revoke_token", token_id)
        if row is None:
            raise errors.NotFound(f"no token {token_id}")
        return _token(row)

    async def list_tokens(self) -> list[TokenInfo]:
        return [_token(r) for r in await self._fetch("list_tokens")]

    # -- artifacts -------------------------------------------------------------------------

    async def put_artifact(
        self, host_id: str | None, new: NewArtifact, artifact_id: ArtifactId, chunks: list[bytes]
    ) -> tuple[ArtifactInfo, bool]:
        """Keep the artifact under its lease (host_id None: any host's): (the artifact
        stored, whether this call stored it). Refusals raise; nothing is stored then."""
        row = await self._fetchrow(
            "put_artifact",
            host_id,
            new.task_id,
            new.attempt,
            new.lease_id,
            artifact_id,
            new.step_index,
            new.action_index,
            new.step_name,
            new.kind,
            new.size_bytes,
            new.sha256,
            chunks,
        )
        assert row is not None
        code = row["code"]
        if code in ("stored", "repeated"):
            return _artifact(row), code == "stored"
        where = f"task {new.task_id} attempt {new.attempt}"
        if code == "other_host":
            raise errors.NotLeaseHolder(
                f"lease {new.lease_id} belongs to another host; nothing was stored"
            )
        if code == "stale":
            raise errors.LeaseNotCurrent(
                f"{where} is no longer current (lease ended, expired or replaced);"
                " nothing was stored"
            )
        if code == "different":
            raise errors.DifferentArtifactStored(
                f"{where} step {new.step_index} action {new.action_index} already has a"
                " different artifact stored; it stands"
            )
        raise errors.LeaseNotCurrent(
            f"lease {new.lease_id} is not the lease of {where}; nothing was stored"
        )

    async def list_artifacts(self, task_id: TaskId, limit: int) -> list[ArtifactInfo]:
        rows = await self._fetch("list_artifacts", task_id, limit)
        if not rows:
            raise errors.TaskNotFound(f"no task {task_id}")
        return [_artifact(r) for r in rows if r["artifact_id"] is not None]

    async def get_artifact(self, task_id: TaskId, artifact_id: ArtifactId) -> ArtifactInfo:
        row = await self._fetchrow("get_artifact", task_id, artifact_id)
        if row is None:
            raise errors.ArtifactNotFound(f"task {task_id} has no artifact {artifact_id}")
        return _artifact(row)

    async def artifact_chunks(
        self, artifact_id: ArtifactId, first: int, limit: int
    ) -> list[tuple[int, bytes]]:
        """Up to `limit` chunks of the artifact from chunk `first` on, in order."""
        rows = await self._fetch("artifact_chunks", artifact_id, first, limit)
        return [(r["seq"], bytes(r["data"])) for r in rows]

    # -- notifications ---------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def listening(
        self, dsn: str, channels: Mapping[str, Listener], on_lost: Callable[[], None]
    ) -> AsyncIterator[asyncpg.Connection]:
        """A dedicated connection LISTENing on `channels`; `on_lost` runs if it drops."""
        with translated():
            conn = await asyncpg.connect(dsn, timeout=10, **session_attrs(dsn))
        try:
            conn.add_termination_listener(lambda _c: on_lost())
            # The database can go away between the connect and the LISTENs, too.
            with translated():
                for channel, callback in channels.items():
                    await conn.add_listener(channel, _adapt(callback))
            yield conn
        finally:
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)

    async def still_listening(self, conn: asyncpg.Connection, channels: Sequence[str]) -> bool:
        """The LISTEN connection's heartbeat: it still hears every channel, and on a
        writable server (notifications of commits come from the primary only)."""
        with translated():
            row = await conn.fetchrow(Q["listener_check"])
        return row is not None and not row["read_only"] and set(channels) <= set(row["channels"])


def _adapt(callback: Listener) -> Callable[[Any, int, str, str], None]:
    def on_notify(_conn: Any, _pid: int, channel: str, payload: str) -> None:
        callback(channel, payload)

    return on_notify


def _expiry(row: asyncpg.Record) -> Expiry:
    return Expiry(
        TaskId(row["task_id"]),
        row["attempt"],
        LeaseId(row["lease_id"]),
        row["host_id"],
        TaskStatus(row["to_status"]),
        row["selector_serial"],
        row["selector_labels"] or {},
    )


_ARTIFACT_COLUMNS = (
    "attempt", "step_index", "action_index", "step_name", "kind", "size_bytes", "created_at",
)  # fmt: skip


def _artifact(row: asyncpg.Record) -> ArtifactInfo:
    return ArtifactInfo(
        artifact_id=ArtifactId(row["artifact_id"]),
        task_id=TaskId(row["task_id"]),
        sha256=bytes(row["sha256"]),
        **_as_is(row, *_ARTIFACT_COLUMNS),
    )


def _when(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _attempt(a: dict[str, Any]) -> AttemptInfo:
    return AttemptInfo(
        attempt=a["attempt"],
        host_id=a["host_id"],
        device_serial=a["device_serial"],
        lease_id=LeaseId(uuid.UUID(a["lease_id"])),
        state=a["state"],
        created_at=datetime.fromisoformat(a["created_at"]),
        acknowledged_at=_when(a["acknowledged_at"]),
        ended_at=_when(a["ended_at"]),
        cancel_requested_at=_when(a["cancel_requested_at"]),
    )


def _event(e: dict[str, Any]) -> TaskEvent:
    return TaskEvent(
        event_id=e["event_id"],
        attempt=e["attempt"],
        kind=e["kind"],
        from_status=TaskStatus(e["from_status"]) if e["from_status"] else None,
        to_status=TaskStatus(e["to_status"]) if e["to_status"] else None,
        detail=e["detail"],
        at=datetime.fromisoformat(e["at"]),
    )


def _device(d: dict[str, Any]) -> DeviceInfo:
    task_id = d.get("task_id")
    return DeviceInfo(
        d["serial"],
        d["state"],
        d["model"],
        d["manufacturer"],
        d["sdk"],
        d["abi"],
        d["labels"] or {},
        TaskId(uuid.UUID(task_id)) if task_id else None,
        bool(d.get("cordoned")),
        DeviceHealth(
            d["serial"],
            d.get("condition") or "ready",
            d.get("condition_reason") or "",
            d.get("battery_percent"),
            d.get("temperature_celsius"),
            d.get("charging"),
            _when(d.get("probed_at")),
        ),
    )


def _spread(parts: list[list[Any]]) -> tuple[float, float, float] | None:
    """(min, mean, max) over the conditions' (min, sum, count, max); None when nothing was
    probed."""
    probed = [p for p in parts if p[2]]
    if not probed:
        return None
    total = sum(float(p[1]) for p in probed) / sum(int(p[2]) for p in probed)
    return min(float(p[0]) for p in probed), total, max(float(p[3]) for p in probed)


def _uuid_or_none(text: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


def _columns(rows: Sequence[Any], *fields: str) -> list[list[Any]]:
    """One list per field, in the order of `rows`: how a batch goes into `unnest(...)`."""
    return [[getattr(row, f) for row in rows] for f in fields]


# A report's refusal by its code: the error and its message.
_REFUSALS: dict[ReportCode, tuple[type[errors.AmcError], str]] = {
    ReportCode.FOREIGN: (
        errors.LeaseConflict,
        "lease does not belong to this host and {where}; nothing was recorded",
    ),
    ReportCode.STALE: (
        errors.StaleAttempt,
        "{where} is no longer current (lease expired or replaced); nothing was recorded",
    ),
    ReportCode.DIFFERENT: (
        errors.DifferentReportRecorded,
        "{where} already has a different outcome recorded; it stands",
    ),
    ReportCode.NO_CANCEL: (
        errors.NoCancellationRequested,
        "{where} has no cancellation request, so it cannot end cancelled",
    ),
}


def _report_refusal(code: ReportCode, report: Report) -> errors.AmcError:
    error, message = _REFUSALS[code]
    return error(message.format(where=f"task {report.task_id} attempt {report.attempt}"))
