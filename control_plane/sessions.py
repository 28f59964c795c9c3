"""Interactive sessions: a client's `Scheduler.OpenSession` stream, paired with its host's
`Lease.SessionActions` call (control_plane.session_hosts).

A session is a task of the `session` kind (one attempt: a session cannot be rerun on another
phone behind its client's back). Its client's stream queues it and follows it until its host
joins; then each client message is relayed to the host as one action and the host's step is
relayed back. The two calls meet in the hub's `Sessions` (control_plane.rendezvous) of the
client's replica, by task id: the client's side registers before the task can be assigned,
and the task is submitted with the replica's id (session_relays). No database work per
action.

One action at a time: the client's next message is read only once the one before was
answered, so actions sent without waiting are run in order, each answered in turn, and what
is not read yet waits in the client's call (gRPC's flow control), never in this replica.
Once the host joined, the task reading the client's call relays each message itself: the
action written to the host's call, its step read and written to the client's as the bytes
the host sent (control_plane.rendezvous, control_plane.session_wire: no queue, no task, no
re-encoding of the step). A message that is not a valid action is answered `refused` (its
code and one line) and the session goes on. The task's end is always the host's report (or
the sweep's), never this module's: the relay tells the host how its client left, and ends
the host's call when the task stops running (the sweep expired its lease). A client's
`close` ends it as closing its side does, but at once (no CLOSE_GRACE). The client's last
response is the finished task; its stream then ends OK once the client closed its side,
cancelled, or sent anything more, or after the idle timeout: a client that writes after the
end still reads the end rather than a write refused by gRPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import structlog

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_common.device_selector import HOST_LABEL
from control_plane import validate
from control_plane.convert import task_to_pb
from control_plane.domain import NewTask, Principal, Role, Task, TaskId
from control_plane.errors import (
    AmcError,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    SessionLimit,
    Unavailable,
)
from control_plane.library import check_references
from control_plane.lifecycle import TaskStatus
from control_plane.rendezvous import HOST_GONE, IDLE, Relay, Writer
from control_plane.rpc import (
    Context,
    TaskServicer,
    first_message,
    principal,
)
from control_plane.session_wire import Queued, client_action, refused, relay_action, until_close
from control_plane.snapshots import check_snapshots, selector_labels

log = structlog.get_logger(__name__)

Reader = Callable[[TaskId], Awaitable[Task]]
# Cancels of sessions whose client left before its host joined, run past the call's end.
_background: set[asyncio.Task[None]] = set()
_RANDOM = random.Random()
# Seconds a session whose client's messages ended waits for that call's cancellation (a
# vanished client) before it takes the end for a close: gRPC delivers the two apart, the
# cancellation within 17 ms in 60 tries on loopback, most within 0.1 ms.
CLOSE_GRACE = 0.1
NO_PHONE_YET = "the session has no phone yet: send actions once a response's task is DISPATCHED"


class ClientGone(Exception):
    """The client's call is over: a write to it found it ended."""


def end_session(relay: Relay, how: lease_pb2.SessionEnd) -> None:
    """Tell the host how its client left (once)."""
    if not relay.ended:
        relay.ended = True
        relay.to_host.put_nowait(lease_pb2.SessionActionsResponse(end=how))


def new_session_task(o: scheduler_pb2.SessionOpen, team: str) -> NewTask:
    session = task_pb2.Session(
        idle_timeout=o.idle_timeout, adb=o.adb, maintenance=o.maintenance, webdriver=o.webdriver
    )
    spec = task_pb2.TaskSpec(session=session)
    if o.HasField("record_screen"):
        spec.record_screen.CopyFrom(o.record_screen)
    spec.apps.extend(o.apps)
    spec.start_snapshot = o.start_snapshot
    return NewTask(
        spec=spec.SerializeToString(deterministic=True),
        request_id=o.request_id or None,
        selector_serial=o.selector.serial or None,
        selector_labels=selector_labels(o.selector.labels, o.start_snapshot),
        priority=o.priority,
        max_attempts=1,
        metadata=dict(o.metadata),
        queue_timeout=o.queue_timeout.ToTimedelta() if o.HasField("queue_timeout") else None,
        deadline=o.max_duration.ToTimedelta() if o.HasField("max_duration") else None,
        fairness_key=o.fairness_key or team,
        maintenance=o.maintenance,
    )


async def _first(*aws: Awaitable[Any], timeout: float | None) -> tuple[int, Any] | None:
    """(index, result) of the first of `aws` to finish (the lowest index among those that
    finished together), or None after `timeout`; the others are cancelled."""
    futures = [asyncio.ensure_future(a) for a in aws]
    try:
        done, _ = await asyncio.wait(futures, timeout=timeout, return_when="FIRST_COMPLETED")
    finally:
        for f in futures:
            if not f.done():
                f.cancel()
    for index, f in enumerate(futures):
        if f in done:
            return index, f.result()
    return None


def _response(task: Task) -> scheduler_pb2.OpenSessionResponse:
    return scheduler_pb2.OpenSessionResponse(task=task_to_pb(task))


def _joined_as_read(relay: Relay, task: Task, changed: asyncio.Event) -> bool:
    """The host joined after `task` was read DISPATCHED, and nothing changed since: the
    join checked its lease live after that read, so it is told as read (no read again)."""
    return relay.joined.is_set() and task.status is TaskStatus.DISPATCHED and not changed.is_set()


def _is_session(task: Task) -> bool:
    kind: str | None = task_pb2.TaskSpec.FromString(task.spec).WhichOneof("kind")
    return kind == "session"


class ClientSession:
    """The client's side of one session: one OpenSession call."""

    def __init__(self, service: TaskServicer, read: Reader, context: Context) -> None:
        self._svc = service
        self._read = read
        self._context = context
        self._finished = False
        self._out: Writer = Writer(context)
        # The task as the session's watch last read it, while the phone was its.
        self._seen: Task | None = None

    async def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """Over gRPC the session writes on its call itself (relayed steps as their bytes),
        so this yields nothing; called in process (the console: a context with no
        `write`), its responses are yielded."""
        if hasattr(self._context, "write"):
            await self._serve(requests)
            return
        queued = Queued()
        self._out = Writer(queued)
        serving = asyncio.create_task(self._serve(requests))
        try:
            async for response in queued.until(serving):
                yield response
        finally:
            serving.cancel()
        serving.result()

    async def _send(self, response: Any) -> None:
        if not await self._out.write(response):
            raise ClientGone

    async def _serve(self, requests: AsyncIterator[Any]) -> None:
        first = await first_message(
            requests, "open", "required: the first message asks for the phone"
        )
        o = validate.session_open(first)
        who = principal()
        if o.maintenance and who.role not in (None, Role.OPERATOR):
            raise PermissionDenied(
                f"role '{who.role}' may not open a maintenance session: it is for operators"
            )
        store, hub = self._svc.store, self._svc.hub
        await self._within_limit(who)
        opened = task_pb2.TaskSpec(apps=o.apps, start_snapshot=o.start_snapshot)
        await check_references(store, [("open", opened)])
        await check_snapshots(store, [("open", opened)])
        task, created = await store.tasks.submit(
            who.caller, new_session_task(o, who.team), name=who.name, relay=hub.replica
        )
        if not created:
            await self._send(_response(await self._opened_before(task, o.request_id)))
            return
        # Before anything can assign it: no await between the commit and this line.
        relay = hub.sessions.open(task.task_id, self._out)
        relay.owner, relay.adb = who.caller, o.adb
        self._svc.effects.submitted([task])
        if o.maintenance:
            # Its phone (cordoned, or of a drained host) has no parked Acquire indexed under
            # it: the host's Acquires look again.
            hub.devices_freed({o.selector.labels[HOST_LABEL]})
        log.info("session opened", task_id=str(task.task_id))
        idle = o.idle_timeout.ToTimedelta().total_seconds()
        pump = asyncio.create_task(relay.pump(until_close(requests, relay)))
        try:
            with hub.watch(task.task_id) as changed:
                await self._until_joined(task.task_id, relay, changed)
                if not self._finished:
                    await self._joined(relay, changed, idle)
            hub.sessions.close(task.task_id)  # over: no host joins it any more
            await self._linger(relay, idle)
        except ClientGone:
            pass  # its call ended: abandoned, as one cancelled
        except AmcError:
            # Refused mid-call: withdrawn before the refusal is answered.
            if not relay.joined.is_set():
                self._finished = True
                await self._cancel(task.task_id, "session abandoned: refused before it started")
            raise
        finally:
            # Never mid-write (the call's next write would find it in flight): a pump
            # handing an action on ends by itself, its call being over.
            relay.stop_pump(pump)
            hub.sessions.close(task.task_id)
            if not self._finished:
                self._abandon(relay)

    async def _within_limit(self, who: Principal) -> None:
        """A token's sessions queued or running stay within --max-sessions-per-token."""
        most = self._svc.settings.max_sessions_per_token
        if not most or who.token_id is None:
            return
        if await self._svc.store.tasks.open_sessions(who.caller) >= most:
            raise SessionLimit(
                f"this token has {most} sessions queued or running, the most it may have"
                " (--max-sessions-per-token): close one first"
            )

    async def _opened_before(self, task: Task, request_id: str) -> Task:
        """The session a request id opened before: its end, if it ended; else refused."""
        if not _is_session(task):
            raise InvalidArgument(
                "open.request_id", f"already used for task {task.task_id}, not a session"
            )
        task = await self._read(task.task_id)
        if not task.status.terminal:
            raise FailedPrecondition(
                f"request_id {request_id!r} opened session {task.task_id} already, which is"
                f" {task.status}: a session is followed on the call that opened it (CancelTask"
                " ends it)"
            )
        self._finished = True
        return task

    async def _until_joined(self, task_id: TaskId, relay: Relay, changed: asyncio.Event) -> None:
        """The task as it changes, until its host joined (or it finished); an action sent
        meanwhile is refused (FAILED_PRECONDITION), and the session goes on waiting."""
        refresh = self._svc.settings.watch_refresh.total_seconds()
        closed, last, read = False, None, True
        while True:
            if read:
                changed.clear()
                task = await self._read(task_id)
                # Dispatched is said once the host joined: then actions can be sent.
                ready = relay.joined.is_set() or task.status is not TaskStatus.DISPATCHED
                if task != last and ready:
                    await self._send(_response(task))
                    last = task
                if task.status.terminal:
                    self._finished = True
                    return
                if relay.joined.is_set() and task.status is TaskStatus.DISPATCHED:
                    return
            # The inbox first: a message is never lost to a wake-up that came with it.
            waits: list[Awaitable[Any]] = [] if closed else [relay.from_client.get()]
            waits.append(changed.wait())
            if not relay.joined.is_set():
                waits.append(relay.joined.wait())
            got = await _first(*waits, timeout=refresh)
            if (
                not closed
                and (got is None or got[0] != 0)
                and _joined_as_read(relay, task, changed)
            ):
                await self._send(_response(task))
                return
            read = True
            if got is None or closed or got[0] != 0 or got[1] is HOST_GONE:
                continue
            if got[1] is None or isinstance(got[1], BaseException):
                closed = True  # the client left before the phone was ready: withdraw
                await self._cancel(task_id, "session closed by its client before it started")
                continue
            read = False  # a refusal changes nothing to read again
            try:
                client_action(got[1])
                raise FailedPrecondition(NO_PHONE_YET)
            except AmcError as exc:
                await self._send(refused(exc))
            relay.answered()

    async def _joined(self, relay: Relay, changed: asyncio.Event, idle: float) -> None:
        """The session's actions and steps, then its finished task."""
        watch = asyncio.create_task(self._watch_task(relay, changed))
        try:
            how = await relay.relay(functools.partial(relay_action, relay), idle)
        finally:
            watch.cancel()
        if how is IDLE:
            log.info("session idle: ended", task_id=str(relay.task_id), idle=idle)
            end_session(relay, lease_pb2.SESSION_END_IDLE)
        elif how is None:
            # A client that vanished (its call cancelled) may look like one that closed
            # its side: the end of its messages comes first, the cancellation of this
            # call a moment later. Only a close that outlives the moment is a close; one
            # the client said (`close`) is one at once.
            if not relay.said_close:
                await asyncio.sleep(CLOSE_GRACE)
            end_session(relay, lease_pb2.SESSION_END_CLOSED)
        elif isinstance(how, BaseException):
            end_session(relay, lease_pb2.SESSION_END_ABANDONED)
        # HOST_GONE: the host stopped (cancelled, lease lost, deadline); its report ends it.
        task = await self._terminal(TaskId(relay.task_id), changed)
        self._finished = True
        await self._send(_response(task))

    async def _watch_task(self, relay: Relay, changed: asyncio.Event) -> None:
        """Ends the relay once its task no longer runs (the sweep expired its lease, a
        report came by another way): re-read when it changed, and every lease TTL or so in
        case a notification was missed."""
        period = self._svc.settings.lease_ttl.total_seconds()
        task_id = TaskId(relay.task_id)
        while not relay.host_gone.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), period * _RANDOM.uniform(0.9, 1.1))
            changed.clear()
            try:
                task = await self._read(task_id)
            except AmcError:
                continue
            except asyncio.CancelledError:
                changed.set()  # what woke it is still to be read, by _terminal
                raise
            self._seen = task
            if task.status is not TaskStatus.DISPATCHED:
                log.info("session's task no longer runs: relay ended", task_id=str(task_id))
                relay.host_left()

    async def _terminal(self, task_id: TaskId, changed: asyncio.Event) -> Task:
        """The task once its host (or the sweep) ended it: read when it changed (one the watch
        heard and did not read is still set), or every watch_refresh in case one was missed."""
        refresh = self._svc.settings.watch_refresh.total_seconds()
        loop = asyncio.get_running_loop()
        until = loop.time() + 4 * self._svc.settings.lease_ttl.total_seconds()
        task = self._seen
        while task is None or not task.status.terminal:
            if (left := until - loop.time()) <= 0:
                raise Unavailable("session over; its result is not recorded yet: WatchTask")
            await _first(changed.wait(), timeout=min(left, refresh))
            changed.clear()
            task = await self._read(task_id)
        return task

    async def _linger(self, relay: Relay, idle: float) -> None:
        """After the last response: until the client closes its side, cancels or sends
        anything more (read and dropped: the finished task answered it), or for the idle
        timeout. gRPC refuses a client's write once the call is over, and its next read
        then says INTERNAL rather than how the session ended."""
        relay.answered()  # by the finished task, if a message was not
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(idle):
                while not relay.client_done:
                    if await relay.from_client.get() is not HOST_GONE:
                        return

    async def _cancel(self, task_id: TaskId, reason: str) -> None:
        code, task, notice = await self._svc.store.tasks.cancel(task_id, reason)
        self._svc.effects.cancelled(code, task, notice)

    def _abandon(self, relay: Relay) -> None:
        """The call ended before the task did: the client vanished, or was refused."""
        if relay.joined.is_set():
            end_session(relay, lease_pb2.SESSION_END_ABANDONED)
            return
        # Cancelled with the call: the withdrawal runs on by itself.
        why = "session abandoned: its client left before it started"
        job = asyncio.get_running_loop().create_task(
            self._cancel_quietly(TaskId(relay.task_id), why)
        )
        _background.add(job)
        job.add_done_callback(_background.discard)

    async def _cancel_quietly(self, task_id: TaskId, reason: str) -> None:
        try:
            await self._cancel(task_id, reason)
        except Exception:
            log.warning("could not withdraw an abandoned session", task_id=str(task_id))
