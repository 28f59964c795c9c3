"""Simulated phones as adbd on loopback, for the harnesses: a real adb server reaches them
with `adb connect 127.0.0.1:PORT`, and each answers the adb services a simulated phone's
door answers (host_agent.simulated_door: shell, exec, sync, logcat, its echo port) over
the phone's end of the adb transport (amc_common.adb_device, no AUTH, as an adbd with
auth off). The benchmark's `adb` workload times the same adb commands on it straight and
through a door.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self

from amc_common import adb_transport
from amc_common.adb_device import DeviceStream, DeviceTransport
from host_agent.adb_door import DoorConnection, DoorRefused
from host_agent.simulated import SimulatedSource
from host_agent.simulated_door import SimulatedDoor


class SimulatedAdbd:
    """One simulated phone (`serial` of `source`) as adbd on 127.0.0.1:`port`."""

    def __init__(self, source: SimulatedSource, serial: str, port: int = 0) -> None:
        self._door = SimulatedDoor(source, serial)
        self._port = port
        self._server: asyncio.Server | None = None
        self._transports: set[DeviceTransport] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.banner = adb_transport.device_banner("simulated", "Simulated", serial, ["cmd"])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._port}"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._connected, "127.0.0.1", self._port)
        self._port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for transport in list(self._transports):
            transport.close()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5.0)
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        transport = DeviceTransport(reader, writer, banner=self.banner, handler=self._stream)
        self._transports.add(transport)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await transport.run()
        finally:
            self._transports.discard(transport)
            if task is not None:
                self._tasks.discard(task)

    async def _stream(self, stream: DeviceStream) -> None:
        try:
            connection = await self._door.open(stream.service)
        except DoorRefused:
            await stream.refuse()
            return
        await stream.accept()
        try:
            await _carry(stream, connection)
        finally:
            connection.close()


async def _carry(stream: DeviceStream, connection: DoorConnection) -> None:
    """A stream's bytes both ways between the adb server and the phone's service."""

    async def up() -> None:
        while data := await connection.read():
            if not await stream.write(data):
                return

    async def down() -> None:
        while data := await stream.read():
            await connection.write(data)

    pumps = {asyncio.create_task(up()), asyncio.create_task(down())}
    try:
        await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pump in pumps:
            pump.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
