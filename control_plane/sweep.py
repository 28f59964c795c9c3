"""The lease-expiry transition's loop: every replica runs it (rows another replica's sweep
holds are skipped), with jitter so that replicas do not sweep in lock-step."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

import structlog

from control_plane import errors, metrics
from control_plane.effects import Effects
from control_plane.lifecycle import Event
from control_plane.store import Store

log = structlog.get_logger(__name__)
BATCH = 100


async def sweep_expired(store: Store, effects: Effects, interval: timedelta) -> None:
    period = interval.total_seconds()
    while True:
        await asyncio.sleep(period * random.uniform(0.5, 1.0))
        try:
            metrics.SWEEPS.inc()
            while ended := await store.expire(BATCH):
                effects.ended(Event.EXPIRED, ended)
                if len(ended) < BATCH:
                    break
        except (errors.DatabaseUnavailable, errors.Contended) as error:
            log.warning("expiry sweep skipped", error=error.message)
