"""The clients' side of the run: a submitter that keeps work queued, and cancellers that
cancel about a third of the tasks at a random moment of their life.

Cancellation moments: `queued` (at once after the submit), `just_assigned` (as soon as a
watch sees it assigned or dispatched), `mid_run` (a random time into the run) and
`before_last_step` (when the attempt's action log shows every device action before the
last step finished). Besides, when a fault cuts a host off, a task or two running there
are cancelled (`host_faulted`): the host cannot hear of it, so the lease runs out with
the cancellation pending. The clients reach the replicas through gRPC's own round-robin
balancing over both addresses, so a dead replica costs them retries only.

Some tasks carry limits: a deadline (a fifth of them; for a long plan often shorter than
its run, so the host stops it at a step boundary and it fails "deadline exceeded") and a
queue timeout (a tenth; a few seconds, so some fail "queue timeout" while the backlog is
deep).

With a fleet, tasks carry selectors (`Selectors`): none, the agents' pool, the fleet's
pool, a row of hosts, one host's rack, one phone's serial (alone or with its rack), so that
dispatch has to find the one parked host, or one of a few, among all of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any, TypeVar

import grpc
from google.protobuf import duration_pb2

from amc.v1 import scheduler_pb2, task_pb2
from amc_common import statuses
from amc_common.device_selector import HOST_LABEL
from chaos_lib.clients import replicas
from chaos_lib.farm import FleetHost
from chaos_lib.specs import Plan, random_plan

T = TypeVar("T")
MOMENTS = ("queued", "just_assigned", "mid_run", "before_last_step")
RETRY_CODES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNKNOWN}
)
IN_FLIGHT = (task_pb2.TASK_STATUS_ASSIGNED, task_pb2.TASK_STATUS_DISPATCHED)
TERMINAL = statuses.numbers(statuses.TERMINAL, task_pb2.TaskStatus)


def _duration(value: float | None) -> duration_pb2.Duration | None:
    if value is None:
        return None
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(value * 1e9))
    return d


def status_name(value: int) -> str:
    return task_pb2.TaskStatus.Name(value).removeprefix("TASK_STATUS_").lower()


# The two teams whose tasks share the phones (fairness keys), and each one's share of the
# submissions; their weights in fair_shares are chaos.py's (FAIR_SHARES).
TEAMS = {"team-a": 0.6, "team-b": 0.4}
# The backlog: tasks for racks no host has (selector kind "unmatched"), queued at the
# start through SubmitTasks and left queued through every fault, cancelled at the quiesce.
UNMATCHED_RACKS = 50
BACKLOG_BATCH = 500
BACKLOG_MOMENT = "backlog"


@dataclass
class Submitted:
    request_id: str
    plan: Plan
    moment: str | None  # when it is to be cancelled; None: never
    selector: str = "none"  # what its selector targets (Selectors.KINDS, or "unmatched")
    team: str = ""  # its fairness key
    deadline: float | None = None  # seconds, when the task has one
    queue_timeout: float | None = None
    request: scheduler_pb2.SubmitTaskRequest | None = None
    task_id: str = ""
    submitted_at: float = 0.0  # wall clock when the submit was acknowledged
    cancel_sent_at: float | None = None
    cancel_answer: str = ""  # the status the answer carried, or the refusal's code
    cancel_acked: bool = False
    cancel_acked_at: float | None = None  # wall clock when the answer came
    # CancelTask calls made for it: after a retry, an earlier try may have landed unanswered
    # (e.g. its commit went through as PostgreSQL crashed).
    cancel_tries: int = 0
    cancel_note: str = ""


@dataclass
class Counters:
    submit_retries: int = 0
    cancel_retries: int = 0
    watch_reconnects: int = 0
    # Codes a client should never see from a healthy control plane (INTERNAL and such).
    unexpected: dict[str, int] = field(default_factory=dict)


class Selectors:
    """Where tasks may run, drawn at random over the fleet's hosts."""

    # kind -> share of the tasks
    KINDS = {
        "none": 0.15,
        "agents": 0.15,  # the three agent processes (label pool=agents)
        "pool": 0.1,
        "row": 0.15,
        "rack": 0.25,
        "serial": 0.1,
        "rack+serial": 0.1,
    }

    def __init__(self, hosts: list[FleetHost], rng: random.Random) -> None:
        self._hosts = hosts
        self._rng = rng

    def draw(self) -> tuple[str, task_pb2.DeviceSelector | None]:
        if not self._hosts:
            return "none", None
        kind = self._rng.choices(list(self.KINDS), weights=list(self.KINDS.values()))[0]
        host = self._rng.choice(self._hosts)
        serial = self._rng.choice(host.serials)
        selector = task_pb2.DeviceSelector
        match kind:
            case "agents":
                return kind, selector(labels={"pool": "agents"})
            case "pool":
                return kind, selector(labels={"pool": "fleet"})
            case "row":
                return kind, selector(labels={"row": host.row})
            case "rack":
                return kind, selector(labels={"rack": host.rack})
            case "serial":
                return kind, selector(serial=serial)
            case "rack+serial":
                return kind, selector(serial=serial, labels={"rack": host.rack})
        return "none", None


class ActionTail:
    """Follows the agents' action logs while the run goes on (for `before_last_step`): a
    waiter reads its own host's log only, so what the tail costs grows with the waiters,
    not with the farm (reading all 500 fleet hosts' logs every 10 ms per waiter took most
    of a core of the harness in a soak)."""

    def __init__(self, logs: dict[str, Path]) -> None:
        self._logs = logs
        self._offsets = dict.fromkeys(logs, 0)
        self._partial = dict.fromkeys(logs, "")
        self.starts: dict[tuple[str, str], list[float]] = {}

    def poll(self, host: str) -> None:
        """Read what `host`'s action log gained since the last read."""
        path = self._logs.get(host)
        if path is None:
            return
        try:
            with path.open(encoding="utf-8") as f:
                f.seek(self._offsets[host])
                chunk = f.read()
                self._offsets[host] = f.tell()
        except FileNotFoundError:
            return
        lines = (self._partial[host] + chunk).split("\n")
        self._partial[host] = lines.pop()
        for line in lines:
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record["action"] == "clean":  # a clean between leases, no task's
                    continue
                key = (host, record["serial"])
                self.starts.setdefault(key, []).append(record["started_wall"])

    def count_since(self, host: str, serial: str, since: float) -> int:
        return sum(1 for s in self.starts.get((host, serial), ()) if s >= since)


class Workload:
    def __init__(
        self,
        addresses: list[str],
        token: str | None,
        rng: random.Random,
        tail: ActionTail,
        backlog: Callable[[], int | None],
        target_backlog: int,
        cancel_share: float = 1 / 3,
        selectors: Selectors | None = None,
    ) -> None:
        self._channel, self._stub = replicas(addresses, token)
        self._rng = rng
        self._tail = tail
        self._backlog = backlog
        self._target = target_backlog
        self._cancel_share = cancel_share
        self._selectors = selectors
        self.tasks: list[Submitted] = []
        self.unmatched: list[Submitted] = []  # the backlog (also in `tasks`)
        self.counters = Counters()
        self._cancellers: set[asyncio.Task[None]] = set()
        self._prefix = uuid.uuid4().hex[:8]

    async def close(self) -> None:
        await self._channel.close()

    # -- calls -------------------------------------------------------------------------------

    async def _call(
        self, call: Callable[[], Awaitable[T]], counter: str, within: float = 60.0
    ) -> T:
        """`call()` until it succeeds, retrying what a client should retry; other errors
        are raised. Submit and cancel are idempotent, so a retry after a lost answer is safe."""
        deadline = time.monotonic() + within
        delay = 0.05
        while True:
            try:
                return await call()
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code not in RETRY_CODES or time.monotonic() > deadline:
                    raise
                if code is grpc.StatusCode.UNKNOWN:
                    self._unexpected(code)
                setattr(self.counters, counter, getattr(self.counters, counter) + 1)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    def _unexpected(self, code: grpc.StatusCode) -> None:
        self.counters.unexpected[code.name] = self.counters.unexpected.get(code.name, 0) + 1

    # -- submitting --------------------------------------------------------------------------

    async def submit_forever(self) -> None:
        while True:
            backlog = self._backlog()
            if backlog is not None and backlog >= self._target:
                await asyncio.sleep(0.1)
                continue
            await self.submit_one()
            await asyncio.sleep(self._rng.uniform(0.0, 0.1))

    @property
    def open_backlog(self) -> int:
        """Backlog tasks not cancelled yet: queued, since no host can take them."""
        return sum(1 for s in self.unmatched if not s.cancel_acked)

    async def submit_backlog(self, count: int) -> None:
        """`count` tasks for racks no host has, over UNMATCHED_RACKS selectors and both
        teams, in SubmitTasks batches: a backlog nobody takes, beside the work."""
        for lo in range(0, count, BACKLOG_BATCH):
            batch = []
            for i in range(lo, min(count, lo + BACKLOG_BATCH)):
                team = list(TEAMS)[i % len(TEAMS)]
                item = Submitted(
                    f"chaos-{self._prefix}-backlog-{i}",
                    random_plan(self._rng),
                    BACKLOG_MOMENT,
                    "unmatched",
                    team,
                )
                item.request = scheduler_pb2.SubmitTaskRequest(
                    request_id=item.request_id,
                    spec=item.plan.spec,
                    selector=task_pb2.DeviceSelector(
                        labels={"rack": f"absent-r{i % UNMATCHED_RACKS:02d}"}
                    ),
                    max_attempts=2,
                    metadata={"chaos": "1", "moment": BACKLOG_MOMENT, "selector": "unmatched"},
                    fairness_key=team,
                )
                batch.append(item)
            self.tasks += batch
            self.unmatched += batch
            request = scheduler_pb2.SubmitTasksRequest(tasks=[b.request for b in batch])
            try:
                answer = await self._call(
                    lambda r=request: self._stub.SubmitTasks(r, timeout=30), "submit_retries"
                )
            except grpc.aio.AioRpcError as exc:
                self._unexpected(exc.code())
                continue  # resubmit_unacknowledged learns their ids at the end
            now = time.time()
            for item, task in zip(batch, answer.tasks, strict=True):
                item.task_id, item.submitted_at = task.task_id, now

    async def cancel_backlog(self, concurrency: int = 16) -> None:
        """At the quiesce: cancel every backlog task (queued all along, so each ends
        cancelled; a cancellation requested is what invariant 3 asks of it)."""
        todo = [s for s in self.unmatched if s.task_id and not s.cancel_acked]
        queue = iter(todo)

        async def worker() -> None:
            for item in queue:
                await self._cancel(item)

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(todo)) or 1)))

    async def submit_one(self) -> Submitted:
        plan = random_plan(self._rng)
        moment = self._rng.choice(MOMENTS) if self._rng.random() < self._cancel_share else None
        kind, selector = self._selectors.draw() if self._selectors else ("none", None)
        team = self._rng.choices(list(TEAMS), weights=list(TEAMS.values()))[0]
        item = Submitted(f"chaos-{self._prefix}-{len(self.tasks)}", plan, moment, kind, team)
        if self._rng.random() < 0.2:
            item.deadline = (
                self._rng.uniform(1.0, 4.0) if plan.long else self._rng.choice([1.0, 2.0, 30.0])
            )
        if self._rng.random() < 0.1:
            item.queue_timeout = self._rng.uniform(1.0, 10.0)
        self.tasks.append(item)
        request = scheduler_pb2.SubmitTaskRequest(
            request_id=item.request_id,
            spec=plan.spec,
            selector=selector,
            max_attempts=self._rng.choice([2, 3, 3, 4, 5]),
            priority=self._rng.choice([0, 0, 0, 1, 5]),
            metadata={"chaos": "1", "moment": moment or "", "selector": kind},
            deadline=_duration(item.deadline),
            queue_timeout=_duration(item.queue_timeout),
            fairness_key=team,
        )
        item.request = request
        try:
            task = await self._submit(request)
        except grpc.aio.AioRpcError as exc:
            self._unexpected(exc.code())
            return item
        item.task_id, item.submitted_at = task.task_id, time.time()
        if moment is not None:
            canceller = asyncio.create_task(self._cancel_at_moment(item, task))
            self._cancellers.add(canceller)
            canceller.add_done_callback(self._cancellers.discard)
        return item

    async def submit_pinned(self, host: str, serial: str) -> Submitted:
        """A task for one phone of one agent (its serial and the `host_id` label every
        device has; the agents' phones share serials), never cancelled: after the phone
        faults, each phone that had one must take work again, on that host (invariant 10)."""
        plan = random_plan(self._rng)
        while plan.fails_on_purpose:
            plan = random_plan(self._rng)
        item = Submitted(f"chaos-{self._prefix}-{len(self.tasks)}", plan, None, "phone_back")
        item.team = next(iter(TEAMS))
        self.tasks.append(item)
        item.request = scheduler_pb2.SubmitTaskRequest(
            request_id=item.request_id,
            spec=plan.spec,
            selector=task_pb2.DeviceSelector(serial=serial, labels={HOST_LABEL: host}),
            max_attempts=5,
            metadata={"chaos": "1", "moment": "", "selector": "phone_back"},
            fairness_key=item.team,
        )
        task = await self._submit(item.request)
        item.task_id, item.submitted_at = task.task_id, time.time()
        return item

    async def submit_emulator(
        self, snapshot: str, labels: dict[str, str], serial: str = ""
    ) -> Submitted:
        """A task for an emulator pool (`labels`; one instance of it with `serial`) that
        starts from `snapshot`, never cancelled, with a plan that does not fail on purpose
        and runs on the emulator's phone (no `touch`: a shell the double's phone lacks), so
        that it ends done, after its emulator died under it too (invariant 14)."""
        plan = random_plan(self._rng)
        while plan.fails_on_purpose or "touch " in str(plan.spec):
            plan = random_plan(self._rng)
        item = Submitted(f"chaos-{self._prefix}-{len(self.tasks)}", plan, None, "emulator")
        item.team = self._rng.choices(list(TEAMS), weights=list(TEAMS.values()))[0]
        self.tasks.append(item)
        spec = task_pb2.TaskSpec()
        spec.CopyFrom(plan.spec)
        spec.start_snapshot = snapshot
        item.request = scheduler_pb2.SubmitTaskRequest(
            request_id=item.request_id,
            spec=spec,
            selector=task_pb2.DeviceSelector(serial=serial, labels=labels),
            max_attempts=3,
            metadata={"chaos": "1", "moment": "", "selector": "emulator", "snapshot": snapshot},
            fairness_key=item.team,
        )
        task = await self._submit(item.request)
        item.task_id, item.submitted_at = task.task_id, time.time()
        return item

    async def resubmit_unacknowledged(self) -> None:
        """After the run: learn the ids of submits whose answers never came (same request
        id, so nothing new is created if the first one did reach the database)."""
        for item in self.tasks:
            if item.task_id:
                continue
            request = item.request or scheduler_pb2.SubmitTaskRequest(
                request_id=item.request_id, spec=item.plan.spec
            )
            item.task_id = (await self._submit(request)).task_id

    async def _submit(self, request: scheduler_pb2.SubmitTaskRequest) -> task_pb2.Task:
        return await self._call(lambda: self._stub.SubmitTask(request, timeout=5), "submit_retries")

    def cancel_on_host(self, host_id: str, most: int = 2) -> None:
        """A fault just cut `host_id` off: cancel a few of the tasks running there."""
        canceller = asyncio.create_task(self._cancel_on_host(host_id, most))
        self._cancellers.add(canceller)
        canceller.add_done_callback(self._cancellers.discard)

    async def _cancel_on_host(self, host_id: str, most: int) -> None:
        request = scheduler_pb2.ListTasksRequest(statuses=IN_FLIGHT, host_id=host_id, page_size=50)
        try:
            listed = await self._call(
                lambda: self._stub.ListTasks(request, timeout=5), "cancel_retries"
            )
        except grpc.aio.AioRpcError as exc:
            self._unexpected(exc.code())
            return
        by_id = {s.task_id: s for s in self.tasks if s.task_id and s.moment is None}
        mine = [by_id[t.task_id] for t in listed.tasks if t.task_id in by_id]
        for item in self._rng.sample(mine, min(most, len(mine))):
            item.moment = "host_faulted"
            await self._cancel(item)

    async def wait_cancellers(self, within: float) -> None:
        if self._cancellers:
            await asyncio.wait(set(self._cancellers), timeout=within)
        for task in set(self._cancellers):
            task.cancel()

    # -- cancelling --------------------------------------------------------------------------

    async def _cancel_at_moment(self, item: Submitted, task: task_pb2.Task) -> None:
        try:
            if item.moment == "queued":
                await self._cancel(item)
                return
            seen = await self._watch_until(
                item.task_id, lambda t: t.status in IN_FLIGHT or t.status in TERMINAL
            )
            if seen is None or seen.status in TERMINAL:
                item.cancel_note = "finished before its moment"
                return
            if item.moment == "mid_run":
                longest = 4.0 if item.plan.long else 1.5
                await asyncio.sleep(self._rng.uniform(0.05, longest))
            elif item.moment == "before_last_step":
                if not await self._before_last_step(item, seen):
                    return
            await self._cancel(item)
        except asyncio.CancelledError:
            item.cancel_note = item.cancel_note or "canceller stopped at the end of the run"
            raise

    async def _before_last_step(self, item: Submitted, seen: task_pb2.Task) -> bool:
        dispatched = await self._watch_until(
            item.task_id,
            lambda t: t.status == task_pb2.TASK_STATUS_DISPATCHED or t.status in TERMINAL,
        )
        if dispatched is None or dispatched.status in TERMINAL:
            item.cancel_note = "finished before its moment"
            return False
        # Updated_at of the first in-flight state seen: the assignment or its acknowledgement,
        # before the attempt's first action either way.
        first = seen if seen.attempt == dispatched.attempt else dispatched
        since = first.updated_at.ToDatetime(tzinfo=UTC).timestamp()
        need = item.plan.device_actions_before_last
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self._tail.poll(dispatched.host_id)
            if self._tail.count_since(dispatched.host_id, dispatched.device_serial, since) >= need:
                return True
            await asyncio.sleep(0.01)
        item.cancel_note = "last step never came"
        return False

    async def _cancel(self, item: Submitted) -> None:
        request = scheduler_pb2.CancelTaskRequest(
            task_id=item.task_id, reason=f"chaos: {item.moment}"
        )
        item.cancel_sent_at = time.time()

        def cancel() -> Awaitable[task_pb2.Task]:
            item.cancel_tries += 1
            return self._stub.CancelTask(request, timeout=5)  # type: ignore[no-any-return]

        try:
            task = await self._call(cancel, "cancel_retries")
        except grpc.aio.AioRpcError as exc:
            item.cancel_answer = exc.code().name
            if exc.code() is not grpc.StatusCode.FAILED_PRECONDITION:
                self._unexpected(exc.code())
            return
        item.cancel_acked, item.cancel_acked_at = True, time.time()
        item.cancel_answer = status_name(task.status)

    async def _watch_until(
        self, task_id: str, done: Callable[[task_pb2.Task], bool], within: float = 120.0
    ) -> task_pb2.Task | None:
        """The first state of the task `done` accepts, following WatchTask (reopened when
        it breaks); None if the deadline passes."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            call: Any = self._stub.WatchTask(scheduler_pb2.WatchTaskRequest(task_id=task_id))
            try:
                async for task in call:
                    if done(task):
                        call.cancel()
                        return task  # type: ignore[no-any-return]
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in RETRY_CODES:
                    self._unexpected(exc.code())
                    return None
            self.counters.watch_reconnects += 1
            await asyncio.sleep(0.1)
        return None
