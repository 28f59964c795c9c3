"""An adb door's host side: the phone's host's `Lease.AdbStreams` call, joined to its
session's door (control_plane.adb_doors) on the replica holding the session's client call,
or forwarded there as a session's SessionActions call is (with the host's own
credentials, over `Peers`; a replica that dies takes the door with it).

The join is checked as a session's is (control_plane.session_hosts.check_join: this host's
live lease of the session's current attempt, in one statement); the session must have
been opened as an adb door. The host's first message says what the phone is (its CNXN
banner for the door); its later frames go to the door's client as they come.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from control_plane.adb_doors import RELAYED_BY, Door, door_of, relay_call, session_id
from control_plane.adb_wire import HOST, relayed, to_host
from control_plane.domain import SessionRelay, TaskId
from control_plane.errors import FailedPrecondition, InvalidArgument, Unavailable
from control_plane.peers import RelayedCall
from control_plane.rpc import check_decoded, first_message
from control_plane.session_hosts import CLIENT_GONE, check_join

log = structlog.get_logger(__name__)


class HostDoor(RelayedCall):
    """The host's side of one door: one Lease.AdbStreams call."""

    RELAYED_BY = RELAYED_BY

    async def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        first = await first_message(
            requests, "join", "required: the first message joins the session's door"
        )
        join = first.join
        session_id(join.task_id, "join.task_id")
        session_id(join.lease_id, "join.lease_id")
        task_id, where = await check_join(self._svc, join)
        relay = self._svc.hub.sessions.get(task_id)
        if relay is None:
            async for response in self._relayed(task_id, where, first, requests):
                yield response
            return
        if not relay.adb:
            raise FailedPrecondition(f"session {task_id} was not opened as an adb door")
        door = door_of(relay)
        if door.host:
            raise FailedPrecondition(f"the door of session {task_id} was joined already")
        door.host = True
        door.phone.set_result(join.phone)
        log.info("adb door joined", task_id=str(task_id), lease_id=join.lease_id)
        pump = asyncio.create_task(_from_host(requests, door))
        try:
            while (frame := await door.to_host.get()) is not None:
                yield to_host(frame)
        finally:
            pump.cancel()
            door.end("its host left")

    async def _relayed(
        self,
        task_id: TaskId,
        where: SessionRelay | None,
        first: Any,
        requests: AsyncIterator[Any],
    ) -> AsyncIterator[Any]:
        """The host's call forwarded to the replica holding its session's client call."""
        hub = self._svc.hub
        if self.relayed or where is None or where.replica_id == hub.replica or not where.address:
            raise Unavailable(CLIENT_GONE)
        if not where.alive:
            raise Unavailable(f"{CLIENT_GONE}: its replica ({where.address}) is gone")
        call = self._peers.raw_stream(where.address, HOST, relayed)(metadata=self.forwarded())
        log.info("adb door relayed", task_id=str(task_id), to=where.address)
        try:
            async for response in relay_call(call, first, requests):
                yield response
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(
                f"adb door relay lost: the replica holding its session ({where.address}) "
                f"answered {exc.code().name}: {exc.details()}"
            ) from None


async def _from_host(requests: AsyncIterator[Any], door: Door) -> None:
    """The host's frames on to the door's client; the door ends with the host's messages."""
    why = "its host left"
    try:
        async for request in requests:
            check_decoded(request)
            if request.WhichOneof("part") != "frame":
                raise InvalidArgument("frame", "every message after the join is a frame")
            door.used(request.frame)
            await door.to_client.put(request.frame)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        why = f"its host's call ended: {exc}"
    finally:
        door.end(why)
