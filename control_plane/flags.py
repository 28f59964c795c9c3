"""The control plane's command line: `serve` and `tokens create`, their flags (each with an
`AMC_*` environment default) and the checks on what they set, before anything starts."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

from amc_common import durations
from amc_common.command_line import OneLineParser
from amc_common.version import version_line
from control_plane.config import AGENT_REPORT_TIMEOUT, TASK_RETENTION_FLOOR, Settings
from control_plane.domain import Role
from control_plane.retention import span_text

DESCRIPTION = """`control-plane`: run a replica, or create a token directly in the database.

control-plane [serve] [--listen 127.0.0.1:50051] [--database-url URL | --data-dir DIR]
control-plane tokens create --role operator [--host-id H] [--name N] [--init]

Every flag of `serve` can come from an environment variable instead (its help names it);
a flag given on the command line wins. A start that fails (database unreachable, port
taken, unreadable certificate) logs one line saying what is wrong, the cause and what to
do, then exits 1; --debug (or AMC_DEBUG=1) adds the traceback. The database URL is only
ever shown with its password masked. A time flag takes a DURATION: 15s, 1m30s, 1h,
250ms, 2d, or a number of seconds (1.5); the retention flags want a unit, or off.
"""

DEFAULT_DATA_DIR = ".amc/pgdata"


_SIZE_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024 * 1024}


def byte_size(text: str) -> int:
    """A size such as `10485760`, `512KiB` or `10MiB`; at least 1 byte."""
    number = text.strip().rstrip("BbIiKkMm")
    unit = text.strip()[len(number) :].lower()
    if unit not in _SIZE_UNITS or not number.isdigit() or int(number) < 1:
        raise argparse.ArgumentTypeError(f"not a size (e.g. 10MiB, 512KiB, 4096): {text!r}")
    return int(number) * _SIZE_UNITS[unit]


def log_format(text: str) -> str:
    if text not in ("auto", "console", "json"):
        raise ValueError(text)
    return text


log_format.__name__ = "log format (auto, console, json)"  # argparse names it in errors

# The time flags' types: one grammar for every program (amc_common.durations).
seconds = durations.above_zero
seconds_or_zero = durations.zero_or_more
retention = durations.span_or_off


def count(text: str) -> int:
    """A whole number, 1 or more."""
    if not text.strip().isdigit() or (value := int(text)) < 1:
        raise ValueError(text)
    return value


count.__name__ = "whole number (1 or more)"


def origins(text: str) -> tuple[str, ...]:
    """Origins, comma-separated: `https://amc.example.com`, `http://10.0.0.5:8080`
    (scheme and host, a port if not the scheme's own; no path); empty: none."""
    found = []
    for item in filter(None, (part.strip().rstrip("/").lower() for part in text.split(","))):
        scheme, sep, host = item.partition("://")
        if scheme not in ("http", "https") or not sep or not host or "/" in host:
            raise ValueError(text)
        found.append(item)
    return tuple(found)


origins.__name__ = "origins (such as https://amc.example.com, comma-separated)"


def count_or_zero(text: str) -> int:
    """A whole number, 0 or more."""
    if not text.strip().isdigit():
        raise ValueError(text)
    return int(text)


count_or_zero.__name__ = "whole number (0 or more)"


# flag, environment variable, default, value parser, help. A flag's value comes from the
# command line, else its variable, else the default (argparse parses string defaults too,
# so a malformed variable is reported like a malformed flag).
Flag = tuple[str, str, str | None, Callable[[str], Any], str]
# fmt: off
DATABASE_FLAGS: list[Flag] = [
    ("--database-url", "DATABASE_URL", None, str,
     "PostgreSQL URL (several hosts h1:p1,h2:p2: the writable one); none: an embedded server"),
    ("--data-dir", "AMC_DATA_DIR", DEFAULT_DATA_DIR, str, "the embedded server's data directory"),
    ("--log-format", "AMC_LOG_FORMAT", "auto", log_format, "auto, console (a terminal) or json"),
]
SERVE_FLAGS: list[Flag] = [
    ("--listen", "AMC_LISTEN", "127.0.0.1:50051", str, "address:port for gRPC"),
    ("--advertise", "AMC_ADVERTISE", None, str,
     "host:port where the other replicas reach this one, to relay a session whose host"
     " and client reached different replicas (none: --listen's, with this host's name for"
     " 0.0.0.0 or [::])"),
    ("--tls-cert", "AMC_TLS_CERT", None, str, "PEM certificate chain: serve TLS"),
    ("--tls-key", "AMC_TLS_KEY", None, str, "PEM private key of --tls-cert"),
    ("--lease-ttl", "AMC_LEASE_TTL", "15", seconds, "seconds a lease lives without renewal"),
    ("--renew-interval", "AMC_RENEW_INTERVAL", None, seconds,
     "seconds between renewals the hosts are told to use (none: a third of the TTL)"),
    ("--sweep-interval", "AMC_SWEEP_INTERVAL", "1", seconds, "seconds between lease-expiry sweeps"),
    ("--metrics-listen", "AMC_METRICS_LISTEN", "", str,
     "host:port for Prometheus metrics at /metrics (off if empty)"),
    ("--http-listen", "AMC_HTTP_LISTEN", "", str,
     "host:port for the operator console in the browser (off if empty)"),
    ("--grace", "AMC_GRACE", "5", seconds_or_zero, "seconds in-flight calls get on SIGTERM"),
    ("--stuck-exit", "AMC_STUCK_EXIT", "30", seconds_or_zero,
     "seconds the event loop may stand still before the replica exits, stacks logged (0: off)"),
    ("--task-retention", "AMC_TASK_RETENTION", "30d", retention,
     "how long a finished task (done, failed, cancelled) is kept after it ended, with its"
     " attempts, events and artifacts: 30d, 12h, 30m, 90s, or off (kept for ever); at least"
     " 2m, so a host's repeated report still finds its task"),
    ("--forget-hosts-after", "AMC_FORGET_HOSTS_AFTER", "7d", retention,
     "a host disconnected this long and holding no lease is forgotten, with its devices:"
     " 7d, 12h, 30m, 90s, or off (never); at least twice --lease-ttl, so a connected host"
     " is never forgotten"),
    ("--max-connection-age", "AMC_MAX_CONNECTION_AGE", "30m", retention,
     "how long a client's connection lasts before this replica asks it to open a new one"
     " (its open calls go on; host agents move their renewal stream): behind a load"
     " balancer, hosts spread over the replicas again after one restarted. 30m, 2h, 90s,"
     " or off"),
    ("--retention-interval", "AMC_RETENTION_INTERVAL", "60", seconds,
     "seconds between this replica's looks for old tasks and hosts to remove"),
    ("--max-artifact-size", "AMC_MAX_ARTIFACT_SIZE", "10MiB", byte_size,
     "the largest screenshot or UI dump an upload may keep (bytes, or with KiB / MiB)"),
    ("--max-viewers-per-token", "AMC_MAX_VIEWERS_PER_TOKEN", "32", count,
     "live screens one token may watch at once on one replica (gRPC and the console);"
     " past it a watch is refused RESOURCE_EXHAUSTED"),
    ("--max-thumbnails-per-token", "AMC_MAX_THUMBNAILS_PER_TOKEN", "1000", count,
     "phones' thumbnails (a frame every few seconds: the console's Farm page) one token may"
     " watch at once on one replica, apart from its live screens"),
    ("--console-origin", "AMC_CONSOLE_ORIGIN", "", origins,
     "the console's public origin(s) behind a proxy that rewrites Host, comma-separated"
     " (https://amc.example.com): its live screens' WebSockets accept pages of them; a"
     " proxy's X-Forwarded-Proto and X-Forwarded-Host are honoured without it"),
    ("--max-sessions-per-token", "AMC_MAX_SESSIONS_PER_TOKEN", "100", count_or_zero,
     "interactive sessions one token may have queued or running at once; past it an"
     " opening is refused RESOURCE_EXHAUSTED (0: no limit)"),
    ("--max-app-size", "AMC_MAX_APP_SIZE", "200MiB", byte_size,
     "the largest APK (or file to push) the app library keeps (bytes, or with KiB / MiB)"),
]
# flag, environment variable (set to 1 to switch on), help
DATABASE_SWITCHES = [("--debug", "AMC_DEBUG", "a failed start also logs its traceback")]
SERVE_SWITCHES = [
    ("--insecure", "AMC_INSECURE", "no authentication (development only; loopback listeners only)"),
]
# fmt: on


_TIMES = (seconds, seconds_or_zero, retention)


def _on(value: str | None) -> bool:
    return (value or "").lower() not in ("", "0", "false", "no", "off")


def add_flags(
    p: argparse.ArgumentParser,
    flags: list[Flag],
    switches: list[tuple[str, str, str]],
    env: Mapping[str, str],
) -> None:
    """Each flag with its variable's value as default, and the variable named in --help."""
    for flag, var, default, parse_value, text in flags:
        shown = f"; default {default}" if default else ""
        p.add_argument(
            flag,
            default=env.get(var, default),
            type=parse_value,
            metavar="DURATION" if parse_value in _TIMES else None,
            help=f"{text} [${var}{shown}]",
        )
    for flag, var, text in switches:
        p.add_argument(
            flag, action="store_true", default=_on(env.get(var)), help=f"{text} [${var}=1]"
        )


def parser(env: Mapping[str, str] = os.environ) -> argparse.ArgumentParser:
    database = OneLineParser(add_help=False)
    add_flags(database, DATABASE_FLAGS, DATABASE_SWITCHES, env)
    p = OneLineParser(
        prog="control-plane",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=version_line("control-plane"))
    sub = p.add_subparsers(dest="command")
    serve = sub.add_parser(
        "serve",
        parents=[database],
        help="run a replica (the default)",
        epilog=f"{durations.GRAMMAR} The retention flags want a unit, or off.",
    )
    add_flags(serve, SERVE_FLAGS, SERVE_SWITCHES, env)
    tokens = sub.add_parser("tokens", help="token bootstrap, straight into the database")
    tsub = tokens.add_subparsers(dest="tokens_command", required=True, metavar="create")
    create = tsub.add_parser("create", parents=[database], help="create a token, print it once")
    create.add_argument("--role", required=True, choices=[r.value for r in Role])
    create.add_argument("--host-id", default=None)
    create.add_argument("--name", default="")
    create.add_argument(
        "--init",
        action="store_true",
        help="create the embedded database at --data-dir if there is none there (without "
        "it, a missing database is refused: the token would be made where no control plane "
        "looks)",
    )
    return p


def settings_from(args: argparse.Namespace) -> Settings:
    renew = timedelta(seconds=args.renew_interval) if args.renew_interval else None
    return Settings(
        lease_ttl=timedelta(seconds=args.lease_ttl),
        renew_interval=renew,
        sweep_interval=timedelta(seconds=args.sweep_interval),
        task_retention=args.task_retention,
        forget_hosts_after=args.forget_hosts_after,
        retention_interval=timedelta(seconds=args.retention_interval),
        max_artifact_bytes=args.max_artifact_size,
        max_app_bytes=args.max_app_size,
        max_connection_age=args.max_connection_age,
        max_viewers_per_token=args.max_viewers_per_token,
        max_thumbnails_per_token=args.max_thumbnails_per_token,
        console_origins=args.console_origin,
        max_sessions_per_token=args.max_sessions_per_token,
    )


def settings_refusal(settings: Settings) -> str | None:
    """Why the settings would break the spec (config.py has the floors); None if they do
    not. Checked before anything starts."""
    if settings.renew_every >= settings.lease_ttl:
        return (
            f"--renew-interval {span_text(settings.renew_every)} is not below --lease-ttl "
            f"{span_text(settings.lease_ttl)}: every lease would expire between two of its "
            "renewals (leave it unset for a third of the TTL)"
        )
    kept = settings.task_retention
    if kept is not None and kept < TASK_RETENTION_FLOOR:
        return (
            f"--task-retention {span_text(kept)} is below its floor of "
            f"{span_text(TASK_RETENTION_FLOOR)} (or off): a host agent repeats a report whose "
            f"answer it lost for up to {AGENT_REPORT_TIMEOUT.total_seconds():g}s (its default "
            "--report-timeout), and the repeat must still find the finished task to get the "
            "recorded outcome, not a lease conflict"
        )
    unseen, floor = settings.forget_hosts_after, settings.forget_hosts_floor
    if unseen is not None and unseen < floor:
        return (
            f"--forget-hosts-after {span_text(unseen)} is below its floor of "
            f"{span_text(floor)} (or off): a connected host is last seen at its replica's "
            f"latest heartbeat (every {span_text(settings.renew_every)}) and counts as "
            f"connected for --lease-ttl {span_text(settings.lease_ttl)} after it; under "
            "twice that, hosts still connected could be forgotten"
        )
    return None
