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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

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
    """A duration as the control plane's float flags take it (millisecond precision)."""
    return format(value, ".3f").rstrip("0").rstrip(".")


def duration(value: float) -> str:
    """A duration as the host agent's flags take it: `0.5s`, `30s`."""
    return seconds(value) + "s"


class _Flags:
    """argv under construction: a flag is written only when it has a value."""

    def __init__(self, *head: str) -> None:
        self.argv = list(head)

    def value(self, flag: str, value: object | None) -> None:
        if value is not None:
            self.argv += [flag, str(value)]

    def switch(self, flag: str, on: bool) -> None:
        if on:
            self.argv.append(flag)


@dataclass(frozen=True)
class ControlPlaneCommand:
    """`control-plane serve`: one replica. Durations are seconds."""

    listen: str
    database_url: str | None = None  # None: the embedded server in `data_dir`
    data_dir: Path | None = None
    insecure: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    lease_ttl: float | None = None
    renew_interval: float | None = None
    sweep_interval: float | None = None
    grace: float | None = None
    metrics_listen: str | None = None
    log_format: LogFormat | None = None
    debug: bool = False

    def argv(self) -> list[str]:
        f = _Flags(str(CONTROL_PLANE), "serve")
        f.value("--listen", self.listen)
        f.value("--database-url", self.database_url)
        f.value("--data-dir", self.data_dir)
        f.switch("--insecure", self.insecure)
        f.value("--tls-cert", self.tls_cert)
        f.value("--tls-key", self.tls_key)
        for flag, value in (
            ("--lease-ttl", self.lease_ttl),
            ("--renew-interval", self.renew_interval),
            ("--sweep-interval", self.sweep_interval),
            ("--grace", self.grace),
        ):
            f.value(flag, None if value is None else seconds(value))
        f.value("--metrics-listen", self.metrics_listen)
        f.value("--log-format", self.log_format)
        f.switch("--debug", self.debug)
        return f.argv

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        return inherited(base)


@dataclass(frozen=True)
class CreateTokenCommand:
    """`control-plane tokens create`: a token straight into the database, printed once."""

    role: TokenRole
    database_url: str | None = None  # None: the embedded server in `data_dir`
    data_dir: Path | None = None
    host_id: str | None = None
    name: str | None = None

    def argv(self) -> list[str]:
        f = _Flags(str(CONTROL_PLANE), "tokens", "create")
        f.value("--role", self.role)
        f.value("--database-url", self.database_url)
        f.value("--data-dir", self.data_dir)
        f.value("--host-id", self.host_id)
        f.value("--name", self.name)
        return f.argv

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        return inherited(base)


@dataclass(frozen=True)
class HostAgentCommand:
    """`host-agent`. Durations are seconds. Without `simulated_devices` the agent drives the
    phones of the adb server at `adb` (its default: 127.0.0.1:5037)."""

    control_plane: str
    host_id: str
    # A host token: as text (passed in the environment) or in a file; neither with
    # `insecure` (a control plane without authentication).
    token: str | None = field(default=None, repr=False)
    token_file: Path | None = None
    insecure: bool = False
    ca: Path | None = None
    tls: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    adb: str | None = None
    adb_timeout: float | None = None
    simulated_devices: int | None = None
    sim_delay: float | None = None
    action_log: Path | None = None
    drain_timeout: float | None = None
    inventory_interval: float | None = None
    acquire_wait: float | None = None
    report_timeout: float | None = None
    shell_timeout: float | None = None
    metrics_listen: str | None = None
    log_format: LogFormat | None = None
    log_level: LogLevel | None = None
    debug: bool = False

    def argv(self) -> list[str]:
        f = _Flags(str(HOST_AGENT))
        f.value("--control-plane", self.control_plane)
        f.value("--host-id", self.host_id)
        f.value("--token-file", self.token_file)
        f.switch("--insecure", self.insecure)
        f.value("--ca", self.ca)
        f.switch("--tls", self.tls)
        for key, value in self.labels.items():
            f.value("--label", f"{key}={value}")
        f.value("--adb", self.adb)
        f.value("--simulated-devices", self.simulated_devices)
        f.value("--action-log", self.action_log)
        for flag, value in (
            ("--adb-timeout", self.adb_timeout),
            ("--sim-delay", self.sim_delay),
            ("--drain-timeout", self.drain_timeout),
            ("--inventory-interval", self.inventory_interval),
            ("--acquire-wait", self.acquire_wait),
            ("--report-timeout", self.report_timeout),
            ("--shell-timeout", self.shell_timeout),
        ):
            f.value(flag, None if value is None else duration(value))
        f.value("--metrics-listen", self.metrics_listen)
        f.value("--log-format", self.log_format)
        f.value("--log-level", self.log_level)
        f.switch("--debug", self.debug)
        return f.argv

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        env = inherited(base)
        if self.token is not None:
            env["AMC_TOKEN"] = self.token
        return env
