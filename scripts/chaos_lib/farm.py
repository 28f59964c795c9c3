"""The whole farm of one run: PostgreSQL, replicas, a proxy per host, the host agents
(each its own process) and the fleet (many hosts, each the real agent, a few processes
holding them: chaos_lib/fleet.py)."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from amc.v1 import admin_pb2, admin_pb2_grpc
from amc_common.channel import with_token
from amc_testing.database import free_port
from chaos_lib import cleaning, emulators
from chaos_lib.cluster import ROOT, AgentProc, FleetProc, Postgres, Replica, health
from chaos_lib.emulators import EmulatorWorld
from chaos_lib.phones import PhoneFaults
from chaos_lib.proxy import ProxyHub
from scripts.launch import CreateTokenCommand, TokenRole

if TYPE_CHECKING:
    from chaos_lib.webdriver import Appium


@dataclass
class FarmConfig:
    workdir: Path
    replicas: int = 2
    agents: int = 3
    devices: int = 3
    lease_ttl: float = 3.0
    sweep_interval: float = 0.5
    insecure: bool = False
    # The fleet: `hosts` hosts of `fleet_devices` phones, `hosts_per_proc` to a process.
    hosts: int = 0
    fleet_devices: int = 3
    hosts_per_proc: int = 15
    # How long a fleet host's Acquire long poll waits (the agent's default: 60 s), so that
    # a wake-up dispatch misses shows as a task left queued, not hidden by a quick re-poll.
    fleet_acquire_wait: float = 60.0
    # The fleet processes' niceness: on a farm the hosts are other machines, so here they
    # take the cores the control plane and PostgreSQL leave (0: as the rest of the run).
    fleet_nice: int = 0
    row_size: int = 10  # hosts per `row` label
    # The replicas' --max-connection-age in seconds (None: theirs, 30 minutes); short (the
    # run's default), the agents' renewal streams move to new connections all through it.
    max_connection_age: float | None = None
    # One more agent, of an emulator pool (chaos_lib/emulators.py).
    emulators: bool = False
    # WebDriver sessions (chaos_lib/webdriver.py): the agents run this Appium, the replicas
    # serve HTTP (the WebDriver endpoint); None: neither.
    appium: Appium | None = None

    @property
    def devices_total(self) -> int:
        pool = emulators.MIN if self.emulators else 0
        return self.agents * self.devices + self.hosts * self.fleet_devices + pool


@dataclass(frozen=True)
class FleetHost:
    """One host of the fleet, as the workload and the checks know it."""

    host_id: str
    proc: str  # the fleet process it runs in
    rack: str
    row: str
    serials: tuple[str, ...]
    sim_delay: float
    action_log: Path

    @property
    def labels(self) -> dict[str, str]:
        return {"pool": "fleet", "rack": self.rack, "row": self.row}


@dataclass
class Farm:
    config: FarmConfig
    rng: random.Random
    pg: Postgres = field(init=False)
    replicas: list[Replica] = field(default_factory=list)
    agents: list[AgentProc] = field(default_factory=list)
    fleet: list[FleetProc] = field(default_factory=list)
    fleet_hosts: list[FleetHost] = field(default_factory=list)
    proxies: ProxyHub | None = None
    client_token: str | None = None
    operator_token: str | None = None  # for Admin calls (the teams' fair shares)
    phone_faults: PhoneFaults | None = None  # the agents' phones' faults (phones.py)
    emulator_world: EmulatorWorld | None = None
    emulator_agent: AgentProc | None = None  # its host runs the emulator pool

    def __post_init__(self) -> None:
        self.pg = Postgres(self.config.workdir / "pgdata")

    @property
    def dsn(self) -> str:
        return self.pg.url

    def action_logs(self) -> dict[str, Path]:
        return {a.host_id: a.action_log for a in self.agents} | {
            h.host_id: h.action_log for h in self.fleet_hosts
        }

    def agent_logs(self) -> dict[str, Path]:
        """By process name (a fleet process's lines name their host_id)."""
        return {a.host_id: a.log for a in self._all_agents} | {f.name: f.log for f in self.fleet}

    @property
    def _all_agents(self) -> list[AgentProc]:
        """The agents, and the emulator pool's."""
        return self.agents + ([self.emulator_agent] if self.emulator_agent else [])

    def acquire_logs(self) -> list[Path]:
        return [f.acquire_log for f in self.fleet]

    def sim_delays(self) -> dict[str, float]:
        return {a.host_id: a.sim_delay for a in self.agents} | {
            h.host_id: h.sim_delay for h in self.fleet_hosts
        }

    def hosts_of(self, target: str) -> list[str]:
        """The hosts a fault on `target` (an agent, a fleet process or a host) cuts off."""
        for f in self.fleet:
            if f.name == target:
                return list(f.hosts)
        return [target]

    async def start(self) -> None:
        c = self.config
        await self.pg.start()
        await asyncio.to_thread(self._migrate_and_tokens)
        for i in range(c.replicas):
            self.replicas.append(
                Replica(
                    f"replica-{i}",
                    self.dsn,
                    c.workdir / f"replica-{i}.log",
                    c.lease_ttl,
                    c.sweep_interval,
                    c.insecure,
                    max_connection_age=c.max_connection_age,
                    http_port=free_port() if c.appium else None,
                )
            )
        await asyncio.gather(*(r.start() for r in self.replicas))
        self.proxies = ProxyHub()
        profile = cleaning.write_profile(c.workdir)
        for i in range(c.agents):
            host = f"chaos-h{i}"
            proxy = self.proxies.add(host, [r.port for r in self.replicas])
            agent = AgentProc(
                host_id=host,
                control_plane=f"127.0.0.1:{proxy.port}",
                devices=c.devices,
                sim_delay=round(self.rng.uniform(0.05, 0.25), 3),
                action_log=c.workdir / f"actions-{host}.jsonl",
                log=c.workdir / f"agent-{host}.log",
                token_file=c.workdir / f"token-{host}",
                sim_faults=c.workdir / f"phone-faults-{host}.json",
                clean_profile=profile,
                appium=c.appium.program(host) if c.appium else None,
                appium_caps=c.appium.caps if c.appium else None,
            )
            agent.spawn()
            self.agents.append(agent)
        self.phone_faults = PhoneFaults(
            {a.host_id: a.sim_faults for a in self.agents if a.sim_faults is not None}
        )
        await self._start_emulators()
        await self._start_fleet()

    async def _start_emulators(self) -> None:
        c = self.config
        if not c.emulators:
            return
        assert self.proxies is not None
        world = self.emulator_world = await EmulatorWorld.make(c.workdir)
        host = emulators.HOST
        proxy = self.proxies.add(host, [r.port for r in self.replicas])
        agent = self.emulator_agent = AgentProc(
            host_id=host,
            control_plane=f"127.0.0.1:{proxy.port}",
            devices=0,
            sim_delay=0.0,
            action_log=c.workdir / f"actions-{host}.jsonl",  # none: its phones are adb's
            log=c.workdir / f"agent-{host}.log",
            token_file=c.workdir / f"token-{host}",
            clean_profile=emulators.write_profile(c.workdir),
            pool=emulators.POOL_LABEL,
            adb=world.adb_address,
            extra_args=world.agent_args(),
            extra_env=world.env,
        )
        agent.spawn()

    async def _start_fleet(self) -> None:
        c = self.config
        if not c.hosts:
            return
        tokens = await self._fleet_tokens()
        assert self.proxies is not None
        procs = (c.hosts + c.hosts_per_proc - 1) // c.hosts_per_proc
        for p in range(procs):
            name = f"fleet-{p}"
            members = range(p * c.hosts_per_proc, min(c.hosts, (p + 1) * c.hosts_per_proc))
            hosts, entries = [], []
            for i in members:
                host = FleetHost(
                    host_id=f"chaos-f{i:02d}",
                    proc=name,
                    rack=f"r{i:02d}",
                    row=f"row{i // c.row_size}",
                    serials=tuple(f"f{i:02d}-{d}" for d in range(c.fleet_devices)),
                    sim_delay=round(self.rng.uniform(0.05, 0.25), 3),
                    action_log=c.workdir / f"actions-chaos-f{i:02d}.jsonl",
                )
                proxy = self.proxies.add(host.host_id, [r.port for r in self.replicas])
                hosts.append(host)
                entries.append(
                    {
                        "host_id": host.host_id,
                        "address": f"127.0.0.1:{proxy.port}",
                        "token": tokens[host.host_id],
                        "labels": host.labels,
                        "devices": c.fleet_devices,
                        "prefix": f"f{i:02d}-",
                        "sim_delay": host.sim_delay,
                        "action_log": str(host.action_log),
                    }
                )
            config = c.workdir / f"{name}.json"
            config.touch(mode=0o600)  # it holds the hosts' tokens
            config.write_text(
                json.dumps(
                    {
                        "hosts": entries,
                        "acquire_log": str(c.workdir / f"acquires-{name}.jsonl"),
                        "acquire_wait": c.fleet_acquire_wait,
                        "nice": c.fleet_nice,
                        "drain_timeout": 5.0,
                        "report_timeout": 30.0,
                    }
                )
            )
            proc = FleetProc(
                name,
                config,
                c.workdir / f"{name}.log",
                c.workdir / f"acquires-{name}.jsonl",
                [h.host_id for h in hosts],
            )
            proc.spawn()
            self.fleet.append(proc)
            self.fleet_hosts += hosts

    async def _fleet_tokens(self) -> dict[str, str]:
        """A host token per fleet host, through the API (Admin.CreateToken with the
        operator's token, 16 calls in flight): 60 `control-plane tokens create` processes
        would take a minute."""
        names = [f"chaos-f{i:02d}" for i in range(self.config.hosts)]
        if self.config.insecure:
            return dict.fromkeys(names, "insecure")
        limit = asyncio.Semaphore(16)
        channel = with_token(
            grpc.aio.insecure_channel(self.replicas[0].address), self.operator_token
        )
        admin = admin_pb2_grpc.AdminStub(channel)

        async def one(name: str) -> tuple[str, str]:
            request = admin_pb2.CreateTokenRequest(
                role=admin_pb2.ROLE_HOST, host_id=name, name=f"chaos host {name}"
            )
            async with limit:
                return name, (await admin.CreateToken(request, timeout=30)).token

        try:
            return dict(await asyncio.gather(*(one(n) for n in names)))
        finally:
            await channel.close()

    def _migrate_and_tokens(self) -> None:
        """Tokens straight into the database with the operator's bootstrap command (which
        also applies the migrations, before any replica starts)."""
        c = self.config
        if c.insecure:
            # The agent still wants a token; with authentication off any text will do.
            for i in range(c.agents):
                (c.workdir / f"token-chaos-h{i}").write_text("insecure\n")
            (c.workdir / f"token-{emulators.HOST}").write_text("insecure\n")
            return
        self.client_token = self._token("client")
        self.operator_token = self._token("operator")
        hosts = [f"chaos-h{i}" for i in range(c.agents)]
        for host in hosts + ([emulators.HOST] if c.emulators else []):
            path = c.workdir / f"token-{host}"
            path.write_text(self._token("host", host) + "\n")
            path.chmod(0o600)

    def _token(self, role: TokenRole, host_id: str | None = None) -> str:
        command = CreateTokenCommand(
            role, database_url=self.dsn, host_id=host_id, name=f"chaos {role} {host_id or ''}"
        )
        done = subprocess.run(
            command.argv(),
            cwd=ROOT,
            env=command.env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.strip().splitlines()[0]

    async def all_serving(self) -> bool:
        checks = await asyncio.gather(*(health(r.address) for r in self.replicas))
        return all(checks)

    async def wait_serving(self, within: float) -> bool:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if await self.all_serving():
                return True
            await asyncio.sleep(0.1)
        return False

    async def wait_not_serving(self, within: float) -> bool:
        """Until every replica says it is not serving (its database gone)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            checks = await asyncio.gather(*(health(r.address) for r in self.replicas))
            if not any(checks):
                return True
            await asyncio.sleep(0.1)
        return False

    async def ensure_up(self) -> list[str]:
        """Everything running and unfrozen, every proxy healed; says what had to be fixed."""
        fixed = []
        if not self.pg.up:
            await self.pg.start()
            fixed.append("postgres")
        assert self.proxies is not None
        for name, proxy in self.proxies.proxies.items():
            if proxy.mode is not None:
                self.proxies.heal(name)
                fixed.append(f"proxy {name}")
        for agent in self._all_agents:
            if agent.frozen:
                agent.thaw()
                fixed.append(f"frozen {agent.host_id}")
            if not agent.alive:
                agent.spawn()
                fixed.append(f"dead {agent.host_id}")
        for proc in self.fleet:
            if proc.frozen:
                proc.thaw()
                fixed.append(f"frozen {proc.name}")
            if not proc.alive:
                proc.spawn()
                fixed.append(f"dead {proc.name}")
        for replica in self.replicas:
            if not replica.alive:
                await replica.start()
                fixed.append(f"dead {replica.name}")
        return fixed

    async def watch(self, busy: set[str], problems: list[str]) -> None:
        """A process that dies with no fault aimed at it (`busy`) is a finding: note it
        and bring it back."""
        while True:
            await asyncio.sleep(1.0)
            for agent in self._all_agents:
                if agent.host_id not in busy and not agent.alive:
                    problems.append(f"{agent.host_id} exited on its own ({_code(agent.proc)})")
                    agent.spawn()
            for proc in self.fleet:
                if proc.name not in busy and not proc.alive:
                    problems.append(f"{proc.name} exited on its own ({_code(proc.proc)})")
                    proc.spawn()
            for replica in self.replicas:
                if replica.name not in busy and not replica.alive:
                    problems.append(f"{replica.name} exited on its own ({_code(replica.proc)})")
                    await replica.start()

    async def stop(self) -> dict[str, int | None]:
        """Agents first (they drain and give leases back), then replicas, then the proxies.
        PostgreSQL stays up for the checks; `stop_database` ends it."""
        codes: dict[str, int | None] = {}
        hosts: list[AgentProc | FleetProc] = [*self._all_agents, *self.fleet]
        names = [a.host_id for a in self._all_agents] + [f.name for f in self.fleet]
        results = await asyncio.gather(*(asyncio.to_thread(h.terminate) for h in hosts))
        codes.update(zip(names, results, strict=True))
        if self.emulator_world is not None:
            if left := self.emulator_world.kill_leftovers():
                codes["emulators left running by their agent"] = len(left)
            await self.emulator_world.close()
        results = await asyncio.gather(*(asyncio.to_thread(r.terminate) for r in self.replicas))
        codes.update({r.name: rc for r, rc in zip(self.replicas, results, strict=True)})
        if self.proxies is not None:
            self.proxies.close()
        return codes

    async def stop_database(self) -> None:
        await self.pg.stop()

    def kill_everything(self) -> None:
        """Last resort on the way out (an error in the harness): leave nothing running."""
        for agent in self._all_agents:
            agent.kill()
        if self.emulator_world is not None:
            self.emulator_world.kill_leftovers()
            self.emulator_world.adb.kill()
        for proc in self.fleet:
            proc.kill()
        for replica in self.replicas:
            replica.kill()
        if self.proxies is not None:
            self.proxies.close()
        try:
            self.pg.kill()
        except Exception:
            pass


def _code(proc: subprocess.Popen[bytes] | None) -> str:
    return f"exit status {proc.returncode}" if proc is not None else "never started"
