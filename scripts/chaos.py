#!/usr/bin/env python3
"""`make chaos`: break the farm on purpose, at random, then check that nothing was lost,
nothing ran twice, and no cancellation was mistaken for a failure.

Starts a durable embedded PostgreSQL, 2 control-plane replicas, 3 host agents with
simulated phones (each behind its own TCP proxy), a fleet of HOSTS more hosts (default 60;
each the real host agent with its own host id, token, proxy, labels `pool`/`row`/`rack`,
3 phones with serials of its own and its own parked Acquire; 15 to a process, since 60
processes would not fit two cores: chaos_lib/fleet.py), and a client that keeps submitting
workflows, with selectors aimed at the fleet (none, the pool, a row, one rack, one serial),
as two teams (fairness keys team-a and team-b, weights 1 and 2 in fair_shares), and
cancels about a third of them at random moments, beside a few interactive sessions on the
agents' phones (chaos_lib/sessions.py: closed, cancelled or abandoned; invariant 9), a few
adb doors on them (`amc adb` driven by the harness's own adb client, stopped, cancelled or
killed: chaos_lib/doors.py; invariant 13: a door never outlives its lease), a few
WebDriver sessions through the replicas' WebDriver endpoint onto the agents' Appium
(deleted, cancelled or abandoned: chaos_lib/webdriver.py; invariant 15: a session never
outlives its lease; skipped, saying why, where Appium cannot be installed), and a
few live-screen viewers watching running tasks by task_id through the replicas, some
relayed between them, following a task that moves (chaos_lib/screens.py; invariant 11). Before
the faults it queues a backlog of
BACKLOG tasks (default 3,000) for racks no host has, through SubmitTasks: they stay queued
through every fault (the queue's groups of tasks nobody can take) and are cancelled at the
quiesce. For DURATION seconds it injects
faults (scripts/chaos_lib/faults.py): replica kill -9 + restart, agent kill -9 + restart,
agent SIGSTOP beyond the lease TTL + SIGCONT, PostgreSQL immediate shutdown + start, one
host's connections cut beyond the TTL, a fleet process (a row of hosts) kill -9 + restart
or SIGSTOP + SIGCONT, an agent's phone unplugged mid-run, hung, boot-looping or too hot
(chaos_lib/phones.py), a phone's cleans between leases hanging or failing at `pm uninstall`
(chaos_lib/cleaning.py), an emulator of the pool of one more agent (`chaos-e0`, emulator
doubles with `--emulator`, reset between leases from a snapshot; tasks and sessions start
from one) dying during a snapshot load (its reset's or a task's), a load failing or hanging,
a start that never boots, its agent killed (chaos_lib/emulators.py), and on the database:
PostgreSQL runs as a primary and a synchronous streaming standby (the replicas' URL names
both), and fails over (primary killed, standby promoted, old primary rewound to follow
it), has random backends terminated, an idle transaction held open, its connection slots
filled. All through, the replicas age client connections out every 20 s
(--max-connection-age), so every host's renewal stream moves to a new connection again and
again under the faults. Then it quiesces (no new faults, everything up, nothing in flight),
checks the invariants
(chaos_lib/invariants.py; the seventh, dispatch liveness, in chaos_lib/dispatch.py; the
eighth, no acknowledged transition lost, across the failovers; the tenth, phone faults, in
chaos_lib/phones.py; the twelfth, no lease on a phone whose last clean failed, in
chaos_lib/cleaning.py; the fourteenth, emulator pools, in chaos_lib/emulators.py)
from PostgreSQL, the agents' logs and the fleet's
record of its Acquire calls, writes chaos-results.json (with the time to serve after each
failover) and prints a table. `--hosts 0`: no fleet (the run as it was before it, the
invariants that apply).

Exit status: 0 when every invariant held and every fault kind ran at least its minimum
number of times; 1 otherwise; 2 when the harness itself failed.
"""

from __future__ import annotations

import os

# The harness forks (pg_ctl, replicas, agents) while gRPC threads run; gRPC's fork
# handlers only get in the way of children that exec at once. Set before grpc loads.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import argparse
import asyncio
import faulthandler
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_lib import (
    cleaning,
    doors,
    emulators,
    evidence,
    faults,
    phones,
    recovery,
    report,
    screens,
    soak,
    webdriver,
)
from chaos_lib.cluster import ROOT
from chaos_lib.dispatch import DispatchCheck, fault_windows
from chaos_lib.doors import DoorLoad
from chaos_lib.emulators import EmulatorLoad
from chaos_lib.farm import Farm, FarmConfig
from chaos_lib.faults import Injector
from chaos_lib.invariants import Checks, Violation, grouped
from chaos_lib.monitor import Monitor
from chaos_lib.screens import ScreenLoad
from chaos_lib.sessions import SessionLoad
from chaos_lib.workload import ActionTail, Selectors, Workload

from amc.v1 import admin_pb2, admin_pb2_grpc, task_pb2
from amc_common.channel import with_token
from amc_testing.host import AgentSettings

QUICK_DURATION = 20.0
DEFAULT_DURATION = 180.0
DEFAULT_HOSTS, QUICK_HOSTS = 60, 12
# Queued plus in flight the submitter keeps, at most: enough to keep every phone of the
# agents busy and the fleet's racks asked for, not so much that two cores only queue.
MAX_BACKLOG = 40
# Tasks nobody can take, queued before the faults (issue 20).
DEFAULT_UNMATCHED, QUICK_UNMATCHED = 3000, 300
# The teams' weights (set with Admin SetFairShare before the run; no caps: a key at its cap
# leaves tasks queued beside idle phones, which invariant 7 would count).
FAIR_SHARES = {"team-a": 1, "team-b": 2}


def _gap(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LO,HI in seconds, e.g. 1,5") from None
    if not 0 < lo <= hi:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 < LO <= HI")
    return lo, hi


def _kinds(text: str) -> tuple[str, ...]:
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    known = faults.KINDS + phones.KINDS + cleaning.KINDS + emulators.KINDS
    if unknown := [k for k in kinds if k not in known]:
        raise argparse.ArgumentTypeError(
            f"no fault kind {', '.join(unknown)}; the kinds: {', '.join(known)}"
        )
    return kinds


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--duration", type=float, default=None, help="seconds of faults (default 180)")
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: 20 s, every fault kind at least once"
    )
    p.add_argument(
        "--min-per-kind",
        type=int,
        default=None,
        help="inject every fault kind at least this often (default 2; 1 with --quick)",
    )
    p.add_argument("--max-concurrent", type=int, default=2, help="faults in progress at once")
    p.add_argument(
        "--fault-gap",
        type=_gap,
        default=(1.0, 5.0),
        metavar="LO,HI",
        help="seconds between two faults, drawn from LO to HI (default 1,5; make soak: 10,30, "
        "so that each window has seconds clear of faults)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed of the schedule and workload")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--agents", type=int, default=3)
    p.add_argument("--devices", type=int, default=3, help="simulated phones per agent")
    p.add_argument(
        "--hosts",
        type=int,
        default=None,
        help=f"fleet hosts (default {DEFAULT_HOSTS}; {QUICK_HOSTS} with --quick; 0: no fleet)",
    )
    p.add_argument("--fleet-devices", type=int, default=3, help="simulated phones per fleet host")
    p.add_argument(
        "--no-emulators",
        action="store_true",
        help="no emulator pool (its agent, its tasks and sessions, the emu_* faults)",
    )
    p.add_argument(
        "--hosts-per-proc",
        type=int,
        default=None,
        help="fleet hosts per fleet process (default 15; 6 with --quick)",
    )
    p.add_argument(
        "--fleet-acquire-wait",
        type=float,
        default=None,
        help="a fleet host's Acquire long poll, seconds (default: the agent's own, 60; 5 with "
        "--quick, as the chaos agents', so that a smoke run stays short)",
    )
    p.add_argument(
        "--fleet-nice",
        type=int,
        default=10,
        help="niceness of the fleet processes (default 10; 0: as the rest of the run): on a "
        "farm the hosts are other machines, so here the simulated hosts take the cores the "
        "control plane and PostgreSQL leave, and the pickup figures are the product's",
    )
    p.add_argument(
        "--strand-bound",
        type=float,
        default=10.0,
        help="invariant 7: seconds a task may stay queued while a fitting host sits parked",
    )
    p.add_argument(
        "--target-backlog",
        type=int,
        default=None,
        help=f"queued + in flight the submitter keeps (default 1.5 per phone, <= {MAX_BACKLOG})",
    )
    p.add_argument(
        "--backlog",
        type=int,
        default=None,
        help=f"tasks for racks no host has, queued before the faults (default "
        f"{DEFAULT_UNMATCHED}; {QUICK_UNMATCHED} with --quick)",
    )
    p.add_argument(
        "--sessions",
        type=int,
        default=3,
        help="interactive sessions kept open at once on the agents' phones (0: none)",
    )
    p.add_argument(
        "--doors",
        type=int,
        default=2,
        help="adb doors (`amc adb`) kept open at once on the agents' phones (0: none)",
    )
    p.add_argument(
        "--webdriver",
        type=int,
        default=2,
        help="WebDriver sessions kept open at once on the agents' Appium (0: none)",
    )
    p.add_argument(
        "--viewers",
        type=int,
        default=3,
        help="live-screen viewers watching running tasks at once (0: none)",
    )
    p.add_argument(
        "--faults",
        type=_kinds,
        default=None,
        metavar="KIND,...",
        help="inject only these kinds (default: every kind the farm has); '' for none: the "
        "workload alone, a baseline for the soak summary's memory and pickup figures (the "
        "invariants are checked as ever)",
    )
    p.add_argument("--lease-ttl", type=float, default=3.0)
    p.add_argument(
        "--max-connection-age",
        type=float,
        default=20.0,
        help="seconds before a replica asks a connection to go (default 20: the agents' "
        "renewal streams move to new connections all through the run, under the faults, as "
        "they do every 30 minutes on a farm); 0: the replicas' own default",
    )
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of work before faults")
    p.add_argument(
        "--quiesce-timeout",
        type=float,
        default=None,
        help="seconds for everything to settle (default 120, 5 fleet Acquire waits if longer)",
    )
    p.add_argument(
        "--insecure", action="store_true", help="authentication off (default: real tokens)"
    )
    p.add_argument(
        "--soak-window",
        type=float,
        default=0.0,
        help="seconds per window of the soak summary (replica RSS, pickup p99 per window; "
        "make soak: 300, or a third of a shorter run); 0: none",
    )
    p.add_argument("--output", type=Path, default=Path("chaos-results.json"))
    p.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="logs and data (default: a new directory under /tmp, removed if the run passes)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory anyway")
    args = p.parse_args(argv)
    if args.duration is None:
        args.duration = QUICK_DURATION if args.quick else DEFAULT_DURATION
    if args.min_per_kind is None:
        args.min_per_kind = 1 if args.quick else 2
    if args.seed is None:
        args.seed = random.randrange(1 << 31)
    if args.hosts is None:
        args.hosts = QUICK_HOSTS if args.quick else DEFAULT_HOSTS
    if args.backlog is None:
        args.backlog = QUICK_UNMATCHED if args.quick else DEFAULT_UNMATCHED
    if args.hosts_per_proc is None:
        args.hosts_per_proc = 6 if args.quick else 15
    if args.fleet_acquire_wait is None:
        args.fleet_acquire_wait = 5.0 if args.quick else AgentSettings.acquire_wait
    if args.quiesce_timeout is None:
        # A task a parked host fails to take waits out its Acquire (60 s), maybe more than once.
        args.quiesce_timeout = max(120.0, 5 * args.fleet_acquire_wait if args.hosts else 0.0)
    return args


def say(message: str) -> None:
    print(f"chaos: {message}", flush=True)


class ChaosRun:
    """One run: start the farm, break it for a while, let it settle, check it."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        appium, self.webdriver_skipped = None, "--webdriver 0"
        if args.webdriver:
            appium, self.webdriver_skipped = webdriver.prepare(ROOT, workdir)
            if appium is None:
                say(f"no WebDriver sessions: Appium cannot be installed: {self.webdriver_skipped}")
        self.config = FarmConfig(
            workdir,
            args.replicas,
            args.agents,
            args.devices,
            args.lease_ttl,
            insecure=args.insecure,
            hosts=args.hosts,
            fleet_devices=args.fleet_devices,
            hosts_per_proc=max(1, args.hosts_per_proc),
            fleet_acquire_wait=args.fleet_acquire_wait,
            fleet_nice=args.fleet_nice,
            max_connection_age=args.max_connection_age or None,
            emulators=not args.no_emulators,
            appium=appium,
        )
        self.farm = Farm(self.config, self.rng)
        self.emulator_load: EmulatorLoad | None = None
        self.emulator_sessions: SessionLoad | None = None
        self.emulators_ready = 0
        self.run_ended = 0.0
        self.problems: list[str] = []
        self.appium_left: list[Any] = []
        self.began = time.monotonic()
        self.chaos_s = 0.0

    async def start(self) -> None:
        await self.farm.start()
        self.monitor = Monitor(self.farm.dsn)
        await self.monitor.wait_devices(self.config.devices_total, within=120)
        fleet = (
            f", a fleet of {len(self.farm.fleet_hosts)} hosts x {self.config.fleet_devices} "
            f"phones in {len(self.farm.fleet)} processes"
            if self.farm.fleet
            else ""
        )
        say(
            f"farm up: PostgreSQL, {len(self.farm.replicas)} replicas, {len(self.farm.agents)} "
            f"agents x {self.config.devices} phones "
            f"(sim delays {[a.sim_delay for a in self.farm.agents]}){fleet}"
        )
        self.target_backlog = self.args.target_backlog or min(
            int(self.config.devices_total * 1.5), MAX_BACKLOG
        )
        self.workload = Workload(
            [r.address for r in self.farm.replicas],
            self.farm.client_token,
            self.rng,
            ActionTail(self.farm.action_logs()),
            self._backlog,
            target_backlog=self.target_backlog,
            selectors=Selectors(self.farm.fleet_hosts, self.rng) if self.farm.fleet else None,
        )
        self.sessions = SessionLoad(
            [r.address for r in self.farm.replicas],
            self.farm.client_token,
            random.Random(self.args.seed + 23),  # the workload's draws stay the seed's
            self.args.sessions,
        )
        self.doors = DoorLoad(
            [r.address for r in self.farm.replicas],
            self.farm.client_token,
            random.Random(self.args.seed + 39),
            self.config.workdir,
            self.args.doors,
        )
        self.webdriver = webdriver.WebDriverLoad(
            [f"http://127.0.0.1:{r.http_port}/wd/hub" for r in self.farm.replicas],
            [r.address for r in self.farm.replicas],
            self.farm.client_token,
            random.Random(self.args.seed + 14),
            self.args.webdriver if self.config.appium else 0,
        )
        self.screens = ScreenLoad(
            [r.address for r in self.farm.replicas],
            self.farm.client_token,
            self.farm.dsn,
            random.Random(self.args.seed + 24),
            self.args.viewers,
        )
        await set_fair_shares(self.farm.replicas[0].address, self.farm.operator_token)
        if self.args.backlog:
            began = time.monotonic()
            await self.workload.submit_backlog(self.args.backlog)
            say(
                f"backlog: {self.args.backlog} tasks for racks no host has, queued in"
                f" {time.monotonic() - began:.1f}s"
            )
        self.injector = Injector(
            self.farm,
            self.rng,
            min_per_kind=self.args.min_per_kind,
            max_concurrent=self.args.max_concurrent,
            gap=self.args.fault_gap,
            kinds=self.args.faults,
        )
        self.injector.spare_first_replica = self.args.soak_window > 0
        self.injector.on_host_fault = self.workload.cancel_on_host
        self.injector.operator = phones.Operator(
            self.farm.dsn, [r.address for r in self.farm.replicas], self.farm.operator_token
        )
        if self.farm.emulator_world is not None:
            self.emulator_load = EmulatorLoad(
                self.workload, self.farm.dsn, random.Random(self.args.seed + 51)
            )
            self.injector.pin_emulator = self.emulator_load.pin
            self.emulator_sessions = SessionLoad(
                [r.address for r in self.farm.replicas],
                self.farm.client_token,
                random.Random(self.args.seed + 52),
                1 if self.args.sessions else 0,
                selector=task_pb2.DeviceSelector(labels={"pool": emulators.POOL_LABEL}),
                snapshots=(emulators.BOOT, emulators.APP),
            )
        self.pinned: dict[str, str] = {}

    def _backlog(self) -> int | None:
        """Queued and in flight, less the tasks nobody can take (they never leave the queue
        until the quiesce cancels them): what paces the submitter."""
        backlog = self.monitor.backlog
        return None if backlog is None else backlog - self.workload.open_backlog

    async def break_things(self) -> None:
        """The workload and the faults for `duration` seconds, the monitor throughout."""
        self._sampling = asyncio.create_task(self.monitor.run())
        self.rss = soak.Sampler(self.farm)
        self._rss_sampling = asyncio.create_task(self.rss.run())
        self.soak_began = time.time()
        submitting = asyncio.create_task(self.workload.submit_forever())
        sessions = asyncio.create_task(self.sessions.run_forever())
        viewing = asyncio.create_task(self.screens.run_forever())
        opening = self._opening = asyncio.create_task(self.doors.run_forever())
        self._driving = asyncio.create_task(self.webdriver.run_forever())
        watching = asyncio.create_task(self.farm.watch(self.injector.busy, self.problems))
        emulating = [
            asyncio.create_task(load.run_forever())
            for load in (self.emulator_load, self.emulator_sessions)
            if load is not None
        ]
        try:
            await asyncio.sleep(self.args.warmup)  # faults find work in flight from the start
            began = time.monotonic()
            await self.injector.run(self.args.duration)
            self.chaos_s = time.monotonic() - began
        finally:
            submitting.cancel()
            self.sessions.stop()
            sessions.cancel()  # the open ones are abandoned: they end failed
            self.screens.stop()
            viewing.cancel()
            self.doors.stop()
            # The open ones' doors are killed (their sessions abandoned); one whose end was
            # asked is given its bound to take it first (the quiesce waits for them).
            opening.cancel()
            self.webdriver.stop()  # the clients end what they began, then stop
            watching.cancel()
            if self.emulator_sessions is not None:
                self.emulator_sessions.stop()
            for task in emulating:
                task.cancel()
        say(f"faults done after {self.chaos_s:.0f}s: {self.injector.counts()}; quiescing")
        self.pinned = await self._phones_back()

    async def _phones_back(self) -> dict[str, str]:
        """Invariant 10: each phone that had a fault, ready again (released if its host
        left it quarantined), is given a task pinned to it."""
        operator = self.injector.operator
        hit = sorted(
            {f.target for f in self.injector.faults if f.kind in phones.KINDS + cleaning.KINDS}
        )
        pinned = {}
        for target in hit:
            host, serial = target.split("/", 1)
            if operator is not None:
                await operator.back_in_service(host, serial, phones.READY_WITHIN)
            pinned[target] = (await self.workload.submit_pinned(host, serial)).task_id
        return pinned

    async def quiesce(self) -> None:
        """No new faults or tasks, everything up; wait until nothing is in flight."""
        fixed = await self.farm.ensure_up()
        if fixed:
            self.problems.append(f"still down at the quiesce: {fixed}")
        if self.farm.emulator_world is not None:
            self.emulators_ready = await emulators.pool_ready(self.farm.dsn, 60)
        await self.workload.wait_cancellers(30)
        await self.workload.resubmit_unacknowledged()
        await self.workload.cancel_backlog()
        self._sampling.cancel()
        self._rss_sampling.cancel()
        self.soak_ended = time.time()
        if not await self.monitor.wait_settled(self.args.quiesce_timeout):
            self.problems.append(
                f"not settled within {self.args.quiesce_timeout:.0f}s: {self.monitor.counts}"
            )
        await asyncio.wait({self._opening}, timeout=doors.DOOR_BOUND + 5)
        await asyncio.wait({self._driving}, timeout=webdriver.QUEUE_TIMEOUT + 30)
        self._driving.cancel()
        await asyncio.sleep(0.5)
        self.run_ended = time.time()
        self.appium_left = await webdriver.left_open({a.host_id: a.log for a in self.farm.agents})
        codes = await self.farm.stop()
        self.problems += [
            f"{name} exited with {rc} at the end"
            for name, rc in codes.items()
            if rc not in (0, None)
        ]
        await self.workload.close()
        await self.sessions.close()
        if self.emulator_sessions is not None:
            await self.emulator_sessions.close()
        await self.screens.close()
        await self.doors.close()
        await self.webdriver.close()
        await self.monitor.close()

    async def check(self) -> dict[str, Any]:
        farm, injector = self.farm, self.injector
        ev = await evidence.load(
            farm.dsn,
            farm.action_logs(),
            farm.agent_logs(),
            farm.acquire_logs(),
            {r.name: r.log for r in farm.replicas},
        )
        freezes: dict[str, list[tuple[float, float]]] = {}
        for f in injector.faults:
            if f.kind in ("agent_freeze", "fleet_freeze"):
                for host in farm.hosts_of(f.target):
                    freezes.setdefault(host, []).append((f.started_at, f.healed_at or time.time()))
        dispatch = DispatchCheck(
            ev,
            {h.host_id for h in farm.fleet_hosts},
            fault_windows(injector.faults, farm.hosts_of),
            self.args.strand_bound,
            {s.task_id: s.selector for s in self.workload.tasks if s.task_id},
        )
        checks = Checks(
            ev,
            self.workload.tasks,
            freezes,
            farm.sim_delays(),
            self.config.lease_ttl,
            dispatch,
            self.sessions.records
            + (self.emulator_sessions.records if self.emulator_sessions else []),
        )
        violations = checks.run(self.monitor.findings)
        verdict = await phones.check(
            farm.dsn, ev.tasks, ev.events, ev.attempts, injector.faults, self.pinned
        )
        violations += [Violation(10, check, detail) for check, detail in verdict.violations]
        watched, viewed = screens.check(
            ev, self.screens.frames, self.screens.watches, self.workload.tasks
        )
        violations += [Violation(11, check, detail) for check, detail in watched]
        opened, door_figures = doors.check(ev, farm.action_logs(), self.doors.records)
        violations += [Violation(13, check, detail) for check, detail in opened]
        wd_sessions = (
            webdriver.appium_sessions(self.config.appium.logs) if self.config.appium else []
        )
        driven, wd_figures = webdriver.check(
            ev, wd_sessions, self.webdriver.records, self.appium_left
        )
        violations += [Violation(15, check, detail) for check, detail in driven]
        world = farm.emulator_world
        emulated = world.read_events() if world is not None else []
        cleans = cleaning.check(
            ev.cleans + emulators.clean_commands(emulated),
            ev.actions,
            ev.attempts,
            await cleaning.records(farm.dsn),
        )
        violations += [Violation(12, check, detail) for check, detail in cleans.violations]
        pool = emulators.check(
            emulated,
            ev.tasks,
            ev.attempts,
            ev.events,
            injector.faults,
            self.emulators_ready,
            self.run_ended,
        )
        if world is not None:
            violations += [Violation(14, check, detail) for check, detail in pool.violations]
        recovery.measure(injector.faults, ev)
        self._harness_problems()
        counts = injector.counts()
        kinds = injector.kinds
        window = self.args.soak_window
        soaked = (
            {
                "soak": soak.summary(
                    self.rss.samples,
                    ev,
                    injector.faults,
                    farm.hosts_of,
                    self.soak_began,
                    self.soak_ended,
                    min(window, (self.soak_ended - self.soak_began) / 3),
                    soak.stalls({r.name: r.log for r in farm.replicas}),
                )
            }
            if window
            else {}
        )
        return soaked | {
            "summary": {
                "passed": not violations and not self.problems,
                "violations": len(violations),
                "tasks": len(ev.tasks),
                "faults": sum(counts.values()),
                "faults_by_kind": counts,
                "duration_s": round(self.chaos_s, 1),
                "wall_s": round(time.monotonic() - self.began, 1),
                "seed": self.args.seed,
                "problems": self.problems,
            },
            "config": self._config_summary(),
            "tasks": report.task_summary(ev, checks.stats),
            "notable": report.notable(ev),
            "faults": report.fault_summary(injector.faults, kinds),
            "violations": grouped(violations),
            "dispatch": dispatch.summary(sum(1 for v in violations if v.invariant == 7)),
            "recovery": recovery.summary(injector.faults, kinds),
            "phones": phones.summary(injector.faults, verdict),
            "cleaning": cleaning.summary(injector.faults, cleans),
            "emulators": (
                emulators.summary(injector.faults, pool)
                | {
                    "tasks_by_start_snapshot": (
                        self.emulator_load.counts() if self.emulator_load else {}
                    ),
                    "sessions": (self.emulator_sessions.counts() if self.emulator_sessions else {}),
                }
                if world is not None
                else {}
            ),
            "failovers": [
                {"at": f.started_at, "error": f.error}
                | {k: v for k, v in f.detail.items() if k.endswith("_s")}
                for f in injector.faults
                if f.kind == "pg_failover"
            ],
            "sessions": self.sessions.counts(),
            "screens": viewed,
            "doors": door_figures | {"ends": self.doors.counts(), "broken": self.doors.broken()},
            "webdriver": (
                wd_figures | {"ends": self.webdriver.counts(), "broken": self.webdriver.broken()}
                if self.config.appium
                else {"skipped": self.webdriver_skipped}
            ),
            "session_errors": self.sessions.errors(),
            "clients": {
                "submit_retries": self.workload.counters.submit_retries,
                "cancel_retries": self.workload.counters.cancel_retries,
                "watch_reconnects": self.workload.counters.watch_reconnects,
                "unexpected_codes": self.workload.counters.unexpected,
            },
            "process_errors_logged": report.process_errors(
                {r.name: r.log for r in farm.replicas} | farm.agent_logs()
            ),
            "monitor": {
                "samples": self.monitor.samples,
                "failed_samples": self.monitor.failed_samples,
            },
        }

    def _harness_problems(self) -> None:
        counts = self.injector.counts()
        short = {k: n for k, n in counts.items() if n < self.args.min_per_kind}
        if short:
            self.problems.append(f"fault kinds injected fewer than the minimum: {short}")
        self.problems += [
            f"{f.kind} on {f.target} failed: {f.error}" for f in self.injector.faults if f.error
        ]
        unfired = sorted(
            {f.kind for f in self.injector.faults if f.kind in emulators.KINDS}
            - {f.kind for f in self.injector.faults if f.detail.get("fired")}
        )
        if unfired:
            self.problems.append(f"emulator fault kinds that never fired: {unfired}")
        internal = self.workload.counters.unexpected.get("INTERNAL")
        if internal:
            self.problems.append(f"clients were answered INTERNAL {internal} times")

    def _config_summary(self) -> dict[str, Any]:
        c = self.config
        return {
            "replicas": c.replicas,
            "agents": c.agents,
            "devices_per_agent": c.devices,
            "fleet_hosts": c.hosts,
            "fleet_devices_per_host": c.fleet_devices,
            "fleet_processes": len(self.farm.fleet),
            "fleet_acquire_wait_s": c.fleet_acquire_wait,
            "fleet_nice": c.fleet_nice,
            "strand_bound_s": self.args.strand_bound,
            "target_backlog": self.target_backlog,
            "unmatched_backlog": self.args.backlog,
            "fair_shares": FAIR_SHARES,
            "tasks_by_team": dict(Counter(t.team for t in self.workload.tasks)),
            "lease_ttl_s": c.lease_ttl,
            "sweep_interval_s": c.sweep_interval,
            "max_connection_age_s": c.max_connection_age,
            "sim_delays_s": self.farm.sim_delays(),
            "auth": not c.insecure,
            "min_per_kind": self.args.min_per_kind,
            "max_concurrent_faults": self.args.max_concurrent,
            "fault_gap_s": list(self.args.fault_gap),
            "workdir": str(c.workdir),
        }


async def set_fair_shares(address: str, token: str | None) -> None:
    """The teams' weights, as an operator sets them (Admin SetFairShare)."""
    channel = with_token(grpc.aio.insecure_channel(address), token)
    admin = admin_pb2_grpc.AdminStub(channel)
    try:
        for key, weight in FAIR_SHARES.items():
            request = admin_pb2.SetFairShareRequest(
                fairness_key=key, weight=weight, reason="chaos: two teams"
            )
            await admin.SetFairShare(request, timeout=10)
    finally:
        await channel.close()


# How long a run told to stop (SIGTERM) may take to wind down before the farm is killed and
# the process ends at once, with every thread's stack on stderr to show what held it.
STOP_WITHIN = 30.0


def _stop_within(seconds: float, farm: Farm) -> None:
    """A last resort that cannot itself wait on the event loop: a daemon thread."""

    def expire() -> None:
        say(f"still stopping after {seconds:.0f}s: killing the farm and exiting; stacks follow")
        faulthandler.dump_traceback(all_threads=True)
        farm.kill_everything()
        sys.stdout.flush()
        os._exit(2)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


async def run(args: argparse.Namespace) -> int:
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="amc-chaos-", dir="/tmp"))
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o755)  # PostgreSQL runs as its own user and must reach its data
    say(f"seed {args.seed}; work directory {workdir}")
    chaos = ChaosRun(args, workdir)
    # SIGTERM (a CI timeout, `kill`) stops the run as Ctrl-C does: the farm with it.
    main_task = asyncio.current_task()
    assert main_task is not None

    def stop() -> None:
        main_task.cancel()
        _stop_within(STOP_WITHIN, chaos.farm)

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop)
    try:
        await chaos.start()
        await chaos.break_things()
        await chaos.quiesce()
        results = await chaos.check()
        await chaos.farm.stop_database()
    except BaseException:
        chaos.farm.kill_everything()
        say(f"harness failed; logs kept in {workdir}")
        raise
    report.write(args.output, results)
    print(report.table(results))
    if "soak" in results:
        print(soak.table(results["soak"]))
    for n, f in enumerate(results["failovers"], 1):
        say(
            f"failover {n}: serving {f.get('serving_after_promotion_s')}s after the promotion"
            f" (promoted {f.get('promote_s')}s after the crash, rejoined in {f.get('rejoin_s')}s)"
        )
    say(f"results in {args.output}")
    passed = bool(results["summary"]["passed"])
    if passed and not args.keep and args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        say(f"logs and data kept in {workdir}")
    return 0 if passed else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        say("stopped: the farm is stopped too")
        return 2
    except Exception:
        traceback.print_exc()
        say("error: the harness failed (exit status 2)")
        return 2


if __name__ == "__main__":
    sys.exit(main())
