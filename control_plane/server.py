"""One control-plane replica: the gRPC server and the background work beside it (the
LISTEN connection, the lease-expiry sweep, retention, the health check of the database)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog
from google.protobuf import descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from amc.v1 import admin_pb2_grpc, lease_pb2_grpc, library_pb2_grpc, scheduler_pb2_grpc
from amc_common.build import record_build
from control_plane import adb_wire, allocator, auth, errors, metrics, session_wire
from control_plane.admin_service import AdminService
from control_plane.artifacts import PostgresArtifacts
from control_plane.config import Settings
from control_plane.console.http import Console
from control_plane.effects import Effects
from control_plane.gauges import FarmGauges
from control_plane.hub import Hub
from control_plane.lease_service import LeaseService
from control_plane.library import PostgresLibrary
from control_plane.library_service import LibraryService
from control_plane.listener import Listener
from control_plane.peers import Peers
from control_plane.pool_hints import keep_pools_told
from control_plane.progress import keep_progress_written, write_once
from control_plane.queue_stats import keep_queue_counted
from control_plane.retention import keep_retention, span_text
from control_plane.rpc import DecodeGuard
from control_plane.rpc_metrics import RpcMetrics, label
from control_plane.scheduler_service import SchedulerService
from control_plane.store import Store, migrate
from control_plane.sweep import sweep_expired

log = structlog.get_logger(__name__)

SERVICERS = (SchedulerService, LeaseService, AdminService, LibraryService)
SERVICES = {s.SERVICE: s.DESCRIPTOR for s in SERVICERS}
MAX_MESSAGE = 1 << 20
# How long a stop waits beyond its grace for calls and background loops to end.
STOP_SLACK = 5.0
# The farm-wide gauges are refreshed on the first database check, then every this many.
GAUGE_TICKS = 5
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
    ("grpc.so_reuseport", 0),
    # A farm's hosts reconnect together (a replica restarts, the network blinks): calls
    # queued before the server takes them must not be cancelled at the default 1,000.
    ("grpc.server.max_pending_requests", 100_000),
    ("grpc.server.max_pending_requests_hard_limit", 200_000),
]


def server_options(settings: Settings) -> list[tuple[str, Any]]:
    """SERVER_OPTIONS, with the connections' maximum age when there is one (no grace set:
    calls open on an aged connection run to their end)."""
    age = settings.max_connection_age
    if age is None:
        return SERVER_OPTIONS
    return [*SERVER_OPTIONS, ("grpc.max_connection_age_ms", int(age.total_seconds() * 1000))]


@dataclass(frozen=True)
class Tls:
    cert_chain: bytes
    private_key: bytes


class _ReflectionPool:
    """The default descriptor pool, plus method names (`amc.v1.Scheduler.SubmitTask`), which
    the upb-backed pool cannot resolve to their file, so that `grpcurl describe` works on a
    method as well as on a service or message."""

    def __init__(self) -> None:
        self._pool = descriptor_pool.Default()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)

    def FindFileContainingSymbol(self, symbol: str) -> Any:
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            return self._pool.FindMethodByName(symbol).containing_service.file


def rpc_methods() -> list[str]:
    return [f"/{name}/{m.name}" for name, svc in SERVICES.items() for m in svc.methods]


# Besides our own: what the per-RPC metrics name rather than count as `other`.
STANDARD_METHODS = [
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
]


def advertised(listen: str, port: int) -> str:
    """Where the other replicas reach a replica listening on `listen` (bound to `port`):
    its address, or this host's name for a wildcard one."""
    host = listen.rsplit(":", 1)[0]
    if host.strip("[]") in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"


def is_loopback(listen: str) -> bool:
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ControlPlane:
    def __init__(
        self,
        dsn: str,
        settings: Settings | None = None,
        *,
        listen: str = "127.0.0.1:50051",
        insecure: bool = False,
        tls: Tls | None = None,
        http_listen: str | None = None,
        advertise: str | None = None,
    ) -> None:
        missing = set(rpc_methods()) - set(auth.POLICY)
        if missing:
            raise RuntimeError(f"no auth policy for {sorted(missing)}")
        for address in (listen, http_listen):
            if insecure and address and not is_loopback(address):
                raise ValueError(
                    "--insecure turns authentication off and is allowed only when "
                    f"listening on loopback, not on {address}"
                )
        self.dsn = dsn
        self.settings = settings or Settings()
        self.listen = listen
        self.insecure = insecure
        self.tls = tls
        self.http_listen = http_listen
        self.advertise = advertise
        # Where the other replicas reach this one (a session's relay); set once listening.
        self.address = ""
        # Channels to the other replicas, for the sessions relayed to them.
        self.peers = Peers(tls.cert_chain if tls else None)
        self.console: Console | None = None
        self.http_port = 0
        self.hub = Hub()
        self.effects = Effects(self.hub)
        self.health = health.aio.HealthServicer()
        self.port = 0
        self._store: Store | None = None
        self._server: grpc.aio.Server | None = None
        self._background: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        # Set when a background loop died of a bug: the replica must not limp on without it.
        self.crashed = asyncio.Event()

    @property
    def store(self) -> Store:
        assert self._store is not None, "not started"
        return self._store

    async def start(self) -> int:
        applied = await migrate(self.dsn)
        self._store = await Store.open(self.dsn)
        self.gauges = FarmGauges(self.store, self.settings)
        authenticator = self.auth = auth.Authenticator(self.store, enabled=not self.insecure)
        await authenticator.know_replicas()
        methods = [*rpc_methods(), *STANDARD_METHODS]
        metrics.create_rpc_series([label(m) for m in methods])
        record_build("control-plane")
        codecs = {**session_wire.CODECS, **adb_wire.CODECS}
        interceptors = [RpcMetrics(methods), DecodeGuard(codecs)]
        server = grpc.aio.server(options=server_options(self.settings), interceptors=interceptors)
        # What every servicer works with; where the tasks' kept files and the app library's
        # bytes are kept is chosen here.
        parts = (
            authenticator,
            self.store,
            self.effects,
            self.settings,
            self.peers,
            PostgresArtifacts(self.store),
            PostgresLibrary(self.store),
        )
        scheduler = SchedulerService(*parts)
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)
        lease_pb2_grpc.add_LeaseServicer_to_server(LeaseService(*parts), server)
        self.library = LibraryService(*parts)
        library_pb2_grpc.add_LibraryServicer_to_server(self.library, server)
        admin = AdminService(*parts)
        admin_pb2_grpc.add_AdminServicer_to_server(admin, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            [
                *SERVICES,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ],
            server,
            pool=_ReflectionPool(),
        )
        if self.tls:
            creds = grpc.ssl_server_credentials([(self.tls.private_key, self.tls.cert_chain)])
            self.port = server.add_secure_port(self.listen, creds)
        else:
            self.port = server.add_insecure_port(self.listen)
        self.address = self.advertise or advertised(self.listen, self.port)
        # Said before the first call is taken: a session opened here may be joined elsewhere.
        await self.store.replicas.replica_alive(self.hub.replica, self.address)
        await server.start()
        self._server = server
        if self.http_listen:
            self.console = Console(scheduler, authenticator, self.hub, admin, self.library)
            self.http_port = await self.console.start(self.http_listen, self._console_tls())
        await self._set_health(True)
        metrics.STREAMS.set_function(self.hub.streams)
        metrics.ACQUIRES_WAITING.set_function(lambda: len(self.hub.dispatcher))
        self._background = [
            asyncio.create_task(coro, name=getattr(coro, "__name__", None))
            for coro in (
                Listener(self.store, self.dsn, self.hub, authenticator).run(),
                sweep_expired(
                    self.store,
                    self.effects,
                    self.settings.sweep_interval,
                    self.settings.lease_ttl,
                ),
                keep_retention(self.store, self.settings),
                keep_queue_counted(self.store, self.settings),
                keep_pools_told(self.store, self.hub.pools),
                keep_progress_written(self.store, self.hub, self.settings),
                self._watch_database(),
                self.hub.send_outbox(self.store.notifications.notify),
                self.hub.presence.write(
                    self.store.replicas.set_presence,
                    lambda: self.store.replicas.replica_alive(self.hub.replica, self.address),
                    self.settings.renew_every,
                ),
            )
        ]
        for task in self._background:
            task.add_done_callback(self._background_done)
        log.info(
            "control plane serving",
            listen=self.listen,
            port=self.port,
            auth="off (--insecure)" if self.insecure else "bearer tokens",
            console=f"http{'s' * bool(self.tls)}://{self.http_listen}/" if self.console else None,
            tls=bool(self.tls),
            migrations_applied=applied,
            malloc=allocator.applied or None,
            lease_ttl=self.settings.lease_ttl.total_seconds(),
            task_retention=span_text(self.settings.task_retention),
            forget_hosts_after=span_text(self.settings.forget_hosts_after),
            max_connection_age=span_text(self.settings.max_connection_age),
        )
        return self.port

    async def stop(self, grace: float = 5.0) -> None:
        """Stop accepting calls, let in-flight ones finish for `grace` seconds, then close."""
        if self._server is not None:
            await self._set_health(False)
            stopping = asyncio.create_task(self._server.stop(grace))
            await asyncio.sleep(0)  # new calls are refused from here on
            self.hub.close()
            # A stop must not hang: calls that outlive their cancellation are left behind.
            done, _ = await asyncio.wait([stopping], timeout=grace + STOP_SLACK)
            if not done:
                log.warning("in-flight calls did not end; stopping without them")
        if self.console is not None:
            await self.console.stop()
        await self.peers.close()
        for task in self._background:
            task.cancel()
        if self._background:
            _, stuck = await asyncio.wait(self._background, timeout=STOP_SLACK)
            for task in stuck:
                log.warning("background loop did not stop", loop=task.get_name())
        if self._store is not None:
            # The step progress sent since the last write, written before the pool closes.
            with contextlib.suppress(errors.AmcError, TimeoutError):
                await asyncio.wait_for(write_once(self._store, self.hub), 2.0)
            with contextlib.suppress(errors.AmcError, TimeoutError):
                await asyncio.wait_for(self._store.replicas.replica_gone(self.hub.replica), 2.0)
            await self._store.close()
        self._stopped.set()
        log.info("control plane stopped")

    def _console_tls(self) -> ssl.SSLContext | None:
        """The gRPC port's certificate serves the console too (ssl wants files)."""
        if self.tls is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        with tempfile.TemporaryDirectory() as tmp:
            cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            cert.write_bytes(self.tls.cert_chain)
            key.touch(0o600)
            key.write_bytes(self.tls.private_key)
            context.load_cert_chain(cert, key)
        return context

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- background ------------------------------------------------------------------------

    def _background_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error(
                "background loop died",
                loop=task.get_coro().__name__,  # type: ignore[union-attr]
                exc_info=exc,
            )
            self.crashed.set()

    async def _set_health(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", *SERVICES):
            await self.health.set(name, status)

    async def _watch_database(self) -> None:
        serving = True
        metrics.DATABASE_UP.set(1)
        ticks = 0
        while True:
            await asyncio.sleep(1.0)
            ticks += 1
            try:
                await asyncio.wait_for(self.store.ping(), 2.0)
                if ticks % GAUGE_TICKS == 1:
                    await self.gauges.refresh()
                ok = True
            except (errors.DatabaseUnavailable, TimeoutError):
                ok = False
            metrics.DATABASE_UP.set(1 if ok else 0)
            if ok != serving:
                serving = ok
                await self._set_health(ok)
                log.warning("database " + ("reachable again" if ok else "unreachable"))
                if ok:  # the calls that failed meanwhile may have left work unseen
                    self.hub.wake_all()
