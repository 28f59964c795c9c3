"""Workload 7, the fleet (issue 10): N hosts x 4 devices, each host its own rack, tasks at a
fixed rate each for one random rack; pickup, CPU per task, RSS per connected host, idle CPU.

Per run: fresh control-plane process(es) on the stack's PostgreSQL (so that RSS with 0
hosts is the process's own baseline), their RSS read once they serve, then the load client
(fleet_load.py, its own process: the hosts are fleet_host.FleetHost) connects (every host
registered, then all open their streams and park at once), idles, submits, verifies; then
the replicas are stopped. One run per --fleet-hosts N on one replica, and one with
--fleet-replica-hosts hosts split across two replicas (tasks submitted through the first).

Issue 20: the submit window lasts at least two re-poll periods (the hosts' Acquire wait,
60 s as the agent's), so that every host's parked Acquire comes back and asks again at
least once inside it, and a share of the hosts (--fleet-short-wait-share) long-polls for
10 s as older agents did. The deep workload (deep.py) runs this same load on a database
holding a backlog and a history.

Issue 27.8: in the submit window every host's phones but the first run a long workflow whose
host reports a step every `step_every` seconds per phone with its renewals, as the agent
reports its progress (0: none); the window's tasks go to the first phones.

Issue 22: after the idle window, a share of the phones (--fleet-condition-churn, 1 %) change
condition a minute, reported as the agent's probe rounds do (fleet_host.FleetHost.churn), a
phone turned not ready being ready again a probe round later; a second idle window says
what the changes add to the control plane's CPU, and they go on through the submit window,
so that the pickup rows are measured with them.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_lib import profiling, stack

HERE = Path(__file__).resolve().parent
BASELINE_SETTLE = 1.0  # after the replicas serve, before their RSS baseline

# Issue 10's targets.
PICKUP_P50_MS, PICKUP_P99_MS = 5.0, 20.0
CPU_GROWTH = 1.5  # control-plane CPU per task at 1,000 hosts vs 10
TARGET_HOSTS = 1000
IDLE_HOSTS = 5000
RSS_PER_HOST_KB = 100.0
IDLE_CORES = 0.05
# Issue 22's: control-plane CPU the condition changes add at IDLE_HOSTS.
CHURN_CORES = 0.05
# Issue 20's: pickup p99 at these sizes, for all hosts and for the short-wait ones, in a
# window of at least REPOLL_PERIODS of the hosts' longest Acquire wait.
P99_HOSTS = (1000, 5000)
REPOLL_PERIODS = 2.0


@dataclass(frozen=True)
class Options:
    hosts: tuple[int, ...] = (10, 1000, 5000)
    rate: float = 20.0
    seconds: float = 15.0
    idle_seconds: float = 10.0
    replica_hosts: int = 1000  # 0: no two-replica run
    lease_ttl: float = 15.0
    devices: int = 4
    drain_timeout: float = 60.0
    hosts_per_channel: int = 1
    acquire_wait: float = 60.0  # the hosts' Acquire wait (the agent's default)
    short_wait: float = 10.0  # ... and the short-wait hosts'
    short_wait_share: float = 0.25
    # Issue 27.8: every host's phones but one run a long workflow whose host reports a
    # step every this many seconds per phone during the submit window (0: none).
    step_every: float = 3.0
    # Issue 22: share of the phones changing condition a minute (0: none).
    condition_churn: float = 0.01
    # How long the busy phones may take to all run (None: 120 s + 10 ms per phone); past
    # it the load is not reached, said so, and the run goes on with those that run.
    busy_timeout: float | None = None
    # The idle window with the condition changes from this many hosts on (its target is
    # judged at IDLE_HOSTS); below, the changes start without a window of their own.
    churn_window_hosts: int = 5000
    # A window of the busy phones' steps alone (CPU per step result) before the submit one.
    steps_window: bool = True
    # --profile: py-spy of the replicas, PostgreSQL's wait events and its statements over
    # each run's submit window (profiling costs throughput: not the run's figures).
    profile: bool = False


# fleet_load's bounds: a probe round of the churning phones, the busy phones' cancels.
PROBE_ROUND = 10.0
FREE_TIMEOUT = 120.0


def busy_timeout(opt: Options, hosts: int) -> float:
    if opt.busy_timeout is not None:
        return opt.busy_timeout
    return 120 + hosts * (opt.devices - 1) / 100 if opt.step_every > 0 else 0.0


def repoll_period(opt: Options) -> float:
    """The longest Acquire wait of the hosts: the period of their re-polls."""
    return max(opt.acquire_wait, opt.short_wait if opt.short_wait_share > 0 else 0.0)


async def run(
    st: stack.Stack,
    opt: Options,
    say: Callable[[str], None],
    out: dict[str, Any] | None = None,
    saved: Callable[[], None] = lambda: None,
) -> dict[str, Any]:
    """Each run in turn, into `out` (the run's results, kept as they come: `saved` is called
    after each run). A run that fails is recorded with its error and the next one goes on."""
    out = {} if out is None else out
    runs: list[dict[str, Any]] = []
    out.update(settings=settings(opt), runs=runs)
    plan = [(n, 1) for n in opt.hosts] + ([(opt.replica_hosts, 2)] if opt.replica_hosts else [])
    for hosts, replicas in plan:
        say(f"fleet: {hosts} hosts x {opt.devices} devices on {replicas} replica(s)")
        result = await run_one_kept(st, opt, hosts, replicas, say)
        runs.append(result)
        say_run(result, say)
        out.update(targets=judge(runs), verified=all(r.get("verified") for r in runs))
        saved()
    return out


async def run_one_kept(
    st: stack.Stack, opt: Options, hosts: int, replicas: int, say: Callable[[str], None], **kw: Any
) -> dict[str, Any]:
    """run_one, or what is known of the run that failed: its size and its error."""
    try:
        return await run_one(st, opt, hosts, replicas, say, **kw)
    except Exception as exc:  # recorded; the workload goes on
        return {
            "name": kw.get("name") or f"fleet-{hosts}x{replicas}",
            "hosts": hosts,
            "replicas": replicas,
            "devices_per_host": opt.devices,
            "verified": False,
            "error": f"{type(exc).__name__}: {exc}"[:2000],
        }


def settings(opt: Options) -> dict[str, Any]:
    return {
        "rate_per_s": opt.rate,
        "seconds": opt.seconds,
        "idle_seconds": opt.idle_seconds,
        "devices_per_host": opt.devices,
        "lease_ttl_s": opt.lease_ttl,
        "hosts_per_channel": opt.hosts_per_channel,
        "acquire_wait_s": opt.acquire_wait,
        "short_wait_s": opt.short_wait,
        "short_wait_share": opt.short_wait_share,
        "step_every_s": opt.step_every,
        "condition_churn_per_min": opt.condition_churn,
    }


def say_run(result: dict[str, Any], say: Callable[[str], None]) -> None:
    for line in result.get("load_not_reached", []):
        say(f"  load not reached: {line}")
    if "submit" not in result:
        say(f"  failed: {result.get('error', 'no result')[:300]}")
        return
    sub = result["submit"]
    nan = float("nan")
    say(
        f"  pickup p50 {sub['pickup_ms'].get('p50', nan):.1f} /"
        f" p99 {sub['pickup_ms'].get('p99', nan):.1f} ms"
        f" (short-wait hosts p99 {sub['pickup_ms_short_wait'].get('p99', nan):.1f});"
        f" CPU ms/task CP {sub['control_plane_cpu_ms_per_task']:.2f}"
        f" PG {sub['postgres_cpu_ms_per_task']:.2f};"
        f" {sub['done']}/{sub['tasks']} done, verified={result['verified']};"
        f" step progress {sub.get('steps_per_s', 0.0):.0f}/s"
    )
    churn = result["idle"].get("churn")
    if churn:
        say(
            f"  idle CPU with {churn['changes_per_min']:.0f} condition changes a minute:"
            f" CP {churn['control_plane_cores']:.4f} cores"
            f" ({churn['control_plane_cores_added']:+.4f} over none);"
            f" {sub.get('condition_changes', 0)} changes in the submit window"
        )


async def run_one(
    st: stack.Stack,
    opt: Options,
    hosts: int,
    replicas: int,
    say: Callable[[str], None],
    *,
    name: str = "",
    dsn: str = "",
    prefix: str = "",
) -> dict[str, Any]:
    """One run of the load: `hosts` hosts on `replicas` fresh replicas of the stack's
    database (or of `dsn`), host ids and racks named from `prefix` (default: unique)."""
    name = name or f"fleet-{hosts}x{replicas}"
    started: list[stack.Replica] = []
    try:
        for k in range(replicas):
            started.append(await st.start_replica(f"{name}-cp{k}", opt.lease_ttl, dsn))
        await asyncio.sleep(BASELINE_SETTLE)
        baseline = sum(stack.rss_bytes(r.child.pid) for r in started)
        pm = st.postmaster_pid()
        assert pm is not None
        argv = [
            sys.executable, str(HERE / "fleet_load.py"),
            "--addresses", ",".join(r.address for r in started),
            "--metrics-urls", ",".join(r.metrics_url for r in started),
            "--cp-pids", ",".join(str(r.child.pid) for r in started),
            "--pg-pid", str(pm), "--dsn", dsn or st.dsn, "--hosts", str(hosts),
            "--devices", str(opt.devices), "--rate", str(opt.rate),
            "--seconds", str(opt.seconds), "--idle-seconds", str(opt.idle_seconds),
            "--drain-timeout", str(opt.drain_timeout),
            "--hosts-per-channel", str(opt.hosts_per_channel),
            "--acquire-wait", str(opt.acquire_wait), "--short-wait", str(opt.short_wait),
            "--short-wait-share", str(opt.short_wait_share),
            "--step-every", str(opt.step_every),
            "--condition-churn", str(opt.condition_churn),
            "--busy-timeout", str(busy_timeout(opt, hosts)),
            *([] if hosts >= opt.churn_window_hosts else ["--no-churn-window"]),
            *([] if opt.steps_window else ["--no-steps-window"]),
            "--prefix", prefix or f"{name}-{int(time.time())}",
        ]  # fmt: skip
        # Connecting, idle, busy phones, submitting, draining, closing: each bounded in the
        # client (this bound only catches a client that hangs).
        limit = (
            240 + hosts / 20 + 3 * opt.idle_seconds + 2 * PROBE_ROUND + busy_timeout(opt, hosts)
            + opt.seconds + 2 * opt.drain_timeout + FREE_TIMEOUT
        )  # fmt: skip
        profile = _Profile(st, name, started, opt.seconds) if opt.profile else None
        result = await _load(argv, st.root / f"{name}-load.log", limit, started, say, profile)
    finally:
        for r in started:
            r.child.stop()
    result["name"] = name
    if "submit" not in result:  # a phase failed: what the load client had, and its error
        result.setdefault("verified", False)
        return result
    connected = result["idle"]["control_plane_rss_bytes"]
    result["repoll_period_s"] = repoll_period(opt)
    result["acquire_wait_s"], result["short_wait_s"] = opt.acquire_wait, opt.short_wait
    result["control_plane_rss_baseline_bytes"] = baseline
    result["control_plane_rss_per_host_bytes"] = (connected - baseline) / hosts
    # What the tasks cost on top of the fleet's idle traffic (which the window also holds).
    sub, idle = result["submit"], result["idle"]
    for proc in ("control_plane", "postgres"):
        extra = sub["usage"][f"{proc}_cores"] - idle[f"{proc}_cores"]
        sub[f"{proc}_cpu_ms_per_task_net_of_idle"] = (
            extra * sub["window_s"] * 1e3 / max(1, sub["done"])
        )
    return result


async def _load(
    argv: list[str],
    log: Path,
    limit: float,
    replicas: list[stack.Replica],
    say: Callable[[str], None],
    profile: _Profile | None = None,
) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    errors = asyncio.ensure_future(proc.stderr.read())
    lines: list[str] = []
    deadline = time.monotonic() + limit
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"the fleet load client ran over {limit:.0f}s")
            try:
                raw = await asyncio.wait_for(proc.stdout.readline(), min(remaining, 5.0))
            except TimeoutError:
                for r in replicas:
                    r.child.check_alive()
                continue
            if not raw:
                break
            line = raw.decode(errors="replace").rstrip()
            lines.append(line)
            if not line.startswith("{"):
                say(f"  {line}")
            if profile is not None:
                await profile.heard(line)
        await asyncio.wait_for(proc.wait(), 30)
    finally:
        if profile is not None:
            await profile.finish()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        err = await errors
        stack.save(log, err)
    if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
        tail = err.decode(errors="replace")[-3000:]
        raise RuntimeError(f"fleet load client failed ({proc.returncode}):\n{tail}")
    result: dict[str, Any] = json.loads(lines[-1])
    if profile is not None:
        result["profile"] = profile.found
    return result


class _Profile:
    """--profile over a run's submit window: from the load client's "submit window" line to
    its "closing the hosts" one."""

    def __init__(
        self, st: stack.Stack, name: str, replicas: list[stack.Replica], seconds: float
    ) -> None:
        self.st, self.name, self.replicas, self.seconds = st, name, replicas, seconds
        self.found: dict[str, Any] = {}
        self._recordings: list[profiling.Recording] = []
        self._waits: profiling.WaitSampler | None = None

    async def heard(self, line: str) -> None:
        if line.startswith("submit window") and self._waits is None:
            await profiling.reset_statements(self.st.dsn)
            self._recordings = [
                await profiling.start(
                    f"{self.name}-{k}", r.child.pid, self.st.root, self.seconds + 30
                )
                for k, r in enumerate(self.replicas)
            ]
            self._waits = profiling.WaitSampler(self.st.dsn)
            await self._waits.__aenter__()
        elif line.startswith("closing the hosts"):
            await self.finish()

    async def finish(self) -> None:
        if self._waits is None or self.found:
            return
        await self._waits.__aexit__(None, None, None)
        self.found = {
            "py_spy": {r.name: await profiling.finish(r) for r in self._recordings},
            "statements": await profiling.top_statements(self.st.dsn, 25),
            "postgres_waits": self._waits.summary(25),
        }


# -- targets -------------------------------------------------------------------------------


def find(runs: list[dict[str, Any]], hosts: int, replicas: int) -> dict[str, Any] | None:
    """The run of that size, if it ran whole (a run that failed, or did not reach its load,
    is not judged)."""
    for r in runs:
        if r["hosts"] == hosts and r["replicas"] == replicas and judged(r):
            return r
    return None


def judged(run: dict[str, Any]) -> bool:
    return "submit" in run and not run.get("load_not_reached")


def pickup_met(run: dict[str, Any]) -> bool | None:
    p = run["submit"]["pickup_ms"]
    if not p.get("n"):
        return None
    complete = run["submit"]["done"] == run["submit"]["tasks"]
    return bool(complete and p["p50"] <= PICKUP_P50_MS and p["p99"] <= PICKUP_P99_MS)


def cpu_met(run: dict[str, Any], base: dict[str, Any] | None) -> bool | None:
    if base is None:
        return None
    limit = CPU_GROWTH * base["submit"]["control_plane_cpu_ms_per_task"]
    return bool(run["submit"]["control_plane_cpu_ms_per_task"] <= limit)


def repolls_covered(run: dict[str, Any]) -> bool | None:
    """The submit window held at least REPOLL_PERIODS of the longest Acquire wait."""
    period = run.get("repoll_period_s")
    if period is None:
        return None
    sub = run["submit"]
    # The submit schedule (tasks / rate): the window runs from its first submit to the last
    # task done, so it holds the schedule whole.
    return bool(sub.get("submit_schedule_s", sub["window_s"]) >= REPOLL_PERIODS * period)


def p99_met(run: dict[str, Any], limit: float) -> bool | None:
    """Issue 20: every task done, pickup p99 within `limit` for all hosts and for the
    short-wait ones apart, over a window of at least two re-poll periods."""
    sub = run["submit"]
    if not sub["pickup_ms"].get("n"):
        return None
    short = sub.get("pickup_ms_short_wait", {})
    return bool(
        sub["done"] == sub["tasks"]
        and sub["pickup_ms"]["p99"] <= limit
        and (not short.get("n") or short["p99"] <= limit)
        and repolls_covered(run) is not False
    )


def judge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each target: met (True/False) or None when the run it needs was not made."""
    base = find(runs, 10, 1)
    one = find(runs, TARGET_HOSTS, 1)
    two = find(runs, TARGET_HOSTS, 2)
    idle = find(runs, IDLE_HOSTS, 1)
    issue20 = {
        f"pickup_p99_{n}_over_repolls": p99_met(r, PICKUP_P99_MS) if r else None
        for n in P99_HOSTS
        for r in [find(runs, n, 1)]
    }
    return {
        **issue20,
        "windows_cover_two_repolls": (
            all(repolls_covered(r) for r in runs) if runs and "repoll_period_s" in runs[0] else None
        ),
        "pickup_1000": pickup_met(one) if one else None,
        "cpu_per_task_1000": cpu_met(one, base) if one else None,
        "pickup_1000_two_replicas": pickup_met(two) if two else None,
        "cpu_per_task_1000_two_replicas": cpu_met(two, base) if two else None,
        "rss_per_host_5000": (
            idle["control_plane_rss_per_host_bytes"] / 1024 <= RSS_PER_HOST_KB if idle else None
        ),
        "idle_cpu_5000": idle["idle"]["control_plane_cores"] <= IDLE_CORES if idle else None,
        "condition_churn_cpu_5000": churn_met(idle) if idle else None,
    }


def churn_met(run: dict[str, Any]) -> bool | None:
    """Issue 22: the condition changes add at most CHURN_CORES of control-plane CPU."""
    churn = run["idle"].get("churn")
    if not churn:
        return None
    return bool(churn["control_plane_cores_added"] <= CHURN_CORES)
