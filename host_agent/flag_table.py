"""The host agent's flags as a table: each flag's environment variable, default, value
parser and help, in the sections `--help` shows them in (read by host_agent.flags).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from host_agent.config import DEFAULT_ADB, DEFAULT_CONTROL_PLANE
from host_agent.flag_values import (
    address,
    address_text,
    budget,
    capabilities,
    celsius,
    count,
    duration,
    log_format,
    log_level,
    percent,
    port_range,
    size,
)
from host_agent.scrcpy_link import jar_flag

# flag, environment variable, default, value parser, help. A flag's value comes from the
# command line, else its variable, else the default (argparse parses string defaults too,
# so a malformed variable is reported like a malformed flag). A flag sets the field of
# AgentSettings, Thresholds or Config named like it (--shell-timeout: `shell_timeout`).
Option = tuple[str, str, str | None, Callable[[str], Any], str]

# fmt: off
_CONTROL_PLANE: list[Option] = [
    ("--control-plane", "AMC_ADDR", DEFAULT_CONTROL_PLANE, address_text, "control plane host:port"),
    ("--ca", "AMC_CA", None, str, "CA certificate (PEM) for TLS to the control plane"),
    ("--token-file", "AMC_TOKEN_FILE", None, str, "file holding the host token (or $AMC_TOKEN)"),
    ("--host-id", "AMC_HOST_ID", socket.gethostname(), str, "this host's id"),
]
_PHONES: list[Option] = [
    ("--adb", "AMC_ADB_ADDR", DEFAULT_ADB, address, "adb server host:port"),
    ("--adb-timeout", "AMC_ADB_TIMEOUT", "30s", duration, "deadline of one adb call"),
    ("--inventory-interval", "AMC_INVENTORY_INTERVAL", "10s", duration, "device list refresh"),
    ("--shell-timeout", "AMC_SHELL_TIMEOUT", "60s", duration, "default timeout of shell actions"),
]
_TASKS: list[Option] = [
    ("--acquire-wait", "AMC_ACQUIRE_WAIT", "60s", duration, "long-poll wait of one Acquire"),
    ("--report-timeout", "AMC_REPORT_TIMEOUT", "60s", duration, "how long a report is retried"),
    ("--upload-timeout", "AMC_UPLOAD_TIMEOUT", "30s", duration,
     "how long one task's screenshot and UI dump uploads may take in all"),
    ("--drain-timeout", "AMC_DRAIN_TIMEOUT", "30s", duration, "SIGTERM: grace for running tasks"),
    ("--app-cache-dir", "AMC_APP_CACHE_DIR", None, Path,
     "where the app library's APKs and files are kept on this host (default: the unit's"
     " $CACHE_DIRECTORY/apps, else ~/.cache/amc-host-agent/apps)"),
    ("--app-cache-size", "AMC_APP_CACHE_SIZE", "2GB", size,
     "most bytes of the app library kept on this host (least recently used out)"),
    ("--logcat-max-bytes", "AMC_LOGCAT_MAX_BYTES", "4MB", size,
     "each run's phone log: most bytes kept, compressed (its start and end; 0: none kept)"),
]
_HELD: list[Option] = [
    ("--battery-low", "AMC_BATTERY_LOW", "20", percent, "hold a phone below this battery %"),
    ("--battery-resume", "AMC_BATTERY_RESUME", "40", percent, "... until it charged to this %"),
    ("--too-hot", "AMC_TOO_HOT", "45", celsius, "hold a phone above this battery temperature (°C)"),
    ("--cool-again", "AMC_COOL_AGAIN", "40", celsius, "... until it is below this (°C)"),
    ("--storage-low", "AMC_STORAGE_LOW", "1GB", size, "hold a phone with less free storage"),
    ("--storage-resume", "AMC_STORAGE_RESUME", "2GB", size, "... until it has more than this"),
]
_PROBES: list[Option] = [
    ("--probe-interval", "AMC_PROBE_INTERVAL", "10s", duration, "how often each phone is probed"),
    ("--probe-timeout", "AMC_PROBE_TIMEOUT", "5s", duration, "how long one probe may take"),
    ("--quarantine-failures", "AMC_QUARANTINE_FAILURES", "3", count,
     "infrastructure failures of a phone that quarantine it (0: never)..."),
    ("--quarantine-window", "AMC_QUARANTINE_WINDOW", "10m", duration, "... within this long"),
    ("--recovery-backoff", "AMC_RECOVERY_BACKOFF", "5s", duration,
     "first pause of the recovery ladder (doubling)"),
    ("--boot-timeout", "AMC_BOOT_TIMEOUT", "2m", duration, "how long a reboot may take"),
]
_CLEANING: list[Option] = [
    ("--clean-profile", "AMC_CLEAN_PROFILE", None, str,
     "YAML file: how phones are cleaned between leases, by pool (docs/operations.md)"),
    ("--clean-baselines", "AMC_CLEAN_BASELINES", None, str,
     "JSON file keeping each phone's baseline (packages, files) across restarts"),
]
_SCREEN: list[Option] = [
    ("--screen-max-fps", "AMC_SCREEN_MAX_FPS", "12", count,
     "live screen: most frames a second captured per phone"),
    ("--screen-max-rate", "AMC_SCREEN_MAX_RATE", "4MB", size,
     "live screen: most bytes a second sent per phone"),
    ("--screen-record-max-bytes", "AMC_SCREEN_RECORD_MAX_BYTES", "8MB", size,
     "a task's screen recording: most bytes kept (under the control plane's artifact limit)"),
    ("--screen-video-max-fps", "AMC_SCREEN_VIDEO_MAX_FPS", "30", count,
     "live screen as H.264: most frames a second streamed per phone"),
    ("--scrcpy-server", "AMC_SCRCPY_SERVER", None, jar_flag,
     "scrcpy-server v3.3.4: real phones' H.264 and input through it (unset: screencap)"),
]
_WEBDRIVER: list[Option] = [
    ("--appium", "AMC_APPIUM", None, str, "the appium program: a WebDriver session's server"),
    ("--appium-caps", "AMC_APPIUM_CAPS", "{}", capabilities, "JSON: caps over every client's"),
]
_LOGS: list[Option] = [
    ("--log-format", "AMC_LOG_FORMAT", "auto", log_format, "auto, console or json"),
    ("--log-level", "AMC_LOG_LEVEL", "INFO", log_level, "DEBUG, INFO, WARNING or ERROR"),
    ("--metrics-listen", "AMC_METRICS_LISTEN", None, address_text, "host:port for /metrics"),
]
_EMULATORS: list[Option] = [
    ("--emulator-pools", "AMC_EMULATOR_POOLS", None, str,
     "YAML file of emulator pools (docs/operations.md), besides --emulator"),
    ("--emulator-binary", "AMC_EMULATOR_BINARY", None, str,
     "the emulator program (default: $ANDROID_HOME/emulator/emulator, else PATH's)"),
    ("--emulator-budget", "AMC_EMULATOR_BUDGET", "2,2GB", budget,
     "what one emulator takes of the host: CPUS,MEMORY"),
    ("--emulator-idle", "AMC_EMULATOR_IDLE", "5m", duration,
     "an emulator idle this long, above its pool's minimum, is stopped"),
    ("--emulator-ports", "AMC_EMULATOR_PORTS", "5554-5682", port_range,
     "the console ports emulators take (even; adb on the next)"),
    ("--emulator-boot-timeout", "AMC_EMULATOR_BOOT_TIMEOUT", "5m", duration,
     "how long an emulator may take to start"),
    ("--emulator-load-timeout", "AMC_EMULATOR_LOAD_TIMEOUT", "1m", duration,
     "how long a snapshot load may take"),
]
_SIMULATED: list[Option] = [
    ("--simulated-devices", "AMC_SIMULATED_DEVICES", "0", count, "N simulated phones, no adb"),
    ("--sim-delay", "AMC_SIM_DELAY", "0.2s", duration, "how long a simulated action takes"),
    ("--action-log", "AMC_ACTION_LOG", None, str, "JSON-lines log of simulated actions"),
    ("--sim-faults", "AMC_SIM_FAULTS", None, str,
     "JSON file of simulated phones' faults, re-read when it changes"),
]
# fmt: on

# The flags by what they are about: each group is a section of --help, in this order.
GROUPS: list[tuple[str, list[Option]]] = [
    ("the control plane", _CONTROL_PLANE),
    ("phones", _PHONES),
    ("tasks", _TASKS),
    ("a phone's health: when it is held from tasks", _HELD),
    ("a phone's health: probes, quarantine and recovery", _PROBES),
    ("cleaning between leases", _CLEANING),
    ("live screen and recordings", _SCREEN),
    ("emulators the host runs (a pool per AVD)", _EMULATORS),
    ("WebDriver sessions (one Appium server per phone, started on demand)", _WEBDRIVER),
    ("logs and metrics", _LOGS),
    ("simulated phones (no adb: for trying the farm out and for tests)", _SIMULATED),
]


# How --help shows a flag's value, by its parser (any other: the flag's name in capitals).
METAVARS: dict[Callable[[str], Any], str] = {
    duration: "DURATION",
    address: "HOST:PORT",
    address_text: "HOST:PORT",
    size: "SIZE",
    count: "N",
    percent: "PERCENT",
    celsius: "CELSIUS",
    log_format: "FORMAT",
    log_level: "LEVEL",
    Path: "DIR",
    budget: "CPUS,MEMORY",
    capabilities: "JSON",
    port_range: "FIRST-LAST",
}
