"""TCP proxies between each host agent and the control-plane replicas, on their own thread.

Every agent talks to the control plane through its own proxy, as it would through a load
balancer: each new connection goes to a replica picked at random among those that accept
it, so a killed replica's agents reconnect to the live one. A proxy can also be cut:

- `blackhole`: a partition. Nothing moves in either direction and new connections hang;
  bytes sent meanwhile are delivered late when the cut heals (TCP would retransmit them),
  so stale renewals and reports do reach the control plane afterwards.
- `reset`: every connection is aborted and new ones are closed at once until it heals.

The proxies run an event loop on a thread of their own, so that the harness's work (or a
blocking call in it) never delays forwarding.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

CUT_MODES = ("blackhole", "reset")


@dataclass(eq=False)
class _Link:
    client: asyncio.StreamWriter
    backend: asyncio.StreamWriter | None = None

    def abort(self) -> None:
        for writer in (self.client, self.backend):
            if writer is not None:
                writer.transport.abort()


@dataclass(eq=False)
class Proxy:
    name: str
    backends: list[int]
    port: int = 0
    mode: str | None = None
    connections: int = 0
    _open: asyncio.Event = field(default_factory=asyncio.Event)
    _links: set[_Link] = field(default_factory=set)
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        self._open.set()

    def cut(self, mode: str) -> None:
        assert mode in CUT_MODES, mode
        self.mode = mode
        self._open.clear()
        if mode == "reset":
            for link in list(self._links):
                link.abort()

    def heal(self) -> None:
        self.mode = None
        self._open.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        self._links.add(link)
        try:
            if self.mode == "reset":
                return
            await self._open.wait()
            backend = await self._connect()
            if backend is None:
                return
            self.connections += 1
            b_reader, link.backend = backend
            await asyncio.gather(self._pump(reader, link.backend), self._pump(b_reader, writer))
        finally:
            self._links.discard(link)
            link.abort()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for port in random.sample(self.backends, len(self.backends)):
            with contextlib.suppress(OSError):
                return await asyncio.open_connection("127.0.0.1", port)
        return None

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while data := await src.read(65536):
                await self._open.wait()  # a blackhole holds what it read until it heals
                dst.write(data)
                await dst.drain()
            await self._open.wait()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            # One side ended: so does the other (closing, as the far end would see it).
            dst.transport.abort()


class ProxyHub:
    """Owns the proxies' thread and event loop; its methods are called from any thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.proxies: dict[str, Proxy] = {}
        self._thread = threading.Thread(target=self.loop.run_forever, name="proxies", daemon=True)
        self._thread.start()

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(timeout=10)

    def add(self, name: str, backends: list[int]) -> Proxy:
        async def make() -> Proxy:
            proxy = Proxy(name, backends)
            await proxy.start()
            return proxy

        proxy = self._call(make())
        self.proxies[name] = proxy
        return proxy

    def cut(self, name: str, mode: str) -> None:
        self._call(_now(self.proxies[name].cut, mode))

    def heal(self, name: str) -> None:
        self._call(_now(self.proxies[name].heal))

    def close(self) -> None:
        async def close_all() -> None:
            for proxy in self.proxies.values():
                await proxy.close()

        with contextlib.suppress(Exception):
            self._call(close_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


async def _now(function: Callable[..., None], *args: Any) -> None:
    """Run `function` on the proxies' loop; `_call` returns once it has."""
    function(*args)
