"""adb doors (`amc adb`): a session's adb streams between its client's door
(`Scheduler.AdbStreams`) and its phone's host (`Lease.AdbStreams`, in
control_plane.adb_door_hosts), met on the replica holding the session's client call.

They meet in the session's `Relay` (control_plane.rendezvous).

A door is its session's: opened by the token that opened the session (`SessionOpen.adb`),
once the session is dispatched, and over when the session is (its host's call ended, the
task no longer runs: `Relay.host_gone`), or when either of its calls ends. Frames are
relayed as they come (a data frame as the bytes it came in: control_plane.adb_wire), one
at a time each way through a short mailbox, so a side that
reads slowly holds the other back through gRPC's flow control and this replica holds no
backlog; the streams' own windows (amc_common.adb_carriage) keep one stream from holding
up another. What this replica judges: which services the caller's role may open
(amc_common.adb_services: refused here, never sent to the host), and the door's use, which
keeps the session from its idle timeout (`Relay.door_streams`, `door_used`). No database
work per stream or frame: one read when a call reaches a replica without the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from amc.v1 import adb_pb2
from amc_common import adb_services
from amc_common.channel import write_unless_ended
from control_plane.adb_wire import DOOR, Frame, relayed, to_client
from control_plane.domain import Role, TaskId
from control_plane.errors import (
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    TaskNotFound,
    Unavailable,
)
from control_plane.peers import RelayedCall
from control_plane.rendezvous import Relay
from control_plane.rpc import check_decoded, first_message, principal, relayed_error

log = structlog.get_logger(__name__)

# Metadata of a door's call relayed by another replica (that replica's id): never relayed on.
RELAYED_BY = "amc-door-relayed-by"
# Frames waiting between the two calls, each way.
MAILBOX = 8
# Streams a door may have open at once.
MAX_STREAMS = 256


class Mailbox:
    """A short queue of frames from one call to the other: `put` waits for room; once
    closed, what it held is dropped and `get` says None."""

    def __init__(self, size: int) -> None:
        self._items: deque[Frame] = deque()
        self._size = size
        self._changed = asyncio.Event()
        self.closed = False

    async def put(self, frame: Frame) -> None:
        while len(self._items) >= self._size and not self.closed:
            self._changed.clear()
            await self._changed.wait()
        if not self.closed:
            self._items.append(frame)
            self._changed.set()

    async def get(self) -> Frame | None:
        while not self._items:
            if self.closed:
                return None
            self._changed.clear()
            await self._changed.wait()
        frame = self._items.popleft()
        self._changed.set()
        return frame

    def close(self) -> None:
        self.closed = True
        self._items.clear()
        self._changed.set()


class Door:
    """One session's door: the frames each way, the phone once its host joined, the
    streams open, and its end (once)."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.to_host = Mailbox(MAILBOX)
        self.to_client = Mailbox(MAILBOX)
        loop = self._loop = asyncio.get_running_loop()
        self.phone: asyncio.Future[adb_pb2.AdbPhone] = loop.create_future()
        self.client = self.host = False
        self.over = asyncio.Event()
        self.why = ""
        self.streams: set[int] = set()
        self._follow = loop.create_task(self._until_session_over())

    async def _until_session_over(self) -> None:
        await self.relay.host_gone.wait()
        self.end("its session is over")

    def end(self, why: str) -> None:
        if self.over.is_set():
            return
        self.why = why
        self.over.set()
        self.to_host.close()
        self.to_client.close()
        if self.relay.door is self:
            self.relay.door = None
        self.relay.door_streams = 0
        if self._follow is not asyncio.current_task():
            self._follow.cancel()
        log.info("adb door closed", task_id=str(self.relay.task_id), why=why)

    def used(self, frame: Frame) -> None:
        """Count a frame's stream open or over, and the door as used now."""
        part = frame.WhichOneof("part")
        if part == "open":
            self.streams.add(frame.stream)
        elif part in ("close", "refused"):
            self.streams.discard(frame.stream)
        self.relay.door_streams = len(self.streams)
        self.relay.door_used = self._loop.time()


def door_of(relay: Relay) -> Door:
    """The session's door, made by whichever of its calls comes first."""
    if relay.door is None:
        relay.door = Door(relay)
    door: Door = relay.door
    return door


def session_id(text: str, field: str) -> TaskId:
    try:
        return TaskId(uuid.UUID(text))
    except ValueError:
        raise InvalidArgument(field, f"not a task id: {text[:40]!r}") from None


async def relay_call(call: Any, first: Any, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A door's call forwarded to the replica holding its session, as is: `first`, then
    the caller's messages as they come, and the answers back. Raises AioRpcError."""

    async def forward() -> None:
        with contextlib.suppress(Exception):  # the caller left, or the relay did
            async for request in requests:
                await call.write(request)
            await call.done_writing()

    forwarding: asyncio.Task[None] | None = None
    try:
        await write_unless_ended(call, first)
        forwarding = asyncio.create_task(forward())
        while (message := await call.read()) is not grpc.aio.EOF:
            yield message
    finally:
        if forwarding is not None:
            forwarding.cancel()
        call.cancel()


class ClientDoor(RelayedCall):
    """The door's side of one door: one Scheduler.AdbStreams call."""

    RELAYED_BY = RELAYED_BY

    async def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        first = await first_message(
            requests, "open", "required: the first message names the door's session"
        )
        task_id = session_id(first.open.task_id, "open.task_id")
        relay = self._svc.hub.sessions.get(task_id)
        if relay is None:
            async for response in self._relayed(task_id, first, requests):
                yield response
            return
        who = principal()
        _check(relay, task_id, who.caller)
        door = door_of(relay)
        if door.client:
            raise FailedPrecondition(f"the door of session {task_id} is open on another call")
        door.client = True
        pump: asyncio.Task[None] | None = None
        try:
            phone = await self._phone(door, task_id)
            log.info("adb door opened", task_id=str(task_id))
            yield adb_pb2.AdbStreamsResponse(phone=phone)
            operator = who.role is not Role.CLIENT
            pump = asyncio.create_task(_from_client(requests, door, operator))
            while (frame := await door.to_client.get()) is not None:
                yield to_client(frame)
        finally:
            if pump is not None:
                pump.cancel()
            door.end("its client left")

    async def _phone(self, door: Door, task_id: TaskId) -> adb_pb2.AdbPhone:
        """The phone, once its host joined the door (at most a lease TTL from now)."""
        wait = self._svc.settings.lease_ttl.total_seconds()
        over = asyncio.ensure_future(door.over.wait())
        waits: set[asyncio.Future[Any]] = {door.phone, over}
        try:
            await asyncio.wait(waits, timeout=wait, return_when="FIRST_COMPLETED")
        finally:
            over.cancel()
        if door.phone.done():
            return door.phone.result()
        if door.over.is_set():
            raise FailedPrecondition(f"session {task_id}'s door closed: {door.why}")
        raise Unavailable(
            f"the phone's host did not open the door of session {task_id} within {wait:g}s"
            " (is its agent older than adb doors?)"
        )

    async def _relayed(
        self, task_id: TaskId, first: Any, requests: AsyncIterator[Any]
    ) -> AsyncIterator[Any]:
        """The call forwarded to the replica holding the session's client call."""
        svc = self._svc
        found = await svc.store.replicas.session_relay(task_id, svc.settings.lease_ttl)
        if found is None:
            raise TaskNotFound(f"no task {task_id}")
        session, caller, where = found
        if not session:
            raise FailedPrecondition(f"task {task_id} is not a session")
        if caller != principal().caller:
            raise PermissionDenied(f"session {task_id} is another token's")
        here = where is None or where.replica_id == svc.hub.replica or not where.address
        if self.relayed or here:
            raise FailedPrecondition(f"session {task_id} is over: its client is not connected")
        assert where is not None and where.address is not None
        if not where.alive:
            raise Unavailable(f"session {task_id}'s replica ({where.address}) is gone")
        method = self._peers.raw_stream(where.address, DOOR, relayed)
        call = method(metadata=self.forwarded())
        log.info("adb door relayed", task_id=str(task_id), to=where.address)
        try:
            async for response in relay_call(call, first, requests):
                yield response
        except grpc.aio.AioRpcError as exc:
            raise relayed_error(exc.code(), exc.details() or "") from None


def _check(relay: Relay, task_id: TaskId, caller: str) -> None:
    if relay.owner != caller:
        raise PermissionDenied(f"session {task_id} is another token's")
    if not relay.adb:
        raise FailedPrecondition(f"session {task_id} was not opened as an adb door")
    if relay.host_gone.is_set():
        raise FailedPrecondition(f"session {task_id} is over")
    if not relay.joined.is_set():
        raise FailedPrecondition(
            f"session {task_id} has no phone yet: open its door once dispatched"
        )


async def _from_client(requests: AsyncIterator[Any], door: Door, operator: bool) -> None:
    """The door's frames on to the host: a service its caller may not open is refused here;
    the door ends with the client's messages (or a message that is not a frame)."""
    why = "its client closed it"
    try:
        async for request in requests:
            check_decoded(request)
            if request.WhichOneof("part") != "frame":
                why = "its client sent something other than a frame"
                return
            frame = request.frame
            if frame.WhichOneof("part") == "open":
                refused = adb_services.refusal(frame.open, operator=operator)
                if refused is None and len(door.streams) >= MAX_STREAMS:
                    refused = f"amc: this door has {MAX_STREAMS} streams open, the most it may"
                if refused is not None:
                    await door.to_client.put(adb_pb2.AdbFrame(stream=frame.stream, refused=refused))
                    continue
            door.used(frame)
            await door.to_host.put(frame)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        why = f"its client's call ended: {exc}"
    finally:
        door.end(why)
