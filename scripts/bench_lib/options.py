"""`make bench`'s flags, the sizes they come to, and the run's plan: what will run, at
which sizes, and about how long each part takes on a 2-core machine (printed at the start,
so that a run says what it chose before it spends half an hour).

The defaults fit in 30 minutes on 2 cores (this shared one at load 10-13): the 5,000-host rows
(a fleet run and a deep run at that size, 10 minutes more at best: the machine must keep
15,000 phones busy) come with --big or --fleet-hosts / --deep-big-hosts. --quick shrinks
everything to a smoke run.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from bench_lib import peer, profiling

WORKLOADS = (
    "ceiling",
    "renewal",
    "lifecycle",
    "pickup",
    "cancel",
    "session",
    "screen",
    "adb",
    "mcp",
    "webdriver",
    "episodes",
    "install",
    "fleet",
    "deep",
    "flood",
    "plans",
    "peer",
)
ROOT = Path(__file__).resolve().parent.parent.parent
BIG_HOSTS = 5000
# The bound the default run is held to (minutes, on 2 cores).
BUDGET_MINUTES = 30


def parse(argv: list[str], doc: str = "") -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="bench.py", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
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
        "--fleet-hosts",
        default="10,1000",
        help="fleet sizes, one run each (one replica); --big adds 5000",
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
        "--fleet-churn-window-hosts",
        type=int,
        default=5000,
        help="fleet: runs of this many hosts or more measure an idle window with the condition"
        " changes (their target's size); smaller runs start the changes without one",
    )
    p.add_argument(
        "--fleet-busy-timeout",
        type=float,
        default=None,
        help="fleet: how long the busy phones may take to all run (default 120 s + 10 ms a"
        " phone); past it the run says 'load not reached' and goes on",
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
        "--deep-big-hosts",
        type=int,
        default=0,
        help="deep: hosts of the big run (0: none; --big: 5000)",
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
    p.add_argument("--flood-seconds", type=float, default=100.0, help="flood: team B's window")
    p.add_argument("--flood-b-rate", type=float, default=1.0, help="flood: team B's tasks per s")
    p.add_argument(
        "--session-sizes", default="1,50,200", help="session: concurrent sessions, each size"
    )
    p.add_argument("--session-seconds", type=float, default=10.0, help="session: each window")
    p.add_argument("--session-starts", type=int, default=50, help="session: starts measured")
    p.add_argument(
        "--session-rate", type=float, default=10.0, help="session: paced windows' taps/s each"
    )
    p.add_argument("--screen-phones", type=int, default=20, help="screen: phones (and viewers)")
    p.add_argument("--screen-seconds", type=float, default=10.0, help="screen: each window")
    p.add_argument(
        "--screen-idle-seconds",
        type=float,
        default=5.0,
        help="screen: nobody watching for (the capture counter must not move: at 12 frames"
        " a second a capture shows within 1 s)",
    )
    p.add_argument("--screen-clicks", type=int, default=50, help="screen: taps timed to a frame")
    p.add_argument(
        "--episodes-emulators", type=int, default=20, help="episodes: emulator doubles in the pool"
    )
    p.add_argument(
        "--episodes-seconds", type=float, default=60.0, help="episodes: the measured window"
    )
    p.add_argument(
        "--episodes-load", type=float, default=0.6, help="episodes: a snapshot load's seconds"
    )
    p.add_argument("--install-mb", type=int, default=50, help="install: the APK's size, MB")
    p.add_argument("--install-phones", type=int, default=100, help="install: phones")
    p.add_argument("--install-hosts", type=int, default=5, help="install: hosts they are on")
    p.add_argument(
        "--plans-history",
        type=int,
        default=1_000_000,
        help="plans: finished tasks loaded (one INSERT ... SELECT, no ANALYZE) for the check",
    )
    p.add_argument(
        "--plans-hosts",
        type=int,
        default=300,
        help="plans: hosts of its live work (>= 130; the old statements flipped the same at"
        " 300 as at 1,000)",
    )
    p.add_argument(
        "--big",
        action="store_true",
        help=f"the {BIG_HOSTS:,}-host rows too: a fleet run and a deep run at that size"
        " (10 minutes more on 2 cores at best: they need the machine to keep 15,000 phones busy)",
    )
    p.add_argument("--adb-shells", type=int, default=100, help="adb: shell round trips each")
    p.add_argument("--adb-push-mb", type=int, default=100, help="adb: the push's size, MB")
    p.add_argument("--mcp-clients", type=int, default=100, help="mcp: MCP clients (and phones)")
    p.add_argument("--mcp-actions", type=int, default=20, help="mcp: taps of each client")
    p.add_argument("--mcp-think", type=float, default=0.5, help="mcp: mean s between taps")
    p.add_argument("--mcp-processes", type=int, default=4, help="mcp: processes of agents")
    p.add_argument(
        "--webdriver-sessions", type=int, default=20, help="webdriver: new sessions each way"
    )
    p.add_argument(
        "--webdriver-requests", type=int, default=200, help="webdriver: requests each way"
    )
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
        args.fleet_condition_churn, args.fleet_churn_window_hosts = 1.0, 1
        # Waits short enough that the 3-s window still holds two re-poll periods.
        args.fleet_acquire_wait, args.fleet_short_wait = 1.0, 0.5
        args.deep_hosts, args.deep_big_hosts, args.deep_selectors = 10, 0, 20
        args.deep_queued, args.deep_history = 1000, 5000
        args.flood_tasks, args.flood_phones, args.flood_task_seconds = 400, 8, 0.2
        args.flood_seconds, args.flood_b_rate = 3.0, 5.0
        args.session_sizes, args.session_seconds, args.session_starts = "1,10", 2.0, 5
        args.screen_phones, args.screen_seconds, args.screen_idle_seconds = 4, 2.0, 2.0
        args.screen_clicks = 5
        args.adb_shells, args.adb_push_mb = 10, 10
        args.mcp_clients, args.mcp_actions, args.mcp_think, args.mcp_processes = 10, 5, 0.2, 2
        args.webdriver_sessions, args.webdriver_requests = 3, 20
        args.episodes_emulators, args.episodes_seconds = 4, 5.0
        args.install_mb, args.install_phones, args.install_hosts = 5, 10, 2
        args.plans_history, args.plans_hosts = 5000, 200
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
    if args.big:
        if BIG_HOSTS not in args.fleet_hosts:
            args.fleet_hosts.append(BIG_HOSTS)
        args.deep_big_hosts = args.deep_big_hosts or BIG_HOSTS
    if any(n < 1 for n in args.fleet_hosts) or args.fleet_rate <= 0:
        p.error("--fleet-hosts must be >= 1 and --fleet-rate > 0")
    if args.profile:
        profiling.py_spy()
    return args


def _fleet_run(a: argparse.Namespace, hosts: int, churn: bool) -> float:
    """Seconds one fleet run takes on 2 cores (as measured at 10 and 1,000 hosts):
    connecting and parking the hosts, the idle window(s), the busy phones (and their steps'
    window), the submit window, the drain and the close."""
    idle = a.fleet_idle_seconds
    seconds = 10 + hosts / 100 + idle + a.fleet_seconds + 5
    if churn and a.fleet_condition_churn > 0 and hosts >= a.fleet_churn_window_hosts:
        seconds += min(20.0, idle) + idle
    if a.fleet_step_every > 0:
        seconds += hosts * 3 / 300 + (idle if churn else 0)
    return seconds


def deep_reuses_fleet_run(a: argparse.Namespace) -> bool:
    """The deep workload's empty run is the fleet's run of its size (deep.empty_from_fleet:
    the same hosts on one replica, no condition-change window at that size)."""
    return (
        "fleet" in a.only
        and a.deep_hosts in a.fleet_hosts
        and (a.fleet_condition_churn <= 0 or a.deep_hosts < a.fleet_churn_window_hosts)
    )


def plan(a: argparse.Namespace) -> list[tuple[str, str, float]]:
    """(workload, what it runs, estimated seconds on 2 cores), in the run's order. The
    estimates are the default run's phases on this 2-core machine, shared (load 10-13: each
    phase as long as it took there, within about 20 %), scaled by size; on a quieter
    machine the phases that are not fixed windows (lifecycle, the loads of deep and plans)
    take less."""
    only: set[str] = a.only
    out: list[tuple[str, str, float]] = []
    renewal = 3 + a.leases / 2000 + a.renew_seconds
    if "ceiling" in only:
        out.append(("ceiling", f"pgbench, {a.pgbench_seconds:g} s x 3 x {a.reps}",
                    3 * a.pgbench_seconds * a.reps + 1))  # fmt: skip
    if "renewal" in only:
        out.append(("renewal", f"{a.leases:,} leases on {a.renew_hosts} streams,"
                    f" {a.renew_seconds:g} s, on the fresh database", renewal))  # fmt: skip
    if "lifecycle" in only:
        # 192 and 159 tasks/s at load 12 (about 800 and 420 on an idle machine).
        single = a.tasks / 160 if a.submit_batch > 1 else 0
        out.append(("lifecycle", f"{a.tasks:,} tasks x {a.reps}, batches of {a.submit_batch}"
                    + (" then one SubmitTask each" if single else ""),
                    a.reps * (a.tasks / 190 + single) + 3))  # fmt: skip
    latency = [w for w in ("pickup", "cancel") if w in only]
    if latency:
        out.append(("+".join(latency), f"{a.trials} trials each (+{a.warmup} warm-up)",
                    (a.trials + a.warmup) * 0.1 * 2))  # fmt: skip
    if "session" in only:
        sizes = [s for s in str(a.session_sizes).split(",") if s.strip()]
        paced = [s for s in sizes if a.session_rate and int(s) * a.session_rate <= 1000]
        windows = len(sizes) + len(paced)
        seconds = windows * (a.session_seconds + 5) + a.session_starts * 0.1 + 5
        out.append(("session", f"{a.session_sizes} sessions, {a.session_seconds:g} s each"
                    f" (paced at {a.session_rate:g}/s each: {','.join(paced) or 'none'});"
                    f" {a.session_starts} starts", seconds))  # fmt: skip
    if "screen" in only:
        # Idle, then eleven windows of --screen-seconds: one viewer, 20 viewers, H.264 and
        # PNG, 0 / 1 / 10 viewers, the bare gRPC floor's three, the console's two; two
        # rounds of --screen-clicks taps; the watched task (5 x 2 runs); its agent's start.
        seconds = a.screen_idle_seconds + 11 * a.screen_seconds + a.screen_clicks * 0.35 + 33
        out.append(("screen", f"{a.screen_phones} phones, {a.screen_seconds:g} s windows",
                    seconds))  # fmt: skip
    out.extend(_doors(a))
    out += _farm_state_plans(a, only)
    if "fleet" in only:
        # 171 s a run of 1,000 hosts (two 120-s re-poll periods, 51 s to connect, park, idle,
        # start the busy phones and their steps' window, drain and close).
        runs = [f"{n:,}" for n in a.fleet_hosts]
        seconds = sum(_fleet_run(a, n, True) for n in a.fleet_hosts)
        if a.fleet_replica_hosts:
            runs.append(f"{a.fleet_replica_hosts:,} on 2 replicas")
            seconds += _fleet_run(a, a.fleet_replica_hosts, True)
        out.append(("fleet", f"{' / '.join(runs)} hosts x 4, {a.fleet_seconds:g} s windows",
                    seconds))  # fmt: skip
    if "deep" in only:
        reuse = deep_reuses_fleet_run(a)
        sizes = [a.deep_hosts] * (1 if reuse else 2) + (
            [a.deep_big_hosts] if a.deep_big_hosts else []
        )
        out.append(("deep", f"{a.deep_hosts:,} hosts "
                    + ("deep (empty: the fleet's run)" if reuse else "empty and deep")
                    + (f", {a.deep_big_hosts:,} deep" if a.deep_big_hosts else "")
                    + f"; {a.deep_history:,} finished, {a.deep_queued:,} queued",
                    sum(_fleet_run(a, n, False) for n in sizes)
                    + a.deep_history / 7400 + a.deep_queued / 4500 + 5))  # fmt: skip
    if "flood" in only:
        out.append(("flood", f"{a.flood_tasks:,} tasks on {a.flood_phones} phones,"
                    f" {a.flood_seconds:g} s window",
                    a.flood_tasks / 5000 + a.flood_seconds + 5))  # fmt: skip
    if "plans" in only:
        # 1,000,000 finished tasks: 103 s to load, 20 s to ANALYZE twice; two live sets of
        # 1,000 hosts 18 s each; pytest, the checks and the closing CHECKPOINT 60 s (at load
        # 10-13; 98 s in all at load 8).
        seconds = a.plans_history / 7000 + a.plans_hosts / 25 + 40
        out.append(("plans", f"hot statements' plans in 4 states, {a.plans_history:,} finished,"
                    f" {a.plans_hosts:,} hosts", seconds))  # fmt: skip
    if "renewal" in only:
        # On a fresh control plane, over the database the others left: 63 s there.
        out.append(("renewal", "again, after every other workload", renewal + 20))
    if "peer" in only and not a.no_peer and peer.find(a.peer_dir):
        # Its drain of 20,000 jobs twice (b10, b100): 13 s idle, its virtualenv made before.
        seconds = 10 + 15 * a.reps + 2 * a.peer_trials
        out.append(("peer", f"pgqueuer, {a.peer_jobs:,} jobs x {a.reps}", seconds))
    return out


def _doors(a: argparse.Namespace) -> list[tuple[str, str, float]]:
    """The plan's steps for the doors onto a leased phone: adb, then MCP."""
    out: list[tuple[str, str, float]] = []
    if "adb" in a.only:
        # Three pushes direct and three through the door; then three through the bare
        # grpc.aio relay (bench_lib.relay_floor: 1.3-2.0 s with its start at load 1.4).
        seconds = 2 + a.adb_shells * 2 * 0.01 + a.adb_push_mb * 6 / 100
        seconds += 1 + a.adb_push_mb * 3 / 100
        out.append(("adb", f"{a.adb_shells} adb shells each way, a {a.adb_push_mb} MB push"
                    " direct, through the door and through a bare grpc.aio relay",
                    seconds))  # fmt: skip
    if "mcp" in a.only:
        seconds = 2 * a.mcp_actions * a.mcp_think * 1.1 + a.mcp_clients / 20 + 6
        out.append(("mcp", f"{a.mcp_clients} MCP clients x {a.mcp_actions} taps, and through"
                    " the client library", seconds))  # fmt: skip
    if "webdriver" in a.only:
        # Appium's npm install, the first time on a machine, is not counted.
        seconds = 6 + a.webdriver_sessions * 2 * 0.15 + a.webdriver_requests * 2 * 0.01
        out.append(("webdriver", f"{a.webdriver_sessions} WebDriver new sessions and"
                    f" {a.webdriver_requests} requests each, direct and through the farm",
                    seconds))  # fmt: skip
    return out


def _farm_state_plans(a: argparse.Namespace, only: set[str]) -> list[tuple[str, str, float]]:
    """The plan's lines for the workloads of a phone's state: emulator pools, installs."""
    out: list[tuple[str, str, float]] = []
    if "episodes" in only:
        seconds = a.episodes_seconds + 10 + a.episodes_emulators * 0.35
        out.append(("episodes", f"{a.episodes_emulators} emulator doubles, sessions of 20"
                    f" taps for {a.episodes_seconds:g} s", seconds))  # fmt: skip
    if "install" in only:
        seconds = 8 + a.install_phones * a.install_mb / 1000
        out.append(("install", f"a {a.install_mb} MB APK onto {a.install_phones} phones of"
                    f" {a.install_hosts} hosts", seconds))  # fmt: skip
    return out


def describe(a: argparse.Namespace) -> list[str]:
    """The plan, as lines to print at the start of the run."""
    steps = plan(a)
    total = sum(s for _, _, s in steps) / 60
    width = max((len(w) for w, _, _ in steps), default=0)
    load = os.getloadavg()[0]
    lines = [f"the plan: about {total:.0f} min on 2 cores (at load 10-13; now {load:.1f})"
             + (f" (over the {BUDGET_MINUTES}-min bound of the default run)"
                if total > BUDGET_MINUTES else "")]  # fmt: skip
    lines += [f"  {w.ljust(width)}  {what}  (~{s / 60:.1f} min)" for w, what, s in steps]
    return lines


def settings(a: argparse.Namespace) -> dict[str, Any]:
    """The flags as the results file keeps them."""
    return {k: sorted(v) if isinstance(v, set) else str(v) for k, v in vars(a).items()}
