"""Prometheus metrics of a control-plane replica (prometheus-client, default registry).

Every labelled series with a known label set exists, at 0, from start-up (`create_series`),
so an alert such as `increase(amc_leases_expired_total{to="failed"}[5m]) > 0` can be
written, and tested, before the first expiry. No `_created` series: they double the scrape
and no dashboard reads them.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client import Counter, Gauge, Histogram

from control_plane.lifecycle import IN_FLIGHT, Event, Outcome, TaskStatus

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

TASKS = Gauge("amc_tasks", "Tasks by status (refreshed every few seconds)", ["status"])
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
EXPIRED = Counter("amc_leases_expired_total", "Leases ended by expiry or release", ["to"])
SWEEPS = Counter("amc_expiry_sweeps_total", "Expiry sweeps run by this replica")
DATABASE_UP = Gauge("amc_database_up", "1 while the database answers")


# The label values each series is created with at start-up: all that this replica counts.
TRANSITION_LABELS: list[tuple[Event, str]] = [
    (Event.SUBMIT, TaskStatus.QUEUED),
    (Event.ASSIGN, TaskStatus.ASSIGNED),
    (Event.ACKNOWLEDGE, TaskStatus.DISPATCHED),
    (Event.CANCEL, TaskStatus.CANCELLED),
    *((Event.CANCEL_REQUESTED, status) for status in sorted(IN_FLIGHT)),
    *((Event.REPORT, outcome) for outcome in Outcome),
]
OFFER_RESULTS = ("woken", "unmatched")
RENEWAL_RESULTS = ("renewed", "conflict")
CANCEL_PATHS = ("push", "renewal")
# An ended lease requeues its task, or cancels it (a cancel was pending), or fails it
# (no attempts left).
EXPIRED_TO = (TaskStatus.QUEUED, TaskStatus.CANCELLED, TaskStatus.FAILED)


def create_series() -> None:
    """Every labelled series at 0 (a series that exists keeps its value)."""
    for status in TaskStatus:
        TASKS.labels(status)
    for event, to in TRANSITION_LABELS:
        TRANSITIONS.labels(event, to)
    for result in OFFER_RESULTS:
        OFFERS.labels(result)
    for result in RENEWAL_RESULTS:
        RENEWALS.labels(result)
    for path in CANCEL_PATHS:
        CANCEL_DELIVERY.labels(path)
    for to in EXPIRED_TO:
        EXPIRED.labels(to)


create_series()
