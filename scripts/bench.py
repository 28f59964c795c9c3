#!/usr/bin/env python3
"""`make bench`: AMC's throughput and latencies, beside PostgreSQL's ceiling and a peer queue,
all measured in one run on this machine (issue 5).

Starts an embedded PostgreSQL (durable, default settings), the control plane and host agents
as separate processes (simulated devices), then runs, in this order:

  5 ceiling    pgbench single-row UPDATE TPS, 1 and 8 clients (and 8 with a NOTIFY), same server
  1 lifecycle  --tasks no-op tasks through 4 agents x 25 devices, first submit -> last done
  2 pickup     --trials submits to an idle device: submit -> dispatched / first action
  3 cancel     --trials cancels of running tasks (10 ms steps): -> runner stopped -> cancelled
  4 renewal    --leases leases renewed back to back for --renew-seconds by fake hosts
  6 peer       ../shared/bench/peers/run-pgqueuer, when that folder exists
  7 fleet      --fleet-hosts N hosts x 4 devices (one rack each) in one load process, tasks at
               --fleet-rate/s for --fleet-seconds, each for a random rack: pickup, CPU per
               task, RSS per connected host, idle CPU; N each on a fresh control plane, then
               --fleet-replica-hosts across two replicas (issue 10). All hosts park at once;
               the window holds two re-poll periods (--fleet-acquire-wait, 60 s), and a
               --fleet-short-wait-share of the hosts long-polls for 10 s (issue 20); in the
               window every host's phones but one run workflows whose hosts report a step
               every --fleet-step-every s per phone with their renewals (issue 27.8); after
               the idle window --fleet-condition-churn (1 %) of the phones change condition
               a minute, as probe rounds report them: a second idle window gives the CPU
               they add, and they go on through the submit window (issue 22)
  8 deep       the fleet load at --deep-hosts on an empty database, then on one holding
               --deep-history finished tasks (bulk SQL) and --deep-queued tasks no host can
               take, and at --deep-big-hosts on that (issue 20)
  9 flood      team A queues --flood-tasks tasks of --flood-task-seconds for --flood-phones
               phones, team B submits one a second: B's pickup, A's drain rate (issue 20)
 10 session    --session-sizes concurrent interactive sessions on simulated phones (0 ms),
               taps back to back for --session-seconds: round trip through AMC beside the
               same taps straight to a phone, actions/s, CPU per action; then
               --session-starts opens on an idle phone one after another (issue 23)
 11 screen     live screens of --screen-phones simulated phones: frames captured with
               nobody watching, frames/s to one viewer, click-to-frame latency through a
               session (--screen-clicks taps), control-plane CPU of one viewer per phone
               (issue 24)
 12 mcp        --mcp-clients MCP clients (in --mcp-processes processes) on one `amc mcp
               --http`, each its own session on its own simulated phone, --mcp-actions taps
               each ~--mcp-think s apart: answers lost or crossed, round trip beside the
               client library's, CPU per tap (issue 39)

--reps repeats lifecycle, ceiling and the peer's drains: each of their figures is reported
as min / median / max over the repetitions. Pickup and cancel are --trials trials each (p50 /
p99 over the trials); renewal is one window (with min / median / max over its 1-s slices).
Prints a table and writes bench-results.json. The default run (--reps 1) takes about 25
minutes on a 2-core machine (fleet ~10, deep ~10, flood ~2; the other workloads ~3).
--quick is a smoke run of about a minute and a half without the peer (its fleet: 10
hosts, 3 s; deep and flood at toy sizes). Only some: `make bench ARGS='--only fleet'`,
`--only deep,flood`. --profile adds py-spy and pg_stat_statements (slower: its figures
are for finding costs, not for quoting).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_lib import (
    ceiling,
    deep,
    fleet,
    flood,
    latency,
    lifecycle,
    mcp_agents,
    peer,
    pgstats,
    profiling,
    promtext,
    renewal,
    report,
    screen,
    session,
)
from bench_lib.client import Client, Clock
from bench_lib.pgstats import Db
from bench_lib.stack import AgentSpec, Stack, workdir

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = (
    "ceiling",
    "lifecycle",
    "pickup",
    "cancel",
    "renewal",
    "peer",
    "fleet",
    "deep",
    "flood",
    "session",
    "screen",
    "mcp",
)
DRAIN_AGENTS = 4
DRAIN_DEVICES = 25
LATENCY_DEVICES = 4


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--tasks", type=int, default=5000, help="lifecycle tasks per repetition")
    p.add_argument("--reps", type=int, default=1, help="repetitions of lifecycle/ceiling/peer")
    p.add_argument("--trials", type=int, default=200, help="pickup and cancel trials each")
    p.add_argument("--warmup", type=int, default=5, help="untimed trials before those")
    p.add_argument("--leases", type=int, default=10_000, help="leases held for the renewals")
    p.add_argument("--renew-hosts", type=int, default=10, help="fake hosts (streams) holding them")
    p.add_argument("--renew-seconds", type=float, default=30.0, help="renewal window")
    p.add_argument("--pgbench-seconds", type=float, default=5.0, help="each pgbench run")
    p.add_argument("--concurrency", type=int, default=32, help="SubmitTask calls in flight")
    p.add_argument(
        "--submit-batch",
        type=int,
        default=50,
        help="lifecycle tasks per SubmitTasks call; then again one SubmitTask each (1: only that)",
    )
    p.add_argument("--lease-ttl", type=float, default=60.0, help="control plane --lease-ttl")
    p.add_argument("--peer-dir", type=Path, default=ROOT.parent / "shared" / "bench" / "peers")
    p.add_argument("--peer-jobs", type=int, default=20_000, help="pgqueuer drain jobs")
    p.add_argument("--peer-trials", type=int, default=0, help="pgqueuer latency trials (~2 s each)")
    p.add_argument("--no-peer", action="store_true", help="skip the pgqueuer run")
    p.add_argument(
        "--fleet-hosts", default="10,1000,5000", help="fleet sizes, one run each (one replica)"
    )
    p.add_argument("--fleet-rate", type=float, default=20.0, help="fleet tasks submitted per s")
    p.add_argument(
        "--fleet-seconds",
        type=float,
        default=None,
        help="fleet (and deep) submit window (default: two re-poll periods, 120 s)",
    )
    p.add_argument(
        "--fleet-acquire-wait", type=float, default=60.0, help="fleet hosts' Acquire wait, s"
    )
    p.add_argument(
        "--fleet-short-wait", type=float, default=10.0, help="the short-wait hosts' wait, s"
    )
    p.add_argument(
        "--fleet-short-wait-share",
        type=float,
        default=0.25,
        help="share of the fleet's hosts with the short wait (0: none)",
    )
    p.add_argument("--fleet-idle-seconds", type=float, default=10.0, help="fleet idle-CPU window")
    p.add_argument(
        "--fleet-step-every",
        type=float,
        default=3.0,
        help="fleet: in the submit window every host's phones but one run a workflow whose"
        " host reports a step every this many seconds per phone (issue 27.8; 0: none)",
    )
    p.add_argument(
        "--fleet-condition-churn",
        type=float,
        default=0.01,
        help="fleet: share of the phones changing condition a minute after the idle window,"
        " reported as the agent's probe rounds (issue 22; 0: none); a second idle window"
        " says the CPU they add, and they run on through the submit window",
    )
    p.add_argument(
        "--fleet-replica-hosts",
        type=int,
        default=1000,
        help="hosts of the two-replica fleet run (0: none)",
    )
    p.add_argument(
        "--fleet-lease-ttl",
        type=float,
        default=15.0,
        help="the fleet replicas' --lease-ttl (15, their default: hosts renew every 5 s)",
    )
    p.add_argument(
        "--fleet-hosts-per-channel",
        type=int,
        default=1,
        help="fleet hosts sharing one gRPC channel (1: a connection per host, as a farm)",
    )
    p.add_argument("--deep-hosts", type=int, default=1000, help="deep: hosts of the runs")
    p.add_argument(
        "--deep-big-hosts", type=int, default=5000, help="deep: hosts of the big run (0: none)"
    )
    p.add_argument(
        "--deep-queued", type=int, default=100_000, help="deep: queued tasks no host can take"
    )
    p.add_argument(
        "--deep-history", type=int, default=1_000_000, help="deep: finished tasks (bulk SQL)"
    )
    p.add_argument(
        "--deep-selectors", type=int, default=200, help="deep: the backlog's distinct selectors"
    )
    p.add_argument("--flood-tasks", type=int, default=50_000, help="flood: team A's tasks")
    p.add_argument("--flood-phones", type=int, default=40, help="flood: phones (4 per host)")
    p.add_argument(
        "--flood-task-seconds", type=float, default=1.0, help="flood: each task's length"
    )
    p.add_argument("--flood-seconds", type=float, default=120.0, help="flood: team B's window")
    p.add_argument("--flood-b-rate", type=float, default=1.0, help="flood: team B's tasks per s")
    p.add_argument(
        "--session-sizes", default="1,50,200", help="session: concurrent sessions, each size"
    )
    p.add_argument("--session-seconds", type=float, default=10.0, help="session: each window")
    p.add_argument("--session-starts", type=int, default=50, help="session: starts measured")
    p.add_argument("--screen-phones", type=int, default=20, help="screen: phones (and viewers)")
    p.add_argument("--screen-seconds", type=float, default=10.0, help="screen: each window")
    p.add_argument(
        "--screen-idle-seconds", type=float, default=10.0, help="screen: nobody watching for"
    )
    p.add_argument("--screen-clicks", type=int, default=50, help="screen: taps timed to a frame")
    p.add_argument("--mcp-clients", type=int, default=100, help="mcp: MCP clients (and phones)")
    p.add_argument("--mcp-actions", type=int, default=20, help="mcp: taps of each client")
    p.add_argument("--mcp-think", type=float, default=0.5, help="mcp: mean s between taps")
    p.add_argument("--mcp-processes", type=int, default=4, help="mcp: processes of agents")
    p.add_argument("--only", default=",".join(WORKLOADS), help="comma-separated workloads")
    p.add_argument("--out", type=Path, default=ROOT / "bench-results.json")
    p.add_argument("--workdir", type=Path, default=None, help="keep data, logs, profiles here")
    p.add_argument("--quick", action="store_true", help="tiny sizes, no peer: a smoke run")
    p.add_argument("--profile", action="store_true", help="py-spy + pg_stat_statements")
    p.add_argument(
        "--pythonpath",
        type=Path,
        default=None,
        help="first on the control plane's and agents' PYTHONPATH (to measure a patched copy)",
    )
    args = p.parse_args(argv)
    if args.quick:
        args.tasks, args.reps, args.trials, args.warmup = 200, 1, 20, 2
        args.leases, args.renew_hosts, args.renew_seconds = 1000, 2, 3.0
        args.pgbench_seconds, args.no_peer = 1.0, True
        args.fleet_hosts, args.fleet_seconds, args.fleet_idle_seconds = "10", 3.0, 2.0
        args.fleet_replica_hosts = 10
        # Enough condition changes on 40 phones that some are reported in the short run.
        args.fleet_condition_churn = 1.0
        # Waits short enough that the 3-s window still holds two re-poll periods.
        args.fleet_acquire_wait, args.fleet_short_wait = 1.0, 0.5
        args.deep_hosts, args.deep_big_hosts, args.deep_selectors = 10, 0, 20
        args.deep_queued, args.deep_history = 1000, 5000
        args.flood_tasks, args.flood_phones, args.flood_task_seconds = 400, 8, 0.2
        args.flood_seconds, args.flood_b_rate = 3.0, 5.0
        args.session_sizes, args.session_seconds, args.session_starts = "1,10", 2.0, 5
        args.screen_phones, args.screen_seconds, args.screen_idle_seconds = 4, 2.0, 2.0
        args.screen_clicks = 5
        args.mcp_clients, args.mcp_actions, args.mcp_think, args.mcp_processes = 10, 5, 0.2, 2
    if args.fleet_seconds is None:
        args.fleet_seconds = 2 * max(args.fleet_acquire_wait, args.fleet_short_wait)
    args.only = {w.strip() for w in args.only.split(",") if w.strip()}
    unknown = args.only - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    try:
        args.fleet_hosts = [int(n) for n in str(args.fleet_hosts).split(",") if n.strip()]
    except ValueError:
        p.error("--fleet-hosts: comma-separated host counts, e.g. 10,1000,5000")
    if any(n < 1 for n in args.fleet_hosts) or args.fleet_rate <= 0:
        p.error("--fleet-hosts must be >= 1 and --fleet-rate > 0")
    if args.profile:
        profiling.py_spy()
    return args


def say(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = workdir(args.workdir)
        self.stack = Stack(self.work, lease_ttl=args.lease_ttl, pythonpath=args.pythonpath)
        self.results: dict[str, Any] = {}
        self.phases: dict[str, float] = {}
        self.profiles: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def phase(self, name: str) -> AsyncIterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(time.monotonic() - started, 1)

    async def main(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "machine": report.machine(),
            "versions": report.versions(ROOT),
            "settings": {k: sorted(v) if isinstance(v, set) else str(v)
                         for k, v in vars(self.args).items()},
            "results": self.results,
            "phases_s": self.phases,
        }  # fmt: skip
        started = time.monotonic()
        try:
            say(f"embedded PostgreSQL (durable) in {self.work}")
            async with self.phase("postgres start"):
                self.stack.start_postgres(profiling.PG_SETTINGS if self.args.profile else None)
                doc["postgres"] = await pgstats.settings(self.stack.dsn)
            if "ceiling" in self.args.only:
                await self.ceiling()
            if self.args.only & {"lifecycle", "pickup", "cancel", "renewal"}:
                await self.amc_workloads()
            if "session" in self.args.only:
                await self.sessions()
            if "screen" in self.args.only:
                await self.screens()
            if "mcp" in self.args.only:
                await self.mcp()
            if "fleet" in self.args.only:
                await self.fleet()
            if "deep" in self.args.only:
                await self.deep()
            if "flood" in self.args.only:
                await self.flood()
        finally:
            say("stopping the stack")
            self.stack.stop()
        if "peer" in self.args.only:
            await self.peer()
        self.results["ratios"] = ratios(self.results)
        if self.profiles:
            doc["profile"] = self.profiles
        doc["machine"]["loadavg_at_end"] = os.getloadavg()
        doc["duration_s"] = round(time.monotonic() - started, 1)
        if self.args.workdir is None:
            shutil.rmtree(self.work, ignore_errors=True)
        return doc

    # -- workloads -------------------------------------------------------------------------

    async def ceiling(self) -> None:
        a = self.args
        say(f"ceiling: pgbench 1-row UPDATE, 1/8/8+NOTIFY clients, {a.pgbench_seconds:g}s each")
        async with self.phase("ceiling"):
            script = await ceiling.prepare(self.stack.dsn, self.work)
            reps = [
                await ceiling.run_once(self.stack.dsn, script, a.pgbench_seconds)
                for _ in range(a.reps)
            ]
        self.results["ceiling"] = ceiling.aggregate(reps)

    async def amc_workloads(self) -> None:
        st, a = self.stack, self.args
        say("control plane and host agents")
        async with self.phase("stack start"):
            await st.start_control_plane()
            for i in range(DRAIN_AGENTS):
                st.start_agent(AgentSpec(f"drain-{i}", DRAIN_DEVICES, 0, lifecycle.POOL))
            st.start_agent(
                AgentSpec(latency.HOST, LATENCY_DEVICES, 0.01, latency.POOL, action_log=True)
            )
            await wait_agents_parked(st, DRAIN_AGENTS + 1)
        clock = Clock()
        client = Client.connect(st.address)
        db = await Db.connect(st.dsn)
        try:
            if "lifecycle" in a.only:
                await self.lifecycle(client, db, clock)
            if a.only & {"pickup", "cancel"}:
                say(f"pickup and cancel latency: {a.trials} trials each")
                async with self.phase("latency"), self.profiled("latency", latency.HOST, 120):
                    self.results["latency"] = await latency.run(
                        st, client, db, clock, a.trials, a.warmup
                    )
            st.check_alive()
        finally:
            await client.close()
            await db.close()
        if "renewal" in a.only:
            st.stop_agents()  # the fake hosts alone, so the CPU figures are the renewals'
            say(f"renewal: {a.leases} leases on {a.renew_hosts} streams, {a.renew_seconds:g}s")
            options = renewal.Options(a.leases, a.renew_seconds, a.renew_hosts)
            window = a.renew_seconds + 5
            async with self.phase("renewal"):
                self.results["renewal"] = await renewal.run(
                    st, options, self.profiled("renewal", None, window)
                )

    async def sessions(self) -> None:
        a, st = self.args, self.stack
        if st.control_plane is None:
            await st.start_control_plane()
        sizes = tuple(int(n) for n in a.session_sizes.split(",") if n.strip())
        options = session.Options(sizes, a.session_seconds, a.session_starts)
        async with self.phase("session"):
            self.results["session"] = await session.run(st, options, say)

    async def screens(self) -> None:
        a, st = self.args, self.stack
        if st.control_plane is None:
            await st.start_control_plane()
        options = screen.Options(
            a.screen_phones, a.screen_seconds, a.screen_idle_seconds, a.screen_clicks
        )
        async with self.phase("screen"):
            self.results["screen"] = await screen.run(st, options, say)

    async def mcp(self) -> None:
        a, st = self.args, self.stack
        if st.control_plane is None:
            await st.start_control_plane()
        options = mcp_agents.Options(a.mcp_clients, a.mcp_actions, a.mcp_think, a.mcp_processes)
        async with self.phase("mcp"):
            self.results["mcp"] = await mcp_agents.run(st, options, say)

    def stop_amc(self) -> None:
        """The fleet's, deep's and flood's control planes alone on the machine: the other
        workloads' control plane and agents are stopped."""
        st = self.stack
        st.stop_agents()
        if st.control_plane is not None:
            st.control_plane.stop()
            st.control_plane = None

    def fleet_options(self) -> fleet.Options:
        a = self.args
        return fleet.Options(
            hosts=tuple(a.fleet_hosts),
            rate=a.fleet_rate,
            seconds=a.fleet_seconds,
            idle_seconds=a.fleet_idle_seconds,
            replica_hosts=a.fleet_replica_hosts,
            lease_ttl=a.fleet_lease_ttl,
            hosts_per_channel=a.fleet_hosts_per_channel,
            acquire_wait=a.fleet_acquire_wait,
            short_wait=a.fleet_short_wait,
            short_wait_share=a.fleet_short_wait_share,
            step_every=a.fleet_step_every,
            condition_churn=a.fleet_condition_churn,
        )

    async def fleet(self) -> None:
        self.stop_amc()
        async with self.phase("fleet"):
            self.results["fleet"] = await fleet.run(self.stack, self.fleet_options(), say)

    async def deep(self) -> None:
        a = self.args
        self.stop_amc()
        options = deep.Options(
            # The deep workload's figures stay comparable with its earlier runs: no
            # condition changes there (the fleet measures them).
            fleet=dataclasses.replace(self.fleet_options(), condition_churn=0.0),
            hosts=a.deep_hosts,
            big_hosts=a.deep_big_hosts,
            queued=a.deep_queued,
            history=a.deep_history,
            selectors=a.deep_selectors,
        )
        async with self.phase("deep"):
            self.results["deep"] = await deep.run(self.stack, options, say)

    async def flood(self) -> None:
        a = self.args
        self.stop_amc()
        options = flood.Options(
            tasks=a.flood_tasks,
            phones=a.flood_phones,
            task_seconds=a.flood_task_seconds,
            seconds=a.flood_seconds,
            b_rate=a.flood_b_rate,
            lease_ttl=a.fleet_lease_ttl,
        )
        async with self.phase("flood"):
            self.results["flood"] = await flood.run(self.stack, options, say)

    async def lifecycle(self, client: Client, db: Db, clock: Clock) -> None:
        a = self.args
        # Batched first (the headline figure), then one SubmitTask per task.
        variants = [("lifecycle", a.submit_batch)]
        if a.submit_batch > 1:
            variants.append(("lifecycle_single", 1))
        for key, batch in variants:
            reps = []
            how = f"SubmitTasks x {batch}" if batch > 1 else "one SubmitTask each"
            for rep in range(a.reps):
                say(f"lifecycle {rep + 1}/{a.reps}: {a.tasks} tasks, {how}")
                options = lifecycle.Options(a.tasks, a.concurrency, batch)
                first = rep == 0 and key == "lifecycle"
                profile = self.profiled("lifecycle", "drain-0", 120) if first else _nothing()
                async with self.phase(f"{key} {rep + 1}"), profile:
                    reps.append(await lifecycle.run_once(self.stack, client, db, clock, options))
                say(f"  {reps[-1]['tasks_per_s']:.0f} tasks/s, verified={reps[-1]['verified']}")
                await wait_agents_parked(self.stack, DRAIN_AGENTS + 1)
            self.results[key] = lifecycle.aggregate(reps)

    async def peer(self) -> None:
        a = self.args
        script = None if a.no_peer else peer.find(a.peer_dir)
        if script is None:
            self.results["peer_skipped"] = "--no-peer" if a.no_peer else f"no {a.peer_dir}"
            return
        say(f"peer: {script} --reps {a.reps} --n {a.peer_jobs} --trials {a.peer_trials}")
        async with self.phase("peer"):
            self.results["peer"] = await peer.run(
                script, a.reps, a.peer_jobs, a.peer_trials, self.work / "peer.log"
            )

    # -- --profile -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def profiled(self, name: str, agent: str | None, seconds: float) -> AsyncIterator[None]:
        if not self.args.profile:
            yield
            return
        st = self.stack
        assert st.control_plane is not None
        await profiling.reset_statements(st.dsn)
        pids = {"control-plane": st.control_plane.pid}
        if agent:
            pids[agent] = st.agents[agent].pid
        recordings = [
            await profiling.start(f"{name}-{proc}", pid, self.work, seconds)
            for proc, pid in pids.items()
        ]
        try:
            async with profiling.WaitSampler(st.dsn) as waits:
                yield
        finally:
            self.profiles[name] = {
                "py_spy": {r.name: await profiling.finish(r) for r in recordings},
                "statements": await profiling.top_statements(st.dsn),
                "postgres_waits": waits.summary(),
            }


@contextlib.asynccontextmanager
async def _nothing() -> AsyncIterator[None]:
    yield


async def wait_agents_parked(st: Stack, agents: int, within: float = 60.0) -> None:
    """Every agent registered and holding an Acquire long poll: the farm is idle."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        st.check_alive()
        samples = await promtext.scrape(st.metrics_url)
        if promtext.value(samples, "amc_acquires_waiting") >= agents:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the {agents} agents did not all park an Acquire within {within:.0f}s")


def ratios(results: dict[str, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    lc = results.get("lifecycle")
    if not lc:
        return out
    amc = lc["tasks_per_s"]["median"]
    ce = results.get("ceiling")
    if ce:
        out["lifecycle_vs_tps_1"] = amc / ce["tps_1_client"]["median"]
        out["lifecycle_vs_tps_8"] = amc / ce["tps_8_clients"]["median"]
    pe = results.get("peer")
    if pe:
        for variant, fig in pe["drain_per_s"].items():
            out[f"lifecycle_vs_pgqueuer_{variant}"] = amc / fig["median"]
            if single := results.get("lifecycle_single"):
                out[f"lifecycle_single_vs_pgqueuer_{variant}"] = (
                    single["tasks_per_s"]["median"] / fig["median"]
                )
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    doc = asyncio.run(Run(args).main())
    rows = report.rows(doc["results"]) + mcp_agents.rows(doc["results"].get("mcp"))
    doc["table"] = [r.__dict__ for r in rows]
    doc["table_markdown"] = report.markdown(rows)
    report.write_json(args.out, doc)
    print(report.table(rows))
    say(f"{doc['duration_s']:.0f}s {doc['phases_s']}; results in {args.out}")
    ok = all(
        doc["results"].get(key, {}).get("verified", True)
        for key in (
            *("lifecycle", "lifecycle_single", "fleet", "deep", "flood", "session", "screen"),
            "mcp",
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
