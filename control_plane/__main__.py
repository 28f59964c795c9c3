"""`control-plane`: run a replica, or create a token directly in the database.

control-plane [serve] [--listen 127.0.0.1:50051] [--database-url URL | --data-dir DIR]
control-plane tokens create --role operator [--host-id H] [--name N]

A start that fails (database unreachable, port taken, unreadable certificate) logs one
line saying what is wrong, the cause and what to do, then exits 1; --debug (or
AMC_DEBUG=1) adds the traceback. The database URL is only ever shown with its password
masked.
"""

from __future__ import annotations

import os

# The embedded server is started and stopped with fork+exec while gRPC runs; gRPC's fork
# handlers only log noise for children that exec at once. Set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import argparse
import asyncio
import contextlib
import signal
import sys
from datetime import timedelta
from pathlib import Path

import asyncpg
import prometheus_client
import structlog

from amc_common import logs
from amc_common.secrets import mask_url, redact
from control_plane import errors
from control_plane.config import Settings
from control_plane.domain import Role
from control_plane.embedded import EmbeddedPostgres
from control_plane.server import ControlPlane, Tls

log = structlog.get_logger("control_plane")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def common_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "--database-url",
        default=_env("DATABASE_URL"),
        help="PostgreSQL URL (env DATABASE_URL); none: an embedded server",
    )
    p.add_argument(
        "--data-dir",
        default=_env("AMC_DATA_DIR", ".amc/pgdata"),
        help="the embedded server's data directory (default .amc/pgdata)",
    )
    p.add_argument(
        "--log-format", choices=["auto", "console", "json"], default=_env("AMC_LOG_FORMAT", "auto")
    )
    p.add_argument(
        "--debug",
        action="store_true",
        default=logs.debug_enabled(),
        help="a failed start shows its traceback (env AMC_DEBUG=1)",
    )
    return p


def parser() -> argparse.ArgumentParser:
    common = common_flags()
    p = argparse.ArgumentParser(
        prog="control-plane",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command")
    serve = sub.add_parser("serve", parents=[common], help="run a replica (the default)")
    add_serve_flags(serve)
    tokens = sub.add_parser("tokens", help="token bootstrap, straight into the database")
    tsub = tokens.add_subparsers(dest="tokens_command", required=True)
    create = tsub.add_parser("create", parents=[common], help="create a token, print it once")
    create.add_argument("--role", required=True, choices=[r.value for r in Role])
    create.add_argument("--host-id", default=None)
    create.add_argument("--name", default="")
    return p


def add_serve_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--listen",
        default=_env("AMC_LISTEN", "127.0.0.1:50051"),
        help="address:port for gRPC (env AMC_LISTEN)",
    )
    p.add_argument(
        "--insecure",
        action="store_true",
        default=_env("AMC_INSECURE", "") in ("1", "true"),
        help="no authentication (development only; loopback listeners only)",
    )
    p.add_argument("--tls-cert", default=_env("AMC_TLS_CERT"), help="PEM certificate chain")
    p.add_argument("--tls-key", default=_env("AMC_TLS_KEY"), help="PEM private key")
    p.add_argument(
        "--lease-ttl",
        type=float,
        default=float(_env("AMC_LEASE_TTL", "15") or 15),
        help="lease time-to-live in seconds (default 15)",
    )
    p.add_argument(
        "--renew-interval",
        type=float,
        default=None,
        help="seconds between renewals the hosts are told to use (default TTL/3)",
    )
    p.add_argument(
        "--sweep-interval",
        type=float,
        default=1.0,
        help="seconds between lease-expiry sweeps (default 1)",
    )
    p.add_argument(
        "--metrics-listen",
        default=_env("AMC_METRICS_LISTEN", ""),
        help="host:port for Prometheus metrics at /metrics (env AMC_METRICS_LISTEN; off if empty)",
    )
    p.add_argument(
        "--grace",
        type=float,
        default=5.0,
        help="seconds in-flight calls get on SIGTERM (default 5)",
    )


def settings_from(args: argparse.Namespace) -> Settings:
    renew = timedelta(seconds=args.renew_interval) if args.renew_interval else None
    return Settings(
        lease_ttl=timedelta(seconds=args.lease_ttl),
        renew_interval=renew,
        sweep_interval=timedelta(seconds=args.sweep_interval),
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
    plane = ControlPlane(
        dsn, settings_from(args), listen=args.listen, insecure=args.insecure, tls=tls_from(args)
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
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopping = asyncio.create_task(stop.wait())
    crashed = asyncio.create_task(plane.crashed.wait())
    await asyncio.wait([stopping, crashed], return_when=asyncio.FIRST_COMPLETED)
    log.info("stopping: finishing in-flight calls", grace=args.grace)
    await plane.stop(args.grace)
    if plane.crashed.is_set():
        raise SystemExit(1)


async def create_token(args: argparse.Namespace, dsn: str) -> None:
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
        + " (shown once)",
        file=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("serve", "tokens", "-h", "--help"):
        argv = ["serve", *argv]
    args = parser().parse_args(argv)
    logs.configure(args.log_format)
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
            asyncio.run(create_token(args, dsn))
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
        if isinstance(exc, errors.DatabaseUnavailable | asyncpg.PostgresError):
            return True
        exc = exc.__cause__
    return False


if __name__ == "__main__":
    sys.exit(main())
