"""Where a session's two calls meet on one replica: its client's `OpenSession` and its
host's `SessionActions` (control_plane.sessions), by task id. Wire-free, so the hub can
own one per replica; what travels through a `Relay` is sessions.py's business.

A relay reads its client's messages one at a time (`Relay.pump`): the next only once the
one before was answered (`Relay.answered`), so a client that sends actions without waiting
for their answers holds them in its own call, behind gRPC's flow control, not in this
replica's memory."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

# Put on the client's and the host's queues once the host's call is over, so that a wait
# for the next message ends with it (one queue read per message: no task per wait).
HOST_GONE = object()


class Relay:
    """One session's two directions between its client's call and its host's call."""

    def __init__(self, task_id: uuid.UUID) -> None:
        self.task_id = task_id
        # What the host is sent: actions, then how the client left (or HOST_GONE).
        self.to_host: asyncio.Queue[Any] = asyncio.Queue()
        # What the host answered: steps, then None once its call is over.
        self.from_host: asyncio.Queue[Any] = asyncio.Queue()
        # The client's messages (at most one read and not answered yet), then None at their
        # end (or the error); HOST_GONE too.
        self.from_client: asyncio.Queue[Any] = asyncio.Queue()
        # How many of the client's messages were read; whether they ended.
        self.read = 0
        self.client_done = False
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

    async def pump(self, requests: AsyncIterator[Any]) -> None:
        """The client's messages into `from_client`, each once the one before was answered,
        then None at their end (or the error)."""
        iterator = aiter(requests)
        try:
            while True:
                await self._room.wait()
                self._room.clear()
                request = await anext(iterator, None)
                if request is None:
                    break
                self.read += 1
                self.from_client.put_nowait(request)
            self.client_done = True
            self.from_client.put_nowait(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.client_done = True
            self.from_client.put_nowait(exc)

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
        self._room.set()

    def host_left(self) -> None:
        if not self.host_gone.is_set():
            self.host_gone.set()
            self.from_host.put_nowait(None)
            self.from_client.put_nowait(HOST_GONE)
            self.to_host.put_nowait(HOST_GONE)


class Sessions:
    """The sessions whose client is connected to this replica, by task."""

    def __init__(self) -> None:
        self._relays: dict[uuid.UUID, Relay] = {}

    def open(self, task_id: uuid.UUID) -> Relay:
        relay = self._relays[task_id] = Relay(task_id)
        return relay

    def close(self, task_id: uuid.UUID) -> None:
        self._relays.pop(task_id, None)

    def join(self, task_id: uuid.UUID) -> Relay | None:
        """The relay a host joins; None when no client of it is here or a host joined."""
        relay = self._relays.get(task_id)
        if relay is None or relay.joined.is_set():
            return None
        relay.joined.set()
        return relay

    def get(self, task_id: uuid.UUID) -> Relay | None:
        """The session's relay, while its client is connected here."""
        return self._relays.get(task_id)

    def __len__(self) -> int:
        return len(self._relays)
