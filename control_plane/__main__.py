"""`control-plane`: run a replica, or create a token directly in the database.

control-plane [serve] [--listen 127.0.0.1:50051] [--database-url URL | --data-dir DIR]
control-plane tokens create --role operator [--host-id H] [--name N] [--init]

Every flag of `serve` can come from an environment variable instead (its help names it);
a flag given on the command line wins. A start that fails (database unreachable, port
taken, unreadable certificate) logs one line saying what is wrong, the cause and what to
do, then exits 1; --debug (or AMC_DEBUG=1) adds the traceback. The database URL is only
ever shown with its password masked.
"""

from __future__ import annotations

import os

# Set before grpc is imported; the user's own settings win. No fork support: the embedded
# server's fork+exec needs none. No C-core lines on stderr: what matters we log, once.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
os.environ.setdefault("GRPC_TRACE", "")

import argparse
import asyncio
import contextlib
import re
import signal
import sys
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import prometheus_client
import structlog

from amc_common import logs
from amc_common.secrets import mask_url, redact
from amc_common.version import version_line
from control_plane import allocator
from control_plane.config import AGENT_REPORT_TIMEOUT, TASK_RETENTION_FLOOR, Settings
from control_plane.domain import Role
from control_plane.embedded import EmbeddedPostgres
from control_plane.heap import Heap
from control_plane.retention import span_text
from control_plane.server import ControlPlane, Tls
from control_plane.store import database_error

log = structlog.get_logger("control_plane")

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

_SPAN = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_SPAN_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def retention(text: str) -> timedelta | None:
    """`30d`, `12h`, `30m`, `90s`, or a sum such as `1d12h`; `off` or `0`: never (None).
    A bare number is refused: read as seconds, a `30` meant as days would delete a month
    of history at once."""
    text = text.strip().lower()
    if text in ("off", "0"):
        return None
    if not text or _SPAN.sub("", text):
        raise ValueError(text)
    total = sum(float(n) * _SPAN_SECONDS[unit] for n, unit in _SPAN.findall(text))
    return timedelta(seconds=total) if total else None


retention.__name__ = "duration (such as 30d, 12h, 30m, 90s, or off)"


def seconds_or_off(text: str) -> float:
    if not 0 <= (value := float(text)) < float("inf"):
        raise ValueError(text)
    return value


seconds_or_off.__name__ = "number of seconds (0: off)"


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
    ("--lease-ttl", "AMC_LEASE_TTL", "15", float, "seconds a lease lives without renewal"),
    ("--renew-interval", "AMC_RENEW_INTERVAL", None, float,
     "seconds between renewals the hosts are told to use (none: a third of the TTL)"),
    ("--sweep-interval", "AMC_SWEEP_INTERVAL", "1", float, "seconds between lease-expiry sweeps"),
    ("--metrics-listen", "AMC_METRICS_LISTEN", "", str,
     "host:port for Prometheus metrics at /metrics (off if empty)"),
    ("--http-listen", "AMC_HTTP_LISTEN", "", str,
     "host:port for the operator console in the browser (off if empty)"),
    ("--grace", "AMC_GRACE", "5", float, "seconds in-flight calls get on SIGTERM"),
    ("--stuck-exit", "AMC_STUCK_EXIT", "30", seconds_or_off,
     "seconds the event loop may stand still before the replica exits, stacks logged (0: off)"),
    ("--task-retention", "AMC_TASK_RETENTION", "30d", retention,
     "how long a finished task (done, failed, cancelled) is kept after it ended, with its"
     " attempts, events and artifacts: 30d, 12h, 30m, 90s, or off (kept for ever); at least"
     " 2m, so a host's repeated report still finds its task"),
    ("--forget-hosts-after", "AMC_FORGET_HOSTS_AFTER", "7d", retention,
     "a host disconnected this long and holding no lease is forgotten, with its devices:"
     " 7d, 12h, 30m, 90s, or off (never); at least twice --lease-ttl, so a connected host"
     " is never forgotten"),
    ("--retention-interval", "AMC_RETENTION_INTERVAL", "60", float,
     "seconds between this replica's looks for old tasks and hosts to remove"),
    ("--max-artifact-size", "AMC_MAX_ARTIFACT_SIZE", "10MiB", byte_size,
     "the largest screenshot or UI dump an upload may keep (bytes, or with KiB / MiB)"),
]
# flag, environment variable (set to 1 to switch on), help
DATABASE_SWITCHES = [("--debug", "AMC_DEBUG", "a failed start also logs its traceback")]
SERVE_SWITCHES = [
    ("--insecure", "AMC_INSECURE", "no authentication (development only; loopback listeners only)"),
]
# fmt: on


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
            flag, default=env.get(var, default), type=parse_value, help=f"{text} [${var}{shown}]"
        )
    for flag, var, text in switches:
        p.add_argument(
            flag, action="store_true", default=_on(env.get(var)), help=f"{text} [${var}=1]"
        )


def parser(env: Mapping[str, str] = os.environ) -> argparse.ArgumentParser:
    database = argparse.ArgumentParser(add_help=False)
    add_flags(database, DATABASE_FLAGS, DATABASE_SWITCHES, env)
    p = argparse.ArgumentParser(
        prog="control-plane",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=version_line("control-plane"))
    sub = p.add_subparsers(dest="command")
    serve = sub.add_parser("serve", parents=[database], help="run a replica (the default)")
    add_flags(serve, SERVE_FLAGS, SERVE_SWITCHES, env)
    tokens = sub.add_parser("tokens", help="token bootstrap, straight into the database")
    tsub = tokens.add_subparsers(dest="tokens_command", required=True)
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
    )


def tls_from(args: argparse.Namespace) -> Tls | None:
    if not args.tls_cert and not args.tls_key:
        return None
    if not (args.tls_cert and args.tls_key):
        raise SystemExit("control-plane: --tls-cert and --tls-key go together")
    return Tls(Path(args.tls_cert).read_bytes(), Path(args.tls_key).read_bytes())


class StartFailed(Exception):
    """The replica could not start; `__cause__` says why. Logged in one line by main()."""


async def serve(args: argparse.Namespace, dsn: str) -> None:
    allocator.tune()  # before gRPC's threads start: an arena is a thread's from its first use
    plane = ControlPlane(
        dsn,
        settings_from(args),
        listen=args.listen,
        insecure=args.insecure,
        tls=tls_from(args),
        http_listen=args.http_listen or None,
        advertise=args.advertise or None,
    )
    try:
        await plane.start()
        if args.metrics_listen:
            host, _, port = args.metrics_listen.rpartition(":")
            prometheus_client.start_http_server(int(port), addr=host or "127.0.0.1")
            log.info("metrics serving", listen=args.metrics_listen)
    except Exception as exc:
        if not _is_database_problem(exc):  # else nothing was opened: migrate() failed
            with contextlib.suppress(Exception):
                await plane.stop(0)
        raise StartFailed() from exc
    heap = Heap(stuck_exit=args.stuck_exit or None)
    heap.install()
    unfreezing = asyncio.create_task(heap.run())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.create_task(stop.wait())
    crashed = asyncio.create_task(plane.crashed.wait())
    await asyncio.wait([stopping, crashed], return_when=asyncio.FIRST_COMPLETED)
    log.info("stopping: finishing in-flight calls", grace=args.grace)
    unfreezing.cancel()
    await plane.stop(args.grace)
    if plane.crashed.is_set():
        raise SystemExit(1)


async def create_token(args: argparse.Namespace, dsn: str, database: str) -> None:
    from control_plane.admin_service import create_token as create
    from control_plane.store import Store, migrate

    await migrate(dsn)
    store = await Store.open(dsn, min_size=1, max_size=1)
    try:
        info, token = await create(store, Role(args.role), args.host_id, args.name)
    finally:
        await store.close()
    print(token)
    print(
        f"token id {info.token_id}, role {info.role}"
        + (f", host {info.host_id}" if info.host_id else "")
        + f", in {database} (shown once)",
        file=sys.stderr,
    )


def _no_database_here(args: argparse.Namespace) -> str | None:
    """Why `tokens create` must not go on: it would make a new embedded database, and a
    token in it that no running control plane knows. None when it may go on."""
    if args.command != "tokens" or args.database_url or args.init:
        return None
    datadir = Path(args.data_dir).resolve()
    if (datadir / "PG_VERSION").exists():  # PostgreSQL's mark of a data directory
        return None
    return (
        f"tokens create: no database at {datadir} (--data-dir): give the --data-dir or "
        "--database-url (DATABASE_URL) of the control plane the token is for, or --init "
        "to create a new database there"
    )


def below_floor(settings: Settings) -> str | None:
    """Why a retention setting would break the spec (config.py has the floors); None if
    neither does. Checked before anything starts."""
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("serve", "tokens", "-h", "--help", "--version"):
        argv = ["serve", *argv]
    args = parser().parse_args(argv)
    logs.configure(args.log_format)
    refusal = _no_database_here(args)
    if args.command == "serve":
        refusal = below_floor(settings_from(args))
    if refusal:
        print(f"control-plane: {refusal}", file=sys.stderr)
        return 2
    embedded = None
    dsn = args.database_url
    try:
        if not dsn:
            embedded = EmbeddedPostgres(Path(args.data_dir))
            dsn = embedded.start()
            log.info(
                "embedded PostgreSQL started", data_dir=str(embedded.datadir), url=mask_url(dsn)
            )
        if args.command == "tokens":
            database = (
                f"the database at {mask_url(args.database_url)}"
                if args.database_url
                else f"the embedded database at {Path(args.data_dir).resolve()}"
            )
            asyncio.run(create_token(args, dsn, database))
        else:
            asyncio.run(serve(args, dsn))
    except ValueError as exc:
        print(f"control-plane: {redact(str(exc))}", file=sys.stderr)
        return 2
    except Exception as exc:
        _cannot_start(exc, args, dsn)
        return 1
    finally:
        if embedded is not None and embedded.started_here:
            embedded.stop()
    return 0


def _cannot_start(exc: Exception, args: argparse.Namespace, dsn: str | None) -> None:
    """One line: what failed, the underlying error, what to do (a traceback with --debug)."""
    cause = exc.__cause__ if isinstance(exc, StartFailed) and exc.__cause__ else exc
    event = "tokens create failed" if args.command == "tokens" else "cannot start"
    debug = bool(args.debug)
    if _is_database_problem(cause):
        where = "--database-url (or DATABASE_URL)" if args.database_url else "--data-dir"
        logs.failure(
            log,
            f"{event}: the database is unreachable or refused the connection",
            cause,
            debug=debug,
            error=logs.describe(logs.root_cause(cause)),
            database=mask_url(dsn or ""),
            hint=f"check {where} and that PostgreSQL is running and reachable there",
        )
    elif isinstance(cause, RuntimeError) and "bind" in str(cause).lower():
        hint = f"is another process listening on {args.listen}? choose another --listen"
        logs.failure(log, event, cause, debug=debug, hint=hint)
    else:
        logs.failure(log, event, cause, debug=debug, hint="check the flags and settings")


def _is_database_problem(exc: BaseException | None) -> bool:
    while exc is not None:
        if database_error(exc):
            return True
        exc = exc.__cause__
    return False


if __name__ == "__main__":
    sys.exit(main())
