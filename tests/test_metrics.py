"""Prometheus metrics move with what happens, and every labelled series is there (at 0)
from start-up: the control plane and the agent run as real processes and their /metrics
endpoints are scraped over HTTP."""

from __future__ import annotations

import asyncio
import importlib
import signal
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from amc.v1 import lease_pb2, scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from control_plane import metrics as plane_metrics
from control_plane.embedded import free_port
from host_agent import devices
from host_agent import metrics as agent_metrics
from scripts.launch import ControlPlaneCommand, HostAgentCommand
from tests.support import Farm, actions_spec, eventually, seconds, tap
from tests.support.replicas import ROOT

Series = tuple[str, frozenset[tuple[str, str]]]


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def scrape(port: int) -> dict[Series, float]:
    """Every sample the /metrics endpoint on `port` serves."""

    def get() -> str:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return str(response.read().decode())

    text = await asyncio.to_thread(get)
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def labelled(samples: dict[Series, float], prefix: str) -> set[Series]:
    """The labelled series whose name starts with `prefix` (histogram buckets aside)."""
    return {
        key for key in samples if key[0].startswith(prefix) and key[1] and "le" not in dict(key[1])
    }


def value(samples: dict[Series, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


@dataclass
class Processes:
    address: str
    plane_metrics: int
    agent_metrics: int


@pytest.fixture
async def processes(database_url: str, tmp_path: Path) -> AsyncIterator[Processes]:
    """A control plane (no authentication) and a host agent with one simulated phone."""
    plane_port, agent_port = free_port(), free_port()
    plane = ControlPlaneCommand(
        listen=f"127.0.0.1:{free_port()}",
        database_url=database_url,
        insecure=True,
        metrics_listen=f"127.0.0.1:{plane_port}",
        log_format="json",
    )
    agent = HostAgentCommand(
        control_plane=plane.listen,
        host_id="h1",
        insecure=True,
        simulated_devices=1,
        sim_delay=0.01,
        metrics_listen=f"127.0.0.1:{agent_port}",
        log_format="json",
    )
    procs = [spawn(plane.argv(), plane.env(), tmp_path / "plane.log")]
    try:
        await eventually(lambda: _up(plane_port), timeout=30, what="the control plane's /metrics")
        procs.append(spawn(agent.argv(), agent.env(), tmp_path / "agent.log"))
        await eventually(lambda: _up(agent_port), timeout=30, what="the agent's /metrics")
        yield Processes(plane.listen, plane_port, agent_port)
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)


def spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


async def _up(port: int) -> bool:
    try:
        await scrape(port)
    except OSError:
        return False
    return True


async def test_every_labelled_series_is_served_at_zero_from_start_up(
    processes: Processes,
) -> None:
    """Before anything happened, each series an alert may name is there with 0, and no
    `_created` series is served."""
    plane = await scrape(processes.plane_metrics)
    agent = await scrape(processes.agent_metrics)
    for samples in (plane, agent):
        assert not [name for name, _ in samples if name.endswith("_created")]
    for to in ("queued", "cancelled", "failed"):
        assert value(plane, "amc_leases_expired_total", to=to) == 0
    for event, to in plane_metrics.TRANSITION_LABELS:
        assert value(plane, "amc_task_transitions_total", event=str(event), to=str(to)) == 0
    for result in ("woken", "unmatched"):
        assert value(plane, "amc_dispatch_offers_total", result=result) == 0
    for result in ("renewed", "conflict"):
        assert value(plane, "amc_renewals_total", result=result) == 0
    for path in ("push", "renewal"):
        assert value(plane, "amc_cancel_delivery_seconds_count", path=path) == 0
    for kind in ("DeviceLost", "DeviceTimeout", "CommandFailed"):
        assert value(agent, "amc_agent_device_errors_total", kind=kind) == 0
    for via in ("push", "renewal"):
        assert value(agent, "amc_agent_cancels_seen_total", via=via) == 0
    for how, outcome in agent_metrics.TASK_ENDINGS:
        assert value(agent, "amc_agent_tasks_total", how=how, outcome=outcome) == 0
    assert value(agent, "amc_agent_action_seconds_count", action="wait", status="stopped") == 0


async def test_a_cancelled_run_counts_under_series_that_were_there_from_the_start(
    processes: Processes,
) -> None:
    """A task cancelled while it runs moves the counters, `reported` and `cancelled` as two
    labels; no series appears that start-up had not made."""
    plane_before = await scrape(processes.plane_metrics)
    agent_before = await scrape(processes.agent_metrics)
    async with aio_channel(processes.address) as channel:
        scheduler = scheduler_pb2_grpc.SchedulerStub(channel)
        spec = actions_spec(tap(), task_pb2.Action(wait=task_pb2.Wait(duration=seconds(60))))
        task = await scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec))

        async def status_is(status: int) -> bool:
            got = await scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))
            return bool(got.status == status)

        await eventually(lambda: status_is(task_pb2.TASK_STATUS_DISPATCHED), timeout=20)
        # Once the tap is counted the minute-long wait runs: the cancel stops it mid-way.
        await eventually(lambda: _tapped(processes.agent_metrics), timeout=20, what="the tap")
        await scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=task.task_id))
        await eventually(lambda: status_is(task_pb2.TASK_STATUS_CANCELLED), timeout=20)

    async def counted() -> dict[Series, float] | None:
        agent = await scrape(processes.agent_metrics)
        done = value(agent, "amc_agent_tasks_total", how="reported", outcome="cancelled")
        return agent if done == 1 else None

    agent = await eventually(counted, timeout=20, what="the agent to count the task")
    plane = await scrape(processes.plane_metrics)
    # Pushed at once, unless a renewal in flight happened to carry it first.
    seen = [value(agent, "amc_agent_cancels_seen_total", via=via) for via in ("push", "renewal")]
    assert sorted(seen) == [0, 1]
    assert value(agent, "amc_agent_action_seconds_count", action="tap", status="ok") == 1
    assert value(agent, "amc_agent_action_seconds_count", action="wait", status="stopped") == 1
    assert value(plane, "amc_task_transitions_total", event="report", to="cancelled") == 1
    paths = [value(plane, "amc_cancel_delivery_seconds_count", path=p) for p in ("push", "renewal")]
    assert sorted(paths) == [0, 1]
    assert labelled(agent, "amc_agent_") == labelled(agent_before, "amc_agent_")
    assert labelled(plane, "amc_") == labelled(plane_before, "amc_")


async def _tapped(port: int) -> bool:
    samples = await scrape(port)
    return value(samples, "amc_agent_action_seconds_count", action="tap", status="ok") == 1


def test_every_device_error_kind_has_its_series() -> None:
    """The kinds created at start-up are the DeviceError classes there are."""
    # Their subclasses count too: the sources', the adb door's and the emulator console's.
    for module in (
        "host_agent.adb",
        "host_agent.simulated",
        "host_agent.adb_door",
        "host_agent.emulator_console",
    ):
        importlib.import_module(module)

    def names(cls: type) -> set[str]:
        return {cls.__name__}.union(*(names(sub) for sub in cls.__subclasses__()))

    assert names(devices.DeviceError) == set(agent_metrics.DEVICE_ERROR_KINDS)


def test_every_action_kind_has_its_series() -> None:
    """The action label covers every kind of action a task may hold."""
    kinds = task_pb2.Action.DESCRIPTOR.oneofs_by_name["kind"].fields
    assert set(agent_metrics.ACTION_KINDS) == {f.name for f in kinds}


async def test_metrics_count_assignments_renewals_and_the_cancel_latency_split(farm: Farm) -> None:
    before = {
        "assigned": sample("amc_task_transitions_total", event="assign", to="assigned"),
        "renewed": sample("amc_renewals_total", result="renewed"),
        "conflict": sample("amc_renewals_total", result="conflict"),
        "push": sample("amc_cancel_delivery_seconds_count", path="push"),
        "renewal": sample("amc_cancel_delivery_seconds_count", path="renewal"),
        "stop": sample("amc_cancel_stop_seconds_count"),
        "latency": sample("amc_assignment_latency_seconds_count"),
    }
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))
    a = await host.acquire_one("s1")
    stream = host.stream()
    await stream.renew(a.lease_id, "not-a-lease")
    await client.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=task.task_id))
    await eventually(lambda: stream.pushes, what="the push")
    await eventually(lambda: _delivered(farm, task.task_id), what="delivery recorded")
    await stream.renew(a.lease_id)
    await host.report(a, lease_pb2.OUTCOME_CANCELLED)
    await stream.close()
    assert sample("amc_task_transitions_total", event="assign", to="assigned") == (
        before["assigned"] + 1
    )
    assert sample("amc_assignment_latency_seconds_count") == before["latency"] + 1
    assert sample("amc_renewals_total", result="renewed") == before["renewed"] + 2
    assert sample("amc_renewals_total", result="conflict") == before["conflict"] + 1
    assert sample("amc_cancel_delivery_seconds_count", path="push") == before["push"] + 1
    # The push told the host first, so the later renewal is not a first delivery.
    assert sample("amc_cancel_delivery_seconds_count", path="renewal") == before["renewal"]
    assert sample("amc_cancel_stop_seconds_count") == before["stop"] + 1


async def _delivered(farm: Farm, task_id: str) -> bool:
    (attempt,) = await farm.attempts(task_id)
    return attempt["cancel_delivered_at"] is not None
