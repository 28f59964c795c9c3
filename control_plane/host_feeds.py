"""The hosts' feeds on this replica, wire-free: a host's call that feeds it (its log lines,
control_plane.log_hosts; its screens' frames, control_plane.screen_feed) kept one a host
(`HostFeeds`, which the hub's `Tails` and `Screens` are), and the loop of such a call
(`HostFeeds.serve`): what this replica wants of the host sent down whenever that changes,
while the call's own messages go up.

A host opens its feed only when asked (`want`, which the hub pushes onto the host's renewal
streams here): when one here waits for the host (`wants`) with no feed here (`ask`), and
again when its feed ends while one here still does. A newer call of the same host takes the
older one's place.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar


class Feed:
    """A host's call feeding this replica."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()

    def pending(self) -> bool:
        """Something to send down though what this replica wants of the host is unchanged."""
        return False


F = TypeVar("F", bound=Feed)


class Gauge(Protocol):
    """The count of the calls open (a metric)."""

    def inc(self) -> None: ...

    def dec(self) -> None: ...


class HostFeeds(Generic[F]):
    """The hosts' feeds on this replica, one a host; `wants` says what this replica wants
    of a host's feed (nothing: no feed is asked of it)."""

    def __init__(self, make: Callable[[], F], want: Callable[[str], None]) -> None:
        self._feeds: dict[str, F] = {}
        self._make = make
        self.closing = False
        # Asks a host (by id) to open its feed here.
        self._want = want

    def wants(self, host_id: str) -> Sequence[object]:
        raise NotImplementedError

    def feeds(self) -> int:
        return len(self._feeds)

    def wanted(self, host_id: str) -> bool:
        """One here waits for the host, and the host has no feed here."""
        return not self.closing and host_id not in self._feeds and bool(self.wants(host_id))

    def ask(self, host_id: str) -> None:
        """Asks the host to open its feed here, if one here waits for it without one."""
        if self.wanted(host_id):
            self._want(host_id)

    @contextlib.contextmanager
    def feed(self, host_id: str) -> Iterator[F]:
        """The host's call: a newer one of the same host takes the older one's place."""
        feed = self._make()
        old = self._feeds.get(host_id)
        self._feeds[host_id] = feed
        if old is not None:
            old.changed.set()
        try:
            yield feed
        finally:
            if self._feeds.get(host_id) is feed:
                del self._feeds[host_id]
                self.ask(host_id)  # one still waiting: the host opens it again

    def has_feed(self, host_id: str) -> bool:
        return host_id in self._feeds

    def current(self, host_id: str, feed: F) -> bool:
        return self._feeds.get(host_id) is feed and not self.closing

    async def serve(
        self,
        requests: AsyncIterator[Any],
        host: Callable[[AsyncIterator[Any]], Awaitable[str]],
        up: Callable[[str, AsyncIterator[Any]], Coroutine[Any, Any, None]],
        gauge: Gauge,
        down: Callable[[Any, F], Any],
    ) -> AsyncIterator[Any]:
        """A host's call, its `requests` in: the host the call is for (`host`, from its
        first requests), then its feed here while it is the host's current one and
        `up(host_id, requests)` (which takes the rest up) runs; `down(wants, feed)` sent
        down first and again whenever what this replica wants of the host changes or the
        feed has something pending. `gauge` counts the call while it is open."""
        host_id = await host(requests)
        with self.feed(host_id) as feed:
            pump = asyncio.get_running_loop().create_task(up(host_id, requests))
            told: Sequence[object] | None = None
            gauge.inc()
            try:
                while self.current(host_id, feed) and not pump.done():
                    feed.changed.clear()
                    wants = self.wants(host_id)
                    if wants != told or feed.pending():
                        told = wants
                        yield down(wants, feed)
                    changed = asyncio.ensure_future(feed.changed.wait())
                    try:
                        await asyncio.wait([pump, changed], return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        changed.cancel()
            finally:
                gauge.dec()
                pump.cancel()

    def close(self) -> None:
        self.closing = True
        for feed in self._feeds.values():
            feed.changed.set()

    def _tell(self, host_id: str) -> None:
        feed = self._feeds.get(host_id)
        if feed is not None:
            feed.changed.set()
