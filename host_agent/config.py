"""The host agent's settings, from flags with `AMC_*` environment defaults.

Every flag can come from the environment instead (the systemd unit's EnvironmentFile);
a flag given on the command line wins. Durations accept `30`, `30s`, `500ms` or `2m`.
Anything malformed ends the process with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from amc_common.channel import read_token
from amc_common.version import version_line
from host_agent.health import Thresholds
from host_agent.recovery import RecoverySettings

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

DEFAULT_CONTROL_PLANE = "127.0.0.1:50051"
DEFAULT_ADB = "127.0.0.1:5037"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, None: 1.0}
_Settings = TypeVar("_Settings", bound="DataclassInstance")


@dataclass(frozen=True)
class AgentSettings:
    """What the Agent itself needs; the rest of `Config` is about building its parts."""

    host_id: str
    labels: Mapping[str, str] = field(default_factory=dict)
    # SIGTERM: how long running tasks may go on before they are stopped and released.
    drain_timeout: float = 30.0
    # How often the device inventory is read again (and re-registered if it changed).
    inventory_interval: float = 10.0
    # How long one Acquire long poll waits for work (the control plane caps it at 60 s).
    acquire_wait: float = 60.0
    # A report gives up after this long; the lease then runs out on the control plane.
    report_timeout: float = 60.0
    release_timeout: float = 10.0
    # The default for `shell` actions that set no timeout of their own.
    shell_timeout: float = 60.0
    # How long the uploads of one run's kept files (screenshots, UI dumps) may take in all,
    # before its result is reported without the rest.
    upload_timeout: float = 30.0
    # Health probes (host_agent.health): how often every phone is probed, how long one
    # probe may take, and when a phone is held and let go again.
    probe_interval: float = 10.0
    probe_timeout: float = 5.0
    thresholds: Thresholds = field(default_factory=Thresholds)
    # Quarantine and the recovery ladder (host_agent.recovery).
    recovery: RecoverySettings = field(default_factory=RecoverySettings)
    # Live screens (host_agent.screencast): at most this many frames a second and bytes a
    # second per phone, whatever its viewers ask; a task's recording at most this many
    # bytes (frames past it are left out).
    screen_max_fps: int = 12
    screen_max_rate: int = 4 << 20
    screen_record_max_bytes: int = 8 << 20
    # How long the ScreenFrames call stays open with no phone watched (no flag: tests
    # shorten it); host_agent.screencast.SCREEN_LINGER.
    screen_linger: float = 30.0


@dataclass(frozen=True)
class Config:
    control_plane: str
    # None with --insecure: the control plane runs without authentication. Not in the
    # repr: a Config printed (or shown in a traceback) must not carry the secret.
    token: str | None = field(repr=False)
    agent: AgentSettings
    ca: Path | None = None
    tls: bool = False
    adb_host: str = "127.0.0.1"
    adb_port: int = 5037
    adb_timeout: float = 30.0
    simulated_devices: int = 0
    sim_delay: float = 0.2
    action_log: Path | None = None
    # Simulated phones' faults, set from outside (SimulatedSource.follow_faults).
    sim_faults: Path | None = None
    log_format: str = "auto"
    log_level: str = "INFO"
    metrics_listen: str | None = None
    # A failure that ends the agent also logs its traceback (never local variables).
    debug: bool = False


class ConfigError(Exception):
    """A setting is malformed or missing."""


# -- value parsers (argparse turns ValueError into "invalid … value") ----------------------


def duration(text: str) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(text)
    return float(match[1]) * _UNITS[match[2]]


def address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(text)
    return host.strip("[]"), int(port)


address.__name__ = "host:port"  # argparse names the parser in its error message


def address_text(text: str) -> str:
    address(text)
    return text


address_text.__name__ = "host:port"


def label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(text)
    return key.strip(), value.strip()


label.__name__ = "KEY=VALUE"


def labels_list(text: str) -> dict[str, str]:
    return dict(label(item) for item in text.split(",") if item.strip())


labels_list.__name__ = "comma-separated key=value list"


def count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def percent(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 100:
        raise ValueError(text)
    return value


percent.__name__ = "percentage (0 to 100)"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(MB|GB)\s*$", re.IGNORECASE)


def size(text: str) -> int:
    """Bytes, from a size in MB or GB (powers of 1024): 500MB, 1.5GB."""
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(text)
    return int(float(match[1]) * (1 << (30 if match[2].upper() == "GB" else 20)))


size.__name__ = "size (e.g. 500MB, 2GB)"


def log_format(text: str) -> str:
    if text not in ("auto", "console", "json"):
        raise ValueError(text)
    return text


log_format.__name__ = "log format (auto, console, json)"


def log_level(text: str) -> str:
    if text.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(text)
    return text.upper()


log_level.__name__ = "log level"


# -- the command line ----------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, not the whole usage: this usually ends up in a journal.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


# flag, environment variable, default, value parser, help. A flag's value comes from the
# command line, else its variable, else the default (argparse parses string defaults too,
# so a malformed variable is reported like a malformed flag). A flag sets the field of
# AgentSettings, Thresholds or Config named like it (--shell-timeout: `shell_timeout`).
# fmt: off
_OPTIONS: list[tuple[str, str, str | None, Callable[[str], Any], str]] = [
    ("--control-plane", "AMC_ADDR", DEFAULT_CONTROL_PLANE, address_text, "control plane host:port"),
    ("--ca", "AMC_CA", None, str, "CA certificate (PEM) for TLS to the control plane"),
    ("--token-file", "AMC_TOKEN_FILE", None, str, "file holding the host token (or $AMC_TOKEN)"),
    ("--host-id", "AMC_HOST_ID", socket.gethostname(), str, "this host's id"),
    ("--adb", "AMC_ADB_ADDR", DEFAULT_ADB, address, "adb server host:port"),
    ("--adb-timeout", "AMC_ADB_TIMEOUT", "30s", duration, "deadline of one adb call"),
    ("--simulated-devices", "AMC_SIMULATED_DEVICES", "0", count, "N simulated phones, no adb"),
    ("--sim-delay", "AMC_SIM_DELAY", "0.2s", duration, "how long a simulated action takes"),
    ("--action-log", "AMC_ACTION_LOG", None, str, "JSON-lines log of simulated actions"),
    ("--sim-faults", "AMC_SIM_FAULTS", None, str,
     "JSON file of simulated phones' faults, re-read when it changes"),
    ("--drain-timeout", "AMC_DRAIN_TIMEOUT", "30s", duration, "SIGTERM: grace for running tasks"),
    ("--inventory-interval", "AMC_INVENTORY_INTERVAL", "10s", duration, "device list refresh"),
    ("--acquire-wait", "AMC_ACQUIRE_WAIT", "60s", duration, "long-poll wait of one Acquire"),
    ("--report-timeout", "AMC_REPORT_TIMEOUT", "60s", duration, "how long a report is retried"),
    ("--shell-timeout", "AMC_SHELL_TIMEOUT", "60s", duration, "default timeout of shell actions"),
    ("--log-format", "AMC_LOG_FORMAT", "auto", log_format, "auto, console or json"),
    ("--log-level", "AMC_LOG_LEVEL", "INFO", log_level, "DEBUG, INFO, WARNING or ERROR"),
    ("--metrics-listen", "AMC_METRICS_LISTEN", None, address_text, "host:port for /metrics"),
    ("--upload-timeout", "AMC_UPLOAD_TIMEOUT", "30s", duration,
     "how long one task's screenshot and UI dump uploads may take in all"),
    ("--probe-interval", "AMC_PROBE_INTERVAL", "10s", duration, "how often each phone is probed"),
    ("--probe-timeout", "AMC_PROBE_TIMEOUT", "5s", duration, "how long one probe may take"),
    ("--battery-low", "AMC_BATTERY_LOW", "20", percent, "hold a phone below this battery %"),
    ("--battery-resume", "AMC_BATTERY_RESUME", "40", percent, "... until it charged to this %"),
    ("--too-hot", "AMC_TOO_HOT", "45", float, "hold a phone above this battery temperature (°C)"),
    ("--cool-again", "AMC_COOL_AGAIN", "40", float, "... until it is below this (°C)"),
    ("--storage-low", "AMC_STORAGE_LOW", "1GB", size, "hold a phone with less free storage"),
    ("--storage-resume", "AMC_STORAGE_RESUME", "2GB", size, "... until it has more than this"),
    ("--quarantine-failures", "AMC_QUARANTINE_FAILURES", "3", count,
     "infrastructure failures of a phone that quarantine it (0: never)..."),
    ("--quarantine-window", "AMC_QUARANTINE_WINDOW", "10m", duration, "... within this long"),
    ("--recovery-backoff", "AMC_RECOVERY_BACKOFF", "5s", duration,
     "first pause of the recovery ladder (doubling)"),
    ("--boot-timeout", "AMC_BOOT_TIMEOUT", "2m", duration, "how long a reboot may take"),
    ("--screen-max-fps", "AMC_SCREEN_MAX_FPS", "12", count,
     "live screen: most frames a second captured per phone"),
    ("--screen-max-rate", "AMC_SCREEN_MAX_RATE", "4MB", size,
     "live screen: most bytes a second sent per phone"),
    ("--screen-record-max-bytes", "AMC_SCREEN_RECORD_MAX_BYTES", "8MB", size,
     "a task's screen recording: most bytes kept (under the control plane's artifact limit)"),
]
# fmt: on


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    p = _Parser(prog="host-agent", description="Runs AMC tasks on this host's phones.")
    for flag, var, default, parse_value, help_text in _OPTIONS:
        p.add_argument(
            flag, default=env.get(var, default), type=parse_value, help=f"{help_text} [${var}]"
        )
    p.add_argument("--version", action="version", version=version_line("host-agent"))
    p.add_argument(
        "--tls",
        action="store_true",
        default=env.get("AMC_TLS", "") in ("1", "true"),
        help="TLS with the system's CA roots [$AMC_TLS=1]",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=env.get("AMC_INSECURE", "") in ("1", "true"),
        help="no token: only for a control plane run with --insecure [$AMC_INSECURE=1]",
    )
    p.add_argument(
        "--debug",
        action="store_true",
        default=env.get("AMC_DEBUG", "").lower() not in ("", "0", "false", "no"),
        help="a failure that ends the agent shows its traceback [$AMC_DEBUG=1]",
    )
    p.add_argument(
        "--label",
        action="append",
        type=label,
        default=[],
        metavar="KEY=VALUE",
        help="a host label, repeatable [$AMC_LABELS, comma-separated]",
    )
    return p


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> Config:
    """The configuration, or exit 2 with one line saying what is wrong."""
    parser = _parser(env)
    args = parser.parse_args(argv)
    try:
        return _config(args, env)
    except ConfigError as exc:
        parser.error(str(exc))


def _config(args: argparse.Namespace, env: Mapping[str, str]) -> Config:
    try:
        host_labels = {**labels_list(env.get("AMC_LABELS", "")), **dict(args.label)}
    except ValueError as exc:
        raise ConfigError(f"$AMC_LABELS: not a key=value list: {exc}") from None
    _check_positive(args)
    agent = _from_flags(
        AgentSettings,
        args,
        labels=host_labels,
        thresholds=_from_flags(Thresholds, args),
        recovery=RecoverySettings(
            failures=args.quarantine_failures,
            window=args.quarantine_window,
            backoff=args.recovery_backoff,
            boot_timeout=args.boot_timeout,
        ),
    )
    if args.battery_resume < args.battery_low:
        raise ConfigError("--battery-resume must be at least --battery-low")
    if args.cool_again > args.too_hot:
        raise ConfigError("--cool-again must be at most --too-hot")
    if args.storage_resume < args.storage_low:
        raise ConfigError("--storage-resume must be at least --storage-low")
    adb_host, adb_port = args.adb
    return _from_flags(
        Config,
        args,
        token=None if args.insecure else _token(args.token_file, env),
        agent=agent,
        ca=_existing(args.ca, "--ca"),
        adb_host=adb_host,
        adb_port=adb_port,
        action_log=Path(args.action_log) if args.action_log else None,
        sim_faults=Path(args.sim_faults) if args.sim_faults else None,
    )


def _from_flags(cls: type[_Settings], args: argparse.Namespace, **given: Any) -> _Settings:
    """A `cls` made of `given` and, for each other field, the flag named after it (the flag's
    dest: --shell-timeout sets `shell_timeout`); a field with neither keeps its default."""
    flags = vars(args)
    named = {
        f.name: flags[f.name]
        for f in dataclasses.fields(cls)
        if f.name in flags and f.name not in given
    }
    return cls(**named, **given)


def _check_positive(args: argparse.Namespace) -> None:
    # A zero drain timeout is allowed: stop running tasks at once on SIGTERM.
    names = (
        "acquire_wait",
        "report_timeout",
        "shell_timeout",
        "inventory_interval",
        "upload_timeout",
        "probe_interval",
        "probe_timeout",
    )
    for name in names:
        if getattr(args, name) <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive")
    if not 1 <= args.screen_max_fps <= 30:
        raise ConfigError("--screen-max-fps must be 1 to 30")
    if args.screen_max_rate <= 0:
        raise ConfigError("--screen-max-rate must be positive")
    if not args.host_id:
        raise ConfigError("--host-id is empty")


def _token(token_file: str | None, env: Mapping[str, str]) -> str:
    try:
        token = read_token(None if token_file else env.get("AMC_TOKEN"), token_file)
    except OSError as exc:
        raise ConfigError(f"--token-file: cannot read {token_file}: {exc.strerror}") from None
    if not token:
        raise ConfigError(
            "no host token: give --token-file, $AMC_TOKEN_FILE or $AMC_TOKEN "
            "(or --insecure for a control plane without authentication)"
        )
    return token


def _existing(path: str | None, flag: str) -> Path | None:
    if not path:
        return None
    if not Path(path).is_file():
        raise ConfigError(f"{flag}: no such file: {path}")
    return Path(path)
