"""Which hosts hold a renewal stream on this replica, written to PostgreSQL cheaply.

A host is connected while its stream is open, leases or not. Writing `last_seen` on every
renewal would cost a write per host per renewal interval; instead the replica writes a
host's row only when its stream opens or closes (changes batched into one statement), and
heartbeats one row of its own (`hosts.replica_id`, `replicas` in schema.sql).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta

import structlog

log = structlog.get_logger(__name__)

# (replica, host ids sorted, open or closed for each)
Flush = Callable[[str, list[str], list[bool]], Awaitable[None]]


class Presence:
    def __init__(self, replica: str) -> None:
        self.replica = replica
        self._streams: dict[str, int] = {}
        self._changed: dict[str, bool] = {}
        self._ready = asyncio.Event()

    def opened(self, host_id: str) -> None:
        self._streams[host_id] = self._streams.get(host_id, 0) + 1
        if self._streams[host_id] == 1:
            self._mark(host_id, True)

    def closed(self, host_id: str) -> None:
        left = self._streams.get(host_id, 1) - 1
        if left > 0:
            self._streams[host_id] = left
            return
        self._streams.pop(host_id, None)
        self._mark(host_id, False)

    def _mark(self, host_id: str, is_open: bool) -> None:
        self._changed[host_id] = is_open
        self._ready.set()

    async def write(
        self, flush: Flush, heartbeat: Callable[[], Awaitable[None]], every: timedelta
    ) -> None:
        """Runs for the replica's life: heartbeats every `every`, and writes stream changes
        as they come, in batches. A failed write is tried again on the next round."""
        period = every.total_seconds()
        loop = asyncio.get_running_loop()
        next_beat = 0.0
        while True:
            try:
                if loop.time() >= next_beat:
                    await heartbeat()
                    next_beat = loop.time() + period
                if self._changed:
                    batch, self._changed = self._changed, {}
                    hosts = sorted(batch)
                    try:
                        await flush(self.replica, hosts, [batch[h] for h in hosts])
                    except Exception:
                        # Keep what changed since: it is newer than this batch.
                        self._changed = batch | self._changed
                        raise
            except Exception as error:  # the database may be away: try again later
                log.warning("host presence not written", error=str(error))
                await asyncio.sleep(min(1.0, period))
                continue
            self._ready.clear()
            if not self._changed:
                remaining = max(0.0, next_beat - loop.time())
                try:
                    await asyncio.wait_for(self._ready.wait(), remaining)
                except TimeoutError:
                    pass
