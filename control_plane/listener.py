"""Keeps the replica's LISTEN connection for its life (reconnecting with backoff), checks it
by a heartbeat, and makes up for the notifications lost while it was down each time it
listens again.

Notifications sent while no connection of the replica listened are gone (a failover loses
those the old primary had not delivered; a dropped connection, those sent until it is
back). So each time it listens (again):

- every parked Acquire and every watcher looks again (Hub.wake_all);
- every token is read again (a revocation may have been lost);
- every renewal stream held here is told what a lost notice would have pushed: one read
  of all their hosts' states (`stream_states`: the drain, the devices released from
  quarantine and not reported on since, the cancels not delivered yet), handed to the hub,
  which pushes each host's onto its streams (renewals: a drain is read again only where
  the agent was told otherwise; releases and cancels are pushed). The read runs beside the
  heartbeat; one that fails is tried again, with backoff, until it is done or the
  connection is lost again (then the next connection reads again).

A change committed once the connection listens is heard; one committed before is in the
read, which starts after it: so nothing falls between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import structlog
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential, wait_random

from control_plane import auth, errors, metrics
from control_plane.hub import CHANNELS, Hub
from control_plane.store import Store

log = structlog.get_logger(__name__)

# How often the LISTEN connection is checked (still listening, on a writable server): a
# connection a failover left silent is replaced within about twice this.
LISTEN_HEARTBEAT = 2.0
# A read of the streams' states that failed is tried again after this long, doubling up to
# the second figure, while the connection lasts.
RESTATE_RETRY = (0.2, 5.0)


class Listener:
    def __init__(self, store: Store, dsn: str, hub: Hub, authenticator: auth.Authenticator):
        self.store = store
        self.dsn = dsn
        self.hub = hub
        self.auth = authenticator

    async def run(self) -> None:
        """For the replica's life: listen, and listen again whenever the connection is lost."""
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(errors.DatabaseUnavailable),
            wait=wait_exponential(multiplier=0.05, max=2.0) + wait_random(0, 0.05),
            reraise=True,
        ):
            with attempt:
                await self._listen_once()

    async def _listen_once(self) -> None:
        lost = asyncio.Event()
        callbacks = dict.fromkeys(CHANNELS, self.hub.notify)
        callbacks[auth.REVOKED_CHANNEL] = self.auth.revoked
        async with self.store.notifications.listening(self.dsn, callbacks, lost.set) as conn:
            self.hub.wake_all()
            self.auth.clear()
            restating = asyncio.create_task(self.restate())
            try:
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), LISTEN_HEARTBEAT)
                    try:
                        alive = await asyncio.wait_for(
                            self.store.notifications.still_listening(conn, list(callbacks)),
                            LISTEN_HEARTBEAT,
                        )
                    except Exception:
                        alive = False
                    if not alive:  # gone, silent, no longer listening, or now a standby
                        break
            finally:
                restating.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await restating
        log.warning("notification connection lost; reconnecting")
        raise errors.DatabaseUnavailable()

    async def restate(self) -> None:
        """Tell every renewal stream held here what lost notices would have pushed: one
        read for all their hosts, tried again until it is done."""
        pause = RESTATE_RETRY[0]
        while True:
            hosts = self.hub.held_hosts()
            if not hosts:
                return
            began = time.perf_counter()
            try:
                states = await self.store.hosts.stream_states(hosts)
            except errors.DatabaseUnavailable as error:
                log.warning("renewal streams' state not read; retrying", error=str(error))
                await asyncio.sleep(pause)
                pause = min(pause * 2, RESTATE_RETRY[1])
                continue
            except Exception:  # a bug: said, and the replica goes on listening
                log.exception("renewal streams' state not read")
                return
            self.hub.restate(states)
            took = time.perf_counter() - began
            metrics.STREAM_RESTATES.observe(took)
            log.info("renewal streams told again", hosts=len(hosts), seconds=round(took, 4))
            return
