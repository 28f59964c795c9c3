"""LISTEN/NOTIFY: the dedicated connection that listens, its heartbeat, and the
notifications sent after commits (notifications.sql)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import asyncpg

from control_plane.store.database import Aggregate, session_attrs, translated
from control_plane.store.sql import QUERIES as Q

Listener = Callable[[str, str], None]


class Notifications(Aggregate):
    async def notify(self, batch: list[tuple[str, str]]) -> None:
        await self._db.fetch("notify", [c for c, _ in batch], [p for _, p in batch])

    @contextlib.asynccontextmanager
    async def listening(
        self, dsn: str, channels: Mapping[str, Listener], on_lost: Callable[[], None]
    ) -> AsyncIterator[asyncpg.Connection]:
        """A dedicated connection LISTENing on `channels`; `on_lost` runs if it drops."""
        with translated():
            conn = await asyncpg.connect(dsn, timeout=10, **session_attrs(dsn))
        try:
            conn.add_termination_listener(lambda _c: on_lost())
            # The database can go away between the connect and the LISTENs, too.
            with translated():
                for channel, callback in channels.items():
                    await conn.add_listener(channel, _adapt(callback))
            yield conn
        finally:
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)

    async def still_listening(self, conn: asyncpg.Connection, channels: Sequence[str]) -> bool:
        """The LISTEN connection's heartbeat: it still hears every channel, and on a
        writable server (notifications of commits come from the primary only)."""
        with translated():
            row = await conn.fetchrow(Q["listener_check"])
        return row is not None and not row["read_only"] and set(channels) <= set(row["channels"])


def _adapt(callback: Listener) -> Callable[[Any, int, str, str], None]:
    def on_notify(_conn: Any, _pid: int, channel: str, payload: str) -> None:
        callback(channel, payload)

    return on_notify
