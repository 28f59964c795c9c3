"""An adb door's streams to a phone through the host's adb server: each on a connection of
its own, switched to the leased phone (`host:transport:<serial>`, the serial fixed here,
never the client's to choose) and then to the service, after which the bytes are the
phone's adbd's, as they are for `adb shell` on the host. The door offers the features the
phone has (`host-serial:<serial>:features`) that live inside streams; not `delayed_ack`,
which is the transport's, and the door's transport is its own.
"""

from __future__ import annotations

import asyncio
import contextlib

from amc.v1 import adb_pb2
from amc_common.adb_carriage import CHUNK
from host_agent.adb_door import DoorConnection, DoorRefused
from host_agent.adb_protocol import ClientAsync, guard, host_query
from host_agent.devices import Device, DeviceError

# Features of the adb transport itself, which the door's own transport does not have.
TRANSPORT_FEATURES = frozenset({"delayed_ack"})
_PROPS = ("ro.product.name", "ro.product.model", "ro.product.device")
_READ_SIZE = CHUNK


class TcpConnection:
    """A stream's connection to the adb server, after the service was opened."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer

    async def read(self) -> bytes:
        try:
            return await self._reader.read(_READ_SIZE)
        except ConnectionError:
            return b""

    async def write(self, data: bytes) -> None:
        self._writer.write(data)
        await self._writer.drain()

    def close(self) -> None:
        self._writer.close()


class AdbServerDoor:
    """One phone's adb services through the adb server at `client`'s address."""

    def __init__(self, client: ClientAsync, device: Device, call_timeout: float) -> None:
        self._host, self._port = client.host, client.port
        self._client = client
        self._device = device
        self._call_timeout = call_timeout

    async def phone(self) -> adb_pb2.AdbPhone:
        serial = self._device.serial
        async with guard(serial, "features", self._call_timeout):
            listed = await host_query(self._client, f"host-serial:{serial}:features")
        features = [f for f in listed.strip().split(",") if f and f not in TRANSPORT_FEATURES]
        shown = await self._device.shell("; ".join(f"getprop {p}" for p in _PROPS), 10.0)
        values = [*shown.output.splitlines(), "", "", ""][: len(_PROPS)]
        product, model, device = (v.strip() for v in values)
        return adb_pb2.AdbPhone(product=product, model=model, device=device, features=features)

    async def open(self, service: str) -> DoorConnection:
        serial = self._device.serial
        try:
            reader, writer = await asyncio.open_connection(self._host, self._port)
        except OSError as exc:
            raise DeviceError(f"adb server unreachable at {self._host}:{self._port}") from exc
        try:
            await _request(reader, writer, f"host:transport:{serial}")
            await _request(reader, writer, service)
        except BaseException:
            writer.close()
            raise
        return TcpConnection(reader, writer)


async def _request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, payload: str
) -> None:
    """One request of the adb host protocol; DoorRefused with the server's FAIL."""
    data = payload.encode()
    writer.write(b"%04x" % len(data) + data)
    await writer.drain()
    try:
        status = await reader.readexactly(4)
        if status == b"OKAY":
            return
        if status != b"FAIL":
            raise DoorRefused(f"the adb server answered {status!r}")
        length = int(await reader.readexactly(4), 16)
        raise DoorRefused((await reader.readexactly(length)).decode(errors="replace"))
    except (asyncio.IncompleteReadError, ValueError):
        with contextlib.suppress(Exception):
            writer.close()
        raise DoorRefused("closed") from None
