"""`amc adb`'s door: a leased phone on a local port, for the real `adb` client.

The door takes a phone with an interactive session (`SessionOpen.adb`: the same queue,
fair shares and lease as any session), then listens on 127.0.0.1 and speaks the phone's
end of the adb transport (amc_common.adb_device) to whatever adb server connects (`adb
connect 127.0.0.1:PORT`): its CNXN banner is the leased phone's (model, features), and each
stream the adb client opens (`shell:`, `sync:`, `exec:`, `tcp:`…) is carried over the
session's `Scheduler.AdbStreams` call (amc_cli.adb_link) to the phone's host, which opens
it on the phone. A service the caller's token may not open (operators' services such as
`root:` and `reboot:`) is answered with why, and the stream closed.

Who may connect: anyone on this machine can reach 127.0.0.1:PORT, so the door asks adb's
own AUTH of every connection and lets in only an adb server that signs with one of the
user's adb keys (~/.android/adbkey.pub, or --adb-key): the user's own adb server does so by
itself; another user's, without the private key, stays `unauthorized`. The farm knows the
door by the user's AMC token (its session is that token's).

The door closes when its session ends (the user stops it: done; a cancel, a lost or
expired lease, the idle timeout or the longest duration: as recorded): every transport is
closed, so the adb client sees the device go offline, and the port stops listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from amc.v1 import adb_pb2
from amc_cli.adb_link import DoorLink
from amc_common import adb_transport
from amc_common.adb_auth import AdbKey
from amc_common.adb_carriage import Carried
from amc_common.adb_device import DeviceStream, DeviceTransport

log = logging.getLogger(__name__)

Say = Callable[[str], None]
# What an adb server's connection may hold unread: a packet of the largest payload.
_READ_LIMIT = adb_transport.DOOR_PAYLOAD + adb_transport.HEADER.size


class AdbDoor:
    """The door's listening port and the transports connected to it: `listen` first (a
    port in use is refused before a session is queued), `start` once the phone is there."""

    def __init__(self, keys: Callable[[], list[AdbKey]] | None, say: Say) -> None:
        self._keys, self._say = keys, say
        self._link: DoorLink | None = None
        self._banner = b""
        self._server: asyncio.Server | None = None
        self._transports: set[DeviceTransport] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def listen(self, host: str, port: int) -> int:
        """Bind the port (0: any free one) without taking connections yet; the port."""
        # A whole packet of the largest payload is read without the reader pausing the
        # socket (its default pauses past 128 KiB, some eight times a packet).
        self._server = await asyncio.start_server(
            self._on_connection, host, port, start_serving=False, limit=_READ_LIMIT
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, link: DoorLink, phone: adb_pb2.AdbPhone) -> None:
        """Take connections from now on, as `phone`, its streams carried over `link`."""
        assert self._server is not None
        self._link = link
        self._banner = adb_transport.device_banner(
            phone.product, phone.model, phone.device, list(phone.features)
        )
        await self._server.start_serving()

    async def close(self) -> None:
        """Stop listening and hang up on every adb server (the device goes offline)."""
        if self._server is not None:
            self._server.close()
        for transport in list(self._transports):
            transport.close()
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        transport = DeviceTransport(
            reader,
            writer,
            banner=self._banner,
            handler=self._stream,
            keys=self._keys,
            max_payload=adb_transport.DOOR_PAYLOAD,
        )
        self._transports.add(transport)
        try:
            if self._link is None or self._link.ended.is_set():
                return
            self._say(f"adb server connected from {transport.peer}")
            await transport.run()
            if transport.dropped:
                self._say(f"adb server {transport.peer} dropped: {transport.dropped}")
        finally:
            transport.close()
            self._transports.discard(transport)
            if task is not None:
                self._tasks.discard(task)

    async def _stream(self, stream: DeviceStream) -> None:
        assert self._link is not None
        carried = self._link.stream(stream.service)
        try:
            why = await carried.opened
            if why == "":
                await stream.accept()
                await _carry(stream, carried)
            elif carried.refused:
                self._say(f"refused {stream.service.split(':', 1)[0]}: {why}")
                await stream.accept()
                await stream.write(_refusal(stream.service, why))
            else:
                await stream.refuse()
        finally:
            carried.close()


def _refusal(service: str, why: str) -> bytes:
    """What the adb client shows of a refusal: `reverse:` speaks the host protocol's
    status (FAIL and a message), the others print what the service wrote."""
    if service.startswith("reverse:"):
        message = why.encode()
        return b"FAIL%04x" % len(message) + message
    return why.encode() + b"\n"


async def _carry(stream: DeviceStream, carried: Carried) -> None:
    """A stream's bytes both ways until either end closes it."""

    async def up() -> None:
        while data := await stream.read():
            if not await carried.send(data):
                return

    async def down() -> None:
        while (data := await carried.recv()) is not None:
            if not await stream.write(data):
                return
            carried.ack(len(data))

    pumps = {asyncio.create_task(up()), asyncio.create_task(down())}
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
