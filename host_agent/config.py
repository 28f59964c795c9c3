"""The host agent's settings: what the agent needs (AgentSettings) and what its process
is built from (Config).

`host_agent.flags` reads them from the command line and `AMC_*` variables; tests and the
harnesses make them directly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from host_agent.clean_profile import Profiles
from host_agent.emulator_config import EmulatorSettings
from host_agent.health import Thresholds
from host_agent.recovery import RecoverySettings
from host_agent.scrcpy_link import ServerJar

DEFAULT_CONTROL_PLANE = "127.0.0.1:50051"
DEFAULT_ADB = "127.0.0.1:5037"


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
    # A phone's H.264 stream (host_agent.videocast): at most this many frames a second.
    screen_video_max_fps: int = 30
    # How long the ScreenFrames call stays open with no phone watched (no flag: tests
    # shorten it); host_agent.screencast.SCREEN_LINGER.
    screen_linger: float = 30.0
    # Each run's phone log (host_agent.logcat): at most this many bytes kept (compressed;
    # 0: none kept), and how long the LogLines call stays open with nothing followed.
    logcat_max_bytes: int = 4 << 20
    log_linger: float = 30.0
    # How phones are cleaned between leases (host_agent.clean_profile), and the file that
    # keeps their baselines across restarts (None: memory only; host_agent.baselines).
    clean_profile: Profiles = field(default_factory=Profiles)
    clean_baselines: Path | None = None
    # The app library's files (APKs, files to push) kept on this host (host_agent.app_cache):
    # where (None: app_cache_dir()'s default) and how many bytes at most.
    app_cache_dir: Path | None = None
    app_cache_size: int = 2 << 30
    # WebDriver sessions (host_agent.appium): the `appium` program (None: none here) and
    # the capabilities put over every client's.
    appium: str | None = None
    appium_caps: Mapping[str, Any] = field(default_factory=dict)


def app_cache_dir(settings: AgentSettings, env: Mapping[str, str] = os.environ) -> Path:
    """Where the app cache is: the setting; else the unit's cache directory under systemd
    ($CACHE_DIRECTORY/apps); else ~/.cache/amc-host-agent/apps ($XDG_CACHE_HOME's)."""
    if settings.app_cache_dir is not None:
        return settings.app_cache_dir
    if env.get("CACHE_DIRECTORY"):
        return Path(env["CACHE_DIRECTORY"].split(":")[0]) / "apps"
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "amc-host-agent" / "apps"


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
    # scrcpy's server for real phones' streams and input (host_agent.scrcpy_link), checked.
    scrcpy_server: ServerJar | None = None
    simulated_devices: int = 0
    sim_delay: float = 0.2
    action_log: Path | None = None
    # Simulated phones' faults, set from outside (host_agent.simulated_faults).
    sim_faults: Path | None = None
    # The emulators this host runs (--emulator, --emulator-pools; host_agent.emulator).
    emulators: EmulatorSettings | None = None
    log_format: str = "auto"
    log_level: str = "INFO"
    metrics_listen: str | None = None
    # A failure that ends the agent also logs its traceback (never local variables).
    debug: bool = False


class ConfigError(Exception):
    """A setting is malformed or missing."""
