"""The system under test as separate processes: an embedded PostgreSQL (durable, default
settings), one control-plane process and host agents with simulated devices. Also what the
benchmark reads about them from outside: CPU seconds and resident memory (psutil)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg
import grpc
import psutil
from grpc_health.v1 import health_pb2, health_pb2_grpc

from amc_testing.database import EmbeddedPostgres, free_port
from scripts.launch import ControlPlaneCommand, HostAgentCommand, LogFormat

# Any non-empty token: the control plane runs with --insecure (auth off, loopback only), but
# the host agent refuses to start without one.
AGENT_TOKEN = "insecure-benchmark"


def workdir(keep: Path | None = None) -> Path:
    """A directory for the server's data and the processes' logs. Under /tmp and 0755:
    as root, PostgreSQL runs as its own user, which must be able to reach its data."""
    path = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="amc-bench-"))
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o755)
    return path


@dataclass
class Child:
    """A process we started, with its output in a log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{tail}")

    def stop(self, timeout: float = 20.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)


def save(path: Path, data: bytes) -> None:
    """A child's captured output, kept beside the other logs."""
    path.write_bytes(data)


def spawn(name: str, argv: list[str], log: Path, env: dict[str, str]) -> Child:
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        popen = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal reaches the benchmark only
        )
    return Child(name, popen, log)


# -- CPU and memory ------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (not its children)."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return t.user + t.system


def rss_bytes(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return 0


def tree_cpu_seconds(pid: int) -> float:
    """A process, its live children and the children it has reaped (PostgreSQL's backends
    come and go; the postmaster reaps them, so their time lands in its children_* fields)."""
    try:
        root = psutil.Process(pid)
        t = root.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                c = child.cpu_times()
                total += c.user + c.system
    except psutil.Error:
        return 0.0
    return total


def cpu_now(st: Stack, agents: tuple[str, ...] = ()) -> dict[str, float]:
    """CPU seconds so far of the control plane, PostgreSQL (its whole tree) and the named
    agents (together): read before and after a window, per_unit() says what a unit of work
    in it cost each."""
    pm = st.postmaster_pid()
    out = {
        "control_plane": cpu_seconds(st.control_plane.pid) if st.control_plane else 0.0,
        "postgres": tree_cpu_seconds(pm) if pm else 0.0,
    }
    if agents:
        out["agent"] = sum(cpu_seconds(st.agents[h].pid) for h in agents if h in st.agents)
    return out


def per_unit(
    before: dict[str, float], after: dict[str, float], units: int, scale: float = 1e3
) -> dict[str, float]:
    """CPU per unit of work by process, in ms (scale 1e3) or us (1e6)."""
    return {k: (after[k] - before[k]) * scale / units for k in before} if units else {}


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent busy since boot (every process, ours or not)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def pressure_seconds() -> dict[str, float]:
    """Linux pressure stall totals (PSI), seconds: `cpu_some` (some task waited for a CPU),
    `io_some` and `io_full`; empty where /proc/pressure is missing."""
    out: dict[str, float] = {}
    for resource in ("cpu", "io"):
        try:
            text = Path(f"/proc/pressure/{resource}").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            kind, *fields = line.split()
            values = dict(f.split("=", 1) for f in fields)
            if resource == "cpu" and kind == "full":
                continue  # not meaningful for the CPU at the system level
            out[f"{resource}_{kind}"] = int(values["total"]) / 1e6
    return out


# -- the stack -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Replica:
    """A control-plane process: where it serves gRPC, its metrics and its console ("": not
    served)."""

    child: Child
    address: str
    metrics_url: str
    console_url: str = ""


@dataclass(frozen=True)
class AgentSpec:
    host_id: str
    devices: int
    sim_delay: float  # seconds
    pool: str
    action_log: bool = False
    # host:port of the agent's /metrics (None: not served).
    metrics_listen: str | None = None


@dataclass
class Stack:
    root: Path
    lease_ttl: float = 60.0
    log_format: LogFormat = "json"
    # Put first on the children's PYTHONPATH: measure a patched copy of the packages
    # (control_plane, host_agent, ...) without touching the working tree.
    pythonpath: Path | None = None
    pg: EmbeddedPostgres | None = None
    dsn: str = ""
    control_plane: Child | None = None
    address: str = ""
    metrics_url: str = ""
    console_url: str = ""
    agents: dict[str, Child] = field(default_factory=dict)
    action_logs: dict[str, Path] = field(default_factory=dict)

    # PostgreSQL ---------------------------------------------------------------------------

    def start_postgres(self, settings: dict[str, str] | None = None) -> str:
        """Durable, PostgreSQL's defaults (plus `settings`, e.g. for --profile)."""
        self.pg = EmbeddedPostgres(self.root / "pg", durable=True, settings=settings or {})
        self.dsn = self.pg.start()
        return self.dsn

    async def create_database(self, name: str) -> str:
        """A new, empty database `name` on this server (dropped first if it exists); its
        DSN. The workloads that need a database of their own (deep, flood) use one."""
        assert self.pg is not None
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return self.dsn.rsplit("/", 1)[0] + "/" + name

    def postmaster_pid(self) -> int | None:
        assert self.pg is not None
        pidfile = self.pg.datadir / "postmaster.pid"
        try:
            return int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return None

    # control plane ------------------------------------------------------------------------

    async def start_control_plane(self) -> None:
        console = f"127.0.0.1:{free_port()}"
        replica = await self.start_replica("control-plane", self.lease_ttl, http_listen=console)
        self.control_plane = replica.child
        self.address, self.metrics_url = replica.address, replica.metrics_url
        self.console_url = replica.console_url

    async def start_replica(
        self, name: str, lease_ttl: float, dsn: str = "", http_listen: str | None = None
    ) -> Replica:
        """One more control-plane process on this stack's database, or on `dsn` (another
        database of the same server; migrated on start), not stopped by stop(): the caller
        stops it. Serving when this returns. Its log is `<name>.log`. With `http_listen`,
        it serves the console (and the WebDriver endpoint) there too."""
        port, mport = free_port(), free_port()
        address = f"127.0.0.1:{port}"
        command = ControlPlaneCommand(
            listen=address,
            database_url=dsn or self.dsn,
            insecure=True,
            lease_ttl=lease_ttl,
            metrics_listen=f"127.0.0.1:{mport}",
            log_format=self.log_format,
            http_listen=http_listen,
        )
        child = spawn(name, command.argv(), self.root / f"{name}.log", self.env_of(command))
        try:
            await wait_serving(address, child)
        except BaseException:
            child.stop()
            raise
        console_url = f"http://{http_listen}" if http_listen else ""
        return Replica(child, address, f"http://127.0.0.1:{mport}/metrics", console_url)

    # host agents --------------------------------------------------------------------------

    def start_agent(self, spec: AgentSpec) -> Child:
        action_log = None
        if spec.action_log:
            action_log = self.root / f"actions-{spec.host_id}.jsonl"
            action_log.unlink(missing_ok=True)
            self.action_logs[spec.host_id] = action_log
        command = HostAgentCommand(
            control_plane=self.address,
            host_id=spec.host_id,
            token=AGENT_TOKEN,
            labels={"pool": spec.pool},
            simulated_devices=spec.devices,
            sim_delay=spec.sim_delay,
            action_log=action_log,
            drain_timeout=0,
            log_format=self.log_format,
            metrics_listen=spec.metrics_listen,
        )
        child = spawn(
            f"host agent {spec.host_id}",
            command.argv(),
            self.root / f"agent-{spec.host_id}.log",
            self.env_of(command),
        )
        self.agents[spec.host_id] = child
        return child

    def env_of(self, command: ControlPlaneCommand | HostAgentCommand) -> dict[str, str]:
        """A child's environment: the command's, with the measured copy of the packages
        first on its PYTHONPATH (--pythonpath)."""
        env = command.env()
        if self.pythonpath is not None:
            rest = env.get("PYTHONPATH", "")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.pythonpath), rest) if p)
        return env

    def check_alive(self) -> None:
        for child in [self.control_plane, *self.agents.values()]:
            if child is not None:
                child.check_alive()

    def stop_agents(self) -> None:
        for child in self.agents.values():
            with contextlib.suppress(ProcessLookupError):
                child.popen.send_signal(signal.SIGTERM)
        for child in self.agents.values():
            child.stop()
        self.agents.clear()

    def stop(self) -> None:
        self.stop_agents()
        if self.control_plane is not None:
            self.control_plane.stop()
            self.control_plane = None
        if self.pg is not None:
            with contextlib.suppress(Exception):
                self.pg.stop("fast")


async def wait_serving(address: str, child: Child, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            child.check_alive()
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{child.name} did not serve on {address} within {within:.0f}s")
