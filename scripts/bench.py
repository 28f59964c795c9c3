#!/usr/bin/env python3
"""`make bench`: AMC's throughput and latencies, beside PostgreSQL's ceiling and a peer queue,
all measured in one run on this machine, with the CPU each unit of work costs beside every
latency (CPU per unit carries across machines; a latency on a shared machine does not).

Starts an embedded PostgreSQL (durable, default settings), the control plane and host agents
as separate processes (simulated devices), prints its plan (each workload, the sizes it
chose, about how long it takes) and runs, in this order:

  5 ceiling    pgbench single-row UPDATE TPS, 1 and 8 clients (and 8 with a NOTIFY), same server
  4 renewal    --leases leases renewed back to back for --renew-seconds by fake hosts, on the
               fresh database (and again at the end)
  1 lifecycle  --tasks no-op tasks through 4 agents x 25 devices, first submit -> last done
  2 pickup     --trials submits to an idle device: submit -> dispatched / first action
  3 cancel     --trials cancels of running tasks (10 ms steps): -> runner stopped -> cancelled
 10 session    --session-sizes concurrent interactive sessions on simulated phones (0 ms),
               taps back to back for --session-seconds: round trip through AMC beside the
               same taps straight to a phone, actions/s, CPU per action; the same paced
               at --session-rate taps/s per session (where sizes x rate <= 1,000/s); then
               --session-starts opens on an idle phone one after another
 11 screen     live screens of --screen-phones simulated phones: frames captured with
               nobody watching, frames/s to one viewer, click-to-frame latency through a
               session (--screen-clicks taps), control-plane CPU of one viewer per phone
 13 adb        an adb door (`amc adb`) with the real adb client: --adb-shells `adb shell`
               round trips through it beside the same straight to the phone on the same
               adb server, and a push of --adb-push-mb MB on each path
 14 mcp        --mcp-clients MCP clients (in --mcp-processes processes) on one `amc mcp
               --http`, each its own session on its own simulated phone, --mcp-actions taps
               each ~--mcp-think s apart: answers lost or crossed, round trip beside the
               client library's, CPU per tap
 17 webdriver  the WebDriver endpoint (/wd/hub) with a real Appium and its fake driver:
               --webdriver-sessions new sessions through the farm (queue, lease, Appium's
               session) beside Appium's own, and --webdriver-requests GET /source through
               it beside Appium straight: the farm's part of each, CPU per request
 15 episodes   agent-style sessions on a pool of --episodes-emulators emulator doubles
               (a host agent's --emulator pool; snapshot load --episodes-load s): each
               session from the pool's snapshot, 20 taps, closed, for --episodes-seconds:
               episodes/hour/emulator beside the ideal, lease-to-first-action, AMC's own
               part of each reset between leases (the reset less the load)
 16 install    a --install-mb MB APK onto --install-phones simulated phones of
               --install-hosts hosts at once: bytes the control plane sent (the APK's size
               times the hosts, never the phones), each install's time
  7 fleet      --fleet-hosts N hosts x 4 devices (one rack each) in one load process, tasks at
               --fleet-rate/s for --fleet-seconds, each for a random rack: pickup, CPU per
               task, RSS per connected host, idle CPU; N each on a fresh control plane, then
               --fleet-replica-hosts across two replicas. All hosts park at once; the window
               holds two re-poll periods (--fleet-acquire-wait, 60 s), and a
               --fleet-short-wait-share of the hosts long-polls for 10 s; before the window
               every host's phones but one start workflows whose hosts report a step every
               --fleet-step-every s per phone with their renewals (a window of them alone
               gives the CPU per step result); after the idle window
               --fleet-condition-churn (1 %) of the phones change condition a minute, as
               probe rounds report them: a second idle window gives the CPU they add, and
               they go on through the submit window
  8 deep       the fleet load at --deep-hosts on an empty database, then on one holding
               --deep-history finished tasks (bulk SQL) and --deep-queued tasks no host can
               take (and at --deep-big-hosts on that, with --big)
  9 flood      team A queues --flood-tasks tasks of --flood-task-seconds for --flood-phones
               phones, team B submits one a second: B's pickup, A's drain rate
 12 plans      the hot statements' plans (acquire, renew, report, submit, step progress,
               give-back; custom and generic) on a fresh database, beside --plans-history
               finished tasks without ANALYZE, analysed, and with stale statistics
               (tests/test_query_plans.py, run here at this size)
  4 renewal    again, on a fresh control plane, after every other workload: the database
               holds what they left, its statistics what autovacuum made of it
  6 peer       ../shared/bench/peers/run-pgqueuer, when that folder exists

Each workload's rows are written to bench-results.json (--out) when it ends, merged with
the rows before it, so a run that is stopped or fails later keeps them. A workload that
fails is recorded with its error and the run goes on; a phase that cannot reach its load
(hosts parked, busy phones running) records how far it got, marked "load not reached", and
goes on with what it has (its targets are then not judged).

--reps repeats lifecycle, ceiling and the peer's drains: each of their figures is reported
as min / median / max over the repetitions. Pickup and cancel are --trials trials each (p50 /
p99 over the trials); renewal is one window (with min / median / max over its 1-s slices).
The default run fits in 30 minutes on a 2-core machine (at load 10-13); --big adds the 5,000-host
fleet and deep runs (10 minutes more at best). --quick is a smoke run of a few minutes
without the peer.
Only some: `make bench ARGS='--only fleet'`, `--only deep,flood`. --profile adds py-spy and
pg_stat_statements (slower: its figures are for finding costs, not for quoting).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_lib import (
    adb_door,
    ceiling,
    deep,
    episodes,
    fleet,
    flood,
    install,
    latency,
    lifecycle,
    mcp_agents,
    options,
    peer,
    pgstats,
    profiling,
    promtext,
    renewal,
    report,
    screen,
    session,
    webdriver,
)
from bench_lib.client import Client, Clock
from bench_lib.pgstats import Db
from bench_lib.stack import AgentSpec, Stack, workdir

ROOT = options.ROOT
DRAIN_AGENTS = 4
DRAIN_DEVICES = 25
LATENCY_DEVICES = 4
PLANS_TEST = (
    "tests/test_query_plans.py"
    "::test_hot_statements_reach_their_rows_by_key_whatever_the_statistics_say"
)


def parse(argv: list[str]) -> argparse.Namespace:
    return options.parse(argv, __doc__ or "")


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
        self.started = time.monotonic()
        self.doc: dict[str, Any] = {
            "machine": report.machine(),
            "versions": report.versions(ROOT),
            "settings": options.settings(args),
            "plan": [
                {"workload": w, "sizes": what, "estimated_s": round(sec)}
                for w, what, sec in options.plan(args)
            ],
            "results": self.results,
            "phases_s": self.phases,
            "complete": False,
        }

    @contextlib.asynccontextmanager
    async def phase(self, name: str) -> AsyncIterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = round(time.monotonic() - started, 1)

    def save(self) -> None:
        """bench-results.json as the run stands: every row so far (rewritten whole, by a
        rename, so that a reader never sees half of it)."""
        self.results["ratios"] = ratios(self.results)
        if self.profiles:
            self.doc["profile"] = self.profiles
        self.doc["duration_s"] = round(time.monotonic() - self.started, 1)
        rows = report.rows(self.results)
        self.doc["table"] = [r.__dict__ for r in rows]
        self.doc["table_markdown"] = report.markdown(rows)
        report.write_json(self.args.out, self.doc)

    @contextlib.asynccontextmanager
    async def workload(self, key: str) -> AsyncIterator[None]:
        """One workload: its time in phases_s, its rows saved when it ends; if it fails, the
        error is kept (results["errors"][key], its log beside the run's) and the run goes
        on to the next workload."""
        started = time.monotonic()
        try:
            yield
        except Exception as exc:
            # Where in the bench's own code it failed: a bare TimeoutError says nothing else.
            ours = [f for f in traceback.extract_tb(exc.__traceback__) if "/scripts/" in f.filename]
            where = f" at {Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else ""
            message = f"{type(exc).__name__}{where}: {exc}"
            self.results.setdefault("errors", {})[key] = message[:3000]
            (self.work / f"error-{key}.txt").write_text(traceback.format_exc())
            say(f"{key} failed ({message[:300]}); its rows so far are kept, the run goes on")
        finally:
            self.phases[key] = round(time.monotonic() - started, 1)
            self.save()

    async def main(self) -> dict[str, Any]:
        a = self.args
        for line in options.describe(a):
            say(line)
        try:
            say(f"embedded PostgreSQL (durable) in {self.work}")
            async with self.phase("postgres start"):
                self.stack.start_postgres(profiling.PG_SETTINGS if a.profile else None)
                self.doc["postgres"] = await pgstats.settings(self.stack.dsn)
            self.save()
            if "ceiling" in a.only:
                async with self.workload("ceiling"):
                    await self.ceiling()
            if a.only & {"lifecycle", "pickup", "cancel", "renewal"}:
                await self.amc_workloads()
            if "session" in a.only:
                async with self.workload("session"):
                    await self.sessions()
            if "screen" in a.only:
                async with self.workload("screen"):
                    await self.screens()
            if "adb" in a.only:
                async with self.workload("adb"):
                    await self.adb_doors()
            if "mcp" in a.only:
                async with self.workload("mcp"):
                    await self.mcp()
            if "webdriver" in a.only:
                async with self.workload("webdriver"):
                    await self.webdriver()
            await self.phone_state_workloads()
            for key, run in (("fleet", self.fleet), ("deep", self.deep), ("flood", self.flood)):
                if key in a.only:
                    self.stop_amc()
                    async with self.workload(key):
                        await run()
            if "plans" in a.only:
                self.stop_amc()
                async with self.workload("plans"):
                    await self.plans()
            if "renewal" in a.only:
                async with self.workload("renewal_after_all"):
                    await self.renewal("renewal_after_all")
        finally:
            say("stopping the stack")
            self.stack.stop()
        if "peer" in a.only:
            async with self.workload("peer"):
                await self.peer()
        self.doc["machine"]["loadavg_at_end"] = os.getloadavg()
        self.doc["complete"] = True
        self.save()
        if a.workdir is None and not self.results.get("errors"):
            shutil.rmtree(self.work, ignore_errors=True)
        return self.doc

    # -- workloads -------------------------------------------------------------------------

    async def ceiling(self) -> None:
        a = self.args
        say(f"ceiling: pgbench 1-row UPDATE, 1/8/8+NOTIFY clients, {a.pgbench_seconds:g}s each")
        script = await ceiling.prepare(self.stack.dsn, self.work)
        reps = [
            await ceiling.run_once(self.stack.dsn, script, a.pgbench_seconds) for _ in range(a.reps)
        ]
        self.results["ceiling"] = ceiling.aggregate(reps)

    async def amc_workloads(self) -> None:
        """The renewal on the fresh database first (no agents: the fake hosts alone, so
        that the CPU figures are the renewals'), then the agents for lifecycle, pickup and
        cancel."""
        st, a = self.stack, self.args
        say("control plane")
        async with self.workload("control plane"):
            await st.start_control_plane()
        if st.control_plane is None:
            return
        if "renewal" in a.only:
            async with self.workload("renewal"):
                await self.renewal("renewal")
        if not a.only & {"lifecycle", "pickup", "cancel"}:
            return
        async with self.workload("agents"):
            say("host agents")
            for i in range(DRAIN_AGENTS):
                st.start_agent(AgentSpec(f"drain-{i}", DRAIN_DEVICES, 0, lifecycle.POOL))
            st.start_agent(
                AgentSpec(latency.HOST, LATENCY_DEVICES, 0.01, latency.POOL, action_log=True)
            )
            await wait_agents_parked(st, DRAIN_AGENTS + 1)
        if self.results.get("errors", {}).get("agents"):
            return
        clock = Clock()
        client = Client.connect(st.address)
        db = await Db.connect(st.dsn)
        try:
            if "lifecycle" in a.only:
                async with self.workload("lifecycle"):
                    await self.lifecycle(client, db, clock)
            if a.only & {"pickup", "cancel"}:
                async with self.workload("latency"):
                    say(f"pickup and cancel latency: {a.trials} trials each")
                    async with self.profiled("latency", latency.HOST, 120):
                        self.results["latency"] = await latency.run(
                            st, client, db, clock, a.trials, a.warmup
                        )
                    st.check_alive()
        finally:
            await client.close()
            await db.close()

    async def renewal(self, key: str) -> None:
        """The renewal workload into results[key]: on the running control plane, or on a
        fresh one (after the fleet and the others stopped theirs)."""
        st, a = self.stack, self.args
        st.stop_agents()  # the fake hosts alone, so that the CPU figures are the renewals'
        if st.control_plane is None:
            await st.start_control_plane()
        when = "on the fresh database" if key == "renewal" else "after every other workload"
        say(f"renewal ({when}): {a.leases} leases on {a.renew_hosts} streams, {a.renew_seconds:g}s")
        opts = renewal.Options(a.leases, a.renew_seconds, a.renew_hosts)
        window = a.renew_seconds + 5
        self.results[key] = await renewal.run(st, opts, self.profiled(key, None, window))
        rn = self.results[key]
        say(
            f"  {rn['renewals_per_s']:,.0f} renewals/s, round trip p50"
            f" {rn['rtt_ms'].get('p50', 0):.0f} / p99 {rn['rtt_ms'].get('p99', 0):.0f} ms"
        )

    async def plans(self) -> None:
        """tests/test_query_plans.py beside --plans-history finished tasks: pytest in a
        process of its own, on this run's server (its fixtures make a database of the
        schema there, and drop it), its findings read from the file it writes."""
        a = self.args
        say(f"plans: the hot statements' plans, {a.plans_history:,} finished tasks")
        found = self.work / "plans.json"
        found.unlink(missing_ok=True)
        env = {
            **os.environ,
            "DATABASE_URL": self.stack.dsn,
            "AMC_PLAN_HISTORY": str(a.plans_history),
            "AMC_PLAN_HOSTS": str(a.plans_hosts),
            "AMC_PLAN_RESULTS": str(found),
        }
        if a.pythonpath is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(a.pythonpath), env.get("PYTHONPATH", "")) if p
            )
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{PLANS_TEST}",
            cwd=ROOT, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        output, _ = await proc.communicate()
        (self.work / "plans.log").write_bytes(output)
        if not found.exists():
            tail = output.decode(errors="replace")[-2000:]
            raise RuntimeError(f"the plan check wrote nothing ({proc.returncode}):\n{tail}")
        self.results["plans"] = json.loads(found.read_text())
        # Its bulk load's writes flushed now, not under the next workload's measure.
        await pgstats.checkpoint(self.stack.dsn)
        problems = self.results["plans"]["problems"]
        say(f"  {len(problems)} problems" + (f"; the first: {problems[0]}" if problems else ""))

    async def sessions(self) -> None:
        a, st = self.args, self.stack
        if st.control_plane is None:
            await st.start_control_plane()
        sizes = tuple(int(n) for n in a.session_sizes.split(",") if n.strip())
        opts = session.Options(sizes, a.session_seconds, a.session_starts, a.session_rate)
        self.results["session"] = await session.run(st, opts, say, self.profiled)

    async def screens(self) -> None:
        a, st = self.args, self.stack
        if st.control_plane is None:
            await st.start_control_plane()
        opts = screen.Options(
            a.screen_phones, a.screen_seconds, a.screen_idle_seconds, a.screen_clicks
        )
        self.results["screen"] = await screen.run(st, opts, say)

    async def adb_doors(self) -> None:
        a, st = self.args, self.stack
        if st.control_plane is None:
            await st.start_control_plane()
        opts = adb_door.Options(a.adb_shells, a.adb_push_mb, self.work if a.profile else None)
        self.results["adb"] = await adb_door.run(st, opts, say)

    async def mcp(self) -> None:
        a, st = self.args, self.stack
        if st.control_plane is None:
            await st.start_control_plane()
        opts = mcp_agents.Options(a.mcp_clients, a.mcp_actions, a.mcp_think, a.mcp_processes)
        self.results["mcp"] = await mcp_agents.run(st, opts, say)

    async def webdriver(self) -> None:
        a, st = self.args, self.stack
        opts = webdriver.Options(a.webdriver_sessions, a.webdriver_requests)
        self.results["webdriver"] = await webdriver.run(st, opts, say)

    async def phone_state_workloads(self) -> None:
        """The workloads of a phone's state: emulator pools, the app library's installs."""
        for key, run in (("episodes", self.episodes), ("install", self.install)):
            if key in self.args.only:
                async with self.workload(key):
                    await run()

    async def episodes(self) -> None:
        a, st = self.args, self.stack
        if st.control_plane is None:
            await st.start_control_plane()
        opts = episodes.Options(a.episodes_emulators, a.episodes_seconds, a.episodes_load)
        # --profile: the control plane's samples and the statements over the whole workload
        # (its agent starts inside it).
        async with self.profiled("episodes", None, a.episodes_seconds + 30):
            self.results["episodes"] = await episodes.run(st, opts, say)

    async def install(self) -> None:
        a, st = self.args, self.stack
        if st.control_plane is None:
            await st.start_control_plane()
        opts = install.Options(a.install_mb, a.install_phones, a.install_hosts)
        self.results["install"] = await install.run(st, opts, say)

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
            busy_timeout=a.fleet_busy_timeout,
            churn_window_hosts=a.fleet_churn_window_hosts,
            profile=a.profile,
        )

    async def fleet(self) -> None:
        self.results["fleet"] = {}
        await fleet.run(self.stack, self.fleet_options(), say, self.results["fleet"], self.save)

    async def deep(self) -> None:
        a = self.args
        opts = deep.Options(
            # The deep workload's figures stay comparable with its earlier runs: no
            # condition changes there (the fleet measures them).
            fleet=dataclasses.replace(
                self.fleet_options(), condition_churn=0.0, steps_window=False
            ),
            hosts=a.deep_hosts,
            big_hosts=a.deep_big_hosts,
            queued=a.deep_queued,
            history=a.deep_history,
            selectors=a.deep_selectors,
        )
        # The fleet's run of the same load, if it ran, is the empty run (not run twice).
        fleet_runs = self.results.get("fleet", {}).get("runs", [])
        opts = dataclasses.replace(
            opts, empty=deep.empty_from_fleet(fleet_runs, opts.fleet, a.deep_hosts)
        )
        self.results["deep"] = {}
        await deep.run(self.stack, opts, say, self.results["deep"], self.save)

    async def flood(self) -> None:
        a = self.args
        opts = flood.Options(
            tasks=a.flood_tasks,
            phones=a.flood_phones,
            task_seconds=a.flood_task_seconds,
            seconds=a.flood_seconds,
            b_rate=a.flood_b_rate,
            lease_ttl=a.fleet_lease_ttl,
        )
        self.results["flood"] = await flood.run(self.stack, opts, say)

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
                opts = lifecycle.Options(a.tasks, a.concurrency, batch)
                profile = self.profiled(key, "drain-0", 120) if rep == 0 else _nothing()
                async with self.phase(f"{key} {rep + 1}"), profile:
                    reps.append(await lifecycle.run_once(self.stack, client, db, clock, opts))
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
    rows = report.rows(doc["results"])
    print(report.table(rows))
    say(f"{doc['duration_s']:.0f}s {doc['phases_s']}; results in {args.out}")
    errors = doc["results"].get("errors", {})
    for key, message in errors.items():
        say(f"{key} failed: {message[:300]}")
    ok = not errors and all(
        doc["results"].get(key, {}).get("verified", True)
        for key in (
            "lifecycle",
            "lifecycle_single",
            "fleet",
            "deep",
            "flood",
            "session",
            "screen",
            "adb",
            "mcp",
            "webdriver",
            "episodes",
            "install",
        )
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
