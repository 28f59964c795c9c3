"""The adb server's host protocol, spoken over connections pure-python-adb (`ppadb`) opens.

This is the one module that imports `ppadb`. The library's async client is old and has
defects that this module and host_agent.adb work around:

* its reads use ``StreamReader.read(n)``, which may return fewer than ``n`` bytes, so a
  reply split across TCP segments (``"O"``, ``"KAY"``) is taken for an error;
* it reads ``FAIL`` messages as 1024 raw bytes (length digits included, or cut short);
* ``shell()`` decodes output strictly (invalid UTF-8 raises ``UnicodeDecodeError``) and
  leaks its connection when anything raises; there is no overall deadline;
* ``screencap()`` rewrites ``\\r\\n`` in the image based on a guess at byte 5;
* ``push``/``pull`` in the async client are broken; every error is a bare ``RuntimeError``.

So `ppadb` only opens and closes the TCP connection and encodes requests; framing
(``OKAY``/``FAIL`` + length) and reading are `Session`'s, one deadline per call and the
error mapping `guard`'s. A session closes its connection in ``finally``, also when
cancelled. No `ppadb` exception type escapes this module: `AdbFailure` (the server
answered FAIL) is turned into a `DeviceError` by `guard`.
"""

from __future__ import annotations

import asyncio
import socket
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

from host_agent.devices import DeviceError, DeviceLost, DeviceTimeout, SourceUnreachable

with warnings.catch_warnings():
    # ppadb writes regexes as plain strings ("\s"); compiling its sources warns.
    warnings.filterwarnings(
        "ignore", message="invalid escape sequence", category=SyntaxWarning, module=r".*ppadb"
    )
    warnings.filterwarnings(
        "ignore", message="invalid escape sequence", category=DeprecationWarning, module=r".*ppadb"
    )
    from ppadb.client_async import ClientAsync
    from ppadb.protocol import Protocol

__all__ = [
    "AdbFailure",
    "ClientAsync",
    "Session",
    "connect",
    "device_session",
    "failure_to_error",
    "guard",
    "host_query",
    "open_service",
]

READ_SIZE = 65536
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only
# Substrings of adb server FAIL messages that mean the phone is gone or unusable.
LOST_HINTS = ("not found", "offline", "closed", "unauthorized", "connection refused", "no devices")


class AdbFailure(Exception):
    """The adb server answered FAIL; carries its message. Never leaves a `guard`."""


def failure_to_error(serial: str, message: str) -> DeviceError:
    if any(hint in message.lower() for hint in LOST_HINTS):
        return DeviceLost(f"device lost: {serial}: {message}")
    return DeviceError(f"{serial}: adb server refused: {message}")


@asynccontextmanager
async def guard(serial: str, what: str, seconds: float) -> AsyncIterator[None]:
    """One deadline for the whole call, and adb/socket failures as DeviceError types."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError as exc:
        raise DeviceTimeout(f"{serial}: {what} timed out after {seconds:g}s") from exc
    except AdbFailure as exc:
        raise failure_to_error(serial, str(exc)) from None
    except (OSError, EOFError) as exc:
        raise DeviceError(f"{serial}: {what}: adb connection failed: {exc!r}") from exc


class Session:
    """One connection to the adb server. ppadb connects; framing is done here."""

    def __init__(self, connection: Any):
        self._conn = connection
        self._reader: asyncio.StreamReader = connection.reader

    async def request(self, payload: str) -> None:
        """Send one request and wait for OKAY; FAIL raises `AdbFailure`."""
        await self._conn.write(Protocol.encode_data(payload))
        status = await self._reader.readexactly(4)
        if status == b"OKAY":
            return
        if status == b"FAIL":
            raise AdbFailure(await self.read_string())
        raise DeviceError(f"adb server sent {status!r} instead of OKAY/FAIL")

    async def write(self, data: bytes) -> None:
        """Raw bytes to the service asked for (a command's stdin, sync packets)."""
        await self._conn.write(data)

    async def read_exactly(self, n: int) -> bytes:
        return await self._reader.readexactly(n)

    async def read_string(self) -> str:
        """A length-prefixed reply (four hex digits, then the payload)."""
        header = await self._reader.readexactly(4)
        try:
            length = int(header, 16)
        except ValueError:
            raise DeviceError(f"adb server sent a bad length {header!r}") from None
        return (await self._reader.readexactly(length)).decode("utf-8", errors="replace")

    async def read_to_end(self) -> bytes:
        """Everything until the server closes; a reset just ends what we got."""
        data = bytearray()
        with suppress(ConnectionError):
            while chunk := await self._reader.read(READ_SIZE):
                data += chunk
        return bytes(data)

    async def read_some(self) -> bytes:
        """What has arrived (up to READ_SIZE bytes), waiting for some; b"" once the server
        closed or reset the connection."""
        with suppress(ConnectionError):
            return await self._reader.read(READ_SIZE)
        return b""

    def ended(self) -> bool:
        """The server has closed or reset the connection, and nothing it sent is unread."""
        return self._reader.at_eof() or self._reader.exception() is not None

    def ack_now(self) -> None:
        """Acknowledge what has arrived at once (TCP_QUICKACK, on Linux), not within the
        kernel's delayed-ACK time (40 ms): the adb server's socket holds a small write back
        until the one before it is acknowledged (Nagle), so on a stream the agent only reads
        after its request (a followed log), the first output after the OKAY would come up
        to 40 ms late. (The option does not last, but a stream only read from then on keeps
        being acknowledged promptly: lines written one by one while followed came in 2 ms.)"""
        sock = self._conn.writer.get_extra_info("socket") if self._conn.writer else None
        if sock is not None and _QUICKACK is not None:
            with suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)

    def close(self) -> None:
        # Synchronous on purpose: it must also work while a cancellation unwinds.
        writer = self._conn.writer
        if writer is not None:
            writer.close()


async def _connection(client: ClientAsync) -> Any:
    try:
        return await client.create_connection()
    except RuntimeError as exc:  # ppadb wraps OSError from connect in RuntimeError
        raise SourceUnreachable(f"adb server unreachable at {client.host}:{client.port}") from exc


@asynccontextmanager
async def connect(client: ClientAsync) -> AsyncIterator[Session]:
    """One connection to the adb server, closed however the block ends."""
    connection = await _connection(client)
    session = Session(connection)
    try:
        yield session
    finally:
        session.close()
        with suppress(Exception):
            await connection.close()


@asynccontextmanager
async def device_session(client: ClientAsync, serial: str) -> AsyncIterator[Session]:
    """A connection switched to `serial`'s transport: what is asked next goes to that phone."""
    async with connect(client) as on_device:
        await on_device.request(f"host:transport:{serial}")
        yield on_device


async def host_query(client: ClientAsync, payload: str) -> str:
    """One request to the adb server itself, and its length-prefixed answer."""
    async with connect(client) as server:
        await server.request(payload)
        return await server.read_string()


async def open_service(client: ClientAsync, serial: str, service: str) -> Session:
    """A connection to one of `serial`'s services that outlives a block (a kept shell,
    host_agent.adb_kept_shell): its caller closes it (`Session.close`); closed here if
    the transport or the service is refused (`AdbFailure`) or anything else raises."""
    session = Session(await _connection(client))
    try:
        await session.request(f"host:transport:{serial}")
        await session.request(service)
    except BaseException:
        session.close()
        raise
    return session
