"""The host agent's command line: its flags, each with an `AMC_*` environment default,
read into a `host_agent.config.Config`.

Every flag can come from the environment instead (the systemd unit's EnvironmentFile);
a flag given on the command line wins. A DURATION is written as for every program
(amc_common.durations): `15s`, `1m30s`, `1h`, `250ms`, or a number of seconds (`30`).
Anything malformed ends the process with one line on stderr and exit code 2. `--help`
lists the flags in sections, by what they are about.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from amc_common import durations
from amc_common.channel import read_token
from amc_common.command_line import OneLineParser
from amc_common.version import version_line
from host_agent import baselines, clean_profile, emulator_config
from host_agent.config import AgentSettings, Config, ConfigError
from host_agent.emulator_config import EmulatorSettings
from host_agent.flag_table import GROUPS, METAVARS
from host_agent.flag_values import label, labels_list
from host_agent.health import Thresholds
from host_agent.log_store import MIN_BYTES
from host_agent.recovery import RecoverySettings

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_Settings = TypeVar("_Settings", bound="DataclassInstance")


# -- the command line ----------------------------------------------------------------------


def _parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="host-agent",
        description="Runs AMC tasks on this host's phones.",
        epilog=durations.GRAMMAR,
    )
    p.add_argument("--version", action="version", version=version_line("host-agent"))
    sections = {title: p.add_argument_group(title) for title, _ in GROUPS}
    for title, options in GROUPS:
        for flag, var, default, parse_value, help_text in options:
            sections[title].add_argument(
                flag,
                default=env.get(var, default),
                type=parse_value,
                metavar=METAVARS.get(parse_value),
                # argparse formats help with %: a literal one is written twice.
                help=f"{help_text} [${var}]".replace("%", "%%"),
            )
    control_plane = sections["the control plane"]
    control_plane.add_argument(
        "--tls",
        action="store_true",
        default=env.get("AMC_TLS", "") in ("1", "true"),
        help="TLS with the system's CA roots [$AMC_TLS=1]",
    )
    control_plane.add_argument(
        "--insecure",
        action="store_true",
        default=env.get("AMC_INSECURE", "") in ("1", "true"),
        help="no token: only for a control plane run with --insecure [$AMC_INSECURE=1]",
    )
    control_plane.add_argument(
        "--label",
        action="append",
        type=label,
        default=[],
        metavar="KEY=VALUE",
        help="a host label, repeatable [$AMC_LABELS, comma-separated]",
    )
    sections["emulators the host runs (a pool per AVD)"].add_argument(
        "--emulator",
        action="append",
        default=[],
        metavar="AVD[@SNAPSHOT]:MIN:MAX",
        help="an emulator pool, repeatable [$AMC_EMULATORS, comma-separated]",
    )
    sections["logs and metrics"].add_argument(
        "--debug",
        action="store_true",
        default=env.get("AMC_DEBUG", "").lower() not in ("", "0", "false", "no"),
        help="a failure that ends the agent shows its traceback [$AMC_DEBUG=1]",
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
        clean_profile=_profiles(args.clean_profile),
        clean_baselines=_baselines(args.clean_baselines),
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
        emulators=_emulators(args, env, adb_host, adb_port),
    )


def _emulators(
    args: argparse.Namespace, env: Mapping[str, str], adb_host: str, adb_port: int
) -> EmulatorSettings | None:
    """The emulator pools, read against their AVDs and the host's size now."""
    flags = [*filter(None, env.get("AMC_EMULATORS", "").split(",")), *args.emulator]
    try:
        return emulator_config.settings(
            flags,
            Path(args.emulator_pools) if args.emulator_pools else None,
            Path(args.emulator_binary) if args.emulator_binary else None,
            env,
            (adb_host, adb_port),
            budget=args.emulator_budget,
            idle=args.emulator_idle,
            ports=args.emulator_ports,
            boot_timeout=args.emulator_boot_timeout,
            load_timeout=args.emulator_load_timeout,
        )
    except emulator_config.PoolError as exc:
        raise ConfigError(str(exc)) from None


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
    for flag, most in (("screen_max_fps", 30), ("screen_video_max_fps", 60)):
        if not 1 <= getattr(args, flag) <= most:
            raise ConfigError(f"--{flag.replace('_', '-')} must be 1 to {most}")
    if args.screen_max_rate <= 0:
        raise ConfigError("--screen-max-rate must be positive")
    if 0 < args.logcat_max_bytes < MIN_BYTES:
        raise ConfigError(f"--logcat-max-bytes must be 0 (none kept) or {MIN_BYTES} or more")
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


def _profiles(path: str | None) -> clean_profile.Profiles:
    """The cleaning profile file, read and checked now (the defaults without one)."""
    if not path:
        return clean_profile.Profiles()
    try:
        return clean_profile.load(Path(path))
    except clean_profile.ProfileError as exc:
        raise ConfigError(f"--clean-profile: {exc}") from None


def _baselines(path: str | None) -> Path | None:
    """The baselines file, if given: one that exists is read now, to refuse a bad one."""
    if not path:
        return None
    try:
        baselines.Baselines(Path(path))
    except baselines.BaselineError as exc:
        raise ConfigError(f"--clean-baselines: {exc}") from None
    return Path(path)


def _existing(path: str | None, flag: str) -> Path | None:
    if not path:
        return None
    if not Path(path).is_file():
        raise ConfigError(f"{flag}: no such file: {path}")
    return Path(path)
