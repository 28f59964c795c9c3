"""A TCP proxy between the host agent and the control plane that can fail on cue.

    async with TcpProxy("127.0.0.1", farm_port) as proxy:
        agent channel -> proxy.address

* `balance(*targets)` spreads new connections over several servers in turn.
* `cut()` resets every open connection and refuses new ones (closed on accept) until
  `heal()`: the control plane is unreachable. `cut(refuse=False)` only resets.
* `freeze_after(direction, pattern)`: once a chunk going `direction` ("up": agent to
  control plane, "down": back) that completes `pattern` has been forwarded, that
  connection stops forwarding either way; what arrives is held (in order) until `thaw()`
  or dropped by `cut()`. gRPC multiplexes every call on one HTTP/2 connection, so a
  protobuf field's bytes (a task id) are how a test points at "the report request" or
  "the assignment". Returns an Event set when it fired.

Every connection is recorded (`connections`), with the bytes it carried each way.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from types import TracebackType
from typing import Literal, Self

Direction = Literal["up", "down"]
_READ = 65536


@dataclass
class _Trigger:
    direction: Direction
    pattern: bytes
    fired: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Link:
    id: int
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    frozen: bool = False
    held: list[tuple[Direction, bytes]] = field(default_factory=list)
    carried: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    # The tail of what went each way, so a pattern split across reads is still seen.
    tails: dict[str, bytes] = field(default_factory=lambda: {"up": b"", "down": b""})
    closed: bool = False

    def writer(self, direction: Direction) -> asyncio.StreamWriter:
        return self.upstream if direction == "up" else self.client

    def abort(self) -> None:
        self.closed = True
        for writer in (self.client, self.upstream):
            writer.transport.abort()


class TcpProxy:
    host = "127.0.0.1"

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        # `balance()`: new connections go to these in turn, as a round-robin load balancer.
        self.targets = [self.target]
        self._turn = 0
        self.port = 0
        self.refusing = False
        self.connections: list[Link] = []
        self.refused = 0
        self._triggers: list[_Trigger] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def live(self) -> list[Link]:
        return [link for link in self.connections if not link.closed]

    # -- faults ---------------------------------------------------------------------------

    def cut(self, *, refuse: bool = True) -> None:
        self.refusing = refuse
        for link in self.live:
            link.abort()

    def heal(self) -> None:
        self.refusing = False
        self._triggers.clear()

    def freeze_after(self, direction: Direction, pattern: bytes) -> asyncio.Event:
        trigger = _Trigger(direction, pattern)
        self._triggers.append(trigger)
        return trigger.fired

    def balance(self, *targets: tuple[str, int]) -> None:
        """From now on, each new connection goes to the next of `targets` (the open ones
        stay where they are)."""
        self.targets = list(targets)

    def thaw(self) -> None:
        for link in self.live:
            link.frozen = False
            for direction, data in link.held:
                link.writer(direction).write(data)
            link.held.clear()

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for link in self.live:
            link.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- forwarding -----------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self.refusing:
                self.refused += 1
                writer.transport.abort()
                return
            await self._forward(reader, writer)
        finally:
            self._tasks.discard(task)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            target = self.targets[self._turn % len(self.targets)]
            self._turn += 1
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.transport.abort()
            return
        link = Link(len(self.connections), writer, up_writer)
        self.connections.append(link)
        pumps = [
            asyncio.ensure_future(self._pump(link, reader, "up")),
            asyncio.ensure_future(self._pump(link, up_reader, "down")),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            link.abort()

    async def _pump(self, link: Link, reader: asyncio.StreamReader, direction: Direction) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(_READ):
                self._carry(link, direction, data)
                await link.writer(direction).drain()

    def _carry(self, link: Link, direction: Direction, data: bytes) -> None:
        link.carried[direction] += len(data)
        if link.frozen:
            link.held.append((direction, data))
            return
        link.writer(direction).write(data)
        seen = link.tails[direction] + data
        for trigger in self._triggers:
            if (
                trigger.direction == direction
                and not trigger.fired.is_set()
                and trigger.pattern in seen
            ):
                link.frozen = True
                trigger.fired.set()
        longest = max((len(t.pattern) for t in self._triggers), default=1)
        link.tails[direction] = seen[-(longest - 1) :] if longest > 1 else b""
