"""Model-based test: hypothesis drives the real control plane (real PostgreSQL, real gRPC)
through random sequences of submit, acquire, renew, cancel, report, release, lease expiry
and server restart, and after every step compares it with a small reference model of
DESIGN.md's transition table, then checks the invariants straight from the database, and
that every `task_events` row is a transition control_plane.lifecycle's table allows.

The farm lives on the test's event loop; hypothesis runs the (synchronous) state machine in
a worker thread and hands each call to that loop. Examples share the farm and start from
emptied tables. `AMC_MODEL_EXAMPLES=500` runs more and longer examples.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import asyncpg
import grpc
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

import control_plane.sweep
from amc.v1 import lease_pb2, scheduler_pb2, scheduler_pb2_grpc, task_pb2
from control_plane.config import Settings
from control_plane.domain import Role
from control_plane.lifecycle import Event, TaskStatus, allowed
from tests.support import Clients, Farm, HostClient, actions_spec, eventually, tap

T = TypeVar("T")

_EXTENDED = int(os.environ.get("AMC_MODEL_EXAMPLES", "0"))
EXAMPLES = _EXTENDED or 50
STEPS = 50 if _EXTENDED else 30
COVERAGE_ROUNDS = 4
# A restart costs ~0.2 s; one per example at most keeps the test quick.
MAX_RESTARTS = 1
# How a report names its attempt: exactly, or with a wrong attempt number, another task or
# one that does not exist.
REPORT_VARIANTS = [
    "exact",
    "exact",
    "exact",
    "exact",
    "wrong_attempt",
    "other_task",
    "unknown_task",
]
SETTINGS = Settings(
    lease_ttl=timedelta(minutes=10),
    sweep_interval=timedelta(seconds=0.05),
    watch_refresh=timedelta(seconds=1),
)

# What the steps ran into over the whole test, printed at the end (pytest -s): how much of
# the table a run reached.
COVERAGE: Counter[str] = Counter()
# The event kinds the runs wrote: the check of them against the lifecycle table is worth
# as much as the kinds it saw.
KINDS_SEEN: set[str] = set()

OK = grpc.StatusCode.OK
NOT_FOUND = grpc.StatusCode.NOT_FOUND
FAILED_PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
ABORTED = grpc.StatusCode.ABORTED

DEVICES = {"A": ("A1", "A2"), "B": ("B1",)}
HOST_OF = {serial: host for host, serials in DEVICES.items() for serial in serials}
ALL_SERIALS = sorted(HOST_OF)
IN_FLIGHT = ("assigned", "dispatched")
TERMINAL = ("done", "failed", "cancelled")
OUTCOMES = {
    "done": lease_pb2.OUTCOME_DONE,
    "failed": lease_pb2.OUTCOME_FAILED,
    "cancelled": lease_pb2.OUTCOME_CANCELLED,
}
STATUS_NAMES = {
    task_pb2.TASK_STATUS_QUEUED: "queued",
    task_pb2.TASK_STATUS_ASSIGNED: "assigned",
    task_pb2.TASK_STATUS_DISPATCHED: "dispatched",
    task_pb2.TASK_STATUS_DONE: "done",
    task_pb2.TASK_STATUS_FAILED: "failed",
    task_pb2.TASK_STATUS_CANCELLED: "cancelled",
}


# -- the reference model ------------------------------------------------------------------


@dataclass
class MTask:
    task_id: str
    seq: int
    priority: int
    serial: str | None  # the selector
    max_attempts: int
    status: str = "queued"
    attempt: int = 0
    cancel: bool = False
    host: str | None = None
    device: str | None = None
    # Attempts given back device_lost and requeued: not counted against max_attempts.
    infra: int = 0


@dataclass
class MAttempt:
    task_id: str
    attempt: int
    lease_id: str
    host: str
    serial: str
    state: str = "active"
    outcome: str | None = None
    cancel: bool = False


@dataclass(frozen=True)
class Submission:
    request_id: str | None
    max_attempts: int
    priority: int
    serial: str | None  # the selector: a serial, another host's, or one nobody has


SUBMISSIONS = st.builds(
    Submission,
    request_id=st.sampled_from([None, None, "r1", "r2"]),
    max_attempts=st.integers(1, 3),
    priority=st.sampled_from([0, 0, 1]),
    serial=st.sampled_from([None, None, "A1", "B1", "Z9"]),
)


@dataclass(frozen=True)
class Lease:
    """What a host got from Acquire: the handle the other rules act on."""

    task_id: str
    attempt: int
    lease_id: str
    host: str
    serial: str


@dataclass
class Model:
    """DESIGN.md's table, written as plainly as possible. Each method returns the gRPC code
    the control plane must answer with, and applies the transition when there is one."""

    tasks: dict[str, MTask] = field(default_factory=dict)
    attempts: dict[str, MAttempt] = field(default_factory=dict)
    holders: dict[str, str | None] = field(default_factory=lambda: dict.fromkeys(HOST_OF))
    by_request: dict[str, str] = field(default_factory=dict)

    def submit(self, task_id: str, s: Submission) -> None:
        self.tasks[task_id] = MTask(task_id, len(self.tasks), s.priority, s.serial, s.max_attempts)
        if s.request_id:
            self.by_request[s.request_id] = task_id

    def acquire(self, host: str, serials: list[str]) -> list[tuple[str, int, str]]:
        """(task, attempt, serial) per device, in serial order, best queued task first."""
        found = []
        for serial in sorted(set(serials) & set(DEVICES[host])):
            if self.holders[serial] is not None:
                continue
            queued = [
                t
                for t in self.tasks.values()
                if t.status == "queued" and t.serial in (None, serial)
            ]
            if not queued:
                continue
            t = min(queued, key=lambda t: (-t.priority, t.seq))
            t.status, t.attempt, t.host, t.device = "assigned", t.attempt + 1, host, serial
            self.holders[serial] = t.task_id
            found.append((t.task_id, t.attempt, serial))
        return found

    def in_flight(self) -> bool:
        return any(t.status in IN_FLIGHT for t in self.tasks.values())

    def record_lease(self, lease: Lease) -> None:
        self.attempts[lease.lease_id] = MAttempt(
            lease.task_id, lease.attempt, lease.lease_id, lease.host, lease.serial
        )

    def renew(self, host: str, lease_id: str) -> tuple[bool, bool]:
        """(renewed, cancel_pending); the first renewal acknowledges the assignment."""
        a = self.attempts.get(lease_id)
        if a is None or a.host != host or a.state != "active":
            return False, False
        t = self.tasks[a.task_id]
        if t.status == "assigned" and t.attempt == a.attempt:
            t.status = "dispatched"
        return True, a.cancel

    def cancel(self, task_id: str) -> grpc.StatusCode:
        t = self.tasks.get(task_id)
        if t is None:
            return NOT_FOUND
        if t.status in ("done", "failed"):
            return FAILED_PRECONDITION
        if t.status == "queued":
            t.status, t.cancel = "cancelled", True
        elif t.status in IN_FLIGHT and not t.cancel:
            t.cancel = True
            self._current(t).cancel = True
        return OK

    def report(
        self, host: str, lease_id: str, task_id: str, attempt: int, outcome: str
    ) -> grpc.StatusCode:
        a = self.attempts[lease_id]
        t = self.tasks[a.task_id]
        if a.task_id != task_id or a.attempt != attempt or a.host != host:
            return ABORTED  # not this host's lease for this task and attempt
        if a.state in TERMINAL:
            return OK if a.outcome == outcome else FAILED_PRECONDITION
        if a.state != "active" or t.attempt != a.attempt or t.status not in IN_FLIGHT:
            return ABORTED  # stale
        if outcome == "cancelled" and not a.cancel:
            return FAILED_PRECONDITION
        a.state = a.outcome = t.status = outcome
        self._free(t)
        return OK

    def release(self, host: str, lease_id: str, device_lost: bool = False) -> grpc.StatusCode:
        a = self.attempts[lease_id]
        if a.host != host:
            return ABORTED
        if a.state == "active":
            self.end(a, "released", device_lost)
        return OK

    def end(self, a: MAttempt, how: str, device_lost: bool = False) -> None:
        """A lease expired or was given back: cancelled / requeued / failed. Given back
        because its phone was lost: requeued within the infrastructure-retry budget, apart
        from max_attempts, failed once it is spent."""
        t = self.tasks[a.task_id]
        a.state = how
        self._free(t)
        if a.cancel:
            t.status = "cancelled"
        elif device_lost and t.infra < SETTINGS.infra_retries:
            t.status, t.host, t.device = "queued", None, None
            t.infra += 1
        elif device_lost:
            t.status = "failed"
        elif t.attempt - t.infra < t.max_attempts:
            t.status, t.host, t.device = "queued", None, None
        else:
            t.status = "failed"

    def time_out(self, t: MTask) -> None:
        """A queued task's queue timeout ran out: failed."""
        t.status = "failed"

    def overrun(self, a: MAttempt) -> None:
        """An attempt ran past its deadline (and the grace): its lease ends, and the task
        fails, or is cancelled if a cancel was pending; never requeued."""
        t = self.tasks[a.task_id]
        a.state = "expired"
        self._free(t)
        t.status = "cancelled" if a.cancel else "failed"

    def _current(self, t: MTask) -> MAttempt:
        (a,) = [
            a for a in self.attempts.values() if a.task_id == t.task_id and a.attempt == t.attempt
        ]
        return a

    def _free(self, t: MTask) -> None:
        for serial, holder in self.holders.items():
            if holder == t.task_id:
                self.holders[serial] = None


# -- the bridge to the farm ---------------------------------------------------------------


@dataclass
class Reply:
    code: grpc.StatusCode
    value: Any = None
    details: str = ""


async def _reply(call: Callable[[], Awaitable[Any]]) -> Reply:
    try:
        return Reply(OK, await call())
    except grpc.aio.AioRpcError as exc:
        return Reply(exc.code(), None, exc.details() or "")


@dataclass
class World:
    """The farm, its event loop, and the callers the state machine acts as."""

    farm: Farm
    loop: asyncio.AbstractEventLoop
    tokens: dict[str, str] = field(default_factory=dict)
    scheduler: Clients | None = None
    hosts: dict[str, HostClient] = field(default_factory=dict)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def call(self, call: Callable[[], Awaitable[Any]]) -> Reply:
        """Make the call on the farm's loop (gRPC calls belong to the loop that made them)."""
        return self.run(_reply(call))

    async def setup(self) -> None:
        self.tokens["operator"] = await self.farm.token(Role.OPERATOR)
        for host in DEVICES:
            self.tokens[host] = await self.farm.token(Role.HOST, host)
        self.connect()

    def connect(self) -> None:
        """Fresh channels: after a restart the old ones may sit in reconnect backoff."""
        self.scheduler = self.farm.clients(self.tokens["operator"])
        self.hosts = {h: HostClient(h, self.farm.clients(self.tokens[h])) for h in DEVICES}

    async def reset(self) -> None:
        """Empty every table but the tokens, and register the hosts again."""
        assert self.farm.db is not None
        # The sweep's statements lock these tables too, in their own order: a deadlock
        # with TRUNCATE rolls one of them back, and the TRUNCATE is simply run again.
        for tries_left in reversed(range(10)):
            try:
                await self.farm.db.execute(
                    "TRUNCATE artifact_chunks, artifacts, task_events, attempt_steps,"
                    " session_relays, attempts, devices, tasks, hosts"
                )
                break
            except asyncpg.DeadlockDetectedError:
                if not tries_left:
                    raise
        for host, serials in DEVICES.items():
            await self.hosts[host].register(*serials)

    async def restart(self) -> None:
        await self.farm.restart()
        self.connect()

    async def expire(self, lease_id: str) -> None:
        """Make the lease run out and wait until the sweeper has ended it."""
        await self.farm.expire_now(lease_id)
        db = self.farm.db
        assert db is not None

        async def swept() -> bool:
            state = await db.fetchval(
                "SELECT state FROM attempts WHERE lease_id = $1::uuid", lease_id
            )
            return state != "active"

        await eventually(swept, timeout=10, what=f"the sweep to end lease {lease_id}")

    async def time_out(self, task_id: str) -> None:
        """Make the task's stay in the queue run out and wait until the sweep failed it."""
        db = self.farm.db
        assert db is not None
        await db.execute(
            "UPDATE tasks SET queue_timeout = interval '1 second',"
            " queue_deadline = now() - interval '1 second' WHERE task_id = $1::uuid",
            task_id,
        )

        async def swept() -> bool:
            status = await db.fetchval("SELECT status FROM tasks WHERE task_id = $1::uuid", task_id)
            return bool(status != "queued")

        await eventually(swept, timeout=10, what=f"the sweep to time out task {task_id}")

    async def overrun(self, lease_id: str) -> None:
        """Make the attempt's run overrun its deadline by more than the lease TTL and wait
        until the sweep ended it."""
        db = self.farm.db
        assert db is not None
        await db.execute(
            "UPDATE tasks t SET deadline = interval '1 second' FROM attempts a"
            " WHERE a.lease_id = $1::uuid AND t.task_id = a.task_id",
            lease_id,
        )
        await db.execute(
            "UPDATE attempts SET deadline_at = now() - interval '1 day' WHERE lease_id = $1::uuid",
            lease_id,
        )

        async def swept() -> bool:
            state = await db.fetchval(
                "SELECT state FROM attempts WHERE lease_id = $1::uuid", lease_id
            )
            return bool(state != "active")

        await eventually(swept, timeout=10, what=f"the sweep to end overrun lease {lease_id}")

    async def read_db(self) -> dict[str, list[Any]]:
        db = self.farm.db
        assert db is not None
        return {
            "tasks": await db.fetch(
                "SELECT task_id::text, status, attempt, cancel_requested_at IS NOT NULL AS cancel,"
                " host_id, device_serial FROM tasks"
            ),
            "attempts": await db.fetch(
                "SELECT task_id::text, attempt, lease_id::text, host_id, device_serial, state,"
                " outcome, cancel_requested_at IS NOT NULL AS cancel FROM attempts"
            ),
            "devices": await db.fetch("SELECT host_id, serial, task_id::text FROM devices"),
            "events": await db.fetch(
                "SELECT task_id::text, kind, from_status, to_status FROM task_events"
                " ORDER BY event_id"
            ),
        }


# -- the state machine --------------------------------------------------------------------


def status_of(task: task_pb2.Task) -> str:
    return STATUS_NAMES[task.status]


def _status(name: str | None) -> TaskStatus | None:
    return None if name is None else TaskStatus(name)


class ControlPlaneMachine(RuleBasedStateMachine):
    world: World  # set by the test

    tasks = Bundle("tasks")
    leases = Bundle("leases")

    def __init__(self) -> None:
        super().__init__()
        self.model = Model()
        self.restarts = 0
        # Terminal statuses seen in the database, which must never change afterwards.
        self.finished: dict[str, str] = {}
        self.world.run(self.world.reset())

    # -- helpers ---------------------------------------------------------------------------

    def expect(self, reply: Reply, code: grpc.StatusCode, what: str) -> None:
        COVERAGE[f"{what.split()[0]} {reply.code.name}"] += 1
        assert reply.code == code, (
            f"{what}: got {reply.code.name} ({reply.details!r}), want {code.name}"
        )

    def expect_task(self, got: task_pb2.Task, what: str) -> None:
        t = self.model.tasks[got.task_id]
        assert (status_of(got), got.attempt, got.HasField("cancel_requested_at")) == (
            t.status,
            t.attempt,
            t.cancel,
        ), f"{what}: the reply says {status_of(got)}/{got.attempt}, the model {t}"

    @property
    def scheduler(self) -> scheduler_pb2_grpc.SchedulerStub:
        assert self.world.scheduler is not None
        return self.world.scheduler.scheduler

    # -- rules -----------------------------------------------------------------------------

    @initialize(target=tasks, submissions=st.lists(SUBMISSIONS, min_size=1, max_size=3))
    def some_tasks(self, submissions: list[Submission]) -> Any:
        """Every example starts with work queued, whichever rules hypothesis turns off."""
        return multiple(*(self.submit(s) for s in submissions))

    @rule(target=tasks, s=SUBMISSIONS)
    def submit(self, s: Submission) -> str:
        request = scheduler_pb2.SubmitTaskRequest(
            request_id=s.request_id or "",
            spec=actions_spec(tap()),
            max_attempts=s.max_attempts,
            priority=s.priority,
            selector=task_pb2.DeviceSelector(serial=s.serial or ""),
        )
        reply = self.world.call(lambda: self.scheduler.SubmitTask(request))
        self.expect(reply, OK, "submit")
        task = reply.value
        earlier = self.model.by_request.get(s.request_id or "")
        if earlier is not None:
            assert task.task_id == earlier, "a repeated request_id made a second task"
            COVERAGE["submit repeated request_id"] += 1
        else:
            assert task.task_id not in self.model.tasks
            self.model.submit(task.task_id, s)
        self.expect_task(task, "submit")
        return str(task.task_id)

    @precondition(lambda self: any(t.status == "queued" for t in self.model.tasks.values()))
    @rule(
        target=leases,
        host=st.sampled_from(sorted(DEVICES)),
        which=st.sampled_from(["own", "own", "own", "first", "twice", "foreign", "none"]),
    )
    def acquire(self, host: str, which: str) -> Any:
        """For its own devices mostly; also for another host's, or for none."""
        own = list(DEVICES[host])
        serials = {
            "own": own,
            "first": own[:1],
            "twice": own + own,
            "foreign": [s for s in ALL_SERIALS if s not in own],
            "none": [],
        }[which]
        reply = self.world.call(lambda: self.world.hosts[host].acquire(*serials))
        self.expect(reply, OK, "acquire")
        want = self.model.acquire(host, serials)
        got = [(a.task_id, a.attempt, a.device_serial) for a in reply.value]
        assert got == want, f"acquire({host}, {serials}): got {got}, want {want}"
        COVERAGE[f"acquire {len(got)} assignments"] += 1
        leases = [
            Lease(a.task_id, a.attempt, a.lease_id, host, a.device_serial) for a in reply.value
        ]
        for lease in leases:
            self.model.record_lease(lease)
        return multiple(*leases)

    @rule(
        leases=st.lists(leases, min_size=1, max_size=3),
        foreign=st.booleans(),
        unknown=st.booleans(),
    )
    def renew(self, leases: list[Lease], foreign: bool, unknown: bool) -> None:
        """One renewal message for several leases (maybe repeated, stale or another host's)."""
        host = self._caller(leases[0], foreign)
        ids = [lease.lease_id for lease in leases] + ([str(uuid.uuid4())] if unknown else [])
        reply = self.world.call(lambda: self.world.hosts[host].renew_answer(*ids))
        self.expect(reply, OK, "renew")
        states = reply.value.leases
        assert reply.value.valid_for.ToTimedelta() == SETTINGS.lease_ttl
        assert [s.lease_id for s in states] == ids
        # The statement renews each distinct lease once; only then are they acknowledged.
        want = {i: self.model.renew(host, i) for i in dict.fromkeys(ids)}
        for s in states:
            renewed, cancel_pending = want[s.lease_id]
            if renewed:
                a = self.model.attempts[s.lease_id]
                assert (s.task_id, s.attempt) == (a.task_id, a.attempt), (
                    f"renewal of {s.lease_id}: {s}"
                )
            COVERAGE[f"renewal {'RENEWED' if renewed else 'CONFLICT'} {cancel_pending=}"] += 1
            result = (
                lease_pb2.RENEWAL_RESULT_RENEWED if renewed else lease_pb2.RENEWAL_RESULT_CONFLICT
            )
            assert (s.result, s.cancel_pending) == (result, cancel_pending), (
                f"renew {s.lease_id} as {host}: got {s}, want renewed={renewed}"
                f" cancel_pending={cancel_pending}"
            )

    @rule(
        task_id=tasks,
        unknown=st.sampled_from([False, False, False, True]),
        timeout=st.sampled_from([False, False, False, False, True]),
    )
    def cancel(self, task_id: str, unknown: bool, timeout: bool) -> None:
        """Mostly a cancel; sometimes its queue timeout ends a queued task first."""
        t = self.model.tasks.get(task_id)
        if timeout and t is not None and t.status == "queued":
            self.world.run(self.world.time_out(task_id))
            self.model.time_out(t)
            COVERAGE["queue timeout"] += 1
            return
        if unknown:
            task_id = str(uuid.uuid4())
        request = scheduler_pb2.CancelTaskRequest(task_id=task_id, reason="model")
        reply = self.world.call(lambda: self.scheduler.CancelTask(request))
        self.expect(reply, self.model.cancel(task_id), f"cancel {task_id}")
        if reply.code == OK:
            self.expect_task(reply.value, "cancel")

    @rule(
        lease=leases,
        outcome=st.sampled_from(["as_told", "as_told", *sorted(OUTCOMES)]),
        foreign=st.booleans(),
        variant=st.sampled_from(REPORT_VARIANTS),
    )
    def report(self, lease: Lease, outcome: str, foreign: bool, variant: str) -> None:
        """`as_told`: what a well-behaved host reports, cancelled once told to cancel."""
        if outcome == "as_told":
            outcome = "cancelled" if self.model.attempts[lease.lease_id].cancel else "done"
        host = self._caller(lease, foreign)
        task_id, attempt = lease.task_id, lease.attempt
        if variant == "wrong_attempt":
            attempt += 1
        elif variant == "other_task":
            task_id = next((t for t in self.model.tasks if t != lease.task_id), task_id)
        elif variant == "unknown_task":
            task_id = str(uuid.uuid4())
        request = lease_pb2.ReportResultRequest(
            task_id=task_id,
            attempt=attempt,
            lease_id=lease.lease_id,
            outcome=OUTCOMES[outcome],
            result=task_pb2.TaskResult(error=f"model {outcome}"),
        )
        reply = self.world.call(lambda: self.world.hosts[host].c.lease.ReportResult(request))
        want = self.model.report(host, lease.lease_id, task_id, attempt, outcome)
        COVERAGE[f"report {outcome} {variant} {'foreign' if foreign else 'own'} {want.name}"] += 1
        self.expect(reply, want, f"report {outcome} on {lease} as {host} ({variant})")
        if reply.code == OK:
            self.expect_task(reply.value, "report")

    @precondition(lambda self: any(a.state == "active" for a in self.model.attempts.values()))
    @rule(
        data=st.data(),
        step=st.sampled_from(["renew", "report", "release", "lost", "expire", "overrun"]),
    )
    def live(self, data: st.DataObject, step: str) -> None:
        """A live lease renewed, reported as told, released, expired or overrun: the steps that
        land, drawn often enough that every run writes every kind of event (the rules
        above draw from all leases, most of them dead after a few steps)."""
        # In the order of the steps that made them (lease ids differ from run to run).
        live = sorted(
            (a for a in self.model.attempts.values() if a.state == "active"),
            key=lambda a: (self.model.tasks[a.task_id].seq, a.attempt),
        )
        a = data.draw(st.sampled_from(live), label="lease")
        lease = Lease(a.task_id, a.attempt, a.lease_id, a.host, a.serial)
        if step == "renew":
            self.renew([lease], False, False)
        elif step == "report":
            self.report(lease, "as_told", False, "exact")
        elif step in ("release", "lost"):
            self.release(lease, False, lost=step == "lost")
        else:
            self.expire(lease, overrun=step == "overrun")

    @rule(lease=leases, foreign=st.booleans(), lost=st.booleans())
    def release(self, lease: Lease, foreign: bool, lost: bool = False) -> None:
        """Given back: as the host drains, or (lost) because its phone was lost mid-run."""
        host = self._caller(lease, foreign)
        reply = self.world.call(
            lambda: self.world.hosts[host].release(lease.lease_id, "model", device_lost=lost)
        )
        want = self.model.release(host, lease.lease_id, lost)
        self.expect(reply, want, f"release {lease} as {host}{' (device lost)' if lost else ''}")

    @rule(lease=leases, overrun=st.sampled_from([False, False, False, False, True]))
    def expire(self, lease: Lease, overrun: bool = False) -> None:
        """The lease runs out; or (overrun) its run passes the task's deadline by more than
        the lease TTL and the sweep ends it."""
        a = self.model.attempts[lease.lease_id]
        if a.state != "active":
            return  # its attempt already ended: moving its expiry means nothing
        if overrun:
            self.world.run(self.world.overrun(lease.lease_id))
            self.model.overrun(a)
            COVERAGE[f"deadline overrun to {self.model.tasks[a.task_id].status}"] += 1
            return
        self.world.run(self.world.expire(lease.lease_id))
        self.model.end(a, "expired")
        COVERAGE[f"expiry to {self.model.tasks[a.task_id].status}"] += 1

    @precondition(lambda self: self.restarts < MAX_RESTARTS and self.model.in_flight())
    @rule()
    def restart(self) -> None:
        self.restarts += 1
        COVERAGE["restart"] += 1
        self.world.run(self.world.restart())

    def _caller(self, lease: Lease, foreign: bool) -> str:
        return next(h for h in DEVICES if h != lease.host) if foreign else lease.host

    # -- after every step ------------------------------------------------------------------

    @invariant()
    def database_matches_the_model_and_the_invariants_hold(self) -> None:
        db = self.world.run(self.world.read_db())
        self._matches_model(db)
        self._invariants(db)

    def _matches_model(self, db: dict[str, list[Any]]) -> None:
        m = self.model
        tasks = {r["task_id"]: (r["status"], r["attempt"], r["cancel"]) for r in db["tasks"]}
        want = {t.task_id: (t.status, t.attempt, t.cancel) for t in m.tasks.values()}
        assert tasks == want, f"tasks (status, attempt, cancel requested): {tasks} != {want}"
        for r in db["tasks"]:
            t = m.tasks[r["task_id"]]
            if t.status in IN_FLIGHT:
                assert (r["host_id"], r["device_serial"]) == (t.host, t.device), t
        attempts = {
            r["lease_id"]: (
                r["task_id"],
                r["attempt"],
                r["host_id"],
                r["device_serial"],
                r["state"],
                r["cancel"],
            )
            for r in db["attempts"]
        }
        want_attempts = {
            a.lease_id: (a.task_id, a.attempt, a.host, a.serial, a.state, a.cancel)
            for a in m.attempts.values()
        }
        assert attempts == want_attempts, f"attempts: {attempts} != {want_attempts}"
        holders = {r["serial"]: r["task_id"] for r in db["devices"]}
        assert holders == m.holders, f"device reservations: {holders} != {m.holders}"

    def _invariants(self, db: dict[str, list[Any]]) -> None:
        """What must hold whatever the model says, read from the database alone."""
        tasks = {r["task_id"]: r for r in db["tasks"]}
        active = Counter(r["task_id"] for r in db["attempts"] if r["state"] == "active")
        assert all(n == 1 for n in active.values()), f"two active attempts: {active}"
        for r in db["attempts"]:
            if r["state"] == "active":
                t = tasks[r["task_id"]]
                assert t["status"] in IN_FLIGHT and t["attempt"] == r["attempt"], (r, t)
        reserved = Counter(r["task_id"] for r in db["devices"] if r["task_id"])
        assert all(n == 1 for n in reserved.values()), f"a task holds two devices: {reserved}"
        for task_id, t in tasks.items():
            in_flight = t["status"] in IN_FLIGHT
            assert in_flight == (active[task_id] == 1), f"in flight without one active attempt: {t}"
            assert in_flight == (reserved[task_id] == 1), f"reservation vs status: {t}"
            if t["status"] == "cancelled":
                assert t["cancel"], f"cancelled without a cancellation request: {t}"
            if t["status"] in TERMINAL:
                seen = self.finished.setdefault(task_id, t["status"])
                assert seen == t["status"], f"terminal status changed: {seen} -> {t}"
        for r in db["devices"]:
            if r["task_id"]:
                t = tasks[r["task_id"]]
                assert (t["host_id"], t["device_serial"]) == (r["host_id"], r["serial"]), (r, t)
        self._terminal_entered_once(db["events"])
        self._events_are_allowed_transitions(db["events"])

    @staticmethod
    def _events_are_allowed_transitions(events: list[Any]) -> None:
        """Each row is allowed by the lifecycle table and starts where the task's previous
        one ended."""
        status: dict[str, str | None] = {}
        for e in events:
            KINDS_SEEN.add(e["kind"])
            before, after = e["from_status"], e["to_status"]
            assert allowed(Event(e["kind"]), _status(before), _status(after)), (
                f"not a transition of the lifecycle table: {dict(e)}"
            )
            assert status.get(e["task_id"]) == before, f"{dict(e)} after {status}"
            status[e["task_id"]] = after

    @staticmethod
    def _terminal_entered_once(events: list[Any]) -> None:
        finished: set[str] = set()
        for e in events:
            assert e["task_id"] not in finished, f"an event after the terminal one: {e}"
            if e["to_status"] in TERMINAL:
                finished.add(e["task_id"])


@pytest.fixture
async def farm(database_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Farm]:
    """Leases that never run out by themselves: only the `expire` rule ends them."""
    # The sweeper's jitter draws from the global `random` while hypothesis generates data in
    # its thread; hypothesis takes that for a strategy using `random` and refuses. Give the
    # sweeper its own generator.
    monkeypatch.setattr(control_plane.sweep, "random", random.Random())
    f = Farm(database_url, SETTINGS)
    await f.start()
    try:
        yield f
    finally:
        await f.stop()


async def test_control_plane_matches_the_reference_state_machine(farm: Farm) -> None:
    """Every step's gRPC codes, task statuses, attempts, cancellation requests and device
    reservations match the reference model of DESIGN.md's table, the invariants hold, and
    every task_events row (of every kind) is a transition the lifecycle table allows."""
    world = World(farm, asyncio.get_running_loop())
    await world.setup()
    machine = type("Machine", (ControlPlaneMachine,), {"world": world})
    config = settings(
        max_examples=EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    # Each round is EXAMPLES new random runs; a round that leaves a kind of event unwritten
    # (rare paths such as a cancel reaching a live attempt) is followed by another, so the
    # check of every kind does not rest on one round's luck.
    for _ in range(COVERAGE_ROUNDS):
        await asyncio.to_thread(run_state_machine_as_test, machine, settings=config)
        missing = {str(e) for e in Event} - KINDS_SEEN
        if not missing:
            break
    print(sorted(COVERAGE.items()))
    assert not missing, f"events never written in {COVERAGE_ROUNDS} rounds: {sorted(missing)}"


def test_the_model_refuses_a_report_from_a_stale_attempt() -> None:
    """A sanity check of the model itself: an expired attempt's report is ABORTED."""
    m = Model()
    m.submit("t", Submission(None, max_attempts=2, priority=0, serial=None))
    ((task, attempt, serial),) = m.acquire("A", ["A1"])
    m.record_lease(Lease(task, attempt, "l1", "A", serial))
    m.end(m.attempts["l1"], "expired")
    assert m.tasks["t"].status == "queued"
    ((_, attempt, _),) = m.acquire("A", ["A1"])
    m.record_lease(Lease(task, attempt, "l2", "A", "A1"))
    assert m.report("A", "l1", "t", 1, "done") == ABORTED
    assert m.report("A", "l2", "t", 2, "done") == OK
    assert m.tasks["t"].status == "done"
