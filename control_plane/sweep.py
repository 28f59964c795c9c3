"""The control plane's sweep loop: every replica runs it (rows another replica's sweep
holds are skipped), with jitter so that replicas do not sweep in lock-step. Each round ends
what ran out, a batch per statement: leases that expired (requeue, cancel or fail their
tasks), queued tasks past their queue timeout (failed, "queue timeout"), and attempts that
ran past their deadline by more than a lease TTL without a report (failed, "deadline
exceeded"). About once a minute it also forgets the queue groups that sat a minute with no
task queued or running (amc_forget_queue_groups): Acquire reads the groups, so they must
not pile up as selectors come and go."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TypeVar

import structlog

from control_plane import errors, metrics
from control_plane.effects import Effects
from control_plane.lifecycle import Event
from control_plane.store import Store

log = structlog.get_logger(__name__)
# Jitter from a generator of its own: drawing from the global one would change the state
# that other code in the process (tests, libraries) relies on.
_RANDOM = random.Random()
BATCH = 100
T = TypeVar("T")
# How often, and after how long empty, queue groups are forgotten.
FORGET_GROUPS_EVERY = 60.0
GROUP_IDLE = timedelta(minutes=1)


async def sweep_expired(
    store: Store, effects: Effects, interval: timedelta, lease_ttl: timedelta
) -> None:
    period = interval.total_seconds()
    loop = asyncio.get_running_loop()
    # Replicas that start together forget groups at different times.
    forget_at = loop.time() + FORGET_GROUPS_EVERY * _RANDOM.uniform(0.5, 1.0)
    while True:
        await asyncio.sleep(period * _RANDOM.uniform(0.5, 1.0))
        try:
            await sweep_once(store, effects, lease_ttl)
            if loop.time() >= forget_at:
                forget_at = loop.time() + FORGET_GROUPS_EVERY * _RANDOM.uniform(0.5, 1.0)
                await store.queue.forget_queue_groups(GROUP_IDLE, BATCH)
        except (errors.DatabaseUnavailable, errors.Contended) as error:
            log.warning("expiry sweep skipped", error=error.message)


async def sweep_once(store: Store, effects: Effects, lease_ttl: timedelta) -> None:
    """One round: each kind of ending, in batches until a batch comes back short."""
    metrics.SWEEPS.inc()
    await _batches(
        lambda: store.leases.expire(BATCH), lambda ended: effects.ended(Event.EXPIRED, ended)
    )
    await _batches(lambda: store.tasks.time_out_queued(BATCH), effects.timed_out)
    await _batches(
        lambda: store.leases.end_overrun(lease_ttl, BATCH),
        lambda ended: effects.ended(Event.DEADLINE_EXCEEDED, ended),
    )


async def _batches(
    run: Callable[[], Awaitable[Sequence[T]]], then: Callable[[Sequence[T]], None]
) -> None:
    while ended := await run():
        then(ended)
        if len(ended) < BATCH:
            break
