"""`control-plane`: run a replica, or create a token directly in the database; its
command line is control_plane.flags."""

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
import signal
import sys
from pathlib import Path

import prometheus_client
import structlog

from amc_common import logs
from amc_common.secrets import mask_url, redact
from amc_common.systemd import Notifier
from control_plane import allocator
from control_plane.domain import Role
from control_plane.embedded import EmbeddedPostgres
from control_plane.flags import parser, settings_from, settings_refusal
from control_plane.heap import Heap
from control_plane.server import ControlPlane, Tls
from control_plane.store import database_error

log = structlog.get_logger("control_plane")


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
    notifier = Notifier()
    notifier.ready(
        f"serving on {args.listen}" + (f", console on {args.http_listen}" * bool(args.http_listen))
    )
    watchdog = asyncio.create_task(notifier.pings())
    stopping = asyncio.create_task(stop.wait())
    crashed = asyncio.create_task(plane.crashed.wait())
    await asyncio.wait([stopping, crashed], return_when=asyncio.FIRST_COMPLETED)
    log.info("stopping: finishing in-flight calls", grace=args.grace)
    notifier.stopping("stopping: finishing in-flight calls")
    unfreezing.cancel()
    watchdog.cancel()
    await plane.stop(args.grace)
    notifier.close()
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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("serve", "tokens", "-h", "--help", "--version"):
        argv = ["serve", *argv]
    args = parser().parse_args(argv)
    logs.configure(args.log_format)
    refused = _no_database_here(args)
    if args.command == "serve":
        refused = settings_refusal(settings_from(args))
    if refused:
        print(f"control-plane: {refused}", file=sys.stderr)
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
