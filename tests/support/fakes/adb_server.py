"""A fake adb server: the adb *host* protocol over real TCP, serving `FakePhone`s.

This is what `adb start-server` listens on (5037); here on 127.0.0.1, ephemeral port.

Protocol (see adb's OVERVIEW.TXT / SERVICES.TXT): the client sends a request as four
hex digits of length followed by the payload; the server answers ``OKAY`` or ``FAIL``
followed by four hex digits and a message. Supported requests:

* ``host:version`` → ``OKAY`` + length-prefixed ``"0029"``, then close
* ``host:devices`` / ``host:devices-l`` → ``OKAY`` + length-prefixed listing, then close
* ``host:transport:<serial>`` → ``OKAY`` and the connection now talks to that phone, or
  ``FAIL device '<serial>' not found`` / ``device offline`` / ``device unauthorized…``
* ``host:transport-any`` → the only attached phone
* ``shell:<cmd>`` and ``exec-out:<cmd>`` (after a transport) → ``OKAY``, the raw output
  as the phone produces it, then close
* ``shell:sh`` (after a transport) → ``OKAY``, then ``sh`` reading command lines from the
  connection (`FakePhone.sh`), each answered as it comes, until the client closes it
* ``exec:<cmd>`` (after a transport): as ``exec-out:``; a command that announces a stdin
  size (``cmd package install -S N``) reads N bytes from the connection first
* ``sync:`` (after a transport) → ``OKAY``, then the sync protocol (tests.support.fakes.sync:
  STAT, SEND, RECV, QUIT) on the phone's files
* ``reboot:`` (after a transport) → ``OKAY``, the phone boots for its `boot_time`, close
* ``localabstract:<name>`` (after a transport): a socket of the phone's, served by a phone
  that has them (tests.support.fakes.scrcpy_server.ScrcpyPhone), refused otherwise
* ``host-serial:<serial>:reconnect`` → ``OKAY`` + ``"reconnecting <serial> [device]\n"``
  (counted in `reconnects`), or ``OKAY`` + why not (as adb answers), then close

Faults (mutable at runtime through `FakeAdbServer.faults`): replies split into tiny TCP
segments, the connection reset half-way through a command's output, or a request that
is never answered (on ``shell:sh``, a line: half its output then a reset, or no answer).
Every request and every connection (with who closed it) is recorded; the lines of a
``shell:sh`` are the phone's `commands`, not requests.

Usage::

    async with FakeAdbServer([FakePhone("emu-1")]) as server:
        source = AdbSource(port=server.port)
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import TracebackType

from tests.support.fakes.phone import FakePhone
from tests.support.fakes.sync import serve_sync, stdin_size

ADB_SERVER_VERSION = "0029"


@dataclass
class Faults:
    # > 0: every reply is written in chunks of this many bytes, each drained and paced.
    chunk_size: int = 0
    chunk_delay: float = 0.001
    # A shell/exec-out command (or a line of shell:sh) containing this gets OKAY, half its
    # output, then a reset.
    drop_on: str | None = None
    # A request (or a line of shell:sh) containing this is never answered (the server
    # waits for the client to go).
    hang_on: str | None = None


@dataclass(frozen=True)
class RecordedRequest:
    at: float
    connection_id: int
    payload: str


@dataclass
class ConnectionRecord:
    id: int
    opened_at: float
    requests: list[str] = field(default_factory=list)
    serial: str | None = None
    closed_at: float | None = None
    # "server" (normal end of a reply), "client", "fault", "device removed" or "stop".
    closed_by: str | None = None

    @property
    def closed(self) -> bool:
        return self.closed_at is not None

    def mark_closed(self, by: str) -> None:
        if self.closed_at is None:
            self.closed_at, self.closed_by = time.monotonic(), by


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    record: ConnectionRecord


class FakeAdbServer:
    host = "127.0.0.1"

    def __init__(self, phones: Iterable[FakePhone] = (), *, faults: Faults | None = None):
        self.faults = faults or Faults()
        self.requests: list[RecordedRequest] = []
        self.connections: list[ConnectionRecord] = []
        self._phones: dict[str, FakePhone] = {}
        self._states: dict[str, str] = {}
        self._live: dict[int, _Conn] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0
        # `adb reconnect`s asked for, per serial.
        self.reconnects: dict[str, int] = {}
        # The lines of a `shell:sh` left unanswered (faults.hang_on), as they came.
        self.hung: list[str] = []
        for phone in phones:
            self.add_phone(phone)

    # -- devices ------------------------------------------------------------------------

    def add_phone(self, phone: FakePhone, state: str = "device") -> FakePhone:
        self._phones[phone.serial] = phone
        self._states[phone.serial] = state
        return phone

    def remove_phone(self, serial: str) -> None:
        """Unplug: the phone leaves the listing and its open connections are reset."""
        self._phones.pop(serial, None)
        self._states.pop(serial, None)
        for conn in list(self._live.values()):
            if conn.record.serial == serial:
                conn.record.mark_closed("device removed")
                conn.writer.transport.abort()

    def set_state(self, serial: str, state: str) -> None:
        self._states[serial] = state

    def phone(self, serial: str) -> FakePhone:
        return self._phones[serial]

    def payloads(self) -> list[str]:
        return [r.payload for r in self.requests]

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> FakeAdbServer:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for conn in list(self._live.values()):
            conn.record.mark_closed("stop")
            conn.writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> FakeAdbServer:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- one client connection ----------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        record = ConnectionRecord(id=len(self.connections), opened_at=time.monotonic())
        self.connections.append(record)
        conn = _Conn(reader, writer, record)
        self._live[record.id] = conn
        # Tiny writes must leave as separate segments for the split-reply fault.
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await self._dialogue(conn)
        except (ConnectionError, asyncio.IncompleteReadError):
            record.mark_closed("client")
        finally:
            self._live.pop(record.id, None)
            record.mark_closed("server")
            writer.close()
            self._tasks.discard(task)

    async def _dialogue(self, conn: _Conn) -> None:
        while True:
            payload = await self._read_request(conn)
            if payload is None:
                conn.record.mark_closed("client")
                return
            if self.faults.hang_on is not None and self.faults.hang_on in payload:
                await self._wait_for_client_close(conn)
                return
            if await self._dispatch(conn, payload):
                return

    async def _read_request(self, conn: _Conn) -> str | None:
        header = await conn.reader.read(4)
        if not header:
            return None
        header += await conn.reader.readexactly(4 - len(header))
        payload = (await conn.reader.readexactly(int(header, 16))).decode()
        self.requests.append(RecordedRequest(time.monotonic(), conn.record.id, payload))
        conn.record.requests.append(payload)
        return payload

    async def _dispatch(self, conn: _Conn, payload: str) -> bool:
        """Answer one request; True when the connection is finished."""
        if payload == "host:version":
            await self._okay_with_data(conn, ADB_SERVER_VERSION)
        elif payload in ("host:devices", "host:devices-l"):
            await self._okay_with_data(conn, self._listing(long=payload.endswith("-l")))
        elif payload.startswith("host:transport:"):
            return not await self._select(conn, payload.removeprefix("host:transport:"))
        elif payload == "host:transport-any":
            return not await self._select(conn, self._any_serial())
        elif payload.startswith(("shell:", "exec-out:", "exec:")):
            await self._run_service(conn, payload)
        elif payload == "sync:" and conn.record.serial in self._phones:
            await self._send(conn, b"OKAY")
            phone = self._phones[conn.record.serial]
            await serve_sync(phone, conn.reader.readexactly, lambda data: self._send(conn, data))
        elif payload.startswith("host-serial:") and payload.endswith(":reconnect"):
            serial = payload.removeprefix("host-serial:").removesuffix(":reconnect")
            state = self._states.get(serial)
            if state is None:
                await self._okay_with_data(conn, f"device '{serial}' not found")
            else:
                self.reconnects[serial] = self.reconnects.get(serial, 0) + 1
                await self._okay_with_data(conn, f"reconnecting {serial} [{state}]\n")
        elif payload.startswith("localabstract:") and (
            serve := getattr(self._phones.get(conn.record.serial or ""), "serve", None)
        ):
            await serve(payload, conn.reader, conn.writer)
        elif payload == "reboot:" and conn.record.serial in self._phones:
            # adb answers OKAY and the phone restarts (it stays listed here, booting).
            self._phones[conn.record.serial].reboot()
            await self._send(conn, b"OKAY")
        else:
            await self._fail(conn, "unknown host service")
        return True

    # -- host services ------------------------------------------------------------------

    def _listing(self, *, long: bool) -> str:
        lines = []
        for transport_id, (serial, state) in enumerate(self._states.items(), start=1):
            if not long:
                lines.append(f"{serial}\t{state}\n")
                continue
            details = ""
            if state == "device":
                props = self._phones[serial].props
                model = props.get("ro.product.model", "").replace(" ", "_")
                details = (
                    f" product:{props.get('ro.product.name', '')} model:{model}"
                    f" device:{props.get('ro.product.device', '')}"
                )
            lines.append(f"{serial:<22} {state}{details} transport_id:{transport_id}\n")
        return "".join(lines)

    def _any_serial(self) -> str:
        serials = list(self._states)
        return serials[0] if len(serials) == 1 else ""

    async def _select(self, conn: _Conn, serial: str) -> bool:
        problem = self._transport_problem(serial)
        if problem:
            await self._fail(conn, problem)
            return False
        conn.record.serial = serial
        await self._send(conn, b"OKAY")
        return True

    def _transport_problem(self, serial: str) -> str | None:
        if not serial:
            return "no devices/emulators found" if not self._states else "more than one device"
        state = self._states.get(serial)
        if state is None:
            return f"device '{serial}' not found"
        if state == "unauthorized":
            return "device unauthorized.\nPlease check the confirmation dialog on your device."
        if state != "device":
            return f"device {state}"
        return None

    # -- device services ----------------------------------------------------------------

    async def _run_service(self, conn: _Conn, payload: str) -> None:
        command = payload.split(":", 1)[1]
        serial = conn.record.serial
        if serial is None:
            await self._fail(conn, "no device selected: send host:transport first")
            return
        if serial not in self._phones:
            await self._fail(conn, f"device '{serial}' not found")
            return
        if self._states[serial] != "device":
            # What adb says when the transport went away under an open request.
            await self._fail(conn, "closed")
            return
        phone = self._phones[serial]
        await self._send(conn, b"OKAY")
        if payload == "shell:sh":
            await self._serve_sh(conn, phone)
        elif (size := stdin_size(command)) is not None:
            data = await conn.reader.readexactly(size)
            await self._send(conn, phone.stdin_command(command, data))
        elif self.faults.drop_on is not None and self.faults.drop_on in command:
            await self._drop_half_way(conn, phone, command)
        else:
            await self._stream_until_done_or_client_gone(conn, phone, command)

    async def _stream_until_done_or_client_gone(
        self, conn: _Conn, phone: FakePhone, command: str
    ) -> None:
        pump = asyncio.ensure_future(self._pump(conn, phone, command))
        # Nothing more is sent by a client after shell:, so a read ends only on close.
        watcher = asyncio.ensure_future(conn.reader.read(1))
        try:
            done, _ = await asyncio.wait({pump, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, watcher):
                task.cancel()
            await asyncio.gather(pump, watcher, return_exceptions=True)
        if pump in done and pump.exception() is None:
            return
        conn.record.mark_closed("client")

    async def _serve_sh(self, conn: _Conn, phone: FakePhone) -> None:
        """``sh`` reading lines from the connection: each line's output sent as it comes,
        the faults applied line by line, until the client closes the connection."""
        async with contextlib.aclosing(phone.sh(conn.reader.readline)) as lines:
            async for command, output in lines:
                if self.faults.hang_on is not None and self.faults.hang_on in command:
                    self.hung.append(command)
                    await self._wait_for_client_close(conn)
                    return
                if self.faults.drop_on is not None and self.faults.drop_on in command:
                    await self._drop_half_way(conn, phone, command)
                    return
                async with contextlib.aclosing(output):
                    async for chunk in output:
                        await self._send(conn, chunk)
        conn.record.mark_closed("client")

    async def _pump(self, conn: _Conn, phone: FakePhone, command: str) -> None:
        async for chunk in phone.stream_shell(command):
            await self._send(conn, chunk)

    async def _drop_half_way(self, conn: _Conn, phone: FakePhone, command: str) -> None:
        output = await phone.run_shell(command)
        await self._send(conn, output[: len(output) // 2])
        conn.record.mark_closed("fault")
        conn.writer.transport.abort()

    async def _wait_for_client_close(self, conn: _Conn) -> None:
        while await conn.reader.read(4096):
            pass
        conn.record.mark_closed("client")

    # -- wire ---------------------------------------------------------------------------

    async def _okay_with_data(self, conn: _Conn, data: str) -> None:
        body = data.encode()
        await self._send(conn, b"OKAY" + f"{len(body):04x}".encode() + body)

    async def _fail(self, conn: _Conn, message: str) -> None:
        body = message.encode()
        await self._send(conn, b"FAIL" + f"{len(body):04x}".encode() + body)

    async def _send(self, conn: _Conn, data: bytes) -> None:
        size = self.faults.chunk_size
        if size <= 0:
            conn.writer.write(data)
            await conn.writer.drain()
            return
        for start in range(0, len(data), size):
            conn.writer.write(data[start : start + size])
            await conn.writer.drain()
            # Pacing so the client really sees one segment at a time.
            await asyncio.sleep(self.faults.chunk_delay)
