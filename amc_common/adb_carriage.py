"""Many adb streams over one gRPC call (amc.v1.AdbFrame): the door's end (amc_cli.adb_link)
and the host's (host_agent.adb_door) each keep a `Carriage` of the streams on their call.

Flow control is per stream, so one slow stream never holds the others back: a side sends
at most WINDOW bytes of a stream that the other side has not acknowledged (`ack`, sent once
the bytes were delivered: written to the adb server, or to the phone's adb connection).
The call's reader hands each frame to its stream at once and never waits for a stream's
reader; what a stream holds unread is bounded by the window its sender keeps to. So the
memory a door costs is the window times its open streams, on each side, and the control
plane between them holds no backlog of its own (it relays frame for frame).

A frame is built in place in the call's own message (`AdbStreamsRequest` at the door,
`LeaseAdbStreamsRequest` at the host: each carries it as `frame`): an `AdbFrame` built
first and then put into that message is copied, its bytes with it, which more than
doubled what framing a stream's bytes cost the side sending them.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any

from amc.v1 import adb_pb2

# The most one data frame carries: as much as keeps the frame's message (and each copy
# gRPC and protobuf make of it) below 128 KiB, the control plane's mmap threshold, so that
# the control plane, which relays it, recycles its blocks in its heap
# (control_plane.allocator); a larger frame was a fresh mapping there, faulted in page by
# page, for each copy of it. Each message costs every process on the way a gRPC read or
# write of its own, so no smaller than that either.
CHUNK = 127 * 1024
# Bytes of a stream a side may have sent and not had acknowledged (whole frames).
WINDOW = 20 * CHUNK
# The most bytes `recv` joins from the frames waiting: what a side writes at once to the
# adb server or client (one write there, one adb packet on its way, rather than a packet
# per frame).
JOINED = 1 << 20
# A receiver acknowledges what it delivered once it adds up to this: a frame each way per
# chunk would double the frames a bulk transfer costs every process on its way.
ACK_EVERY = WINDOW // 4

# The call's messages (each holds one frame, as `frame`), and how one is put on the call.
Message = adb_pb2.AdbStreamsRequest | adb_pb2.LeaseAdbStreamsRequest
Send = Callable[[Any], None]


class Carried:
    """One stream on a carriage: what the other side sent it, in order, and what it may
    send. Its end is said once by either side (`close`), and then it is forgotten."""

    def __init__(self, carriage: Carriage, number: int) -> None:
        self.number = number
        self._carriage = carriage
        self._inbox: deque[bytes] = deque()
        self._arrived = asyncio.Event()
        self._unacked = 0
        self._delivered = 0
        self._room = asyncio.Event()
        self._room.set()
        # The other side's first word on the stream: "" (opened) or why it is not.
        self.opened: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        # Why the other side ended it (None: it did not); whether it was a refusal (by the
        # control plane: the caller may not open the service); whether this side ended it.
        self.ended_by_peer: str | None = None
        self.refused = False
        self.closed = False
        self.received = 0
        self.sent = 0

    @property
    def over(self) -> bool:
        return self.closed or self.ended_by_peer is not None

    async def send(self, data: bytes) -> bool:
        """Send `data` within the window; False once the stream is over."""
        for start in range(0, len(data), CHUNK):
            chunk = data[start : start + CHUNK]
            while self._unacked and self._unacked + len(chunk) > WINDOW and not self.over:
                self._room.clear()
                await self._room.wait()
            if self.over:
                return False
            self._unacked += len(chunk)
            self.sent += len(chunk)
            self._carriage.frame(self.number, data=chunk)
        return not self.over

    async def recv(self) -> bytes | None:
        """The next bytes the other side sent, with those of the frames already waiting
        behind them, up to JOINED; None once it ended the stream (or this side did).
        Acknowledge them with `ack` once delivered."""
        inbox = self._inbox
        while not inbox:
            if self.over:
                return None
            self._arrived.clear()
            await self._arrived.wait()
        data = inbox.popleft()
        if not inbox or len(data) + len(inbox[0]) > JOINED:
            return data
        parts, size = [data], len(data)
        while inbox and size + len(inbox[0]) <= JOINED:
            size += len(inbox[0])
            parts.append(inbox.popleft())
        return b"".join(parts)

    def ack(self, count: int) -> None:
        """`count` bytes received were delivered: the other side may send as many more
        (told once they add up to ACK_EVERY, which a sender waiting for room has sent)."""
        self._delivered += count
        if self._delivered >= ACK_EVERY and not self.over:
            self._carriage.frame(self.number, ack=self._delivered)
            self._delivered = 0

    def accept(self) -> None:
        """Tell the other side the stream is open (the host's answer to `open`)."""
        self._carriage.frame(self.number, opened=True)

    def close(self, why: str = "") -> None:
        """End the stream from this side (once)."""
        if self.over:
            self._forget()
            return
        self.closed = True
        self._carriage.frame(self.number, close=why)
        self._wake()
        self._forget()

    def _frame(self, frame: adb_pb2.AdbFrame) -> None:
        part = frame.WhichOneof("part")
        if part == "data":
            self._inbox.append(frame.data)
            self.received += len(frame.data)
            self._arrived.set()
        elif part == "ack":
            self._unacked = max(0, self._unacked - frame.ack)
            self._room.set()
        elif part == "opened":
            if not self.opened.done():
                self.opened.set_result("")
        elif part == "close":
            self.ended(frame.close)
        elif part == "refused":
            self.refused = True
            self.ended(frame.refused or "refused")

    def ended(self, why: str) -> None:
        """The other side (or the carriage's end) ended the stream."""
        if self.ended_by_peer is None and not self.closed:
            self.ended_by_peer = why
        if not self.opened.done():
            self.opened.set_result(why or "closed")
        self._wake()
        self._forget()

    def _wake(self) -> None:
        self._arrived.set()
        self._room.set()

    def _forget(self) -> None:
        self._carriage.streams.pop(self.number, None)


class Carriage:
    """The streams of one call, by number; `send` puts a message of the call's kind
    (`message`) on the call, in order."""

    def __init__(self, send: Send, message: type[Message]) -> None:
        self.send = send
        self._message = message
        self.streams: dict[int, Carried] = {}

    def frame(self, stream: int, **part: Any) -> None:
        """Send a frame of `stream` with its part (`data=…`, `ack=…`, `open=…`, …)."""
        message = self._message()
        frame = message.frame
        frame.stream = stream
        for name, value in part.items():
            setattr(frame, name, value)
        self.send(message)

    def stream(self, number: int) -> Carried:
        """A new stream of this number."""
        carried = self.streams[number] = Carried(self, number)
        return carried

    def deliver(self, frame: adb_pb2.AdbFrame) -> Carried | None:
        """Hand a frame from the call to its stream; the stream (None: not open here)."""
        carried = self.streams.get(frame.stream)
        if carried is not None:
            carried._frame(frame)
        return carried

    def end(self, why: str) -> None:
        """The call is over: every stream ends with it."""
        for carried in list(self.streams.values()):
            carried.ended(why)
