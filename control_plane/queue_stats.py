"""The queue's counts: what GetQueue, ListFairShares and the queue's metrics show, kept in
`queue_group_stats` (a row per queue group: its queued tasks, since when, and the devices
its selector matches) so that reading the queue never reads the backlog.

Every replica runs `keep_queue_counted`; each round asks the database to count
(`amc_count_queue`), which does so only if no other transaction is counting (an advisory
lock, tried) and the last count, by any replica, is older than `queue_count_every`. So the
figures are at most about that old, and the farm counts once per period, not once per
replica.

What a count costs grows with the backlog: it reads every queued task once (a microsecond
or so each) and the devices once. So its own cost is bounded in time instead: a replica
whose count took `t` asks for the next one no sooner than `t / COUNT_SHARE` after it, and
counting takes at most COUNT_SHARE of one database connection (one backend, no parallel
workers), however deep the queue. docs/architecture.md has the figures.
"""

from __future__ import annotations

import asyncio
import random
import time
from datetime import timedelta

import structlog

from control_plane import errors, metrics
from control_plane.config import Settings
from control_plane.store import Store

log = structlog.get_logger(__name__)
# Jitter from a generator of its own: drawing from the global one would change the state
# that other code in the process (tests, libraries) relies on.
_RANDOM = random.Random()

# The most of one database connection's time counting may take.
COUNT_SHARE = 0.1
# Rounds per period: a replica asks this often whether a count is due (a read of the small
# stats table when it is not), so the figures are not much older than the period.
ROUNDS = 4


async def keep_queue_counted(store: Store, settings: Settings) -> None:
    """Count the queue every `queue_count_every` (or less often: see COUNT_SHARE), with
    jitter, one replica at a time."""
    every = settings.queue_count_every
    while True:
        await asyncio.sleep(every.total_seconds() / ROUNDS * _RANDOM.uniform(0.5, 1.0))
        try:
            took = await count_once(store, every, settings.lease_ttl)
        except (errors.DatabaseUnavailable, errors.Contended) as error:
            log.warning("queue count skipped", error=error.message)
            continue
        if took is not None:
            every = max(settings.queue_count_every, timedelta(seconds=took / COUNT_SHARE))


async def count_once(store: Store, every: timedelta, connected_within: timedelta) -> float | None:
    """Count the queue if it is due; the seconds the count took, or None if another
    replica counted it within `every` or is counting it now."""
    started = time.monotonic()
    queued = await store.queue.count_queue(every, connected_within)
    if queued is None:
        return None
    took = time.monotonic() - started
    metrics.QUEUE_COUNT_SECONDS.observe(took)
    log.debug("queue counted", queued=queued, seconds=round(took, 3))
    return took
