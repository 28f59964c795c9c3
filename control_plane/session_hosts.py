"""A session's host side: its `Lease.SessionActions` call, joined to its client's
`OpenSession` (control_plane.sessions) on the replica holding the client's call, or
forwarded there.

The join is checked in one statement (replicas.sql session_join): the lease must be the
task's current attempt, active and unexpired by the database's clock, and this host's.
A host whose call reached another replica has that call relayed: the replica it reached
forwards it, with the host's own credentials, to the client's replica's SessionActions
over a channel it keeps to it (`Peers`), message for message. A replica that dies ends
the relay, and the host fails the task ("session relay lost"). After telling the host how
its client left, the call stays open until the host ends it (it stops at once), so that a
step it was writing as the end came never turns the end into a refused write.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc
import structlog

from amc_common.channel import write_unless_ended
from control_plane import validate_lease
from control_plane.domain import Role, SessionRelay, TaskId
from control_plane.errors import (
    FailedPrecondition,
    LeaseNotCurrent,
    NotLeaseHolder,
    TaskNotFound,
    Unavailable,
)
from control_plane.lifecycle import TaskStatus
from control_plane.peers import RelayedCall
from control_plane.rendezvous import HOST_GONE, Writer
from control_plane.rpc import Context, TaskServicer, first_message, principal
from control_plane.session_wire import SESSION_ACTIONS, RawStep, as_bytes

log = structlog.get_logger(__name__)

CLIENT_GONE = "the session's client is no longer connected"
# Metadata of a host's call relayed by another replica (that replica's id): never relayed on.
RELAYED_BY = "amc-session-relayed-by"


class Joining(Protocol):
    """What a host's join names: a SessionJoin, or an adb door's AdbDoorJoin."""

    task_id: str
    attempt: int
    lease_id: str


async def _forward(requests: AsyncIterator[Any], call: Any) -> None:
    """The host's messages on to the replica holding its client, then its end."""
    with contextlib.suppress(Exception):  # the host left, or the relay did: both end here
        async for request in requests:
            await call.write(request)
        await call.done_writing()


async def _steps(requests: AsyncIterator[Any]) -> AsyncIterator[RawStep]:
    """The host's steps, as their bytes, read one for each action sent; they end with the
    host's call, or with a message that is no step."""
    try:
        async for request in requests:
            if not isinstance(request, RawStep):
                log.warning("session host sent something other than a step; ending")
                return
            yield request
    except Exception as exc:
        log.info("session host call ended", error=str(exc))


class HostSession(RelayedCall):
    """The host's side of one session: one SessionActions call. It writes on its call
    itself (the client's actions come from the task reading the client's call), so it
    yields nothing."""

    RELAYED_BY = RELAYED_BY

    def __init__(self, service: TaskServicer, context: Context) -> None:
        super().__init__(service, context)
        self._out = Writer(context)

    async def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        await self._serve(requests)
        return
        yield  # an async generator, as every conversation

    async def _serve(self, requests: AsyncIterator[Any]) -> None:
        first = await first_message(
            requests, "join", "required: the first message joins the session"
        )
        join = validate_lease.session_join(first)
        task_id, where = await check_join(self._svc, join)
        relay = self._svc.hub.sessions.join(task_id, self._out, _steps(requests))
        if relay is None:
            if self.relayed:
                raise Unavailable(CLIENT_GONE)  # relayed here already: never on again
            await self._relayed(task_id, where, first, requests)
            return
        log.info("session joined", task_id=join.task_id, lease_id=join.lease_id)
        try:
            # Each action is written, and its step read, by the task reading the client's
            # call; here, how the client left, then until the host ends its call (it
            # stops at once, cancelling it), a lease TTL at most.
            message = await relay.to_host.get()
            if message is not HOST_GONE:
                await self._out.write(message)
                await asyncio.sleep(self._svc.settings.lease_ttl.total_seconds())
        finally:
            relay.host_left()

    async def _relayed(
        self,
        task_id: TaskId,
        where: SessionRelay | None,
        first: Any,
        requests: AsyncIterator[Any],
    ) -> None:
        """The host's call forwarded to the replica holding its client's call, as is: its
        messages' bytes both ways."""
        hub = self._svc.hub
        if where is None or where.replica_id == hub.replica or not where.address:
            raise Unavailable(CLIENT_GONE)
        if not where.alive:
            raise Unavailable(f"{CLIENT_GONE}: its replica ({where.address}) is gone")
        metadata = self.forwarded()
        method = self._peers.raw_stream(where.address, SESSION_ACTIONS, as_bytes)
        call = method(metadata=metadata)
        forward: asyncio.Task[None] | None = None
        log.info("session relayed", task_id=str(task_id), to=where.address)
        try:
            # A call the other replica ended at once ends by its status, which the read raises.
            await write_unless_ended(call, first)
            forward = asyncio.create_task(_forward(requests, call))
            while (message := await call.read()) is not grpc.aio.EOF:
                if not await self._out.write(message):
                    return
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(
                f"session relay lost: the replica holding its client ({where.address}) "
                f"answered {exc.code().name}: {exc.details()}"
            ) from None
        finally:
            if forward is not None:
                forward.cancel()
            call.cancel()


async def check_join(service: TaskServicer, join: Joining) -> tuple[TaskId, SessionRelay | None]:
    """The session's task, if `join` names the calling host's live lease of it, and where
    its client's call is held (one statement: replicas.sql session_join). A session's
    SessionActions and its adb door's Lease.AdbStreams are joined alike."""
    task_id, lease_id = TaskId(uuid.UUID(join.task_id)), uuid.UUID(join.lease_id)
    settings = service.settings
    found = await service.store.replicas.session_join(task_id, lease_id, settings.lease_ttl)
    if found is None:
        raise TaskNotFound(f"no task {task_id}")
    who = principal()  # a host token acts as its own host only (auth off: any host)
    if found.attempt is not None and who.role is Role.HOST and found.host_id != who.host_id:
        raise NotLeaseHolder(f"lease {lease_id} is another host's")
    if not found.session:
        raise FailedPrecondition(f"task {task_id} is not a session")
    running = found.status in (TaskStatus.ASSIGNED, TaskStatus.DISPATCHED)
    if found.attempt is None or not found.live or not running:
        raise LeaseNotCurrent(f"lease {lease_id} is not the live lease of task {task_id}")
    if found.attempt != join.attempt or found.task_attempt != found.attempt:
        raise LeaseNotCurrent(f"attempt {join.attempt} is not task {task_id}'s current one")
    return task_id, found.relay
