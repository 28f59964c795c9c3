"""The whole farm of one run: PostgreSQL, replicas, a proxy per agent, the agents."""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos_lib.cluster import BIN, ROOT, AgentProc, Postgres, Replica, health
from chaos_lib.proxy import ProxyHub


@dataclass
class FarmConfig:
    workdir: Path
    replicas: int = 2
    agents: int = 3
    devices: int = 3
    lease_ttl: float = 3.0
    sweep_interval: float = 0.5
    insecure: bool = False


@dataclass
class Farm:
    config: FarmConfig
    rng: random.Random
    pg: Postgres = field(init=False)
    replicas: list[Replica] = field(default_factory=list)
    agents: list[AgentProc] = field(default_factory=list)
    proxies: ProxyHub | None = None
    client_token: str | None = None

    def __post_init__(self) -> None:
        self.pg = Postgres(self.config.workdir / "pgdata")

    @property
    def dsn(self) -> str:
        return self.pg.url

    def action_logs(self) -> dict[str, Path]:
        return {a.host_id: a.action_log for a in self.agents}

    def agent_logs(self) -> dict[str, Path]:
        return {a.host_id: a.log for a in self.agents}

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
                )
            )
        await asyncio.gather(*(r.start() for r in self.replicas))
        self.proxies = ProxyHub()
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
            )
            agent.spawn()
            self.agents.append(agent)

    def _migrate_and_tokens(self) -> None:
        """Tokens straight into the database with the operator's bootstrap command (which
        also applies the migrations, before any replica starts)."""
        c = self.config
        if c.insecure:
            # The agent still wants a token; with authentication off any text will do.
            for i in range(c.agents):
                (c.workdir / f"token-chaos-h{i}").write_text("insecure\n")
            return
        self.client_token = self._token("client")
        for i in range(c.agents):
            path = c.workdir / f"token-chaos-h{i}"
            path.write_text(self._token("host", f"chaos-h{i}") + "\n")
            path.chmod(0o600)

    def _token(self, role: str, host_id: str | None = None) -> str:
        command = [
            str(BIN / "control-plane"),
            "tokens",
            "create",
            "--role",
            role,
            "--database-url",
            self.dsn,
            "--name",
            f"chaos {role} {host_id or ''}",
        ]
        if host_id:
            command += ["--host-id", host_id]
        done = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
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
        for agent in self.agents:
            if agent.frozen:
                agent.thaw()
                fixed.append(f"frozen {agent.host_id}")
            if not agent.alive:
                agent.spawn()
                fixed.append(f"dead {agent.host_id}")
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
            for agent in self.agents:
                if agent.host_id not in busy and not agent.alive:
                    problems.append(f"{agent.host_id} exited on its own ({_code(agent.proc)})")
                    agent.spawn()
            for replica in self.replicas:
                if replica.name not in busy and not replica.alive:
                    problems.append(f"{replica.name} exited on its own ({_code(replica.proc)})")
                    await replica.start()

    async def stop(self) -> dict[str, int | None]:
        """Agents first (they drain and give leases back), then replicas, then the proxies.
        PostgreSQL stays up for the checks; `stop_database` ends it."""
        codes: dict[str, int | None] = {}
        results = await asyncio.gather(*(asyncio.to_thread(a.terminate) for a in self.agents))
        codes.update({a.host_id: rc for a, rc in zip(self.agents, results, strict=True)})
        results = await asyncio.gather(*(asyncio.to_thread(r.terminate) for r in self.replicas))
        codes.update({r.name: rc for r, rc in zip(self.replicas, results, strict=True)})
        if self.proxies is not None:
            self.proxies.close()
        return codes

    async def stop_database(self) -> None:
        await self.pg.stop()

    def kill_everything(self) -> None:
        """Last resort on the way out (an error in the harness): leave nothing running."""
        for agent in self.agents:
            agent.kill()
        for replica in self.replicas:
            replica.kill()
        if self.proxies is not None:
            self.proxies.close()
        try:
            self.pg.server.stop("immediate")
        except Exception:
            pass


def _code(proc: subprocess.Popen[bytes] | None) -> str:
    return f"exit status {proc.returncode}" if proc is not None else "never started"
