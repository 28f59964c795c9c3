"""Retention: what a farm no longer needs, deleted in the background of every replica.

- Finished tasks (done, failed, cancelled) whose `finished_at` is older than
  `--task-retention` go, with their attempts, events and artifacts; so do the `cleaning`
  host events (a few per lease: the steps of the hosts' cleans) older than that.
- Hosts not seen for `--forget-hosts-after` that hold no lease go, with their devices, as
  `amc hosts remove` would remove them (an event in the host's history says retention did
  it, and why).

Each batch is one statement (`delete_old_tasks`, `forget_hosts` in store/retention.sql), so
short transaction over at most `retention_batch` rows (fewer while batches take longer than
`retention_batch_time`), which it locks with SKIP LOCKED: it
never waits on a row the hot path holds, and tasks in flight are never looked at. After a
batch the loop pauses at least as long as the batch took, so retention takes at most half of
one connection and the hot path finds the tables free between batches. Only one replica at
a time runs a batch (each tries a transaction-scoped advisory lock and removes nothing
without it), so several replicas do not add up their load; the one that got the lock goes
on while batches come back full, the others look again at their next round.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import structlog

from control_plane import errors, metrics
from control_plane.config import Settings
from control_plane.domain import Removed
from control_plane.store import Store

log = structlog.get_logger(__name__)
# Jitter from a generator of its own: drawing from the global one would change the state
# that other code in the process (tests, libraries) relies on.
_RANDOM = random.Random()


async def keep_retention(store: Store, settings: Settings) -> None:
    """Every `retention_interval` (with jitter, so that replicas do not look in step), one
    round of retention."""
    if settings.task_retention is None and settings.forget_hosts_after is None:
        log.info("retention off: finished tasks and disconnected hosts are kept")
        return
    period = settings.retention_interval.total_seconds()
    while True:
        await asyncio.sleep(period * _RANDOM.uniform(0.5, 1.0))
        try:
            removed = await retain(store, settings)
        except (errors.DatabaseUnavailable, errors.Contended) as error:
            log.warning("retention skipped", error=error.message)
            continue
        if removed != Removed():
            log.info("retention removed", **removed.counts())


def span_text(span: timedelta | None) -> str:
    """A retention setting as the flags write it: `30d`, `1.5h`, `90s`, `off`."""
    if span is None:
        return "off"
    value = span.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if value >= size:
            return f"{value / size:g}{unit}"
    return f"{value:g}s"


async def retain(store: Store, settings: Settings) -> Removed:
    """One round: batch after batch until what is due is gone (or another replica holds
    the retention lock); the rows removed."""
    removed = Removed()
    if settings.task_retention is not None:
        keep = settings.task_retention
        removed += await _batches(
            "tasks", lambda limit: store.retention.delete_old_tasks(keep, limit), settings
        )
        removed += await _batches(
            "cleaning_events",
            lambda limit: store.retention.delete_old_cleaning_events(keep, limit),
            settings,
        )
    if settings.forget_hosts_after is not None:
        unseen = settings.forget_hosts_after
        reason = f"not seen for {span_text(unseen)} (--forget-hosts-after)"
        removed += await _batches(
            "hosts", lambda limit: store.retention.forget_hosts(unseen, limit, reason), settings
        )
    return removed


async def _batches(
    what: str, batch: Callable[[int], Awaitable[Removed]], settings: Settings
) -> Removed:
    """Batches of `what` until one comes back short. A batch that took longer than
    `retention_batch_time` halves the next one's limit (a task may carry megabytes of
    artifacts), a quick one doubles it, up to `retention_batch`: transactions stay short
    whatever hangs off the rows."""
    total = Removed()
    most = settings.retention_batch
    target = settings.retention_batch_time.total_seconds()
    limit = most
    while True:
        started = time.monotonic()
        removed = await batch(limit)
        took = time.monotonic() - started
        metrics.RETENTION_BATCH.labels(what).observe(took)
        for kind, count in removed.counts().items():
            if count:
                metrics.RETENTION_REMOVED.labels(kind).inc(count)
        total += removed
        if removed.counts()[what] < limit:
            return total
        await asyncio.sleep(max(settings.retention_pause.total_seconds(), took))
        if took > target:
            limit = max(1, limit // 2)
        elif took < target / 4:
            limit = min(most, limit * 2)
