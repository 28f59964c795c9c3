"""The processes of the farm under test: PostgreSQL, control-plane replicas, host agents.

Each wrapper can crash its process the hard way (SIGKILL, an immediate PostgreSQL
shutdown, SIGSTOP) and bring it back on the same address, and logs every process's
output to a file in the run's work directory (appended across restarts).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from amc_testing.database import EmbeddedPostgres, ReplicatedPostgres, free_port
from chaos_lib import phones
from scripts.launch import ControlPlaneCommand, HostAgentCommand

ROOT = Path(__file__).resolve().parents[2]
SERVING = health_pb2.HealthCheckResponse.SERVING


def _spawn(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _kill(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGKILL) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(sig)
        if sig == signal.SIGKILL:
            proc.wait(10)


def _terminate(proc: subprocess.Popen[bytes] | None, within: float) -> int | None:
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(within)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


@dataclass
class Postgres:
    """Durable embedded servers, a primary and a synchronous streaming standby, that can
    crash and come back on the same port, or fail over (the standby promoted, the old
    primary rewound to follow it). `url` names both and asks for the writable one, as the
    replicas' --database-url does."""

    datadir: Path
    pair: ReplicatedPostgres = field(init=False)
    url: str = ""
    up: bool = False
    failovers: int = 0

    def __post_init__(self) -> None:
        self.pair = ReplicatedPostgres(self.datadir)

    @property
    def server(self) -> EmbeddedPostgres:
        """The primary."""
        return self.pair.primary

    async def start(self) -> str:
        # The ports are kept from the first start (EmbeddedPostgres reuses a port set before).
        if self.pair.servers:
            await asyncio.to_thread(self.pair.primary.start)
        else:
            await asyncio.to_thread(self.pair.start)
        self.url = self.pair.url + "?target_session_attrs=read-write"
        self.up = True
        return self.url

    async def crash(self) -> None:
        """An immediate shutdown of the primary: no checkpoint, as a power cut would leave it."""
        self.up = False
        await asyncio.to_thread(self.pair.kill_primary)

    async def promote(self) -> None:
        """The standby takes over from the crashed primary."""
        await asyncio.to_thread(self.pair.promote)
        self.failovers += 1
        self.up = True

    async def rejoin(self) -> None:
        """The crashed former primary follows the new one (pg_rewind), synchronously."""
        await asyncio.to_thread(self.pair.rejoin)

    async def stop(self) -> None:
        self.up = False
        await asyncio.to_thread(self.pair.stop)

    def kill(self) -> None:
        for server in self.pair.servers:
            server.stop("immediate")


async def health(address: str, within: float = 1.0) -> bool:
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=within
            )
        except grpc.aio.AioRpcError:
            return False
    return reply.status == SERVING


@dataclass
class Replica:
    name: str
    dsn: str
    log: Path
    lease_ttl: float
    sweep_interval: float
    insecure: bool
    max_connection_age: float | None = None
    port: int = field(default_factory=free_port)
    http_port: int | None = None  # the console's (and WebDriver endpoint's) HTTP port
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def spawn(self) -> None:
        command = ControlPlaneCommand(
            listen=self.address,
            database_url=self.dsn,
            insecure=self.insecure,
            lease_ttl=self.lease_ttl,
            sweep_interval=self.sweep_interval,
            grace=1,
            log_format="json",
            max_connection_age=self.max_connection_age,
            http_listen=f"127.0.0.1:{self.http_port}" if self.http_port else None,
        )
        self.proc = _spawn(command.argv(), self.log, command.env())
        self.starts += 1

    async def start(self, within: float = 90.0) -> float:
        """Start (again, if it dies before serving: e.g. PostgreSQL is down); returns when
        it serves, with the seconds that took."""
        began = time.monotonic()
        deadline = began + within
        self.spawn()
        while time.monotonic() < deadline:
            if not self.alive:
                await asyncio.sleep(0.3)
                self.spawn()
                continue
            if await health(self.address):
                return time.monotonic() - began
            await asyncio.sleep(0.1)
        raise RuntimeError(f"replica {self.name} did not serve within {within:.0f}s")

    def kill(self) -> None:
        _kill(self.proc)

    def terminate(self) -> int | None:
        return _terminate(self.proc, 15)


class _Faultable:
    """What faults do to an agent process or a fleet process: kill, freeze, thaw, stop."""

    proc: subprocess.Popen[bytes] | None
    frozen: bool
    STOP_TIMEOUT = 20.0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        _kill(self.proc)
        self.frozen = False

    def freeze(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)
        self.frozen = True

    def thaw(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)
        self.frozen = False

    def terminate(self) -> int | None:
        self.frozen = False
        return _terminate(self.proc, self.STOP_TIMEOUT)


@dataclass
class AgentProc(_Faultable):
    host_id: str
    control_plane: str  # the address of this agent's proxy
    devices: int
    sim_delay: float
    action_log: Path
    log: Path
    token_file: Path
    proc: subprocess.Popen[bytes] | None = None
    frozen: bool = False
    starts: int = 0
    # Its phones' faults (chaos_lib/phones.py), read by the agent when the file changes.
    sim_faults: Path | None = None
    # How its phones are cleaned between leases (chaos_lib/cleaning.py: a short timeout).
    clean_profile: Path | None = None
    # An agent of emulator pools (chaos_lib/emulators.py): no simulated phones, but those
    # of the adb server at `adb`, its emulators started by flags `extra_args`, with the
    # environment `extra_env` (the emulator double on PATH, its AVDs, its faults).
    pool: str = "agents"
    adb: str | None = None
    extra_args: list[str] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    # WebDriver sessions (chaos_lib/webdriver.py): its `appium` and the caps over clients'.
    appium: Path | None = None
    appium_caps: str | None = None

    def spawn(self) -> None:
        simulated = self.adb is None
        command = HostAgentCommand(
            control_plane=self.control_plane,
            host_id=self.host_id,
            token_file=self.token_file,
            labels={"pool": self.pool},
            adb=self.adb,
            simulated_devices=self.devices if simulated else None,
            sim_delay=self.sim_delay if simulated else None,
            action_log=self.action_log if simulated else None,
            drain_timeout=5,
            acquire_wait=5,
            report_timeout=30,
            log_format="json",
            sim_faults=self.sim_faults,
            inventory_interval=phones.INVENTORY_INTERVAL,
            adb_timeout=phones.CALL_TIMEOUT,
            probe_interval=phones.PROBE_INTERVAL,
            probe_timeout=phones.PROBE_TIMEOUT,
            quarantine_failures=phones.QUARANTINE_FAILURES,
            quarantine_window=phones.QUARANTINE_WINDOW,
            recovery_backoff=phones.RECOVERY_BACKOFF,
            boot_timeout=phones.BOOT_TIMEOUT,
            clean_profile=self.clean_profile,
            appium=self.appium,
            appium_caps=self.appium_caps,
        )
        argv = [*command.argv(), *self.extra_args]
        self.proc = _spawn(argv, self.log, {**command.env(), **self.extra_env})
        self.frozen = False
        self.starts += 1


@dataclass
class FleetProc(_Faultable):
    """One fleet process (chaos_lib/fleet.py): many hosts, each the real Agent, in one
    process; killed or stopped, all of them go down together."""

    name: str
    config: Path  # the JSON the process reads: its hosts, their proxies and tokens
    log: Path
    acquire_log: Path
    hosts: list[str]
    proc: subprocess.Popen[bytes] | None = None
    frozen: bool = False
    starts: int = 0
    STOP_TIMEOUT = 30.0

    def spawn(self) -> None:
        command = [sys.executable, "-m", "chaos_lib.fleet", str(self.config)]
        self.proc = _spawn(command, self.log, {**os.environ, "PYTHONPATH": str(ROOT / "scripts")})
        self.frozen = False
        self.starts += 1
