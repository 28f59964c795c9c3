"""The phone's end of one adb transport (a TCP connection an adb server made with `adb
connect`): the CNXN handshake with AUTH, the streams the server opens (OPEN), their bytes
both ways with adb's flow control (one WRTE in flight until its OKAY), and their ends
(CLSE). What a stream is for is its handler's business: an adb door carries it to a leased
phone (amc_cli.adb_door), a harness's simulated phone answers it (amc_testing.adbd).

    server                                   DeviceTransport
    CNXN(version, maxdata, "host::…")   →
                                        ←   AUTH(TOKEN, 0, 20 random bytes)      (keys given)
    AUTH(SIGNATURE, 0, sig)             →   checked against the keys; else a new TOKEN, and
                                            an RSAPUBLICKEY alone is never trusted
                                        ←   CNXN(version, maxdata, "device::…;features=…")
    OPEN(their_id, 0, "shell:ls")       →   handler(stream): accept() → OKAY, refuse() → CLSE
    WRTE / OKAY / CLSE                  ⇄   stream.read(), stream.write(), stream.close()

A packet that is not one (a bad magic, a payload past the agreed size, a wrong checksum
owed by an old peer) drops the connection, as adbd does; the handlers' streams end with
it. A WRTE is answered OKAY at once while the stream holds less than two unread chunks,
else when its reader takes one: a slow reader slows its writer, never the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable

from amc_common import adb_transport as t
from amc_common.adb_auth import AdbKey, NotAKey, parse_key

log = logging.getLogger(__name__)

# Unread chunks a stream holds before its next OKAY waits for its reader.
_BUFFERED = 2
# How long the handlers of a transport that ended have to finish before they are cut.
_HANDLERS_GRACE = 1.0


class DeviceStream:
    """One stream the adb server opened; its handler accepts or refuses it, then reads
    what the server writes (b"" once it is over) and writes back."""

    def __init__(self, transport: DeviceTransport, local_id: int, remote_id: int, service: str):
        self.service = service
        self.local_id, self.remote_id = local_id, remote_id
        self._transport = transport
        self._inbox: deque[bytes] = deque()
        self._arrived = asyncio.Event()
        self._okay_owed = False
        self._acked = asyncio.Event()
        self._acked.set()
        self.accepted = False
        self.closed = False

    async def accept(self) -> None:
        """The service is open (OKAY)."""
        self.accepted = True
        await self._transport.send(t.Message(t.A_OKAY, self.local_id, self.remote_id))

    async def refuse(self) -> None:
        """The service could not be opened (CLSE with no id of ours)."""
        if not self.closed:
            self._over()
            await self._transport.send(t.Message(t.A_CLSE, 0, self.remote_id))

    async def read(self) -> bytes:
        """The next bytes the server wrote; b"" once the stream is over."""
        while not self._inbox:
            if self.closed:
                return b""
            self._arrived.clear()
            await self._arrived.wait()
        data = self._inbox.popleft()
        if self._okay_owed and len(self._inbox) < _BUFFERED and not self.closed:
            self._okay_owed = False
            await self._transport.send(t.Message(t.A_OKAY, self.local_id, self.remote_id))
        return data

    async def write(self, data: bytes) -> bool:
        """Send `data` in packets of the agreed size, each once the one before was OKAYed;
        False once the stream is over."""
        size = self._transport.max_payload
        for start in range(0, len(data), size):
            await self._acked.wait()
            if self.closed:
                return False
            self._acked.clear()
            chunk = data[start : start + size]
            await self._transport.send(t.Message(t.A_WRTE, self.local_id, self.remote_id, chunk))
        return not self.closed

    async def close(self) -> None:
        """End the stream from the phone's side (CLSE), once."""
        if not self.closed:
            self._over()
            await self._transport.send(t.Message(t.A_CLSE, self.local_id, self.remote_id))

    # -- from the transport's reader ---------------------------------------------------------

    def _received(self, data: bytes) -> None:
        self._inbox.append(data)
        self._arrived.set()
        if len(self._inbox) < _BUFFERED:
            self._transport.send_soon(t.Message(t.A_OKAY, self.local_id, self.remote_id))
        else:
            self._okay_owed = True

    def _over(self) -> None:
        self.closed = True
        self._arrived.set()
        self._acked.set()
        self._transport.forget(self)


Handler = Callable[[DeviceStream], Awaitable[None]]
# The adb keys trusted now (read again at each AUTH: a key made since counts).
Keys = Callable[[], list[AdbKey]]


class DeviceTransport:
    """The phone's end of one connection from an adb server; `run()` until it ends.
    `keys` None: no AUTH (an adbd with auth off); otherwise only a server that signs with
    one of them gets the CNXN."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        banner: bytes,
        handler: Handler,
        keys: Keys | None = None,
        max_payload: int = t.MAX_PAYLOAD,
    ) -> None:
        self._reader, self._writer = reader, writer
        self._banner, self._handler, self._keys = banner, handler, keys
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        # The largest payload this end takes (said in its CNXN), and the one agreed.
        self._most = max_payload
        self.max_payload = max_payload
        self._version = t.A_VERSION
        self._checked = False
        self._streams: dict[int, DeviceStream] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._token = b""
        self.online = False
        # Why the connection ended when this side ended it: a protocol error, an unknown key.
        self.dropped = ""

    async def run(self) -> None:
        try:
            while True:
                limit = self._most
                message = await t.read_message(self._reader, limit, self._checked)
                await self._dispatch(message)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the server hung up (adb disconnect, kill-server), or we closed it
        except t.ProtocolError as exc:
            self.dropped = f"protocol error: {exc}"
            log.warning("adb transport %s dropped: %s", self.peer, exc)
        finally:
            await self._end()

    def close(self) -> None:
        """Hang up on the server, as an unplugged phone does."""
        self._writer.close()

    async def send(self, message: t.Message) -> None:
        self.send_soon(message)
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()

    def send_soon(self, message: t.Message) -> None:
        """Queue a packet without waiting for the socket's room (a short one)."""
        if not self._writer.is_closing():
            self._writer.write(message.encode(self._checked))

    def forget(self, stream: DeviceStream) -> None:
        self._streams.pop(stream.local_id, None)

    async def _dispatch(self, m: t.Message) -> None:
        if m.command == t.A_CNXN:
            await self._connect(m)
        elif m.command == t.A_AUTH:
            await self._auth(m)
        elif not self.online:
            return  # adbd ignores streams before the handshake
        elif m.command == t.A_OPEN:
            self._open(m)
        elif m.command == t.A_OKAY:
            stream = self._streams.get(m.arg1)
            if stream is not None and stream.remote_id == m.arg0:
                stream._acked.set()
        elif m.command == t.A_WRTE:
            stream = self._streams.get(m.arg1)
            if stream is not None and stream.remote_id == m.arg0 and stream.accepted:
                stream._received(m.data)
        elif m.command == t.A_CLSE:
            stream = self._streams.get(m.arg1)
            if stream is not None and stream.remote_id == m.arg0:
                stream._over()

    async def _connect(self, m: t.Message) -> None:
        if m.arg0 < t.A_VERSION_MIN or m.arg1 <= 0:
            raise t.ProtocolError(f"CNXN of version {m.arg0:#x}, payloads of {m.arg1}")
        self._version = min(m.arg0, t.A_VERSION)
        self._checked = self._version < t.A_VERSION_SKIP_CHECKSUM
        self.max_payload = min(m.arg1, self._most)
        if self._keys is None:
            await self._online()
        else:
            await self._ask_token()

    async def _ask_token(self) -> None:
        self._token = os.urandom(t.TOKEN_SIZE)
        await self.send(t.Message(t.A_AUTH, t.AUTH_TOKEN, 0, self._token))

    async def _auth(self, m: t.Message) -> None:
        if self._keys is None or self.online or not self._token:
            return
        if m.arg0 == t.AUTH_SIGNATURE:
            if any(key.verifies(self._token, m.data) for key in self._keys()):
                await self._online()
            else:
                await self._ask_token()  # the server tries its next key
        elif m.arg0 == t.AUTH_RSAPUBLICKEY:
            # A phone would ask its user; nobody is asked here, and a public key proves
            # nothing: the server stays unauthorized.
            try:
                who = parse_key(m.data).comment or "no name"
            except NotAKey:
                who = "not a key"
            self.dropped = f"unauthorized: an adb server whose key is not trusted ({who})"
            log.warning("adb transport %s: %s", self.peer, self.dropped)

    async def _online(self) -> None:
        self.online = True
        banner = t.Message(t.A_CNXN, self._version, self._most, self._banner)
        await self.send(banner)

    def _open(self, m: t.Message) -> None:
        if m.arg0 == 0 or any(s.remote_id == m.arg0 for s in self._streams.values()):
            return
        stream = DeviceStream(self, next(self._ids), m.arg0, m.text())
        self._streams[stream.local_id] = stream
        task = asyncio.create_task(self._serve(stream))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, stream: DeviceStream) -> None:
        try:
            await self._handler(stream)
        except ConnectionError:
            pass
        except Exception:
            log.exception("adb stream %r failed", stream.service)
        finally:
            if stream.accepted:
                await stream.close()
            else:
                await stream.refuse()

    async def _end(self) -> None:
        for stream in list(self._streams.values()):
            stream._over()
        # Their handlers see the end (a read of b"", a refused write) and finish; any that
        # does not within a second is cut.
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=_HANDLERS_GRACE)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
