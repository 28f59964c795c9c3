"""Control-plane replicas as real processes, for tests about restarts and replicas."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from control_plane.config import Settings
from control_plane.embedded import free_port
from scripts.launch import ControlPlaneCommand
from tests.support import Farm, eventually

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Replica:
    dsn: str
    port: int = field(default_factory=free_port)
    sweep_interval: float | None = None
    metrics_listen: str | None = None
    log: Path | None = None
    # Retention (seconds; 0: off); None: the binary's defaults.
    task_retention: float | None = None
    forget_hosts_after: float | None = None
    retention_interval: float | None = None
    # Seconds; None: the binary's default.
    max_connection_age: float | None = None
    # The console's (and WebDriver endpoint's) port; None: no HTTP.
    http_port: int | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Replica:
        self.spawn()
        await eventually(self.serving, timeout=30, interval=0.1, what=f"replica {self.address}")
        return self

    def spawn(self) -> None:
        command = ControlPlaneCommand(
            listen=self.address,
            database_url=self.dsn,
            sweep_interval=self.sweep_interval,
            metrics_listen=self.metrics_listen,
            log_format="json",
            task_retention=self.task_retention,
            forget_hosts_after=self.forget_hosts_after,
            retention_interval=self.retention_interval,
            max_connection_age=self.max_connection_age,
            http_listen=f"127.0.0.1:{self.http_port}" if self.http_port else None,
        )
        argv, env = command.argv(), command.env()
        if self.log:
            with open(self.log, "ab") as out:  # the child keeps its own copy of the fd
                self.proc = subprocess.Popen(
                    argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
                )
        else:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )

    async def serving(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"replica exited with {self.proc.returncode}")
        async with grpc.aio.insecure_channel(self.address) as ch:
            try:
                reply = await health_pb2_grpc.HealthStub(ch).Check(
                    health_pb2.HealthCheckRequest(), timeout=1
                )
            except grpc.aio.AioRpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def kill(self) -> None:
        """As a crash: no clean-up at all."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self, timeout: float = 30) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@asynccontextmanager
async def farm_with_replicas(
    dsn: str, logs: Path, settings: Settings | None = None, count: int = 2, **fields: Any
) -> AsyncIterator[tuple[Farm, list[Replica]]]:
    """An in-process replica (`settings`) for tokens and database reads, and `count`
    replica processes on the same database (`fields` as Replica's), each logging to
    `logs`/replica<i>.log; all started together, all stopped on exit."""
    farm = Farm(dsn, settings or Settings())
    await farm.start()
    replicas = [Replica(dsn, log=logs / f"replica{i}.log", **fields) for i in range(count)]
    try:
        await asyncio.gather(*(r.start() for r in replicas))
        yield farm, replicas
    finally:
        for r in replicas:
            r.stop()
        await farm.stop()
