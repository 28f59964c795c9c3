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
    # Retention (control_plane/retention.py): terminal tasks are deleted this long after
    # they finished, hosts this long after they were last seen (None: kept for ever).
    task_retention: timedelta | None = timedelta(days=30)
    forget_hosts_after: timedelta | None = timedelta(days=7)
    # How often this replica looks for what retention removes (one replica at a time does).
    retention_interval: timedelta = timedelta(seconds=60)
    # Rows per batch (one statement, one short transaction) at most; the time a batch
    # should take (longer ones halve the next batch's rows); the least pause between
    # batches: a batch is followed by a pause at least as long as it took, so retention
    # uses at most half of one connection's time.
    retention_batch: int = 500
    retention_batch_time: timedelta = timedelta(seconds=0.25)
    retention_pause: timedelta = timedelta(seconds=0.05)
    # The largest artifact (screenshot, UI dump) an upload may keep.
    max_artifact_bytes: int = 10 * 1024 * 1024
    # What the uploads being received on one replica may hold in memory at once; past it
    # an upload is refused UNAVAILABLE and its host tries again.
    max_upload_memory: int = 256 * 1024 * 1024

    @property
    def renew_every(self) -> timedelta:
        return self.renew_interval or self.lease_ttl / 3
