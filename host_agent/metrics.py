"""Prometheus metrics of the host agent (prometheus-client, default registry).

Every labelled series with a known label set exists, at 0, from start-up (`create_series`),
so an alert such as `increase(amc_agent_device_errors_total{kind="DeviceLost"}[5m]) > 0`
can be written, and tested, before the first error. No `_created` series.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import prometheus_client
from prometheus_client import Counter, Gauge, Histogram

from amc_common import device_conditions
from amc_common.action_table import ACTIONS

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

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
TASKS = Counter(
    "amc_agent_tasks_total",
    "Attempts this agent finished: how (reported, released: given back unreported, dropped:"
    " the lease was already lost) and the run's outcome (none: nothing ran)",
    ["how", "outcome"],
)
LEASES_HELD = Gauge("amc_agent_leases_held", "Leases held right now")


CONNECTED = Gauge(
    "amc_agent_connected", "1 while the renewal stream to the control plane is open and answered"
)
STREAM_MOVES = Counter(
    "amc_agent_stream_moves_total",
    "Renewal streams moved to a new connection (the control plane aged the old one out)",
)
ADB_UP = Gauge(
    "amc_agent_adb_up", "1 while the device source (the adb server) answered the last inventory"
)
DEVICES = Gauge("amc_agent_devices", "Devices in the last inventory, by adb state", ["state"])
ARTIFACT_UPLOADS = Counter(
    "amc_agent_artifact_uploads_total",
    "Kept files (screenshots, UI dumps, phone logs) by upload result: stored, failed"
    " (refused or unreachable), timeout (the run's upload time was spent), with_report"
    " (small enough to go with the run's report instead)",
    ["result"],
)
ARTIFACT_BYTES = Counter("amc_agent_artifact_bytes_total", "Bytes of kept files uploaded")
LOGCAT_LINES = Counter(
    "amc_agent_logcat_lines_total",
    "Lines of the phones' logs read for the runs (host_agent.logcat)",
)
LOGCAT_BYTES_KEPT = Counter(
    "amc_agent_logcat_bytes_kept_total", "Bytes of the runs' kept logs (compressed), before upload"
)
LOG_LINES_SENT = Counter(
    "amc_agent_log_lines_sent_total", "Lines of followed runs' logs sent up (the live tail)"
)
# Per phone: a host has a few, so a label per device is cheap here (the control plane
# aggregates instead).
BATTERY = Gauge(
    "amc_agent_device_battery_percent", "Battery level of each phone, as last probed", ["device"]
)
TEMPERATURE = Gauge(
    "amc_agent_device_temperature_celsius",
    "Battery temperature of each phone, as last probed",
    ["device"],
)
CONDITIONS = Gauge(
    "amc_agent_devices_by_condition",
    "Phones probed, by the condition their last probe put them in",
    ["condition"],
)
QUARANTINES = Counter(
    "amc_agent_quarantines_total", "Phones quarantined after repeated infrastructure failures"
)
RECOVERIES = Counter(
    "amc_agent_recoveries_total",
    "Recovery ladders run, by result: recovered (back in service) or failed (left quarantined)",
    ["result"],
)
CLEAN_SECONDS = Histogram(
    "amc_agent_clean_seconds",
    "How long each clean between leases took, by result: passed, or failed (the phone was"
    " quarantined)",
    ["result"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
PROBE_SECONDS = Histogram(
    "amc_agent_probe_seconds",
    "How long a health probe's responsiveness round trip took",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)

# The label values each series is created with at start-up: all that the agent counts.
ACTION_KINDS = tuple(ACTIONS)
ACTION_STATUSES = ("ok", "failed", "stopped")
# The DeviceError classes (host_agent.devices, host_agent.adb) by name.
DEVICE_ERROR_KINDS = (
    "DeviceError",
    "DeviceLost",
    "DeviceUnresponsive",
    "DeviceTimeout",
    "SourceUnreachable",
    "CommandFailed",
    "CleanFailed",
    "UnsupportedText",
    "VideoUnavailable",
    "DoorRefused",
    "ConsoleError",
)
CANCEL_VIAS = ("push", "renewal")
ARTIFACT_RESULTS = ("stored", "failed", "timeout", "with_report")
DEVICE_STATES = ("device", "offline", "unauthorized", "other")
# how, outcome: a report carries the run's outcome; a release follows a run that never
# started (none) or one stopped by a shutdown (failed); a dropped lease ran nothing.
TASK_ENDINGS = (
    ("reported", "done"),
    ("reported", "failed"),
    ("reported", "cancelled"),
    ("released", "none"),
    ("released", "failed"),
    ("dropped", "none"),
)


SCREEN_CAPTURES = Counter(
    "amc_agent_screen_captures_total",
    "Live-screen frames captured (phones watched, or recorded): 0 while nobody watches",
)
SCREEN_CAPTURE_FAILURES = Counter(
    "amc_agent_screen_capture_failures_total", "Live-screen captures that failed"
)
SCREEN_FRAMES_SENT = Counter(
    "amc_agent_screen_frames_sent_total", "Live-screen frames sent to the control plane"
)
SCREEN_BYTES_SENT = Counter(
    "amc_agent_screen_bytes_sent_total", "Bytes of live-screen frames sent to the control plane"
)
SCREEN_FRAMES_JPEG = Counter(
    "amc_agent_screen_frames_jpeg_total",
    "Live-screen frames over the control plane's message size sent as JPEG instead",
)
SCREEN_DROP_REASONS = ("superseded", "too_large", "behind")
SCREEN_FRAMES_DROPPED = Counter(
    "amc_agent_screen_frames_dropped_total",
    "Live-screen frames not sent: superseded (a newer one came before it could go),"
    " too_large (over the control plane's message size, and no JPEG: Pillow missing) or"
    " behind (a stream's frames piled up: dropped up to its next key frame)",
    ["reason"],
)

LIBRARY_FILES = Counter(
    "amc_agent_library_files_total",
    "App library files (APKs, files to push) a task needed, by result: hit (in this host's"
    " cache), fetched (from the control plane), failed (the fetch failed or arrived damaged)",
    ["result"],
)
LIBRARY_FETCH_BYTES = Counter(
    "amc_agent_library_fetch_bytes_total", "Bytes of the app library fetched into the cache"
)
LIBRARY_CACHE_BYTES = Gauge(
    "amc_agent_library_cache_bytes", "Bytes in this host's app library cache (--app-cache-size)"
)
LIBRARY_RESULTS = ("hit", "fetched", "failed")


def create_series() -> None:
    """Every labelled series at 0 (a series that exists keeps its value)."""
    for reason in SCREEN_DROP_REASONS:
        SCREEN_FRAMES_DROPPED.labels(reason)
    for action in ACTION_KINDS:
        for status in ACTION_STATUSES:
            STEP_SECONDS.labels(action, status)
    for kind in DEVICE_ERROR_KINDS:
        DEVICE_ERRORS.labels(kind)
    for via in CANCEL_VIAS:
        CANCELS_SEEN.labels(via)
    for how, outcome in TASK_ENDINGS:
        TASKS.labels(how, outcome)
    for state in DEVICE_STATES:
        DEVICES.labels(state)
    for result in ARTIFACT_RESULTS:
        ARTIFACT_UPLOADS.labels(result)
    for condition in device_conditions.CONDITIONS:
        CONDITIONS.labels(condition)
    for result in ("recovered", "failed"):
        RECOVERIES.labels(result)
    for result in ("passed", "failed"):
        CLEAN_SECONDS.labels(result)
    for result in LIBRARY_RESULTS:
        LIBRARY_FILES.labels(result)


create_series()


def inventory_read(states: list[str] | None) -> None:
    """After reading the inventory: the adb states seen, or None when the read failed."""
    ADB_UP.set(0 if states is None else 1)
    counts = dict.fromkeys(DEVICE_STATES, 0)
    for state in states or ():
        counts[state if state in counts else "other"] += 1
    for state, n in counts.items():
        DEVICES.labels(state).set(n)


def probed(health: Mapping[str, tuple[str, int | None, float | None]], gone: Iterable[str]) -> None:
    """After a probe round: each phone's (condition, battery, temperature); the series of
    phones no longer probed (`gone`) removed."""
    counts = dict.fromkeys(device_conditions.CONDITIONS, 0)
    for serial, (condition, battery, temperature) in health.items():
        counts[condition] = counts.get(condition, 0) + 1
        if battery is not None:
            BATTERY.labels(serial).set(battery)
        if temperature is not None:
            TEMPERATURE.labels(serial).set(temperature)
    for serial in gone:
        for gauge in (BATTERY, TEMPERATURE):
            try:
                gauge.remove(serial)
            except KeyError:
                pass
    for condition, n in counts.items():
        CONDITIONS.labels(condition).set(n)
