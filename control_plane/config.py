"""Settings of one control-plane replica."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True)
class Settings:
    lease_ttl: timedelta = timedelta(seconds=15)
    # None: a third of the TTL.
    renew_interval: timedelta | None = None
    # How often this replica looks for expired leases (every replica does; it is safe).
    sweep_interval: timedelta = timedelta(seconds=1)
    max_acquire_wait: timedelta = timedelta(seconds=60)
    # WatchTask re-reads the task at least this often, in case a notification was missed.
    watch_refresh: timedelta = timedelta(seconds=5)

    @property
    def renew_every(self) -> timedelta:
        return self.renew_interval or self.lease_ttl / 3
