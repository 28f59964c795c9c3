"""The fleet load client, a process of its own: N fake hosts x 4 devices (fleet_host.py), each
with a rack label of its own, on one or more control-plane replicas, and a submitter.

    fleet_load.py --addresses A[,B] --metrics-urls U[,V] --cp-pids P[,Q] --pg-pid PM \
        --dsn URL --hosts 1000 [--rate 20] [--seconds 15] [--idle-seconds 10] [--prefix f1000]

1. connect: one grpc.aio channel per host (its own TCP connection: a local subchannel pool),
   host i on replica i mod R; every host's RegisterHost (32 in flight), then all hosts at
   once open their renewal streams and park their first Acquires (as after a control-plane
   restart: their re-polls start in step), and their ScreenFrames calls; until every
   replica's metrics count all its hosts' streams and parked Acquires, and every host's
   ScreenFrames call has its first answer. A host's Acquire waits --acquire-wait seconds (60,
   the agent's default), or --short-wait (10) for a --short-wait-share of the hosts (every
   k-th host).
2. idle: nothing queued for --idle-seconds: CPU of the replicas, of PostgreSQL (the
   postmaster's tree) and of this process, and the replicas' RSS. With --condition-churn
   SHARE > 0 (issue 22), then every host's phones start changing condition, SHARE of them
   a minute (fleet_host.FleetHost.churn: each turned not ready, ready again a probe round
   later, a host's changes of a round in one ReportDeviceHealth), and after two probe
   rounds (so that the returns to ready flow too) a second idle window as long as the first
   says what the changes add; they go on through the submit window. A task whose phone is
   not ready waits for it, so none fails: the verification stays as it is.
   Then every replica's LISTEN connection is ended (as a failover would): until each has
   listened again and read its renewal streams' state again, the CPU of the replicas and
   of PostgreSQL, and the read as the replicas time it (amc_stream_restate_seconds).
3. submit: --rate SubmitTask calls per second for --seconds through the first replica,
   open loop (each at its scheduled time, whatever the earlier ones are doing), each task
   for the rack of a random host; then until every task is reported done, or
   --drain-timeout after the last submit. CPU deltas over first submit -> last done.
   Pickup = just before SubmitTask -> the Acquire answer naming the task arrives at its host
   (time.monotonic() in this one process); also apart for the tasks of short-wait hosts,
   and per 10-s slice of the window (re-polls come in waves). Acquire calls answered empty
   (re-polls) and the replicas' amc_acquire_queries_total over the window say how many
   re-polls it held.
   With --step-every S > 0 (issue 27.8), before the window every host's phones but its
   first run a long workflow each (busy phones), a step ending every S seconds per phone,
   sent with the renewals as the agent sends its progress; the window's tasks go to the
   first phones. After the window the busy tasks are cancelled and reported so.
4. verify in PostgreSQL: every task done, exactly one attempt, done once.

Progress lines go to stdout, then the result as one JSON line (the last line).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
import psutil

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from amc_common.logs import configure
from bench_lib import promtext, stack
from bench_lib.client import bounded, key_actions
from bench_lib.fleet_host import PROBE_ROUND, Counters, FleetHost
from bench_lib.pgstats import Db
from bench_lib.stats import summarize

# A channel of its own per host means a TCP connection of its own only with a local
# subchannel pool: by default gRPC shares one connection among channels with equal options.
HOST_CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]
CONNECT_CONCURRENCY = 32
SETTLE = 2.0  # after every host is parked, before the idle window
LISTEN_AGAIN_LIMIT = 60.0  # for the replicas to listen again and read their streams
LAG_TICK = 0.01  # the event-loop lag probe's period
AUTOVAC_TICK = 0.25  # the autovacuum meter's


def progress(message: str) -> None:
    print(message, flush=True)


class Usage:
    """CPU seconds of the replicas, PostgreSQL and this process, read at one moment."""

    def __init__(self, cp_pids: list[int], pg_pid: int) -> None:
        self.at = time.monotonic()
        self.cp = sum(stack.cpu_seconds(p) for p in cp_pids)
        self.pg = stack.tree_cpu_seconds(pg_pid)
        self.me = stack.cpu_seconds(os.getpid())
        self.machine = stack.machine_busy_seconds()
        self.pressure = stack.pressure_seconds()

    def cores_since(self, before: Usage) -> dict[str, float]:
        wall = self.at - before.at
        return {
            "wall_s": wall,
            "control_plane_cores": (self.cp - before.cp) / wall,
            "postgres_cores": (self.pg - before.pg) / wall,
            "load_client_cores": (self.me - before.me) / wall,
            "machine_busy_cores": (self.machine - before.machine) / wall,
            # Share of the window in which some task of the machine waited for a CPU /
            # for I/O (Linux PSI): how much other work got in the way.
            **{
                f"{k}_pressure": (self.pressure[k] - before.pressure[k]) / wall
                for k in self.pressure
                if k in before.pressure
            },
        }


class AutovacuumMeter:
    """CPU of PostgreSQL's autovacuum workers over a window, sampled every AUTOVAC_TICK:
    the part of PostgreSQL's CPU that is vacuuming and analysing, not serving the calls
    (a worker that starts and ends between two samples is missed)."""

    def __init__(self, pg_pid: int) -> None:
        self._pg = pg_pid
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._started: set[int] = set()  # workers first seen after the window began
        self._task: asyncio.Task[None] | None = None
        self.workers_seen = 0

    def __enter__(self) -> AutovacuumMeter:
        self._sample(first=True)
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self._sample(first=False)

    @property
    def cpu_s(self) -> float:
        return sum(
            last - (0.0 if pid in self._started else self._first[pid])
            for pid, last in self._last.items()
        )

    def _sample(self, first: bool) -> None:
        try:
            children = psutil.Process(self._pg).children()
        except psutil.Error:
            return
        for child in children:
            try:
                if "autovacuum worker" not in " ".join(child.cmdline()):
                    continue
                t = child.cpu_times()
            except psutil.Error:
                continue
            cpu = t.user + t.system
            if child.pid not in self._first:
                self._first[child.pid] = cpu
                self.workers_seen += 1
                if not first:
                    self._started.add(child.pid)
            self._last[child.pid] = cpu

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(AUTOVAC_TICK)
            self._sample(first=False)


class LagProbe:
    """How late a LAG_TICK sleep wakes up: this process's event loop is the clock of every
    pickup, so its lag is an error bar on them."""

    def __init__(self) -> None:
        self.lags_ms: list[float] = []
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> LagProbe:
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()

    async def _run(self) -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(LAG_TICK)
            self.lags_ms.append((time.monotonic() - t - LAG_TICK) * 1e3)


def connections(pid: int, address: str) -> int:
    """Established TCP connections to the replica's gRPC port."""
    port = int(address.rsplit(":", 1)[1])
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return -1
    return sum(1 for c in conns if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port)


async def parked(urls: list[str], expected: list[int]) -> tuple[list[int], list[int]]:
    waiting, streams = [], []
    for url in urls:
        samples = await promtext.scrape(url)
        waiting.append(int(promtext.value(samples, "amc_acquires_waiting")))
        streams.append(int(promtext.value(samples, "amc_renewal_streams")))
    return waiting, streams


def short_every(share: float) -> int:
    """Every k-th host has the short wait, for a share of about 1/k (0: none)."""
    return 0 if share <= 0 else max(1, round(1 / min(share, 1.0)))


SLICE = 10.0  # seconds: pickups per slice of the submit window
SLOWEST = 25  # the slowest pickups kept, with their times


def slices(points: list[tuple[float, float]], width: float) -> list[dict[str, float]]:
    """(offset s, pickup ms) -> per `width`-second slice of the window: its start, n, p50,
    p99 and max, so that a wave of re-polls shows where it fell."""
    by: dict[int, list[float]] = {}
    for offset, ms in points:
        by.setdefault(int(offset // width), []).append(ms)
    out = []
    for k in sorted(by):
        summary = summarize(by[k])
        out.append({"from_s": k * width, **{q: summary[q] for q in ("n", "p50", "p99", "max")}})
    return out


# Replica counters read before and after the submit window (summed over the replicas).
METRICS = ("amc_acquire_queries_total", "amc_gc_pause_seconds_count", "amc_gc_pause_seconds_sum")


async def scrape_all(urls: list[str]) -> list[promtext.Samples]:
    return [await promtext.scrape(url) for url in urls]


def metric_deltas(before: list[promtext.Samples], after: list[promtext.Samples]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in METRICS:
        out[name] = sum(
            promtext.value(a, name) - promtext.value(b, name)
            for b, a in zip(before, after, strict=True)
        )
    gc_max = 0.0
    for generation in ("0", "1", "2"):
        count = total = worst = 0.0
        for b, a in zip(before, after, strict=True):
            h = promtext.histogram(b, a, "amc_gc_pause_seconds", generation=generation)
            if h.count:
                count, total = count + h.count, total + h.total
                worst = max(worst, h.quantile(1.0))
        # Collections, their seconds, and the upper bound of the longest's bucket.
        out[f"gc_generation_{generation}"] = {"n": count, "s": total, "max_s_bound": worst}
        gc_max = max(gc_max, worst)
    out["gc_pause_max_s_upper_bound"] = gc_max
    # What the replicas waited for: a connection of their database pool, their event loop
    # (summed over the replicas; ms).
    for name, key in (
        ("amc_database_pool_wait_seconds", "pool_wait_ms"),
        ("amc_event_loop_lag_seconds", "loop_lag_ms"),
    ):
        h = [promtext.histogram(b, a, name) for b, a in zip(before, after, strict=True)]
        count, total = sum(x.count for x in h), sum(x.total for x in h)
        out[key] = {
            "n": count,
            "mean": total * 1e3 / count if count else 0.0,
            "p99": max((x.quantile(0.99) for x in h if x.count), default=0.0) * 1e3,
            "total_s": total,
        }
    return out


class Fleet:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.addresses: list[str] = args.addresses.split(",")
        self.urls: list[str] = args.metrics_urls.split(",")
        self.cp_pids = [int(p) for p in args.cp_pids.split(",")]
        self.counters = Counters()
        self.assigned: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self.all_done = asyncio.Event()
        self.expected = 0  # tasks submitted so far; all_done when that many are done
        self.submitting = True
        self.hosts: list[FleetHost] = []
        self.channels: list[grpc.aio.Channel] = []
        self._by_key: dict[tuple[int, int], grpc.aio.Channel] = {}
        self.started_at = 0.0  # when every host opened its stream and parked, together
        self.short: set[int] = set()  # the hosts whose Acquire waits --short-wait
        self.busy_ids: list[str] = []  # the busy phones' tasks (--step-every)
        # What the load did not reach (each a line saying how far it got): the run goes on
        # and its result says so.
        self.not_reached: list[str] = []

    def on_assigned(self, task_id: str, at: float) -> None:
        self.assigned.setdefault(task_id, at)

    def on_done(self, task_id: str, at: float) -> None:
        self.done.setdefault(task_id, at)
        if not self.submitting and len(self.done) >= self.expected:
            self.all_done.set()

    def usage(self) -> Usage:
        return Usage(self.cp_pids, self.args.pg_pid)

    def rss(self) -> int:
        return sum(stack.rss_bytes(p) for p in self.cp_pids)

    # -- 1. connect ------------------------------------------------------------------------

    async def connect(self) -> dict[str, Any]:
        a = self.args
        per_channel = max(1, a.hosts_per_channel)
        every = short_every(a.short_wait_share)
        self.short = {i for i in range(a.hosts) if every and i % every == every - 1}
        for i in range(a.hosts):
            replica = i % len(self.addresses)
            host_id = f"{a.prefix}-h{i:05d}"
            labels = {"pool": "fleet", "rack": f"{a.prefix}-rack{i:05d}"}
            channel = self._channel_for(i, replica, per_channel)
            self.hosts.append(
                FleetHost(
                    host_id,
                    labels,
                    channel,
                    devices=a.devices,
                    counters=self.counters,
                    on_assigned=self.on_assigned,
                    on_done=self.on_done,
                    acquire_wait=a.short_wait if i in self.short else a.acquire_wait,
                    step_every=a.step_every,
                )
            )
        started = time.monotonic()
        await bounded([h.register for h in self.hosts], CONNECT_CONCURRENCY)
        registered = time.monotonic() - started
        # All at once: their first Acquires park together, so their re-polls start in step.
        self.started_at = time.monotonic()
        for host in self.hosts:
            host.start()
        progress(f"{a.hosts} hosts registered in {registered:.1f}s; waiting for them to park")
        expected = [len(range(r, a.hosts, len(self.addresses))) for r in range(len(self.urls))]
        deadline = time.monotonic() + 60 + a.hosts / 50
        while True:
            waiting, streams = await parked(self.urls, expected)
            # No ScreenFrames call is awaited: a host opens one only when a viewer waits
            # for one of its phones (none here); `screen_calls` counts any that opened.
            if all(w >= e and s >= e for w, s, e in zip(waiting, streams, expected, strict=True)):
                break
            if time.monotonic() > deadline:
                self.not_reached.append(
                    f"hosts parked: acquires {waiting}, streams {streams} of {expected}"
                )
                progress(f"load not reached: {self.not_reached[-1]}; the run goes on")
                break
            await asyncio.sleep(0.2)
        return {
            "register_s": registered,
            "connect_s": time.monotonic() - started,
            "park_s": time.monotonic() - self.started_at,
            "short_wait_hosts": len(self.short),
            "screen_calls": self.counters.screen_calls,
            "channels": len(self.channels),
            "tcp_connections": [
                connections(pid, address)
                for pid, address in zip(self.cp_pids, self.addresses, strict=True)
            ],
        }

    def _channel_for(self, i: int, replica: int, per_channel: int) -> grpc.aio.Channel:
        """One channel per host (per_channel 1), or hosts grouped per_channel to a channel."""
        key = (replica, i // len(self.addresses) // per_channel)
        channel = self._by_key.get(key)
        if channel is None:
            channel = aio_channel(self.addresses[replica], options=HOST_CHANNEL_OPTIONS)
            self._by_key[key] = channel
            self.channels.append(channel)
        return channel

    # -- 2. idle ---------------------------------------------------------------------------

    async def idle(self) -> dict[str, Any]:
        self.counters.phase = "idle"
        await asyncio.sleep(SETTLE)
        queries = await self.acquire_queries()
        before = self.usage()
        with LagProbe() as lag:
            await asyncio.sleep(self.args.idle_seconds)
        after = self.usage()
        queries = await self.acquire_queries() - queries
        waiting, streams = await parked(self.urls, [])
        out = {
            **after.cores_since(before),
            # The short-wait hosts re-poll in waves: how many re-poll queries the window
            # held (an idle window's CPU goes with them).
            "acquire_queries": queries,
            "control_plane_rss_bytes": self.rss(),
            "acquires_waiting": waiting,
            "streams": streams,
            "screen_calls": self.counters.screen_calls,
            "loop_lag_ms": summarize(lag.lags_ms),
        }
        if self.args.condition_churn > 0 and self.args.churn_window:
            out["churn"] = await self.idle_churn(out)
        elif self.args.condition_churn > 0:  # the changes run on, unmeasured while idle
            for host in self.hosts:
                host.churn(self.args.condition_churn)
        return out

    async def listen_again(self) -> dict[str, Any]:
        """Every replica's LISTEN connection ended, as a failover would: until each has
        listened again and told every renewal stream it holds its host's state again (one
        read), the CPU of the replicas and of PostgreSQL, and the read and its push as the
        replicas time them (amc_stream_restate_seconds). Every parked Acquire looks again
        too (one query each): that is in the CPU."""
        self.counters.phase = "listen"
        name = "amc_stream_restate_seconds"
        before_samples = await scrape_all(self.urls)
        before = self.usage()
        db = await Db.connect(self.args.dsn)
        try:
            ended = await db.terminate_listeners()
        finally:
            await db.close()
        deadline = time.monotonic() + LISTEN_AGAIN_LIMIT
        while True:
            after_samples = await scrape_all(self.urls)
            counts = [
                promtext.value(a, f"{name}_count") - promtext.value(b, f"{name}_count")
                for b, a in zip(before_samples, after_samples, strict=True)
            ]
            if all(c >= 1 for c in counts):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replicas did not read their streams again: {counts}")
            await asyncio.sleep(0.05)
        after = self.usage()
        return {
            "listeners_ended": ended,
            "wall_s": after.at - before.at,
            "control_plane_cpu_ms": (after.cp - before.cp) * 1e3,
            "postgres_cpu_ms": (after.pg - before.pg) * 1e3,
            "restate_ms": [
                (promtext.value(a, f"{name}_sum") - promtext.value(b, f"{name}_sum")) * 1e3
                for b, a in zip(before_samples, after_samples, strict=True)
            ],
        }

    async def acquire_queries(self) -> int:
        return int(
            sum(promtext.value(s, "amc_acquire_queries_total") for s in await scrape_all(self.urls))
        )

    async def idle_churn(self, quiet: dict[str, Any]) -> dict[str, Any]:
        """Issue 22: the phones start changing condition; an idle window as long as the
        quiet one once the changes and the returns to ready flow."""
        a = self.args
        for host in self.hosts:
            host.churn(a.condition_churn)
        await asyncio.sleep(min(2 * PROBE_ROUND, a.idle_seconds))
        self.counters.phase = "idle_churn"
        queries = await self.acquire_queries()
        before = self.usage()
        with LagProbe() as lag:
            await asyncio.sleep(a.idle_seconds)
        after = self.usage()
        queries = await self.acquire_queries() - queries
        self.counters.phase = "busy"
        usage = after.cores_since(before)
        reports = self.counters.health_reports.get("idle_churn", 0)
        changes = self.counters.health_changes.get("idle_churn", 0)
        return {
            **usage,
            "share_per_min": a.condition_churn,
            "reports": reports,
            "changes": changes,
            "changes_per_min": changes * 60 / usage["wall_s"],
            "acquire_queries": queries,
            "control_plane_cores_added": usage["control_plane_cores"]
            - quiet["control_plane_cores"],
            "postgres_cores_added": usage["postgres_cores"] - quiet["postgres_cores"],
            "loop_lag_ms": summarize(lag.lags_ms),
        }

    # -- busy phones (issue 27.8) ------------------------------------------------------------

    BUSY_STEPS = 100  # the busy workflow's steps (a step "ends" every --step-every s)

    async def occupy(self) -> dict[str, Any]:
        """Every host's phones but d0 busy with a long workflow sending step progress;
        until all of them run."""
        a = self.args
        spec = task_pb2.TaskSpec(
            workflow=task_pb2.Workflow(
                steps=[
                    task_pb2.WorkflowStep(
                        name=f"step {i}",
                        actions=[task_pb2.Action(key=task_pb2.Key(keycode=0))],
                    )
                    for i in range(self.BUSY_STEPS)
                ]
            )
        )
        requests = [
            scheduler_pb2.SubmitTaskRequest(
                spec=spec,
                selector=task_pb2.DeviceSelector(serial=f"d{k}", labels={"rack": h.labels["rack"]}),
                max_attempts=1,
                metadata={"bench": "busy"},
            )
            for h in self.hosts
            for k in range(1, a.devices)
        ]
        channel = aio_channel(self.addresses[a.submit_to])
        scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
        started = time.monotonic()
        try:
            for i in range(0, len(requests), 500):
                batch = scheduler_pb2.SubmitTasksRequest(tasks=requests[i : i + 500])
                answer = await scheduler.SubmitTasks(batch, timeout=120)
                self.busy_ids += [t.task_id for t in answer.tasks]
        finally:
            await channel.close()
        deadline = time.monotonic() + a.busy_timeout
        while self.counters.busy < len(requests):
            if time.monotonic() > deadline:
                self.not_reached.append(
                    f"busy phones: {self.counters.busy} of {len(requests)} running after"
                    f" {time.monotonic() - started:.0f} s"
                )
                progress(f"load not reached: {self.not_reached[-1]}; the run goes on")
                break
            await asyncio.sleep(0.2)
        return {
            "busy_phones": len(requests),
            "busy_running": self.counters.busy,
            "occupy_s": time.monotonic() - started,
        }

    async def steps_window(self, idle: dict[str, Any]) -> dict[str, Any]:
        """The busy phones sending their steps, nothing submitted, for as long as the idle
        window: the CPU a step result costs (with the renewals it rides on, of leases held
        meanwhile), against the idle window's."""
        self.counters.phase = "steps"
        await asyncio.sleep(SETTLE)
        sent = self.counters.steps_sent
        before = self.usage()
        await asyncio.sleep(self.args.idle_seconds)
        after = self.usage()
        steps = self.counters.steps_sent - sent
        usage = after.cores_since(before)
        wall = usage["wall_s"]
        out: dict[str, Any] = {**usage, "steps": steps, "steps_per_s": steps / wall}
        for proc in ("control_plane", "postgres"):
            added = usage[f"{proc}_cores"] - idle[f"{proc}_cores"]
            out[f"{proc}_cores_added"] = added
            out[f"{proc}_cpu_us_per_step"] = added * wall * 1e6 / steps if steps else None
        return out

    async def free(self) -> dict[str, Any]:
        """Cancel the busy tasks; until every busy phone reported its task cancelled."""
        channel = aio_channel(self.addresses[self.args.submit_to])
        scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
        started = time.monotonic()

        async def cancel(task_id: str) -> None:
            try:
                await scheduler.CancelTask(
                    scheduler_pb2.CancelTaskRequest(task_id=task_id, reason="bench: end"),
                    timeout=60,
                )
            except grpc.aio.AioRpcError as exc:
                # Already finished (e.g. failed: its lease ran out on a saturated machine):
                # nothing to free.
                if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                    raise

        try:
            await bounded(
                [functools.partial(cancel, t) for t in self.busy_ids], CONNECT_CONCURRENCY
            )
        finally:
            await channel.close()
        deadline = time.monotonic() + 120
        while self.counters.busy > 0:
            if time.monotonic() > deadline:
                break  # reported as busy_left
            await asyncio.sleep(0.2)
        return {"busy_left": self.counters.busy, "free_s": time.monotonic() - started}

    # -- 3. submit -------------------------------------------------------------------------

    async def submit(self) -> dict[str, Any]:
        a = self.args
        rng = random.Random(a.seed)
        count = round(a.rate * a.seconds)
        spec = key_actions(1)
        channel = aio_channel(self.addresses[a.submit_to])
        scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
        submitted: dict[str, float] = {}
        host_of: dict[str, int] = {}
        call_of: dict[str, float] = {}
        call_ms: list[float] = []
        failed: list[str] = []
        rss: list[int] = []
        self.counters.phase = "submit"

        async def one(host: int) -> None:
            rack = self.hosts[host].labels["rack"]
            request = scheduler_pb2.SubmitTaskRequest(
                spec=spec, selector=task_pb2.DeviceSelector(labels={"rack": rack}), max_attempts=1
            )
            sent = time.monotonic()
            try:
                task = await scheduler.SubmitTask(request, timeout=60)
            except grpc.aio.AioRpcError as exc:
                failed.append(f"{exc.code().name}: {exc.details()}")
                return
            call_ms.append((time.monotonic() - sent) * 1e3)
            submitted[task.task_id] = sent
            host_of[task.task_id] = host
            call_of[task.task_id] = call_ms[-1]

        async def sample_rss() -> None:
            while True:
                rss.append(self.rss())
                await asyncio.sleep(0.5)

        try:
            # The submitter's connection up before the clock starts.
            await asyncio.wait_for(channel.channel_ready(), 10)
            calls: list[asyncio.Task[None]] = []
            sampler = asyncio.ensure_future(sample_rss())
            metrics_before = await scrape_all(self.urls)
            progress(f"submit window: {count} tasks at {a.rate:g}/s")
            before = self.usage()
            start = before.at
            with LagProbe() as lag, AutovacuumMeter(a.pg_pid) as autovacuum:
                for i in range(count):
                    await asyncio.sleep(max(0.0, start + i / a.rate - time.monotonic()))
                    calls.append(asyncio.ensure_future(one(rng.randrange(len(self.hosts)))))
                await asyncio.gather(*calls)
                last_submit = time.monotonic()
                self.expected = len(submitted)
                self.submitting = False
                if len(self.done) >= self.expected:
                    self.all_done.set()
                progress(f"{len(submitted)} tasks submitted; waiting for them to be done")
                try:
                    await asyncio.wait_for(self.all_done.wait(), a.drain_timeout)
                except TimeoutError:
                    pass
                after = self.usage()
            metrics_after = await scrape_all(self.urls)
            sampler.cancel()
        finally:
            await channel.close()
        done_in = [t for t in submitted if t in self.done]
        pickup = {
            t: (self.assigned[t] - s) * 1e3 for t, s in submitted.items() if t in self.assigned
        }
        usage = after.cores_since(before)
        wall = usage["wall_s"]
        n = max(1, len(done_in))
        return {
            "tasks": count,
            "submitted": len(submitted),
            "submit_failures": len(failed),
            "submit_failure_example": failed[0] if failed else "",
            "assigned": sum(1 for t in submitted if t in self.assigned),
            "done": len(done_in),
            "window_s": wall,
            "submit_phase_s": last_submit - start,
            "window_from_start_s": start - self.started_at,
            "drained": self.all_done.is_set(),
            "pickup_ms": summarize(list(pickup.values())),
            "pickup_ms_short_wait": summarize(
                [ms for t, ms in pickup.items() if host_of[t] in self.short]
            ),
            "pickup_ms_long_wait": summarize(
                [ms for t, ms in pickup.items() if host_of[t] not in self.short]
            ),
            # The same over the tasks whose host kept every phone ready from submit to
            # pickup (the others may have waited for a phone the churn took away).
            "pickup_ms_phones_ready": summarize(
                [
                    ms
                    for t, ms in pickup.items()
                    if not self.hosts[host_of[t]].had_phone_not_ready(
                        submitted[t], self.assigned[t]
                    )
                ]
            ),
            "pickup_ms_by_slice": slices(
                [(submitted[t] - start, ms) for t, ms in pickup.items()], SLICE
            ),
            # The slowest pickups: when in the window, and how much of each was the
            # SubmitTask call itself (the rest: dispatch to the parked Acquire and back).
            "slowest": [
                {
                    "at_s": round(submitted[t] - start, 3),
                    "pickup_ms": round(ms, 1),
                    "submit_call_ms": round(call_of[t], 1),
                    "short_wait": host_of[t] in self.short,
                    # A phone of the task's host (its rack's) was said not ready meanwhile
                    # (the condition churn): the task may have waited for a ready phone.
                    "phone_not_ready": self.hosts[host_of[t]].had_phone_not_ready(
                        submitted[t], self.assigned[t]
                    ),
                }
                for t, ms in sorted(pickup.items(), key=lambda kv: -kv[1])[:SLOWEST]
            ],
            "submit_schedule_s": count / a.rate,
            "submit_to_done_ms": summarize(
                [(self.done[t] - s) * 1e3 for t, s in submitted.items() if t in self.done]
            ),
            "submit_call_ms": summarize(call_ms),
            "usage": usage,
            "control_plane_cpu_ms_per_task": (after.cp - before.cp) * 1e3 / n,
            "postgres_cpu_ms_per_task": (after.pg - before.pg) * 1e3 / n,
            "postgres_autovacuum_cpu_s": autovacuum.cpu_s,
            "postgres_autovacuum_workers_seen": autovacuum.workers_seen,
            "postgres_cpu_ms_per_task_excluding_autovacuum": (
                (after.pg - before.pg - autovacuum.cpu_s) * 1e3 / n
            ),
            "load_client_cpu_ms_per_task": (after.me - before.me) * 1e3 / n,
            "control_plane_rss_bytes_max": max(rss) if rss else self.rss(),
            "loop_lag_ms": summarize(lag.lags_ms),
            "acquires_answered": self.counters.acquires.get("submit", 0),
            "repolls": self.counters.repolls.get("submit", 0),
            "replica_metrics": metric_deltas(metrics_before, metrics_after),
            "task_ids": list(submitted),
        }

    # -- 4. verify, and the end ------------------------------------------------------------

    async def verify(self, task_ids: list[str]) -> dict[str, Any]:
        db = await Db.connect(self.args.dsn)
        try:
            check = await db.lifecycle_check([uuid.UUID(t) for t in task_ids])
        finally:
            await db.close()
        counts = {k: int(v) for k, v in check.items() if isinstance(v, int)}
        n = len(task_ids)
        wanted = ("tasks", "done", "attempts", "attempts_done", "done_events")
        ok = n > 0 and all(counts.get(k) == n for k in wanted)
        return {"verified": ok, "check": counts}

    async def close(self) -> None:
        self.counters.phase = "close"
        await asyncio.wait_for(
            asyncio.gather(*(h.stop() for h in self.hosts), return_exceptions=True), 60
        )
        await asyncio.wait_for(
            asyncio.gather(*(c.close() for c in self.channels), return_exceptions=True), 60
        )


async def main(args: argparse.Namespace) -> dict[str, Any]:
    """The run's result; if a phase fails, what the phases before it found, and the error
    (the caller keeps the run's rows and goes on)."""
    fleet = Fleet(args)
    out: dict[str, Any] = {
        "hosts": args.hosts,
        "devices_per_host": args.devices,
        "replicas": len(fleet.addresses),
        "hosts_per_channel": args.hosts_per_channel,
        "load_not_reached": fleet.not_reached,
    }
    try:
        await phases(fleet, args, out)
    except Exception as exc:  # the result says what failed; the caller goes on
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        progress(f"failed: {out['error'][:300]}")
    return out


async def phases(fleet: Fleet, args: argparse.Namespace, out: dict[str, Any]) -> None:
    try:
        out["connect"] = await fleet.connect()
        # Thousands of hosts' objects live to the end: keep the collector from walking them
        # (its pauses would show up as pickup time).
        gc.collect()
        gc.freeze()
        progress(f"connected in {out['connect']['connect_s']:.1f}s; idle {args.idle_seconds:g}s")
        out["idle"] = await fleet.idle()
        progress(f"idle: control plane {out['idle']['control_plane_cores']:.3f} cores")
        if "churn" in out["idle"]:
            churn = out["idle"]["churn"]
            progress(
                f"idle with {churn['changes_per_min']:.0f} condition changes a minute:"
                f" control plane {churn['control_plane_cores']:.3f} cores"
                f" ({churn['control_plane_cores_added']:+.4f})"
            )
        out["listen_again"] = await fleet.listen_again()
        again = out["listen_again"]
        progress(
            f"listening again: streams' state read and pushed in"
            f" {', '.join(f'{ms:.1f}' for ms in again['restate_ms'])} ms;"
            f" control plane {again['control_plane_cpu_ms']:.0f} ms,"
            f" PostgreSQL {again['postgres_cpu_ms']:.0f} ms of CPU in {again['wall_s']:.2f}s"
        )
        if args.step_every > 0:
            out["busy"] = await fleet.occupy()
            progress(
                f"{out['busy']['busy_running']} of {out['busy']['busy_phones']} busy phones,"
                f" a step every {args.step_every:g}s"
            )
            if args.steps_window:
                out["steps"] = await fleet.steps_window(out["idle"])
                per = out["steps"]["control_plane_cpu_us_per_step"]
                progress(
                    f"steps: {out['steps']['steps_per_s']:.0f}/s; CPU per step result:"
                    f" control plane {per or 0:.0f} us (with the renewals they ride on)"
                )
        steps_before = fleet.counters.steps_sent
        out["submit"] = await fleet.submit()
        out["submit"]["steps_sent"] = fleet.counters.steps_sent - steps_before
        out["submit"]["steps_per_s"] = out["submit"]["steps_sent"] / out["submit"]["window_s"]
        out["submit"]["condition_changes"] = fleet.counters.health_changes.get("submit", 0)
        if args.step_every > 0:
            out["busy"].update(await fleet.free())
        task_ids = out["submit"].pop("task_ids")
        out.update(await fleet.verify(task_ids))
    finally:
        errors = dict(vars(fleet.counters))
        errors["failed_after_s"] = summarize(errors["failed_after_s"])
        out["errors"] = {**errors, "total": fleet.counters.total()}
        progress("closing the hosts")
        await fleet.close()


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--addresses", required=True, help="replicas' gRPC addresses, comma-separated")
    p.add_argument("--metrics-urls", required=True, help="their /metrics URLs, same order")
    p.add_argument("--cp-pids", required=True, help="their process ids, same order")
    p.add_argument("--pg-pid", type=int, required=True, help="the postmaster's process id")
    p.add_argument("--dsn", required=True)
    p.add_argument("--hosts", type=int, default=10)
    p.add_argument("--devices", type=int, default=4)
    p.add_argument("--rate", type=float, default=20.0)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--idle-seconds", type=float, default=10.0)
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument("--hosts-per-channel", type=int, default=1)
    p.add_argument("--acquire-wait", type=float, default=60.0, help="hosts' Acquire wait, s")
    p.add_argument("--short-wait", type=float, default=10.0, help="the short-wait hosts' one")
    p.add_argument("--short-wait-share", type=float, default=0.0, help="share of those hosts")
    p.add_argument("--submit-to", type=int, default=0, help="index of the submitting replica")
    p.add_argument("--prefix", default=f"fleet-{uuid.uuid4().hex[:6]}")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--step-every", type=float, default=0.0, help="busy phones' step period, s (0: none)"
    )
    p.add_argument(
        "--no-churn-window",
        dest="churn_window",
        action="store_false",
        help="the condition changes start after the idle window without a window of their own",
    )
    p.add_argument(
        "--no-steps-window",
        dest="steps_window",
        action="store_false",
        help="no window of the busy phones' steps alone before the submit window",
    )
    p.add_argument(
        "--busy-timeout",
        type=float,
        default=120.0,
        help="how long the busy phones may take to all run; past it: load not reached",
    )
    p.add_argument(
        "--condition-churn",
        type=float,
        default=0.0,
        help="share of the phones changing condition a minute, from after the quiet idle"
        " window (issue 22; 0: none)",
    )
    return p.parse_args(argv)


if __name__ == "__main__":
    # The hosts report through the agent's own ResultBatcher: its per-result log lines
    # would cost this process more than playing the hosts does.
    configure(level="WARNING")
    result = asyncio.run(main(parse(sys.argv[1:])))
    print(json.dumps(result), flush=True)
