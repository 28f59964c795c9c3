"""Interactive sessions: a client's `Scheduler.OpenSession` stream paired with its host's
`Lease.SessionActions` call.

A session is a task of the `session` kind (one attempt: a session cannot be rerun on
another phone behind its client's back). Its client's stream queues it and follows it
until its host joins; then each client message is relayed to the host as one action and
the host's step is relayed back. The two calls meet in the hub's `Sessions`
(control_plane.rendezvous) of the client's replica, by task id: the client's side
registers before the task can be assigned, and the task is submitted with the replica's
id (session_relays). A host whose call reached another replica has that call relayed: the
replica it reached reads where the client is (the replica's advertised address) and
forwards the host's call, with the host's own credentials, to that replica's
SessionActions over a channel it keeps to it (`Peers`), message for message. No database
work per action; a replica that dies ends the relay, and the host fails the task ("session
relay lost"). The task's end is always the host's report (or the sweep's expiry), never
this module's: the relay only tells the host how its client left.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_common.channel import write_unless_ended
from control_plane import validate, validate_lease
from control_plane.convert import task_to_pb
from control_plane.domain import NewTask, Role, Task, TaskId
from control_plane.errors import (
    AmcError,
    FailedPrecondition,
    LeaseNotCurrent,
    NotLeaseHolder,
    Unavailable,
)
from control_plane.lifecycle import TaskStatus
from control_plane.peers import RelayedCall
from control_plane.rendezvous import HOST_GONE, Relay
from control_plane.rpc import TaskServicer, check_decoded, first_message, principal

log = structlog.get_logger(__name__)

Reader = Callable[[TaskId], Awaitable[Task]]
# Cancels of sessions whose client left before its host joined, run past the call's end.
_background: set[asyncio.Task[None]] = set()
CLIENT_GONE = "the session's client is no longer connected"
# Seconds a session whose client's messages ended waits for that call's cancellation (a
# vanished client) before it takes the end for a close: gRPC delivers the two apart, the
# cancellation within 17 ms in 60 tries on loopback, most within 0.1 ms.
CLOSE_GRACE = 0.1
# Metadata of a host's call relayed by another replica (that replica's id): never relayed on.
RELAYED_BY = "amc-session-relayed-by"


def end_session(relay: Relay, how: lease_pb2.SessionEnd) -> None:
    """Tell the host how its client left (once)."""
    if not relay.ended:
        relay.ended = True
        relay.to_host.put_nowait(lease_pb2.SessionActionsResponse(end=how))


def new_session_task(o: scheduler_pb2.SessionOpen, team: str) -> NewTask:
    spec = task_pb2.TaskSpec(session=task_pb2.Session(idle_timeout=o.idle_timeout))
    if o.HasField("record_screen"):
        spec.record_screen.CopyFrom(o.record_screen)
    return NewTask(
        spec=spec.SerializeToString(deterministic=True),
        selector_serial=o.selector.serial or None,
        selector_labels=dict(o.selector.labels),
        priority=o.priority,
        max_attempts=1,
        metadata=dict(o.metadata),
        queue_timeout=o.queue_timeout.ToTimedelta() if o.HasField("queue_timeout") else None,
        deadline=o.max_duration.ToTimedelta() if o.HasField("max_duration") else None,
        fairness_key=o.fairness_key or team,
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


async def _pump(requests: AsyncIterator[Any], inbox: asyncio.Queue[Any]) -> None:
    """The client's messages into `inbox`, then None at its end (or the error)."""
    try:
        async for request in requests:
            inbox.put_nowait(request)
        inbox.put_nowait(None)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        inbox.put_nowait(exc)


def _response(task: Task) -> scheduler_pb2.OpenSessionResponse:
    return scheduler_pb2.OpenSessionResponse(task=task_to_pb(task))


async def _forward(requests: AsyncIterator[Any], call: Any) -> None:
    """The host's messages on to the replica holding its client, then its end."""
    with contextlib.suppress(Exception):  # the host left, or the relay did: both end here
        async for request in requests:
            await call.write(request)
        await call.done_writing()


class ClientSession:
    """The client's side of one session: one OpenSession call."""

    def __init__(self, service: TaskServicer, read: Reader) -> None:
        self._svc = service
        self._read = read
        self._finished = False

    async def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        first = await first_message(
            requests, "open", "required: the first message asks for the phone"
        )
        o = validate.session_open(first)
        who = principal()
        store, hub = self._svc.store, self._svc.hub
        new = new_session_task(o, who.team)
        task, _ = await store.tasks.submit(who.caller, new, relay=hub.replica)
        # Before anything can assign it: no await between the commit and this line.
        relay = hub.sessions.open(task.task_id)
        self._svc.effects.submitted([task])
        log.info("session opened", task_id=str(task.task_id))
        inbox = relay.from_client
        pump = asyncio.create_task(_pump(requests, inbox))
        try:
            async for response in self._until_joined(task.task_id, relay, inbox):
                yield response
            if self._finished:
                return
            idle = o.idle_timeout.ToTimedelta().total_seconds()
            async for response in self._relay(relay, inbox, idle):
                yield response
            yield _response(await self._terminal(task.task_id))
            self._finished = True
        except AmcError:
            # Refused mid-call: withdrawn before the refusal is answered.
            if not relay.joined.is_set():
                self._finished = True
                await self._cancel(task.task_id, "session abandoned: refused before it started")
            raise
        finally:
            pump.cancel()
            hub.sessions.close(task.task_id)
            if not self._finished:
                self._abandon(relay)

    async def _until_joined(
        self, task_id: TaskId, relay: Relay, inbox: asyncio.Queue[Any]
    ) -> AsyncIterator[scheduler_pb2.OpenSessionResponse]:
        """The task as it changes, until its host joined (or it finished)."""
        refresh = self._svc.settings.watch_refresh.total_seconds()
        closed = False
        with self._svc.hub.watch(task_id) as changed:
            last = None
            while True:
                changed.clear()
                task = await self._read(task_id)
                # Dispatched is said once the host joined: then actions can be sent.
                ready = relay.joined.is_set() or task.status is not TaskStatus.DISPATCHED
                if task != last and ready:
                    yield _response(task)
                    last = task
                if task.status.terminal:
                    self._finished = True
                    return
                if relay.joined.is_set() and task.status is TaskStatus.DISPATCHED:
                    return
                # The inbox first: a message is never lost to a wake-up that came with it.
                reading = not closed
                waits: list[Awaitable[Any]] = [inbox.get()] if reading else []
                waits.append(changed.wait())
                if not relay.joined.is_set():
                    waits.append(relay.joined.wait())
                got = await _first(*waits, timeout=refresh)
                if got is None or not reading or got[0] != 0 or got[1] is HOST_GONE:
                    continue
                if got[1] is not None:
                    raise FailedPrecondition(
                        "the session has no phone yet: send actions once a response's task"
                        " is DISPATCHED"
                    )
                closed = True  # the client left before the phone was ready: withdraw
                await self._cancel(task_id, "session closed by its client before it started")

    async def _relay(
        self, relay: Relay, inbox: asyncio.Queue[Any], idle: float
    ) -> AsyncIterator[scheduler_pb2.OpenSessionResponse]:
        """Each client message to the host as an action, each step back, until either
        side ends."""
        while not relay.host_gone.is_set():
            try:
                async with asyncio.timeout(idle):
                    item = await inbox.get()
            except TimeoutError:
                log.info("session idle: abandoned", task_id=str(relay.task_id), idle=idle)
                end_session(relay, lease_pb2.SESSION_END_ABANDONED)
                return
            if item is HOST_GONE:
                return  # the host stopped: cancelled, lease lost, deadline
            if item is None:
                # A client that vanished (its call cancelled) may look like one that closed
                # its side: the end of its messages comes first, the cancellation of this
                # call a moment later. Only a close that outlives the moment is a close.
                await asyncio.sleep(CLOSE_GRACE)
                end_session(relay, lease_pb2.SESSION_END_CLOSED)
                return
            if isinstance(item, BaseException):
                raise item
            check_decoded(item)
            action = validate.session_action(item)
            relay.to_host.put_nowait(lease_pb2.SessionActionsResponse(action=action))
            step = await relay.from_host.get()
            if step is None:
                return
            yield scheduler_pb2.OpenSessionResponse(step=step)

    async def _terminal(self, task_id: TaskId) -> Task:
        """The task once its host (or the sweep) ended it."""
        settings = self._svc.settings
        patience = 4 * settings.lease_ttl.total_seconds()
        loop = asyncio.get_running_loop()
        until = loop.time() + patience
        with self._svc.hub.watch(task_id) as changed:
            while True:
                changed.clear()
                task = await self._read(task_id)
                if task.status.terminal:
                    return task
                left = until - loop.time()
                if left <= 0:
                    raise Unavailable("session over; its result is not recorded yet: WatchTask")
                wait = min(left, settings.watch_refresh.total_seconds())
                await _first(changed.wait(), timeout=wait)

    async def _cancel(self, task_id: TaskId, reason: str) -> None:
        code, task = await self._svc.store.tasks.cancel(task_id, reason)
        self._svc.effects.cancelled(code, task)

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


class HostSession(RelayedCall):
    """The host's side of one session: one SessionActions call."""

    RELAYED_BY = RELAYED_BY

    async def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        first = await first_message(
            requests, "join", "required: the first message joins the session"
        )
        join = validate_lease.session_join(first)
        task_id = await self._check(join)
        relay = self._svc.hub.sessions.join(task_id)
        if relay is None:
            if self.relayed:
                raise Unavailable(CLIENT_GONE)  # relayed here already: never on again
            async for response in self._relayed(task_id, first, requests):
                yield response
            return
        log.info("session joined", task_id=join.task_id, lease_id=join.lease_id)
        pump = asyncio.create_task(self._steps(requests, relay))
        try:
            while not relay.host_gone.is_set():
                message = await relay.to_host.get()
                if message is HOST_GONE:
                    return
                yield message
                if message.WhichOneof("part") == "end":
                    return
        finally:
            pump.cancel()
            relay.host_left()

    async def _relayed(
        self, task_id: TaskId, first: Any, requests: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        """The host's call forwarded to the replica holding its client's call, as is."""
        hub = self._svc.hub
        where = await self._svc.store.replicas.session_relay(task_id, self._svc.settings.lease_ttl)
        if where is None or where.replica_id == hub.replica or not where.address:
            raise Unavailable(CLIENT_GONE)
        if not where.alive:
            raise Unavailable(f"{CLIENT_GONE}: its replica ({where.address}) is gone")
        metadata = self.forwarded()
        call = self._peers.lease(where.address).SessionActions(metadata=metadata)
        forward: asyncio.Task[None] | None = None
        log.info("session relayed", task_id=str(task_id), to=where.address)
        try:
            # A call the other replica ended at once ends by its status, which the read raises.
            await write_unless_ended(call, first)
            forward = asyncio.create_task(_forward(requests, call))
            while (message := await call.read()) is not grpc.aio.EOF:
                yield message
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(
                f"session relay lost: the replica holding its client ({where.address}) "
                f"answered {exc.code().name}: {exc.details()}"
            ) from None
        finally:
            if forward is not None:
                forward.cancel()
            call.cancel()

    async def _check(self, join: lease_pb2.SessionJoin) -> TaskId:
        """The session's task, if `join` names this host's live lease of it."""
        task_id, lease_id = TaskId(uuid.UUID(join.task_id)), uuid.UUID(join.lease_id)
        task = await self._svc.store.tasks.get_task(task_id)
        history = await self._svc.store.tasks.task_history(task_id, 0, 1)
        attempt = next((a for a in history.attempts if a.lease_id == lease_id), None)
        who = principal()  # a host token acts as its own host only (auth off: any host)
        if attempt is not None and who.role is Role.HOST and attempt.host_id != who.host_id:
            raise NotLeaseHolder(f"lease {lease_id} is another host's")
        if task_pb2.TaskSpec.FromString(task.spec).WhichOneof("kind") != "session":
            raise FailedPrecondition(f"task {task_id} is not a session")
        live = task.status in (TaskStatus.ASSIGNED, TaskStatus.DISPATCHED)
        if attempt is None or attempt.state != "active" or not live:
            raise LeaseNotCurrent(f"lease {lease_id} is not the live lease of task {task_id}")
        if attempt.attempt != join.attempt or task.attempt != attempt.attempt:
            raise LeaseNotCurrent(f"attempt {join.attempt} is not task {task_id}'s current one")
        return task_id

    async def _steps(self, requests: AsyncIterator[Any], relay: Relay) -> None:
        try:
            async for request in requests:
                if isinstance(request, lease_pb2.SessionActionsRequest) and request.HasField(
                    "step"
                ):
                    relay.from_host.put_nowait(request.step)
                else:
                    log.warning("session host sent something other than a step; ending")
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.info("session host call ended", error=str(exc))
        finally:
            relay.host_left()
