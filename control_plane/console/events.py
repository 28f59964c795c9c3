"""The console's `GET /api/events`: server-sent events from the replica's notification hub
(task changed, host freed, work queued), coalesced per browser; pages re-read what
changed. Who may listen is the HTTP server's (control_plane.console.http) to decide."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from aiohttp import web

from control_plane.hub import Hub

# A browser is sent what changed at most this often; more changes meanwhile are merged.
EVENT_INTERVAL = 0.25
# Past this many distinct changes waiting for one browser, it is told to re-read everything.
PENDING_LIMIT = 500
KEEPALIVE = 15.0


class Events:
    """The event streams open on this replica's console."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self._streams: set[Stream] = set()

    async def serve(
        self, request: web.Request, *, hosts: bool, headers: Mapping[str, str]
    ) -> web.StreamResponse:
        """One browser's stream, until it leaves or the replica closes; host ids only if
        `hosts` (for those who may see the farm)."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
        )
        await response.prepare(request)
        await response.write(b"event: hello\ndata: \n\n")
        stream = Stream(self.hub, hosts=hosts)
        self._streams.add(stream)
        try:
            await stream.run(response)
        finally:
            self._streams.discard(stream)
        return response

    def close(self) -> None:
        """After the hub closed: the streams end."""
        for stream in self._streams:
            stream.ready.set()


class Stream:
    """One browser's events: changes gathered as they come, sent together."""

    def __init__(self, hub: Hub, *, hosts: bool) -> None:
        self.hub = hub
        self.hosts = hosts
        self.pending: dict[tuple[str, str], None] = {}
        self.ready = asyncio.Event()

    def hear(self, channel: str, payload: str) -> None:
        event = _event(channel, payload)
        if event is None or (event[0] == "host" and not self.hosts):
            return
        if len(self.pending) >= PENDING_LIMIT:
            self.pending = {("resync", ""): None}
        else:
            self.pending[event] = None
        self.ready.set()

    async def run(self, response: web.StreamResponse) -> None:
        with self.hub.listening(self.hear), contextlib.suppress(ConnectionError):
            while not self.hub.closing:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(KEEPALIVE):
                        await self.ready.wait()
                self.ready.clear()
                batch, self.pending = list(self.pending), {}
                text = "".join(f"event: {kind}\ndata: {data}\n\n" for kind, data in batch)
                await response.write(text.encode() or b": keepalive\n\n")
                await asyncio.sleep(EVENT_INTERVAL)


def _event(channel: str, payload: str) -> tuple[str, str] | None:
    if channel == "amc_task":
        return ("task", payload)
    if channel == "amc_freed":
        return ("host", payload)
    if channel == "amc_drain":
        return ("host", payload.rsplit(" ", 1)[0])
    if channel == "amc_release":
        return ("host", payload.split(" ", 1)[0])
    if channel == "amc_cancel":
        return ("host", payload.split(" ", 1)[0])
    if channel == "amc_queued":
        return ("queue", "")
    return None
