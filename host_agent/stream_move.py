"""When a host's renewal stream moves to a new connection (host_agent.leases): once the
connection under it is left (aged out by its replica, or dropped) and the live calls open
on the old one (the screens', the logs') have ended, so that the stream and those calls
stay on one replica."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import grpc


async def time_to_move(
    channel: grpc.aio.Channel | None, may_move: Sequence[Callable[[], Awaitable[None]]]
) -> None:
    """Returns when the stream should move: its connection is going away, and each of
    `may_move` has returned."""
    await connection_left(channel)
    await asyncio.gather(*(wait() for wait in may_move))


async def connection_left(channel: grpc.aio.Channel | None) -> None:
    """Returns when the channel, once READY, leaves READY: its connection is going away.

    A replica ends each connection after `--max-connection-age` with an HTTP/2 GOAWAY:
    calls open on it go on, new ones open a new connection, which a load balancer may give
    to another replica. A renewal stream lives for good, so it would stay on the aged
    connection (and its replica) for ever; the keeper moves it instead, and the hosts of a
    replica that took over a dead one's spread out again. A connection that dropped is
    left too: its stream breaks as well, and whichever is seen first reopens it. Without a
    channel (tests that pass a bare stub) it never returns. (The keeper then also waits for
    `may_move`: the live screens' and logs' calls, if open, end first.)"""
    if channel is None:
        await asyncio.Event().wait()
        return
    ready = grpc.ChannelConnectivity.READY
    while (state := channel.get_state()) is not ready:
        await channel.wait_for_state_change(state)
    # Any change from READY, however short (another call may reconnect at once).
    await channel.wait_for_state_change(ready)
