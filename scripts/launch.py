"""The command lines that start a control plane and a host agent, written in one place.

`make run`, the benchmark, the chaos run and the tests that start the real binaries all
describe what they start with these dataclasses: one typed field per flag, `None` (or
False) for "not given, the binary's default". `argv()` renders the installed console
script of this virtualenv with its flags; `env()` the environment to start it in.

A started process is configured by its command line alone: `env()` leaves out every
variable the binaries read a setting from (`AMC_*`, `DATABASE_URL`, systemd's
`NOTIFY_SOCKET` and `WATCHDOG_*`), so a variable exported in the shell that starts a farm
(an `AMC_ADDR` or `AMC_TLS` meant for the `amc` CLI) cannot reconfigure it. The one
setting that travels in the environment is a host token given as text (`AMC_TOKEN`), so
that it never shows in a process listing.

Only the checkout needs this: nothing shipped starts these processes (in production
systemd starts the agent with its EnvironmentFile), so it lives beside the scripts, as
`scripts.launch` (the checkout's root is on the path: `make setup` installs the project
editable, and pytest puts it there for the tests). tests/test_launch.py reads every
rendered flag back with the binaries' own parsers, so this module cannot drift from them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar, Literal

BIN = Path(sys.executable).parent
CONTROL_PLANE = BIN / "control-plane"
HOST_AGENT = BIN / "host-agent"

LogFormat = Literal["auto", "console", "json"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR"]
TokenRole = Literal["operator", "client", "host"]

# Variables the binaries read settings from: never inherited by a launched process.
_SETTINGS_PREFIXES = ("AMC_", "NOTIFY_", "WATCHDOG_")
_SETTINGS_NAMES = frozenset({"DATABASE_URL"})


def inherited(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) without the settings variables."""
    base = os.environ if base is None else base
    return {
        k: v
        for k, v in base.items()
        if not k.startswith(_SETTINGS_PREFIXES) and k not in _SETTINGS_NAMES
    }


def seconds(value: float) -> str:
    """A duration as the control plane's flags take it (millisecond precision)."""
    return format(value, ".3f").rstrip("0").rstrip(".")


def duration(value: float) -> str:
    """A duration with its unit, as the host agent's flags and the control plane's retention
    flags take it: `0.5s`, `30s`."""
    return seconds(value) + "s"


def megabytes(value: int) -> str:
    """A size in bytes as the host agent's size flags take it (MB, powers of 1024), exactly:
    `2048MB`, `0.5MB`."""
    whole, rest = divmod(value, 1 << 20)
    fraction = format(Decimal(rest) / (1 << 20), "f")[1:] if rest else ""
    return f"{whole}{fraction}MB"


def _seconds() -> Any:
    return field(default=None, metadata={"render": seconds})


def _duration() -> Any:
    return field(default=None, metadata={"render": duration})


class _Command:
    """A dataclass of flags after `head`, the program (and subcommand). A field is the flag
    of its name (`lease_ttl`: `--lease-ttl`), left out when None or False, alone when True,
    once per item of a mapping (`--label k=v`); its metadata may name another `flag` (None:
    not a flag) and `render` its value (durations: `_seconds()`, `_duration()`; the agent's
    sizes: `megabytes`)."""

    head: ClassVar[tuple[str, ...]]

    def argv(self) -> list[str]:
        argv = list(self.head)
        for f in fields(self):  # type: ignore[arg-type]
            flag = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
            value = getattr(self, f.name)
            if flag is None or value is None or value is False:
                continue
            if value is True:
                argv.append(flag)
            elif isinstance(value, Mapping):
                for key, item in value.items():
                    argv += [flag, f"{key}={item}"]
            else:
                argv += [flag, f.metadata.get("render", str)(value)]
        return argv

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        return inherited(base)


@dataclass(frozen=True)
class ControlPlaneCommand(_Command):
    """`control-plane serve`: one replica. Durations are seconds."""

    head = (str(CONTROL_PLANE), "serve")

    listen: str
    database_url: str | None = None  # None: the embedded server in `data_dir`
    data_dir: Path | None = None
    insecure: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    lease_ttl: float | None = _seconds()
    renew_interval: float | None = _seconds()
    sweep_interval: float | None = _seconds()
    grace: float | None = _seconds()
    metrics_listen: str | None = None
    http_listen: str | None = None
    log_format: LogFormat | None = None
    debug: bool = False
    # Retention: 0 turns it off.
    task_retention: float | None = _duration()
    forget_hosts_after: float | None = _duration()
    retention_interval: float | None = _seconds()
    max_artifact_size: int | None = None
    max_app_size: int | None = None  # bytes
    # 0 turns it off.
    max_connection_age: float | None = _duration()


@dataclass(frozen=True)
class CreateTokenCommand(_Command):
    """`control-plane tokens create`: a token straight into the database, printed once."""

    head = (str(CONTROL_PLANE), "tokens", "create")

    role: TokenRole
    database_url: str | None = None  # None: the embedded server in `data_dir`
    data_dir: Path | None = None
    host_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class HostAgentCommand(_Command):
    """`host-agent`. Durations are seconds. Without `simulated_devices` the agent drives the
    phones of the adb server at `adb` (its default: 127.0.0.1:5037)."""

    head = (str(HOST_AGENT),)

    control_plane: str
    host_id: str
    # A host token: as text (passed in the environment, see env()) or in a file; neither
    # with `insecure` (a control plane without authentication).
    token: str | None = field(default=None, repr=False, metadata={"flag": None})
    token_file: Path | None = None
    insecure: bool = False
    ca: Path | None = None
    tls: bool = False
    labels: Mapping[str, str] = field(default_factory=dict, metadata={"flag": "--label"})
    adb: str | None = None
    adb_timeout: float | None = _duration()
    simulated_devices: int | None = None
    sim_delay: float | None = _duration()
    action_log: Path | None = None
    drain_timeout: float | None = _duration()
    inventory_interval: float | None = _duration()
    acquire_wait: float | None = _duration()
    report_timeout: float | None = _duration()
    shell_timeout: float | None = _duration()
    metrics_listen: str | None = None
    log_format: LogFormat | None = None
    log_level: LogLevel | None = None
    debug: bool = False
    upload_timeout: float | None = _duration()
    # Health probes, quarantine and simulated phones' faults.
    probe_interval: float | None = _duration()
    probe_timeout: float | None = _duration()
    quarantine_failures: int | None = None
    quarantine_window: float | None = _duration()
    recovery_backoff: float | None = _duration()
    boot_timeout: float | None = _duration()
    sim_faults: Path | None = None
    # Cleaning between leases: the profile file and where baselines are kept.
    clean_profile: Path | None = None
    clean_baselines: Path | None = None
    # The app library's files kept on this host: where, and how many bytes at most.
    app_cache_dir: Path | None = None
    app_cache_size: int | None = field(default=None, metadata={"render": megabytes})
    # WebDriver sessions: the `appium` program, and the capabilities put over every client's
    # (JSON).
    appium: Path | None = None
    appium_caps: str | None = None

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = inherited(base)
        if self.token is not None:
            env["AMC_TOKEN"] = self.token
        return env
