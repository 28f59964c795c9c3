"""A fake phone-side adbd: the real adb server can `adb connect` to it over loopback.

It speaks the device end of the adb transport protocol (AOSP ``protocol.txt``):
24-byte little-endian headers ``command, arg0, arg1, data_length, data_check, magic``
with ``magic == command ^ 0xffffffff``, followed by ``data_length`` bytes.

    server                               FakeAdbd
    CNXN(version, maxdata, "host::…")  →
                                       ←  CNXN(version, maxdata, "device::…")   (no AUTH)
    OPEN(their_id, 0, "shell:echo hi") →
                                       ←  OKAY(our_id, their_id)
                                       ←  WRTE(our_id, their_id, b"hi\\n")
    OKAY(their_id, our_id)             →  (flow control: one WRTE in flight per stream)
                                       ←  CLSE(our_id, their_id)

Services ``shell:``, ``exec:`` and ``exec-out:`` run the command on a `FakePhone` (an
``exec:`` that announces a stdin size, ``cmd package install -S N``, reads N bytes of the
server's WRTEs first); ``shell:sh`` is ``sh`` reading command lines from the server's
WRTEs (`FakePhone.sh`), each run as its line ends, until the server closes the stream (as
adbd's ``sh -c sh`` with the stream as its stdin); ``sync:`` speaks the sync protocol on
the phone's files (tests.support.fakes.sync); ``tcp:7`` echoes what it is sent (the
phone's echo port, as a simulated phone's, so that ``adb forward`` has something to
reach); anything else (``reboot:``, …) is refused with ``CLSE(0, their_id)``.
`wedged`: the transport hangs (OPENs go unanswered, as over a stuck USB link) until the
server connects again (`adb reconnect`), which clears it.
We do not advertise ``shell_v2`` so the server uses plain ``shell:``, the service our
driver (pure-python-adb) uses; output is therefore raw bytes with no exit code.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import struct
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self, cast

from host_agent.simulated_door import ECHO_PORT
from tests.support.fakes.phone import FakePhone
from tests.support.fakes.sync import serve_sync, stdin_size

log = logging.getLogger(__name__)

A_CNXN = 0x4E584E43
A_AUTH = 0x48545541
A_OPEN = 0x4E45504F
A_OKAY = 0x59414B4F
A_CLSE = 0x45534C43
A_WRTE = 0x45545257
A_STLS = 0x534C5453

A_VERSION_MIN = 0x01000000
# From this version on, senders may leave data_check at 0 (we still fill it in).
A_VERSION_SKIP_CHECKSUM = 0x01000001
MAX_PAYLOAD = 256 * 1024

_HEADER = struct.Struct("<6I")
# Refuse absurd lengths rather than buffering garbage from a confused peer.
_MAX_ACCEPTED_PAYLOAD = 16 * 1024 * 1024
_EXEC_SERVICES = ("shell:", "exec:", "exec-out:")

_NAMES = {
    A_CNXN: "CNXN",
    A_AUTH: "AUTH",
    A_OPEN: "OPEN",
    A_OKAY: "OKAY",
    A_CLSE: "CLSE",
    A_WRTE: "WRTE",
    A_STLS: "STLS",
}


class ProtocolError(Exception):
    """The peer sent something that is not an adb message."""


@dataclass(frozen=True)
class Message:
    command: int
    arg0: int
    arg1: int
    data: bytes = b""

    def encode(self) -> bytes:
        check = sum(self.data) & 0xFFFFFFFF
        magic = self.command ^ 0xFFFFFFFF
        header = _HEADER.pack(self.command, self.arg0, self.arg1, len(self.data), check, magic)
        return header + self.data

    def __str__(self) -> str:
        name = _NAMES.get(self.command, hex(self.command))
        return f"{name}({self.arg0:#x}, {self.arg1:#x}, {self.data[:60]!r})"


async def read_message(reader: asyncio.StreamReader) -> Message:
    header = await reader.readexactly(_HEADER.size)
    command, arg0, arg1, length, _check, magic = _HEADER.unpack(header)
    if magic != command ^ 0xFFFFFFFF:
        raise ProtocolError(f"bad magic {magic:#x} for command {command:#x}")
    if length > _MAX_ACCEPTED_PAYLOAD:
        raise ProtocolError(f"payload of {length} bytes is too large")
    data = await reader.readexactly(length) if length else b""
    return Message(command, arg0, arg1, data)


@dataclass(frozen=True)
class ConnectionRecord:
    """One transport the adb server opened to us."""

    peer: str
    # What the server said about itself in its CNXN, e.g. "host::features=…".
    system_identity: str
    version: int
    max_payload: int


@dataclass
class _Stream:
    local_id: int
    remote_id: int
    service: str
    acked: asyncio.Event = field(default_factory=asyncio.Event)
    closed: bool = False
    task: asyncio.Task[None] | None = None
    # What the server wrote into the stream (a command's stdin, sync packets).
    stdin: asyncio.StreamReader = field(default_factory=asyncio.StreamReader)


class FakeAdbd:
    """One fake phone on ``127.0.0.1:<port>``; use as ``async with FakeAdbd(phone) as adbd``.

    `connections` lists the transports the server opened (one per ``adb connect``,
    again after a reconnect); `services` every stream the server opened, in order
    (e.g. ``"shell:input tap 1 2"``), and `hung_up` those the server closed before they
    ended (its CLSE first). The phone records the commands themselves.

    `features` goes into the CNXN banner. Leave out ``shell_v2``: with it the server
    would expect the shell protocol's packet framing (and exit codes), which this fake
    does not speak. Data the server writes into a stream is its stdin: read by an install
    from stdin, by sync and by ``shell:sh``, dropped by the others.
    """

    def __init__(
        self,
        phone: FakePhone,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_payload: int = MAX_PAYLOAD,
        features: tuple[str, ...] = ("cmd",),
    ) -> None:
        self.phone = phone
        self.host = host
        self._port = port
        self.max_payload = max_payload
        self.features = features
        self.connections: list[ConnectionRecord] = []
        self.services: list[str] = []
        self.hung_up: list[str] = []
        # While set, services asked for are never answered; a new connection clears it.
        self.wedged = False
        # Bytes the server wrote into streams; while `reading` is clear, the phone reads
        # nothing more from its connections (as a phone whose storage stalls).
        self.received = 0
        self.reading = asyncio.Event()
        self.reading.set()
        self._server: asyncio.Server | None = None
        self._sessions: set[_Session] = set()
        self._ids = itertools.count(1)

    @property
    def port(self) -> int:
        """The bound port; kept after `stop` so a restart comes back on the same address."""
        if not self._port:
            raise RuntimeError("FakeAdbd was never started")
        return self._port

    @property
    def address(self) -> str:
        """What to pass to ``adb connect``; also the serial the server will report."""
        return f"{self.host}:{self.port}"

    def banner(self) -> bytes:
        props = self.phone.props
        fields = [
            f"ro.product.name={props.get('ro.product.name', 'fake')}",
            f"ro.product.model={props.get('ro.product.model', 'Fake')}",
            f"ro.product.device={props.get('ro.product.device', 'fake')}",
            f"features={','.join(self.features)}",
        ]
        return ("device::" + ";".join(fields)).encode()

    def _next_local_id(self) -> int:
        return next(self._ids)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._on_connection, self.host, self._port)
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        # A session waiting to read again ends too: a test that failed while `reading` was
        # clear must not hang in its teardown.
        self.reading.set()
        server, self._server = self._server, None
        if server is not None:
            server.close()
        await self.drop_connections()
        if server is not None:
            await server.wait_closed()

    async def drop_connections(self) -> None:
        """Hang up on the adb server, as a phone does when unplugged or rebooted."""
        sessions = list(self._sessions)
        for session in sessions:
            session.close()
        for session in sessions:
            await session.wait_finished()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        session = _Session(self, reader, writer)
        self._sessions.add(session)
        try:
            await session.run()
        finally:
            self._sessions.discard(session)


class _Session:
    """One TCP connection from the adb server: a transport carrying many streams."""

    def __init__(
        self, adbd: FakeAdbd, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.adbd = adbd
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.streams: dict[int, _Stream] = {}
        self.max_payload = adbd.max_payload
        self._write_lock = asyncio.Lock()
        # Every stream's task, including ones the server already closed, so none outlives us.
        self._tasks: set[asyncio.Task[None]] = set()
        self._finished = asyncio.Event()

    async def run(self) -> None:
        try:
            while True:
                message = await read_message(self.reader)
                log.debug("adbd %s <- %s", self.peer, message)
                await self._dispatch(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the server hung up (adb disconnect, kill-server) or we closed it
        except ProtocolError:
            log.exception("adbd %s: protocol error, dropping the connection", self.peer)
        finally:
            await self._shutdown()

    def close(self) -> None:
        self.writer.close()

    async def wait_finished(self) -> None:
        await self._finished.wait()

    async def _shutdown(self) -> None:
        for stream in self.streams.values():
            stream.closed = True
            stream.acked.set()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.streams.clear()
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()
        self._finished.set()

    async def send(self, message: Message) -> None:
        log.debug("adbd %s -> %s", self.peer, message)
        async with self._write_lock:
            self.writer.write(message.encode())
            await self.writer.drain()

    async def _dispatch(self, message: Message) -> None:
        command = message.command
        if command == A_CNXN:
            await self._on_connect(message)
        elif command == A_OPEN:
            await self._on_open(message)
        elif command == A_OKAY:
            self._on_okay(message)
        elif command == A_WRTE:
            await self._on_write(message)
        elif command == A_CLSE:
            self._on_close(message)
        else:
            # AUTH/STLS only come after we ask for them, which we never do.
            log.warning("adbd %s: ignoring %s", self.peer, message)

    async def _on_connect(self, message: Message) -> None:
        version = min(message.arg0, A_VERSION_SKIP_CHECKSUM)
        self.max_payload = min(self.adbd.max_payload, message.arg1)
        identity = message.data.rstrip(b"\0").decode(errors="replace")
        self.adbd.connections.append(
            ConnectionRecord(self.peer, identity, message.arg0, message.arg1)
        )
        self.adbd.wedged = False
        # Answering CNXN straight away (no AUTH) is what a device with auth disabled does.
        await self.send(Message(A_CNXN, version, self.adbd.max_payload, self.adbd.banner()))

    async def _on_open(self, message: Message) -> None:
        remote_id = message.arg0
        service = message.data.rstrip(b"\0").decode(errors="replace")
        self.adbd.services.append(service)
        if self.adbd.wedged:
            log.info("adbd %s: wedged, not answering %r", self.peer, service)
            return
        command = "" if service.startswith(("sync:", ECHO_PORT)) else _command_of(service)
        if command is None:
            log.info("adbd %s: refusing service %r", self.peer, service)
            await self.send(Message(A_CLSE, 0, remote_id))
            return
        stream = _Stream(self.adbd._next_local_id(), remote_id, service)
        self.streams[stream.local_id] = stream
        await self.send(Message(A_OKAY, stream.local_id, remote_id))
        stream.task = asyncio.create_task(self._serve(stream, command))
        self._tasks.add(stream.task)
        stream.task.add_done_callback(self._tasks.discard)

    def _on_okay(self, message: Message) -> None:
        stream = self.streams.get(message.arg1)
        if stream is not None:
            stream.acked.set()

    async def _on_write(self, message: Message) -> None:
        self.adbd.received += len(message.data)
        await self.adbd.reading.wait()
        stream = self.streams.get(message.arg1)
        if stream is None:
            return
        # Stdin for the command (read by an install from stdin and by sync; else dropped).
        stream.stdin.feed_data(message.data)
        await self.send(Message(A_OKAY, stream.local_id, stream.remote_id))

    def _on_close(self, message: Message) -> None:
        stream = self.streams.pop(message.arg1, None)
        if stream is None:
            return
        self.adbd.hung_up.append(stream.service)
        stream.closed = True
        stream.acked.set()
        stream.stdin.feed_eof()
        if stream.task is not None and not stream.service.startswith("sync:"):
            stream.task.cancel()  # like SIGHUP to the shell when the host hangs up

    async def _serve(self, stream: _Stream, command: str) -> None:
        try:
            if stream.service.startswith("sync:"):
                await self._serve_sync(stream)
                return
            if stream.service == ECHO_PORT:
                while chunk := await stream.stdin.read(self.max_payload):
                    await self._write(stream, chunk)
                return
            if stream.service == "shell:sh":
                await self._serve_sh(stream)
                return
            if (size := stdin_size(command)) is not None:
                data = await stream.stdin.readexactly(size)
                await self._write_all(stream, self.adbd.phone.stdin_command(command, data))
                await self._close_stream(stream)
                return
            # stream_shell is an async generator; close it so a `return` mid-way runs its finally.
            outputs = cast(AsyncGenerator[bytes, None], self.adbd.phone.stream_shell(command))
            async with contextlib.aclosing(outputs):
                async for output in outputs:
                    for start in range(0, len(output), self.max_payload):
                        chunk = output[start : start + self.max_payload]
                        if not await self._write(stream, chunk):
                            return
            await self._close_stream(stream)
        except ConnectionError:
            pass  # the transport went away; _shutdown cleans up
        except Exception:
            # A bug in the fake phone: say so, and end the stream rather than hang the host.
            log.exception("adbd %s: %r failed", self.peer, stream.service)
            await self._close_stream(stream)

    async def _serve_sh(self, stream: _Stream) -> None:
        """Each line the server writes run as it ends, its output written back, until the
        server closes the stream (which cancels this, as SIGHUP ends adbd's ``sh``)."""
        async with contextlib.aclosing(self.adbd.phone.sh(stream.stdin.readline)) as lines:
            async for _command, output in lines:
                async with contextlib.aclosing(output):
                    async for chunk in output:
                        await self._write_all(stream, chunk)
                if stream.closed:
                    return
        await self._close_stream(stream)

    async def _serve_sync(self, stream: _Stream) -> None:
        async def write(data: bytes) -> None:
            await self._write_all(stream, data)

        await serve_sync(self.adbd.phone, stream.stdin.readexactly, write)
        await self._close_stream(stream)

    async def _write_all(self, stream: _Stream, data: bytes) -> None:
        for start in range(0, len(data), self.max_payload):
            if not await self._write(stream, data[start : start + self.max_payload]):
                return

    async def _close_stream(self, stream: _Stream) -> None:
        if stream.closed:
            return
        self.streams.pop(stream.local_id, None)
        stream.closed = True
        await self.send(Message(A_CLSE, stream.local_id, stream.remote_id))

    async def _write(self, stream: _Stream, chunk: bytes) -> bool:
        """Send one WRTE and wait for its OKAY; False if the server closed the stream."""
        if stream.closed:
            return False
        stream.acked.clear()
        await self.send(Message(A_WRTE, stream.local_id, stream.remote_id, chunk))
        await stream.acked.wait()
        return not stream.closed


def _command_of(service: str) -> str | None:
    for prefix in _EXEC_SERVICES:
        if service.startswith(prefix):
            return service[len(prefix) :]
    return None
