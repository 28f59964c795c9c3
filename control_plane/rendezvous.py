"""Where a session's two calls meet on one replica: its client's `OpenSession` and its
host's `SessionActions` (control_plane.sessions), by task id. Wire-free, so the hub can
own one per replica; what travels through a `Relay` is sessions.py's business.

A relay reads its client's messages one at a time (`Relay.pump`): the next only once the
one before was answered (`Relay.answered`), so a client that sends actions without waiting
for their answers holds them in its own call, behind gRPC's flow control, not in this
replica's memory.

Once the session runs, an action crosses with no hop of its own: the task reading the
client's call hands each message to the session's handler (`Relay.relay`), which writes it
to the host's call, reads the host's step and writes it to the client's call, then lets the
next message be read: four waits on gRPC per action, nothing else. The client's call waits
for the relay's end (`Relay.relay` returns why), woken by nothing per action. Each call has
one `Writer`: one message in flight at a time, whichever task writes it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

# Put on the client's and the host's queues once the host's call is over, so that a wait
# for the next message ends with it (one queue read per message: no task per wait); also
# what `Relay.relay` returns when the host's call ended the relay.
HOST_GONE = object()
# What `Relay.relay` returns when the client sent nothing for the idle timeout.
IDLE = object()

Handler = Callable[[Any], Awaitable[None]]


class Call(Protocol):
    """What a `Writer` writes on: a gRPC call's (or a servicer context's) `write`."""

    async def write(self, message: Any) -> None: ...


class Writer:
    """One call's writes, one at a time (gRPC allows one message in flight on a call),
    from whichever task writes. A write that finds the call over is dropped: False (the
    call's reader says how it ended). A task writing is never cancelled mid-write by the
    relay (`busy`), so the next write never finds the last one still in flight."""

    def __init__(self, call: Call) -> None:
        self._call = call
        self._lock = asyncio.Lock()
        self.busy = False

    async def write(self, message: Any) -> bool:
        async with self._lock:
            self.busy = True
            try:
                await self._call.write(message)
            except asyncio.CancelledError:
                raise
            except Exception:  # the call is over (grpc.aio says so in several ways)
                return False
            finally:
                self.busy = False
        return True

    async def idle(self) -> None:
        """Once no write is in flight."""
        async with self._lock:
            pass


class Relay:
    """One session's two directions between its client's call and its host's call."""

    def __init__(self, task_id: uuid.UUID, client: Writer) -> None:
        self.task_id = task_id
        # The client's call, and the host's once it joined: its writes, and its steps
        # (each read once an action was written).
        self.client = client
        self.host: Writer | None = None
        self.steps: AsyncIterator[Any] | None = None
        # What the host is told besides actions: how the client left (or HOST_GONE).
        self.to_host: asyncio.Queue[Any] = asyncio.Queue()
        # The client's messages while no relay runs (before the host joined, after the
        # end: at most one read and not answered yet), then None at their end (or the
        # error); HOST_GONE too.
        self.from_client: asyncio.Queue[Any] = asyncio.Queue()
        # How many of the client's messages were read, sent to the host, answered; whether
        # they ended.
        self.read = 0
        self.sent = 0
        self.answers = 0
        self.client_done = False
        # The client said `close` (sessions.py): its end is a close, with no grace.
        self.said_close = False
        self._room = asyncio.Event()
        self._room.set()
        self.joined = asyncio.Event()
        self.host_gone = asyncio.Event()
        # The host was told how the client left.
        self.ended = False
        # Whose session it is (the caller that opened it), whether it is an adb door, and
        # the door once either of its calls came (control_plane.adb_doors); the door's use
        # (streams open now, when it last carried a frame: loop time) keeps the session
        # from its idle timeout as actions do.
        self.owner = ""
        self.adb = False
        self.door: Any = None
        self.door_streams = 0
        self.door_used = 0.0
        # While the relay runs: the session's handler of each client message, and what
        # ends the relay (the client's end or error, HOST_GONE).
        self._handler: Handler | None = None
        self._over: asyncio.Future[Any] | None = None
        self._answered_at = 0.0
        # The pump is handing a message to the handler (not cancelled meanwhile), and is
        # to stop once it did.
        self.handing = False
        self._stopping = False

    @property
    def unanswered(self) -> int:
        """The client's messages read into this replica and not answered yet (0 or 1)."""
        return self.read - self.answers

    async def pump(self, requests: AsyncIterator[Any]) -> None:
        """The client's messages, each once the one before was answered: to the relay's
        handler while it runs, else into `from_client`; then their end (or the error)."""
        iterator = aiter(requests)
        try:
            while True:
                await self._room.wait()
                self._room.clear()
                request = await anext(iterator, None)
                if request is None:
                    break
                self.read += 1
                handler = self._handler
                if handler is None:
                    self.from_client.put_nowait(request)
                    continue
                self.handing = True
                try:
                    await handler(request)
                finally:
                    self.handing = False
                if self._stopping:
                    return
            self.client_done = True
            self._client_ended(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.client_done = True
            self._client_ended(exc)

    def _client_ended(self, how: BaseException | None) -> None:
        if self._over is not None and not self._over.done():
            self._over.set_result(how)
        else:
            self.from_client.put_nowait(how)

    def stop_pump(self, pump: asyncio.Task[None]) -> None:
        """Stop `pump` (the task running `pump()`), never while it hands a message on (its
        write would still be in flight for the call's next one): then once it did."""
        if self.handing:
            self._stopping = True
        else:
            pump.cancel()

    def idle_left(self, idle: float) -> float:
        """Seconds left of an `idle` timeout that actions alone would have run out: all of
        it while the door has a stream open, else what is left since it last carried one."""
        if self.door_streams:
            return idle
        if not self.door_used:
            return 0.0
        return self.door_used + idle - asyncio.get_running_loop().time()

    def answered(self) -> None:
        """The client's last message is answered: its next one may be read."""
        if self.answers < self.read:
            self.answers += 1
            self._answered_at = asyncio.get_running_loop().time()
        self._room.set()

    async def relay(self, handler: Handler, idle: float) -> Any:
        """Run the relay: each client message to `handler` (in the task reading them),
        until the client's messages end (None, or the error), the host's call does
        (HOST_GONE) or neither an action nor the adb door came for `idle` seconds once
        answered (IDLE)."""
        loop = asyncio.get_running_loop()
        self._answered_at = loop.time()
        over: asyncio.Future[Any] = loop.create_future()
        self._over, self._handler = over, handler
        try:
            # What was read before the relay ran (at most one message); the pump hands
            # it the rest itself.
            while not self.from_client.empty():
                item = self.from_client.get_nowait()
                if item is HOST_GONE:
                    return HOST_GONE
                if item is None or isinstance(item, BaseException):
                    return item
                await handler(item)
            if self.host_gone.is_set():
                return HOST_GONE
            while not over.done():
                wait = idle
                if self.unanswered == 0:
                    # Since the last answer, or the adb door's use (idle_left).
                    wait = max(self._answered_at + idle - loop.time(), self.idle_left(idle))
                    if wait <= 0:
                        return IDLE
                await asyncio.wait({over}, timeout=wait)
            return over.result()
        finally:
            self._over = self._handler = None

    def host_left(self) -> None:
        if not self.host_gone.is_set():
            self.host_gone.set()
            if self._over is not None and not self._over.done():
                self._over.set_result(HOST_GONE)
            self.from_client.put_nowait(HOST_GONE)
            self.to_host.put_nowait(HOST_GONE)


class Sessions:
    """The sessions whose client is connected to this replica, by task."""

    def __init__(self) -> None:
        self._relays: dict[uuid.UUID, Relay] = {}

    def open(self, task_id: uuid.UUID, client: Writer) -> Relay:
        relay = self._relays[task_id] = Relay(task_id, client)
        return relay

    def close(self, task_id: uuid.UUID) -> None:
        self._relays.pop(task_id, None)

    def join(self, task_id: uuid.UUID, host: Writer, steps: AsyncIterator[Any]) -> Relay | None:
        """The relay a host joins, writing to it by `host` and reading its `steps`; None
        when no client of it is here or a host joined."""
        relay = self._relays.get(task_id)
        if relay is None or relay.joined.is_set():
            return None
        relay.host, relay.steps = host, steps
        relay.joined.set()
        return relay

    def get(self, task_id: uuid.UUID) -> Relay | None:
        """The session's relay, while its client is connected here."""
        return self._relays.get(task_id)

    def __len__(self) -> int:
        return len(self._relays)
