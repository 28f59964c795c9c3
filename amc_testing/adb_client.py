"""An adb server's end of one adb transport, for the harnesses and the tests: it connects
to an adb door (`amc adb`) as `adb connect` does, signs the door's AUTH token with an adb
key of its own (`AdbClientKey`: RSA 2048, its public half written as adb writes
adbkey.pub), opens streams and reads and writes them with adb's flow control, and says
when the door hung up (`closed_at`), which the chaos run holds against its session's end.

What the real adb client and server do is tested with them; this is for what they cannot
do on demand: count the time to a hang-up to the millisecond, send what no adb client
sends (a service of the adb server's own, a malformed packet), or many doors at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa, utils

from amc_common import adb_transport as t
from amc_common.adb_auth import AdbKey

HOST_BANNER = b"host::features=shell_v2,cmd,stat_v2"


class AdbClientKey:
    """An adb key pair of the harness's own."""

    def __init__(self) -> None:
        self._private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        numbers = self._private.public_key().public_numbers()
        self.public = AdbKey(numbers.n, numbers.e, "harness@amc")

    def sign(self, token: bytes) -> bytes:
        """The token signed as adb signs it (PKCS#1 v1.5, the token taken as SHA-1)."""
        return self._private.sign(token, padding.PKCS1v15(), utils.Prehashed(hashes.SHA1()))

    def write(self, path: Path) -> Path:
        """Its public half as an adbkey.pub file (for `amc adb --adb-key`)."""
        path.write_text(self.public.encode() + "\n")
        return path


class Refused(Exception):
    """The door would not open the service (CLSE with no id)."""


@dataclass
class ClientStream:
    client: AdbClient
    local_id: int
    remote_id: int = 0
    received: bytearray = field(default_factory=bytearray)
    closed: bool = False
    _opened: asyncio.Event = field(default_factory=asyncio.Event)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _acked: asyncio.Event = field(default_factory=asyncio.Event)

    async def write(self, data: bytes) -> None:
        size = self.client.max_payload
        for start in range(0, len(data), size):
            self._acked.clear()
            chunk = data[start : start + size]
            self.client.send(t.Message(t.A_WRTE, self.local_id, self.remote_id, chunk))
            while not self._acked.is_set() and not self.closed:
                await self._wait()

    async def read_all(self, within: float = 30.0) -> bytes:
        """Everything until the door closes the stream."""
        async with asyncio.timeout(within):
            while not self.closed:
                await self._wait()
        return bytes(self.received)

    async def read_until(self, needle: bytes, within: float = 30.0) -> bytes:
        async with asyncio.timeout(within):
            while needle not in self.received and not self.closed:
                await self._wait()
        return bytes(self.received)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.client.send(t.Message(t.A_CLSE, self.local_id, self.remote_id))

    async def _wait(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    def _wake(self) -> None:
        self._changed.set()


class AdbClient:
    """One connection to a door: `connect`, then `open` streams."""

    def __init__(self, key: AdbClientKey) -> None:
        self._key = key
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._streams: dict[int, ClientStream] = {}
        self._ids = itertools.count(1)
        self._online = asyncio.Event()
        self._reading: asyncio.Task[None] | None = None
        self.banner = ""
        self.max_payload = t.MAX_PAYLOAD
        self.tokens = 0  # AUTH tokens the door sent (a second one: the key was refused)
        # time.time() when the door hung up (None: it has not).
        self.closed_at: float | None = None

    async def connect(self, host: str, port: int, within: float = 10.0) -> None:
        """Connect and authenticate; TimeoutError if the door never lets this key in."""
        self._reader, self._writer = await asyncio.open_connection(host, port)
        self.send(t.Message(t.A_CNXN, t.A_VERSION, t.MAX_PAYLOAD, HOST_BANNER))
        self._reading = asyncio.create_task(self._read())
        await asyncio.wait_for(self._online.wait(), within)

    def send(self, message: t.Message) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(message.encode(checksum=False))

    def send_raw(self, data: bytes) -> None:
        """Bytes that need not be a packet (for a door's handling of bad input)."""
        assert self._writer is not None
        self._writer.write(data)

    async def open(self, service: str, within: float = 30.0) -> ClientStream:
        stream = ClientStream(self, next(self._ids))
        self._streams[stream.local_id] = stream
        self.send(t.Message(t.A_OPEN, stream.local_id, 0, service.encode() + b"\0"))
        async with asyncio.timeout(within):
            while not stream._opened.is_set() and not stream.closed:
                await stream._wait()
        if not stream._opened.is_set():
            raise Refused(service)
        return stream

    async def shell(self, command: str, within: float = 30.0) -> bytes:
        stream = await self.open(f"shell:{command}", within)
        return await stream.read_all(within)

    async def wait_closed(self, within: float = 30.0) -> float:
        """When the door hung up (time.time())."""
        assert self._reading is not None
        await asyncio.wait_for(asyncio.shield(self._reading), within)
        assert self.closed_at is not None
        return self.closed_at

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reading

    async def _read(self) -> None:
        assert self._reader is not None
        try:
            while True:
                self._on(await t.read_message(self._reader, 16 * 1024 * 1024))
        except (asyncio.IncompleteReadError, ConnectionError, t.ProtocolError):
            pass
        finally:
            self.closed_at = time.time()
            if self._writer is not None:
                self._writer.close()
            for stream in self._streams.values():
                stream.closed = True
                stream._wake()

    def _on(self, m: t.Message) -> None:
        if m.command == t.A_AUTH and m.arg0 == t.AUTH_TOKEN:
            self.tokens += 1
            if self.tokens == 1:
                self.send(t.Message(t.A_AUTH, t.AUTH_SIGNATURE, 0, self._key.sign(m.data)))
            else:
                key = self._key.public.encode().encode() + b"\0"
                self.send(t.Message(t.A_AUTH, t.AUTH_RSAPUBLICKEY, 0, key))
        elif m.command == t.A_CNXN:
            self.banner, self.max_payload = m.text(), min(m.arg1, t.MAX_PAYLOAD)
            self._online.set()
        elif (stream := self._streams.get(m.arg1)) is not None:
            self._on_stream(stream, m)

    def _on_stream(self, stream: ClientStream, m: t.Message) -> None:
        if m.command == t.A_OKAY:
            if not stream._opened.is_set():
                stream.remote_id = m.arg0
                stream._opened.set()
            else:
                stream._acked.set()
        elif m.command == t.A_WRTE:
            stream.received += m.data
            self.send(t.Message(t.A_OKAY, stream.local_id, stream.remote_id))
        elif m.command == t.A_CLSE:
            stream.closed = True
        stream._wake()
