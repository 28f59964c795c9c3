"""Settings of one control-plane replica."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

# The host agent's default --report-timeout (AgentSettings in host_agent/config.py): how
# long it repeats a report whose answer it lost, the last try running at least a second
# past the start of that try (host_agent/retry.py). The control plane imports nothing of
# the agent, and cannot know each agent's setting: tests/test_setting_floors.py keeps
# this in step.
AGENT_REPORT_TIMEOUT = timedelta(seconds=60)
# The least --task-retention (besides off): a repeated report must still find its finished
# task to be answered with the recorded outcome ("repeating the same report SHALL return
# the already recorded outcome"), not a lease conflict. Twice the agent's default window:
# its last try's own deadline, and room to spare.
TASK_RETENTION_FLOOR = 2 * AGENT_REPORT_TIMEOUT
# --forget-hosts-after is at least this many connected windows (see forget_hosts_floor).
FORGET_HOSTS_WINDOWS = 2


@dataclass(frozen=True)
class Settings:
    lease_ttl: timedelta = timedelta(seconds=15)
    # How many times a task whose phone was lost mid-run is run again on another, apart
    # from its max_attempts (an infrastructure failure is not the task's).
    infra_retries: int = 2
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
    # How often the queue is counted for GetQueue, ListFairShares and the queue's metrics
    # (at most: a deep queue's count stretches it; control_plane/queue_stats.py).
    queue_count_every: timedelta = timedelta(seconds=5)
    # How often a replica writes the step progress its renewal streams were sent, in one
    # statement for all its hosts (control_plane/progress.py): a step shows on every
    # replica within one renew interval (the agent sends it with its next renewal) and this.
    progress_every: timedelta = timedelta(seconds=1)
    # A client's connection is asked to go (HTTP/2 GOAWAY) this long after it opened, give
    # or take gRPC's 10 % jitter; its calls go on, new ones take a new connection (None:
    # never). Host agents move their renewal stream with it (host_agent.leases), so the
    # hosts a replica took over from a dead one spread again through the load balancer.
    max_connection_age: timedelta | None = timedelta(minutes=30)
    # The sessions (Scheduler.OpenSession) one token may have queued or running at once;
    # 0: no limit. Not counted with authentication off.
    max_sessions_per_token: int = 100
    # The largest artifact (screenshot, UI dump) an upload may keep.
    max_artifact_bytes: int = 10 * 1024 * 1024
    # What the uploads being received on one replica may hold in memory at once; past it
    # an upload is refused UNAVAILABLE and its host tries again.
    max_upload_memory: int = 256 * 1024 * 1024
    # Live screens one token may watch at once on one replica (WatchScreen calls and the
    # console's screen sockets); past it a watch is refused RESOURCE_EXHAUSTED.
    max_viewers_per_token: int = 32
    # Thumbnails (WatchScreenRequest.thumbnail: the console's Farm page) one token may
    # watch at once on one replica, apart from its viewers; past it RESOURCE_EXHAUSTED.
    max_thumbnails_per_token: int = 1000
    # The origins (scheme://host[:port]) the console is reached at besides its own address
    # as a request names it (behind a proxy that rewrites Host): the console's WebSockets
    # accept a page of these.
    console_origins: tuple[str, ...] = ()
    # The largest app or file the app library keeps (--max-app-size), and what the library
    # uploads being received on one replica may spool to its disk at once (past it an
    # upload is refused UNAVAILABLE: try again shortly).
    max_app_bytes: int = 200 * 1024 * 1024
    max_library_spool: int = 1024 * 1024 * 1024

    @property
    def renew_every(self) -> timedelta:
        return self.renew_interval or self.lease_ttl / 3

    @property
    def forget_hosts_floor(self) -> timedelta:
        """The least --forget-hosts-after (besides off). A connected host is last seen at
        its replica's latest heartbeat (one every `renew_every`) and counts as connected
        for `lease_ttl` after it (list_hosts in store/hosts.sql, forget_hosts in
        store/retention.sql); twice the longer of the two leaves a late heartbeat room
        before a connected host could be forgotten."""
        return FORGET_HOSTS_WINDOWS * max(self.lease_ttl, self.renew_every)
