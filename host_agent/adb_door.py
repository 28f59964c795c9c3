"""An adb door's host side: while an adb session runs (TaskSpec.session.adb), the host joins
the door (`Lease.AdbStreams`, under the attempt's lease), says what the phone is, and opens
each stream its client asks for on the leased phone, carrying its bytes both ways
(amc_common.adb_carriage: per-stream windows over the one call).

How a stream reaches the phone is the device source's (`DoorSource.door(serial)`): through
the adb server, `host:transport:<serial>` then the service, on a connection of its own
(host_agent.adb_server_door); a simulated phone answers it itself (host_agent.
simulated_door). Services that would reach past the phone are refused here whoever asks
(amc_common.adb_services.never); what is for operators the control plane refused already.

The door lives inside its lease: it runs under the attempt's stop token, so a cancel, a
lost lease (the host's own fencing deadline), the session's end or a shutdown closes every
stream's connection at once, and the door's call with them; the door's client sees its
phone go offline. The session itself goes on or ends as a session does
(host_agent.session): a door whose call failed leaves it to its client.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol, runtime_checkable

import grpc
import structlog

from amc.v1 import adb_pb2, lease_pb2_grpc
from amc_common.adb_carriage import Carriage, Carried
from amc_common.adb_services import never
from host_agent.devices import DeviceError
from host_agent.fencing import HeldLease
from host_agent.stop_token import Stopped, StopToken

log = structlog.get_logger(__name__)

# How long a service may take to open on the phone.
OPEN_TIMEOUT = 15.0


class DoorConnection(Protocol):
    """One stream's connection to the phone: what it prints, what it is sent."""

    async def read(self) -> bytes:
        """The next bytes; b"" once the phone's end is closed."""
        ...

    async def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...


class DoorRefused(DeviceError):
    """The phone (or its adb server) would not open the service: why, in its words."""


class DoorBackend(Protocol):
    """One phone's adb services, as a door opens them."""

    async def phone(self) -> adb_pb2.AdbPhone:
        """What the phone says it is, and the features the door may offer."""
        ...

    async def open(self, service: str) -> DoorConnection:
        """The service open on the phone; DoorRefused (a DeviceError) if it is not."""
        ...


@runtime_checkable
class DoorSource(Protocol):
    """A device source whose phones can have an adb door."""

    def door(self, serial: str) -> DoorBackend: ...


@contextlib.asynccontextmanager
async def door_served(
    stub: lease_pb2_grpc.LeaseStub, lease: HeldLease, source: object, serial: str, wanted: bool
) -> AsyncIterator[None]:
    """The session's door served while the block runs (if `wanted` and the source can)."""
    if not wanted or not isinstance(source, DoorSource):
        if wanted:
            log.warning("adb door asked of a device source without doors", serial=serial)
        yield
        return
    task = asyncio.create_task(serve_door(stub, lease, source.door(serial), lease.token))
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def serve_door(
    stub: lease_pb2_grpc.LeaseStub, lease: HeldLease, backend: DoorBackend, token: StopToken
) -> None:
    """Serve the door until its call ends or the token trips; never raises for its own
    failures (the session goes on without its door)."""
    door = _HostDoor(stub, lease, backend, token)
    try:
        await token.race(door.run())
    except Stopped as stop:
        log.info("adb door closed with its lease", why=stop.reason.label)
    except grpc.aio.AioRpcError as exc:
        log.warning("adb door call ended", code=exc.code().name, details=exc.details())
    except DeviceError as exc:
        log.warning("adb door not served", error=str(exc))
    finally:
        await door.close()


class _HostDoor:
    def __init__(
        self,
        stub: lease_pb2_grpc.LeaseStub,
        lease: HeldLease,
        backend: DoorBackend,
        token: StopToken,
    ) -> None:
        self._stub, self._lease, self._backend, self._token = stub, lease, backend, token
        self._call: Any = None
        self._outgoing: asyncio.Queue[adb_pb2.LeaseAdbStreamsRequest] = asyncio.Queue()
        self._carriage = Carriage(self._outgoing.put_nowait, adb_pb2.LeaseAdbStreamsRequest)
        self._tasks: set[asyncio.Task[None]] = set()
        self._connections: set[DoorConnection] = set()

    async def run(self) -> None:
        phone = await asyncio.wait_for(self._backend.phone(), OPEN_TIMEOUT)
        lease = self._lease
        join = adb_pb2.AdbDoorJoin(
            task_id=lease.task_id, attempt=lease.attempt, lease_id=lease.lease_id, phone=phone
        )
        self._call = self._stub.AdbStreams()
        await self._call.write(adb_pb2.LeaseAdbStreamsRequest(join=join))
        writer = asyncio.create_task(self._write())
        try:
            while (response := await self._call.read()) is not grpc.aio.EOF:
                self._frame(response.frame)
            log.info("adb door closed by the control plane")
        finally:
            writer.cancel()

    def _frame(self, frame: adb_pb2.AdbFrame) -> None:
        if frame.WhichOneof("part") != "open":
            self._carriage.deliver(frame)
        elif frame.stream and frame.stream not in self._carriage.streams:
            carried = self._carriage.stream(frame.stream)
            task = asyncio.create_task(self._stream(carried, frame.open))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _write(self) -> None:
        while True:
            await self._call.write(await self._outgoing.get())

    async def _stream(self, carried: Carried, service: str) -> None:
        refused = never(service)
        if refused is not None or self._token.tripped:
            carried.close(refused or "the lease is over")
            return
        try:
            connection = await asyncio.wait_for(self._backend.open(service), OPEN_TIMEOUT)
        except (DeviceError, OSError, TimeoutError) as exc:
            carried.close(str(exc) or type(exc).__name__)
            return
        self._connections.add(connection)
        carried.accept()
        try:
            await carry(connection, carried, self._token)
        finally:
            connection.close()
            self._connections.discard(connection)
            carried.close()

    async def close(self) -> None:
        """Every stream's connection closed at once, then the call."""
        for connection in list(self._connections):
            connection.close()
        self._carriage.end("the door closed")
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._call is not None:
            self._call.cancel()


async def carry(connection: DoorConnection, carried: Carried, token: StopToken) -> None:
    """A stream's bytes both ways until either end closes it, or the token trips: it is
    looked at before every write to the phone and every send from it (reading the clock
    against the fencing deadline), so no byte crosses once the lease is over, even one that
    came in the same turn of the loop as a process woke from a freeze."""

    async def up() -> None:
        while (data := await connection.read()) and not token.tripped:
            if not await carried.send(data):
                return

    async def down() -> None:
        while (data := await carried.recv()) is not None and not token.tripped:
            await connection.write(data)
            carried.ack(len(data))

    pumps = {asyncio.create_task(up()), asyncio.create_task(down())}
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
