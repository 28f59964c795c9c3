"""Faults on a random schedule: every kind at least `min_per_kind` times, then more at
random until the time is up; at most `max_concurrent` at once, never two on one target,
and never both replicas down together (the farm is meant to survive one at a time).

    replica_kill   SIGKILL a control-plane replica, restart it on the same port
    agent_kill     SIGKILL a host agent, restart it (same host id and devices)
    agent_freeze   SIGSTOP an agent for longer than the lease TTL, then SIGCONT
    pg_restart     PostgreSQL immediate shutdown (a crash), then start it again
    proxy_cut      cut one host's connections for longer than the TTL (blackhole or reset):
                   an agent's or a fleet host's, even odds
    fleet_kill     SIGKILL a fleet process (a row of hosts at once), restart it
    fleet_freeze   SIGSTOP a fleet process for longer than the TTL, then SIGCONT
    pg_failover    kill the primary (immediate shutdown), promote the synchronous standby;
                   once the replicas serve again, the old primary is rewound (pg_rewind)
                   and rejoins as the new standby, so that the next failover can happen
    pg_terminate   pg_terminate_backend on a few random client backends (a replica's
                   pooled connections, its LISTEN connection)
    pg_idle_txn    an idle transaction held open 2-6 lease TTLs (vacuum pinned behind it)
    pg_conn_fill   every free connection slot taken for a few seconds (new connections
                   are refused: pools that grow, the LISTEN connection's reconnect)
    phone_*        a phone of an agent unplugged (mid-run), hung, boot-looping or too hot,
                   then well again (chaos_lib/phones.py)
    clean_*        a phone's cleans between leases hang, or fail at `pm uninstall` (a
                   phone running a task where one does), then well again
                   (chaos_lib/cleaning.py)
    emu_*          an emulator of the pool dies during its reset's load or a task's, a load
                   fails or hangs, a start never boots, the pool's agent is killed
                   (chaos_lib/emulators.py); two at most at once, on different instances,
                   and none while its agent is killed

The fleet kinds run only when there is a fleet (`--hosts`), the emulator kinds when there
is an emulator pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import asyncpg

from chaos_lib import cleaning, emulators, phones
from chaos_lib.farm import Farm
from chaos_lib.proxy import CUT_MODES

KINDS = (
    "replica_kill",
    "agent_kill",
    "agent_freeze",
    "pg_restart",
    "proxy_cut",
    "fleet_kill",
    "fleet_freeze",
    "pg_failover",
    "pg_terminate",
    "pg_idle_txn",
    "pg_conn_fill",
)
# Faults on the database apart from pg_restart and pg_failover, each on a target of its
# own (they may overlap those two).
PG_TARGETS = {
    "pg_terminate": "postgres-backends",
    "pg_idle_txn": "postgres-idle",
    "pg_conn_fill": "postgres-connections",
}
FLEET_KINDS = ("fleet_kill", "fleet_freeze")
# pg_conn_fill stops at this many connections if the server has not refused one yet.
FILL_MOST = 400
# Faults that cut hosts off (the workload cancels a few tasks running there).
HOST_KINDS = ("agent_kill", "agent_freeze", "proxy_cut", "fleet_kill", "fleet_freeze")


def kinds_for(farm: Farm) -> tuple[str, ...]:
    kinds = KINDS if farm.fleet else tuple(k for k in KINDS if k not in FLEET_KINDS)
    kinds += phones.KINDS + cleaning.KINDS if farm.phone_faults is not None else ()
    return kinds + (emulators.KINDS if farm.emulator_world is not None else ())


@dataclass
class Fault:
    kind: str
    target: str
    started_at: float  # wall clock
    healed_at: float | None = None  # when the fault was undone (restart begun, SIGCONT, heal)
    recovered_at: float | None = None  # when the harness saw the target serving again
    detail: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Injector:
    def __init__(
        self,
        farm: Farm,
        rng: random.Random,
        *,
        min_per_kind: int,
        max_concurrent: int = 2,
        kinds: tuple[str, ...] | None = None,
        gap: tuple[float, float] = (1.0, 5.0),
    ) -> None:
        self.farm = farm
        self.rng = rng
        self.min_per_kind = min_per_kind
        self.max_concurrent = max_concurrent
        # The soak never kills the first replica, so that one process's memory is watched
        # over the whole run (the other replica is killed as often as ever).
        self.spare_first_replica = False
        # Seconds between two faults once every kind had its minimum; the minimum's faults
        # are spread over the run at most gap[1] apart (6 s at the default).
        self.gap = gap
        self.kinds = kinds if kinds is not None else kinds_for(farm)
        self.faults: list[Fault] = []
        self.busy: set[str] = set()
        self._running: set[asyncio.Task[None]] = set()
        self.stopping = False
        # Called with the host id when a fault cuts a host off (the workload cancels there).
        self.on_host_fault: Callable[[str], None] | None = None
        # Admin calls and reads for the phone faults (set by chaos.py).
        self.operator: phones.Operator | None = None
        # Submits a task pinned to an emulator that starts from chaos_app (set by chaos.py).
        self.pin_emulator: Callable[[str], Any] | None = None

    @property
    def ttl(self) -> float:
        return self.farm.config.lease_ttl

    def counts(self) -> dict[str, int]:
        return {k: sum(1 for f in self.faults if f.kind == k) for k in self.kinds}

    async def run(self, duration: float) -> None:
        """Inject until `duration` seconds passed and every kind had its minimum."""
        deadline = time.monotonic() + duration
        required = [k for k in self.kinds for _ in range(self.min_per_kind)]
        self.rng.shuffle(required)
        while not self.stopping:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and not required:
                break
            if len(self._running) >= self.max_concurrent:
                await asyncio.wait(set(self._running), return_when=asyncio.FIRST_COMPLETED)
                continue
            pool = required or self.rng.sample(self.kinds, len(self.kinds))
            choice = next(((k, t) for k in pool if (t := self._target(k)) is not None), None)
            if choice is None:
                await asyncio.sleep(0.2)
                continue
            kind, target = choice
            if kind in required:
                required.remove(kind)
            self._launch(kind, target)
            if required:
                pace = max(0.3, min(remaining / (len(required) + 1), max(6.0, self.gap[1])))
                await asyncio.sleep(self.rng.uniform(min(0.3 * self.gap[0], pace), pace))
            else:  # never past the end of the run
                await asyncio.sleep(min(self.rng.uniform(*self.gap), max(0.0, remaining)))
        await self.finish()

    async def finish(self) -> None:
        """Wait for the faults in progress to be undone."""
        if self._running:
            await asyncio.wait(set(self._running))

    def _target(self, kind: str) -> str | None:
        farm = self.farm
        if kind in emulators.KINDS:
            # A slot (its instance is drawn when the fault begins: emulators.pick); the
            # agent's kill only while no other emulator fault runs, and none during it.
            slots = [f"{emulators.HOST}/fault-{n}" for n in range(2)]
            if emulators.HOST in self.busy:
                return None
            if kind == "emu_agent_kill":
                return None if self.busy.intersection(slots) else emulators.HOST
            free = [slot for slot in slots if slot not in self.busy]
            return free[0] if free else None
        if kind in phones.KINDS or kind in cleaning.KINDS:
            free = self._free_phones()
            return self.rng.choice(free) if free else None
        if kind == "replica_kill":
            alive = [r.name for r in farm.replicas if r.alive and r.name not in self.busy]
            if len(alive) != len(farm.replicas):
                return None
            spared = farm.replicas[0].name if self.spare_first_replica else None
            return self.rng.choice([name for name in alive if name != spared] or [None])
        if kind in ("pg_restart", "pg_failover"):
            blocked = {"postgres", PG_TARGETS["pg_terminate"], PG_TARGETS["pg_conn_fill"]}
            return None if self.busy & blocked else "postgres"
        if kind in PG_TARGETS:
            # Each connects first: not while the server is down or its slots are full.
            blocked = {"postgres", PG_TARGETS[kind], PG_TARGETS["pg_conn_fill"]}
            return None if self.busy & blocked else PG_TARGETS[kind]
        if kind in FLEET_KINDS:
            # Not while one of its hosts' proxies is cut: one fault per host at a time.
            free = [
                f.name
                for f in farm.fleet
                if f.name not in self.busy and not self.busy.intersection(f.hosts)
            ]
            return self.rng.choice(free) if free else None
        agents = [a.host_id for a in farm.agents if a.host_id not in self.busy]
        if kind != "proxy_cut" or not farm.fleet or (agents and self.rng.random() < 0.5):
            return self.rng.choice(agents) if agents else None
        busy_procs = {f.name for f in farm.fleet if f.name in self.busy}
        hosts = [
            h.host_id
            for h in farm.fleet_hosts
            if h.host_id not in self.busy and h.proc not in busy_procs
        ]
        return self.rng.choice(hosts) if hosts else None

    def _launch(self, kind: str, target: str) -> None:
        fault = Fault(kind, target, time.time())
        self.faults.append(fault)
        self.busy.add(target)
        task = asyncio.create_task(self._inject(fault))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _inject(self, fault: Fault) -> None:
        try:
            await getattr(self, f"_{fault.kind}")(fault)
        except Exception as exc:
            fault.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.busy.discard(fault.target)

    def _free_phones(self) -> list[str]:
        return [
            phones.target(a.host_id, f"sim-{d}")
            for a in self.farm.agents
            for d in range(a.devices)
            if phones.target(a.host_id, f"sim-{d}") not in self.busy
        ]

    # -- the faults --------------------------------------------------------------------------

    async def _phone_fault(self, fault: Fault) -> None:
        assert self.farm.phone_faults is not None and self.operator is not None
        mid_run = fault.kind == "phone_unplug" or fault.kind in cleaning.KINDS
        if mid_run:  # where a phone of those free runs a task (a clean follows it)
            free = [fault.target, *self._free_phones()]
            chosen = await phones.pick("phone_unplug", free, self.operator, self.rng)
            if chosen is not None and chosen != fault.target:
                self.busy.discard(fault.target)
                fault.target = chosen
                self.busy.add(chosen)
        inject = cleaning.inject if fault.kind in cleaning.KINDS else phones.inject
        await inject(fault, self.farm.phone_faults, self.operator, self.rng)

    _phone_unplug = _phone_hang = _phone_reboot_loop = _phone_overheat = _phone_fault
    _clean_hang = _clean_uninstall_fail = _phone_fault

    async def _emulator_fault(self, fault: Fault) -> None:
        world = self.farm.emulator_world
        assert world is not None and self.operator is not None and self.pin_emulator
        await emulators.inject(fault, world, self.operator, self.rng, self.pin_emulator)

    _emu_die_in_load = _emu_die_in_task_load = _emu_load_fails = _emulator_fault
    _emu_load_hang = _emu_boot_fails = _emulator_fault

    async def _emu_agent_kill(self, fault: Fault) -> None:
        """The emulator host's agent SIGKILLed (its instances outlive it), started again."""
        agent = self.farm.emulator_agent
        assert agent is not None
        agent.kill()
        self._host_cut_off(fault.target)
        await asyncio.sleep(self.rng.uniform(0.5, 2.5))
        agent.spawn()
        fault.healed_at = time.time()
        world = self.farm.emulator_world
        assert world is not None
        ready = await emulators.pool_back(
            world, self.farm.dsn, fault.healed_at, emulators.READY_WITHIN
        )
        fault.detail["fired"] = True
        if ready >= emulators.MIN:
            fault.recovered_at = time.time()
            fault.detail["ready_again_s"] = round(fault.recovered_at - fault.healed_at, 3)
        else:
            fault.error = f"the pool not at its minimum within {emulators.READY_WITHIN:g}s"

    async def _replica_kill(self, fault: Fault) -> None:
        replica = next(r for r in self.farm.replicas if r.name == fault.target)
        replica.kill()
        down = self.rng.uniform(0.5, 2.5)
        await asyncio.sleep(down)
        fault.healed_at = time.time()
        fault.detail["restart_to_serving_s"] = round(await replica.start(), 3)
        fault.recovered_at = time.time()

    async def _agent_kill(self, fault: Fault) -> None:
        agent = self._agent(fault.target)
        agent.kill()
        self._host_cut_off(fault.target)
        await asyncio.sleep(self.rng.uniform(0.5, 2.5))
        agent.spawn()
        fault.healed_at = time.time()

    async def _agent_freeze(self, fault: Fault) -> None:
        agent = self._agent(fault.target)
        agent.freeze()
        self._host_cut_off(fault.target)
        frozen = self.ttl + self.rng.uniform(1.0, 3.0)
        fault.detail["frozen_s"] = round(frozen, 3)
        await asyncio.sleep(frozen)
        agent.thaw()
        fault.healed_at = time.time()

    async def _pg_restart(self, fault: Fault) -> None:
        await self.farm.pg.crash()
        fault.detail["crashed_at"] = time.time()
        await asyncio.sleep(self.rng.uniform(0.2, 2.0))
        await self.farm.pg.start()
        fault.healed_at = time.time()
        fault.detail["outage_s"] = round(fault.healed_at - fault.started_at, 3)
        await self.farm.wait_serving(60)
        fault.recovered_at = time.time()

    async def _pg_failover(self, fault: Fault) -> None:
        """The primary dies; once the replicas have seen it (NOT_SERVING), the standby is
        promoted; time to serve: from the promotion until every replica serves again."""
        pg = self.farm.pg
        await pg.crash()
        fault.detail["crashed_at"] = time.time()
        noticed = await self.farm.wait_not_serving(10)
        fault.detail["noticed_s"] = round(time.time() - fault.started_at, 3) if noticed else None
        await pg.promote()
        promoted = fault.healed_at = time.time()
        fault.detail["promote_s"] = round(promoted - fault.detail["crashed_at"], 3)
        served = await self.farm.wait_serving(60)
        fault.recovered_at = time.time()
        fault.detail["serving_after_promotion_s"] = round(fault.recovered_at - promoted, 3)
        if not served:
            fault.error = "replicas did not serve within 60 s of the promotion"
        began = time.time()
        await pg.rejoin()
        fault.detail["rejoin_s"] = round(time.time() - began, 3)

    async def _pg_terminate(self, fault: Fault) -> None:
        """A few client backends terminated at once (an operator's pg_terminate_backend)."""
        conn = await asyncpg.connect(self.farm.dsn, timeout=10)
        try:
            pids = await conn.fetch(
                "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
                " AND pid <> pg_backend_pid() AND datname = current_database()"
            )
            chosen = self.rng.sample([p["pid"] for p in pids], min(len(pids), 3))
            killed = await conn.fetchval(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(p))"
                " FROM unnest($1::int[]) AS p",
                chosen,
            )
        finally:
            await conn.close()
        fault.detail["terminated"] = int(killed)
        fault.healed_at = time.time()
        await self.farm.wait_serving(30)
        fault.recovered_at = time.time()

    async def _pg_idle_txn(self, fault: Fault) -> None:
        """A session that began a transaction, took a snapshot and went idle: vacuum cannot
        remove what any later transaction deleted until it ends."""
        # Some lease TTLs: 6-18 s in the chaos run, 30-90 s in the soak's.
        held = self.rng.uniform(2.0, 6.0) * self.ttl
        fault.detail["held_s"] = round(held, 3)
        conn = await asyncpg.connect(self.farm.dsn, timeout=10)
        try:
            await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            fault.detail["xmin"] = str(await conn.fetchval("SELECT pg_current_xact_id()"))
            await asyncio.sleep(held)
            with contextlib.suppress(asyncpg.PostgresError, OSError, asyncpg.InterfaceError):
                await conn.execute("ROLLBACK")
        except (asyncpg.PostgresError, OSError, asyncpg.InterfaceError) as exc:
            fault.detail["ended_by"] = type(exc).__name__  # a failover or restart ended it
        finally:
            with contextlib.suppress(Exception):
                await conn.close(timeout=2)
        fault.healed_at = time.time()

    async def _pg_conn_fill(self, fault: Fault) -> None:
        """Connections opened until the server refuses more, held a few seconds, closed."""
        conns: list[asyncpg.Connection] = []
        refused = ""
        try:
            while not refused and len(conns) < FILL_MOST:
                batch = await asyncio.gather(
                    *(asyncpg.connect(self.farm.dsn, timeout=10) for _ in range(10)),
                    return_exceptions=True,
                )
                for c in batch:
                    if isinstance(c, BaseException):
                        refused = type(c).__name__
                    else:
                        conns.append(c)
            fault.detail["connections"] = len(conns)
            fault.detail["refused_with"] = refused
            held = self.rng.uniform(2.0, 5.0)
            fault.detail["held_s"] = round(held, 3)
            await asyncio.sleep(held)
        finally:
            await asyncio.gather(*(c.close(timeout=2) for c in conns), return_exceptions=True)
        fault.healed_at = time.time()
        await self.farm.wait_serving(30)
        fault.recovered_at = time.time()

    async def _proxy_cut(self, fault: Fault) -> None:
        assert self.farm.proxies is not None
        mode = self.rng.choice(CUT_MODES)
        fault.detail["mode"] = mode
        self.farm.proxies.cut(fault.target, mode)
        self._host_cut_off(fault.target)
        cut = self.ttl + self.rng.uniform(1.0, 3.0)
        fault.detail["cut_s"] = round(cut, 3)
        await asyncio.sleep(cut)
        self.farm.proxies.heal(fault.target)
        fault.healed_at = time.time()

    async def _fleet_kill(self, fault: Fault) -> None:
        proc = self._fleet(fault.target)
        fault.detail["hosts"] = list(proc.hosts)
        proc.kill()
        self._row_cut_off(proc.hosts)
        await asyncio.sleep(self.rng.uniform(0.5, 2.5))
        proc.spawn()
        fault.healed_at = time.time()

    async def _fleet_freeze(self, fault: Fault) -> None:
        proc = self._fleet(fault.target)
        fault.detail["hosts"] = list(proc.hosts)
        proc.freeze()
        self._row_cut_off(proc.hosts)
        frozen = self.ttl + self.rng.uniform(1.0, 3.0)
        fault.detail["frozen_s"] = round(frozen, 3)
        await asyncio.sleep(frozen)
        proc.thaw()
        fault.healed_at = time.time()

    def _row_cut_off(self, hosts: list[str], most: int = 4) -> None:
        for host in self.rng.sample(hosts, min(most, len(hosts))):
            self._host_cut_off(host)

    def _host_cut_off(self, host_id: str) -> None:
        if self.on_host_fault is not None:
            self.on_host_fault(host_id)

    def _fleet(self, name: str) -> Any:
        return next(f for f in self.farm.fleet if f.name == name)

    def _agent(self, host_id: str) -> Any:
        return next(a for a in self.farm.agents if a.host_id == host_id)
