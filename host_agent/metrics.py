"""Prometheus metrics of the host agent (prometheus-client, default registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

STEP_SECONDS = Histogram(
    "amc_agent_action_seconds",
    "How long each device action took, by action kind and how it ended",
    ["action", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
DEVICE_ERRORS = Counter(
    "amc_agent_device_errors_total", "Errors talking to phones, by kind", ["kind"]
)
DEADLINE_MISSES = Counter(
    "amc_agent_lease_deadline_misses_total",
    "Leases whose self-fencing deadline passed without a renewal (the agent stopped acting)",
)
LEASE_CONFLICTS = Counter("amc_agent_lease_conflicts_total", "Renewals answered CONFLICT")
CANCELS_SEEN = Counter("amc_agent_cancels_seen_total", "Cancellations observed", ["via"])
TASKS = Counter("amc_agent_tasks_total", "Attempts this agent finished, by ending", ["ending"])
LEASES_HELD = Gauge("amc_agent_leases_held", "Leases held right now")
