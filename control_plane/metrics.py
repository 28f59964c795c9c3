"""Prometheus metrics of a control-plane replica (prometheus-client, default registry).

Every labelled series with a known label set exists, at 0, from start-up (`create_series`),
so an alert such as `increase(amc_leases_expired_total{to="failed"}[5m]) > 0` can be
written, and tested, before the first expiry. No `_created` series: they double the scrape
and no dashboard reads them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import prometheus_client
from prometheus_client import Counter, Gauge, Histogram

from amc_common.device_conditions import CONDITIONS
from control_plane.lifecycle import IN_FLIGHT, Event, Outcome, TaskStatus

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

# Tasks not finished, by status: queued as the queue was last counted (queue_group_stats),
# assigned and dispatched counted now (the running tasks' index). Finished tasks are not
# counted (a count of them would read the whole history every few seconds): their rate is
# amc_task_transitions_total.
LIVE_STATUSES = (TaskStatus.QUEUED, TaskStatus.ASSIGNED, TaskStatus.DISPATCHED)
TASKS = Gauge(
    "amc_tasks", "Tasks not finished, by status (refreshed every few seconds)", ["status"]
)
TRANSITIONS = Counter(
    "amc_task_transitions_total", "Task transitions done by this replica", ["event", "to"]
)
ACQUIRE_WAIT = Histogram(
    "amc_acquire_wait_seconds", "How long Acquire calls were held", buckets=LATENCY
)
ACQUIRES_WAITING = Gauge(
    "amc_acquires_waiting", "Acquire long polls parked right now with an idle device to offer"
)
ACQUIRE_QUERIES = Counter(
    "amc_acquire_queries_total", "Times an Acquire asked the database for work (first or woken)"
)
OFFERS = Counter(
    "amc_dispatch_offers_total",
    "Queued tasks offered to this replica's parked Acquires: woken (one that can take it) or"
    " unmatched (none here can; nothing woken)",
    ["result"],
)
ASSIGNMENT_LATENCY = Histogram(
    "amc_assignment_latency_seconds", "Time from queued to assigned", buckets=LATENCY
)
RENEWALS = Counter("amc_renewals_total", "Lease renewals answered", ["result"])
RENEWAL_BATCH = Histogram(
    "amc_renewal_batch_leases",
    "Leases per renewal request",
    buckets=(1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 5000),
)
STEP_PROGRESS = Counter(
    "amc_step_progress_total",
    "Steps of running tasks sent with renewals: kept (of a lease the renewal renewed:"
    " written with the replica's next bulk write unless its task ended first), refused (a"
    " stale attempt's, or a lease not renewed), or dropped (too many waiting for a write"
    " while the database was away)",
    ["result"],
)
HOSTS_CONNECTED = Gauge(
    "amc_hosts_connected", "Hosts whose renewal stream is open on a live replica (any replica)"
)
STREAMS = Gauge("amc_renewal_streams", "Renewal streams open on this replica")
CANCEL_DELIVERY = Histogram(
    "amc_cancel_delivery_seconds",
    "Cancel requested -> delivered to the host (push or renewal)",
    ["path"],
    buckets=LATENCY,
)
CANCEL_STOP = Histogram(
    "amc_cancel_stop_seconds",
    "Cancel delivered -> the host's cancelled report received",
    buckets=LATENCY,
)
STREAM_RESTATES = Histogram(
    "amc_stream_restate_seconds",
    "After the LISTEN connection listened again: the read of every renewal stream's state"
    " held here (one statement) and its push onto the streams",
    buckets=LATENCY,
)
EXPIRED = Counter("amc_leases_expired_total", "Leases ended by expiry or release", ["to"])
SWEEPS = Counter("amc_expiry_sweeps_total", "Expiry sweeps run by this replica")
DATABASE_UP = Gauge("amc_database_up", "1 while the database answers")


# -- what an operator alerts on ---------------------------------------------------------------
# Farm-wide gauges come from one aggregate query every few seconds (gauges.FarmGauges);
# the queue's per-selector series follow the queue (at most QUEUE_SELECTORS of them, plus
# `any` and `other`, which always exist).

DEVICE_STATES = ("device", "offline", "unauthorized", "gone")
DEVICE_USES = ("busy", "idle")
QUEUE_SELECTORS = 20
RUN_TIME = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)

DEVICES = Gauge(
    "amc_devices",
    "Devices by state (as their host last reported: device = online) and use (busy: holds a task)",
    ["state", "use"],
)
DEVICE_CONDITIONS = Gauge(
    "amc_devices_by_condition",
    "Online devices by condition, as their hosts' probes last saw them (only ready ones take work)",
    ["condition"],
)
SPREAD = ("min", "mean", "max")


def _spread(name: str, quantity: str) -> Gauge:
    """A gauge of `quantity` over the farm's online devices probed, by SPREAD's stat."""
    help_text = f"{quantity} of the online devices probed: min, mean and max over the farm"
    return Gauge(name, help_text, ["stat"])


BATTERY = _spread("amc_device_battery_percent", "Battery level")
TEMPERATURE = _spread("amc_device_temperature_celsius", "Battery temperature")
QUEUE_DEPTH = Gauge(
    "amc_queue_depth",
    f"Queued tasks by selector (the {QUEUE_SELECTORS} deepest; the rest under `other`;"
    " `any`: no selector)",
    ["selector"],
)
QUEUE_OLDEST = Gauge(
    "amc_queue_oldest_seconds", "Age of the oldest queued task, by selector", ["selector"]
)
# Per fairness key: the QUEUE_KEYS keys with most queued (then running) by name, the rest
# summed under `other` (so a client inventing keys cannot grow the series without bound).
QUEUE_KEYS = 20
KEY_QUEUED = Gauge(
    "amc_fair_share_queued",
    f"Queued tasks by fairness key, as last counted (the {QUEUE_KEYS} keys with most queued;"
    " the rest under `other`)",
    ["key"],
)
KEY_RUNNING = Gauge(
    "amc_fair_share_running",
    "Running (assigned or dispatched) tasks by fairness key (the same keys as"
    " amc_fair_share_queued)",
    ["key"],
)
KEY_OLDEST = Gauge(
    "amc_fair_share_oldest_seconds",
    "Age of the oldest queued task by fairness key, as last counted (0: none queued)",
    ["key"],
)
QUEUE_COUNT_SECONDS = Histogram(
    "amc_queue_count_seconds",
    "How long a count of the queue took on this replica (one replica counts at a time)",
    buckets=LATENCY,
)
QUEUE_COUNT_AGE = Gauge(
    "amc_queue_count_age_seconds",
    "How old the queue's counts are (what GetQueue, ListFairShares and the queue's gauges show)",
)
PICKUP = Histogram(
    "amc_pickup_latency_seconds",
    "Queued -> dispatched (the host acknowledged the assignment)",
    buckets=LATENCY,
)
RUN_SECONDS = Histogram(
    "amc_task_run_seconds",
    "Dispatched -> result reported, by outcome",
    ["outcome"],
    buckets=RUN_TIME,
)
REQUEUES = Counter(
    "amc_task_requeues_total",
    "Tasks put back in the queue for another attempt, by cause",
    ["cause"],
)
# lease_device_lost: an infrastructure retry (the phone was lost mid-run).
REQUEUE_CAUSES = ("lease_expired", "lease_released", "lease_device_lost")
AUTH_FAILURES = Counter(
    "amc_auth_failures_total",
    "Calls refused by authentication or authorization, by reason",
    ["reason"],
)
AUTH_REASONS = ("missing", "malformed", "unknown", "revoked", "forbidden")
RPC_REQUESTS = Counter(
    "amc_rpc_requests_total", "gRPC calls answered, by method and status code", ["method", "code"]
)
RPC_SECONDS = Histogram(
    "amc_rpc_duration_seconds",
    "gRPC call duration by method and status code (streams: the whole stream)",
    ["method", "code"],
    buckets=LATENCY,
)
GC_PAUSE = Histogram(
    "amc_gc_pause_seconds",
    "How long each cyclic garbage collection stopped the replica, by generation (see heap.py)",
    ["generation"],
    buckets=LATENCY,
)
POOL_WAIT = Histogram(
    "amc_database_pool_wait_seconds",
    "How long a statement waited for a connection of the replica's database pool",
    buckets=LATENCY,
)
LOOP_LAG = Histogram(
    "amc_event_loop_lag_seconds",
    "How late the replica's event loop ran a timer, read every 0.25 s (see heap.py)",
    buckets=LATENCY,
)
RETENTION_REMOVED = Counter(
    "amc_retention_removed_total",
    "Rows deleted by retention on this replica (--task-retention, --forget-hosts-after), by kind",
    ["kind"],
)
RETENTION_BATCH = Histogram(
    "amc_retention_batch_seconds",
    "How long one retention batch (one statement, one transaction) took, by what it removed",
    ["what"],
    buckets=LATENCY,
)
# What retention deletes: finished tasks with their attempts, events and artifacts; hosts
# with their devices.
RETENTION_KINDS = (
    "tasks",
    "attempts",
    "task_events",
    "artifacts",
    "hosts",
    "devices",
    "cleaning_events",
)
RETENTION_BATCHES = ("tasks", "hosts", "cleaning_events")

ARTIFACT_UPLOADS = Counter(
    "amc_artifact_uploads_total",
    "Artifact uploads answered, by result: stored, repeated (stored before), too_large,"
    " damaged (size or sha256 not as announced), refused (lease not current or another"
    " host's), invalid, busy (the replica held its upload memory budget already; the host"
    " retries), with_report (a small file carried with its result and stored with it)",
    ["result"],
)
ARTIFACT_BYTES = Counter(
    "amc_artifact_bytes_total", "Bytes of artifacts, by result (stored or refused)", ["result"]
)
ARTIFACT_UPLOAD_MEMORY = Gauge(
    "amc_artifact_upload_bytes_held",
    "Bytes the artifact uploads being received on this replica have reserved (at most its"
    " upload memory budget)",
)
ARTIFACT_RESULTS = (
    *("stored", "repeated", "too_large", "damaged", "refused", "invalid", "busy", "with_report"),
)
ARTIFACT_BYTE_RESULTS = ("stored", "refused")
LIBRARY_UPLOADS = Counter(
    "amc_library_uploads_total",
    "App library uploads answered, by what (app, file) and result: stored, repeated (the same"
    " bytes were kept before), too_large, damaged (size or sha256 not as announced),"
    " not_apk, invalid, busy (the replica's upload budget was held already)",
    ["what", "result"],
)
LIBRARY_SPOOL = Gauge(
    "amc_library_upload_bytes_held",
    "Bytes the app library uploads being received on this replica have reserved on disk",
)
LIBRARY_FETCHES = Counter(
    "amc_library_fetches_total",
    "Library bytes (an APK, a file to push) sent to hosts (Lease.FetchFile), by result: sent"
    " whole, or cut (the host's call ended first)",
    ["result"],
)
LIBRARY_FETCH_BYTES = Counter(
    "amc_library_fetch_bytes_total", "Bytes of the library sent to hosts (Lease.FetchFile)"
)
LIBRARY_UPLOAD_RESULTS = (
    "stored", "repeated", "too_large", "damaged", "not_apk", "invalid", "busy",
)  # fmt: skip


# The label values each series is created with at start-up: all that this replica counts.
TRANSITION_LABELS: list[tuple[Event, str]] = [
    (Event.SUBMIT, TaskStatus.QUEUED),
    (Event.ASSIGN, TaskStatus.ASSIGNED),
    (Event.ACKNOWLEDGE, TaskStatus.DISPATCHED),
    (Event.CANCEL, TaskStatus.CANCELLED),
    *((Event.CANCEL_REQUESTED, status) for status in sorted(IN_FLIGHT)),
    *((Event.REPORT, outcome) for outcome in Outcome),
    (Event.QUEUE_TIMEOUT, TaskStatus.FAILED),
    (Event.DEADLINE_EXCEEDED, TaskStatus.FAILED),
    (Event.DEADLINE_EXCEEDED, TaskStatus.CANCELLED),
    *(
        (Event.DEVICE_LOST, status)
        for status in (TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.FAILED)
    ),
]
OFFER_RESULTS = ("woken", "unmatched")
# unanswered: the database was away (the lease was not renewed; its deadline stands).
RENEWAL_RESULTS = ("renewed", "conflict", "unanswered")
CANCEL_PATHS = ("push", "renewal")
STEP_RESULTS = ("kept", "refused", "dropped")
# An ended lease requeues its task, or cancels it (a cancel was pending), or fails it
# (no attempts left).
EXPIRED_TO = (TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.FAILED)


def _at_zero(metric: Counter | Gauge | Histogram, *labels: Iterable[str]) -> None:
    """The series of every combination of the given label values."""
    for values in itertools.product(*labels):
        metric.labels(*values)


SCREEN_FRAME_RESULTS = (
    "received",
    "unwatched",
    "relayed",
    "sent",
    "malformed",
    "over_rate",
    "awaiting_key_frame",
    "gop_too_big",
    "skipped_to_key_frame",
)
SCREEN_FRAMES = Counter(
    "amc_screen_frames_total",
    "Screen frames: received from this replica's hosts for a phone watched here, or for"
    " one no longer watched (unwatched: dropped), relayed from another replica, sent to"
    " a viewer, or kept from a task's viewer (other_attempt: captured while its phone ran"
    " another attempt); of a stream (H.264), dropped as malformed (cut short, not Annex B,"
    " a key frame without its codec), over_rate (past what a phone's host may send a"
    " second), awaiting_key_frame (after one was dropped), gop_too_big, or a viewer's"
    " frames skipped_to_key_frame (it fell behind)",
    ["result"],
)
SCREEN_VIEWERS = Gauge(
    "amc_screen_viewers", "WatchScreen calls open on this replica (relays from others too)"
)
SCREEN_FEEDS = Gauge(
    "amc_screen_feeds",
    "Hosts' ScreenFrames calls open on this replica (a host opens one only while a viewer"
    " wants one of its phones)",
)
LOG_LINE_RESULTS = ("received", "unfollowed", "relayed")
LOG_LINES = Counter(
    "amc_log_lines_total",
    "Lines of running attempts' phone logs: received from this replica's hosts for an"
    " attempt followed here, or for one no longer followed (unfollowed: dropped), or"
    " relayed from another replica",
    ["result"],
)
LOG_READERS = Gauge("amc_log_readers", "StreamLogs calls open on this replica (relays too)")
LOG_FEEDS = Gauge(
    "amc_log_feeds",
    "Hosts' LogLines calls open on this replica (a host opens one only while an attempt"
    " of its phones is followed)",
)


def create_series() -> None:
    """Every labelled series at 0 (a series that exists keeps its value)."""
    for event, to in TRANSITION_LABELS:
        TRANSITIONS.labels(event, to)
    _at_zero(TASKS, LIVE_STATUSES)
    _at_zero(OFFERS, OFFER_RESULTS)
    _at_zero(RENEWALS, RENEWAL_RESULTS)
    _at_zero(STEP_PROGRESS, STEP_RESULTS)
    _at_zero(CANCEL_DELIVERY, CANCEL_PATHS)
    _at_zero(EXPIRED, EXPIRED_TO)
    _at_zero(DEVICES, DEVICE_STATES, DEVICE_USES)
    _at_zero(DEVICE_CONDITIONS, CONDITIONS)
    _at_zero(BATTERY, SPREAD)
    _at_zero(TEMPERATURE, SPREAD)
    _at_zero(QUEUE_DEPTH, ("any", "other"))
    _at_zero(QUEUE_OLDEST, ("any", "other"))
    _at_zero(KEY_QUEUED, ("default", "other"))
    _at_zero(KEY_RUNNING, ("default", "other"))
    _at_zero(KEY_OLDEST, ("default", "other"))
    _at_zero(RUN_SECONDS, Outcome)
    _at_zero(REQUEUES, REQUEUE_CAUSES)
    _at_zero(AUTH_FAILURES, AUTH_REASONS)
    _at_zero(GC_PAUSE, ("0", "1", "2"))
    _at_zero(RETENTION_REMOVED, RETENTION_KINDS)
    _at_zero(RETENTION_BATCH, RETENTION_BATCHES)
    _at_zero(ARTIFACT_UPLOADS, ARTIFACT_RESULTS)
    _at_zero(ARTIFACT_BYTES, ARTIFACT_BYTE_RESULTS)
    _at_zero(LIBRARY_UPLOADS, ("app", "file"), LIBRARY_UPLOAD_RESULTS)
    _at_zero(LIBRARY_FETCHES, ("sent", "cut"))
    _at_zero(SCREEN_FRAMES, SCREEN_FRAME_RESULTS)
    _at_zero(LOG_LINES, LOG_LINE_RESULTS)


def create_rpc_series(methods: list[str]) -> None:
    """The per-RPC series of the server's methods, at 0 (their answers: OK)."""
    for method in methods:
        RPC_REQUESTS.labels(method, "OK")
        RPC_SECONDS.labels(method, "OK")


create_series()
