"""The metrics an operator alerts on, scraped from the real /metrics of a control-plane
process and a host-agent process: they exist at 0 from start-up and move with the farm."""

from __future__ import annotations

import asyncio
import subprocess
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from amc.v1 import lease_pb2, lease_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from control_plane.admin_service import create_token
from control_plane.domain import Role
from control_plane.embedded import free_port
from control_plane.store import Store
from scripts.launch import HostAgentCommand
from tests.support import actions_spec, device, eventually, seconds, tap
from tests.support.replicas import Replica

ROOT = Path(__file__).resolve().parent.parent
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@dataclass
class Scraper:
    port: int

    async def __call__(self) -> Samples:
        """The samples; none while the process is not listening yet."""
        try:
            return await asyncio.to_thread(scrape, self.port)
        except OSError:
            return {}

    async def value(self, name: str, **labels: str) -> float | None:
        return (await self()).get((name, frozenset(labels.items())))

    async def reaches(self, name: str, value: float, **labels: str) -> None:
        async def check() -> bool:
            return await self.value(name, **labels) == value

        await eventually(check, timeout=20, interval=0.2, what=f"{name}{labels} == {value}")


@pytest.fixture
def control_plane(database_url: str, tmp_path: Path) -> Iterator[tuple[Replica, Scraper]]:
    port = free_port()
    replica = Replica(database_url, metrics_listen=f"127.0.0.1:{port}", log=tmp_path / "cp.log")
    try:
        yield replica, Scraper(port)
    finally:
        replica.stop()


async def token(dsn: str, role: Role, host_id: str | None = None) -> str:
    store = await Store.open(dsn, min_size=1, max_size=1)
    try:
        return (await create_token(store, role, host_id, "metrics test"))[1]
    finally:
        await store.close()


@asynccontextmanager
async def agent_process(
    address: str, host_token: str, metrics_port: int, log: Path
) -> AsyncIterator[None]:
    command = HostAgentCommand(
        control_plane=address,
        host_id="m1",
        token=host_token,
        simulated_devices=2,
        sim_delay=0.01,
        metrics_listen=f"127.0.0.1:{metrics_port}",
    )
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *command.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=command.env()
        )
    try:
        yield
    finally:
        proc.kill()
        await proc.wait()


ZERO_AT_START = [
    ("amc_devices", {"state": state, "use": use})
    for state in ("device", "offline", "unauthorized", "gone")
    for use in ("busy", "idle")
] + [
    ("amc_queue_depth", {"selector": "any"}),
    ("amc_queue_oldest_seconds", {"selector": "any"}),
    ("amc_pickup_latency_seconds_count", {}),
    ("amc_task_run_seconds_count", {"outcome": "done"}),
    ("amc_task_run_seconds_count", {"outcome": "failed"}),
    ("amc_task_run_seconds_count", {"outcome": "cancelled"}),
    ("amc_task_requeues_total", {"cause": "lease_expired"}),
    ("amc_task_requeues_total", {"cause": "lease_released"}),
    *[
        ("amc_auth_failures_total", {"reason": r})
        for r in ("missing", "malformed", "unknown", "revoked", "forbidden")
    ],
    *[
        ("amc_retention_removed_total", {"kind": k})
        for k in ("tasks", "attempts", "task_events", "artifacts", "hosts", "devices")
    ],
    ("amc_retention_batch_seconds_count", {"what": "tasks"}),
    ("amc_retention_batch_seconds_count", {"what": "hosts"}),
    ("amc_rpc_requests_total", {"method": "Scheduler/SubmitTask", "code": "OK"}),
    ("amc_rpc_requests_total", {"method": "Lease/RenewLeases", "code": "OK"}),
    ("amc_rpc_duration_seconds_count", {"method": "Scheduler/ListTaskEvents", "code": "OK"}),
]


async def test_operator_metrics_exist_at_zero_from_start_up(
    control_plane: tuple[Replica, Scraper], database_url: str, tmp_path: Path
) -> None:
    """Every labelled series is there before anything happened; the agent's connection,
    adb and device gauges follow it; both name their build."""
    replica, cp = control_plane
    agent = Scraper(free_port())
    host_token = await token(database_url, Role.HOST, "m1")
    # The agent first, so that it starts disconnected.
    async with agent_process(replica.address, host_token, agent.port, tmp_path / "agent.log"):
        await agent.reaches("amc_agent_devices", 2, state="device")
        assert await agent.value("amc_agent_connected") == 0
        assert await agent.value("amc_agent_adb_up") == 1
        assert await agent.value("amc_agent_devices", state="offline") == 0
        await replica.start()
        samples = await cp()
        for name, labels in ZERO_AT_START:
            assert samples.get((name, frozenset(labels.items()))) == 0, (name, labels)
        builds = [labels for (name, labels), v in samples.items() if name == "amc_build_info"]
        assert any(("program", "control-plane") in labels for labels in builds), builds
        await agent.reaches("amc_agent_connected", 1)
        assert any(
            name == "amc_build_info" and ("program", "host-agent") in labels
            for name, labels in await agent()
        )
        await cp.reaches("amc_devices", 2, state="device", use="idle")
        await cp.reaches("amc_hosts_connected", 1)


async def test_operator_metrics_move_with_the_farm(
    control_plane: tuple[Replica, Scraper], database_url: str
) -> None:
    """Refused calls count by reason; the queue by selector; a release counts a requeue;
    acknowledgement a pickup; a report the run time by outcome; each call by method and
    code."""
    replica, cp = control_plane
    client_token = await token(database_url, Role.CLIENT)
    host_token = await token(database_url, Role.HOST, "h9")
    await replica.start()
    anonymous = aio_channel(replica.address, None)
    client = aio_channel(replica.address, client_token)
    host = aio_channel(replica.address, host_token)
    try:
        scheduler = scheduler_pb2_grpc.SchedulerStub(client)
        with pytest.raises(grpc.aio.AioRpcError):
            await scheduler_pb2_grpc.SchedulerStub(anonymous).ListTasks(
                scheduler_pb2.ListTasksRequest()
            )
        with pytest.raises(grpc.aio.AioRpcError):
            await scheduler.ListHosts(scheduler_pb2.ListHostsRequest())
        with pytest.raises(grpc.aio.AioRpcError):
            await scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id="nope"))
        await cp.reaches("amc_auth_failures_total", 1, reason="missing")
        await cp.reaches("amc_auth_failures_total", 1, reason="forbidden")
        await cp.reaches(
            "amc_rpc_requests_total", 1, method="Scheduler/ListHosts", code="PERMISSION_DENIED"
        )
        await cp.reaches(
            "amc_rpc_requests_total", 1, method="Scheduler/GetTask", code="INVALID_ARGUMENT"
        )

        await scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(
                spec=actions_spec(tap()),
                selector=task_pb2.DeviceSelector(labels={"rack": "r9"}),
            )
        )
        await cp.reaches("amc_queue_depth", 1, selector="rack=r9")
        await cp.reaches("amc_rpc_requests_total", 1, method="Scheduler/SubmitTask", code="OK")

        lease = lease_pb2_grpc.LeaseStub(host)
        await lease.RegisterHost(
            lease_pb2.RegisterHostRequest(
                host_id="h9", labels={"rack": "r9"}, devices=[device("s1")]
            )
        )
        first = await _dispatched(lease)
        await lease.ReleaseLease(lease_pb2.ReleaseLeaseRequest(lease_id=first.lease_id))
        await cp.reaches("amc_task_requeues_total", 1, cause="lease_released")
        second = await _dispatched(lease)
        await lease.ReportResult(
            lease_pb2.ReportResultRequest(
                task_id=second.task_id,
                attempt=second.attempt,
                lease_id=second.lease_id,
                outcome=lease_pb2.OUTCOME_DONE,
            )
        )
        await cp.reaches("amc_pickup_latency_seconds_count", 2)
        await cp.reaches("amc_task_run_seconds_count", 1, outcome="done")
        await cp.reaches("amc_queue_depth", None, selector="rack=r9")  # type: ignore[arg-type]
        assert await cp.value("amc_queue_depth", selector="any") == 0
    finally:
        for channel in (anonymous, client, host):
            await channel.close()


async def _dispatched(lease: lease_pb2_grpc.LeaseStub) -> lease_pb2.Assignment:
    answer = await lease.Acquire(
        lease_pb2.AcquireRequest(host_id="h9", idle_serials=["s1"], wait=seconds(5))
    )
    (assignment,) = answer.assignments
    request = lease_pb2.RenewLeasesRequest(host_id="h9", lease_ids=[assignment.lease_id], seq=1)
    [r async for r in lease.RenewLeases(iter([request]))]
    return assignment


async def test_retention_counts_the_rows_it_removes(database_url: str, tmp_path: Path) -> None:
    """A replica with --task-retention 1d and --forget-hosts-after 1d deletes a task that
    finished two days ago and a host unseen for two days; /metrics counts each kind."""
    port = free_port()
    replica = Replica(
        database_url,
        metrics_listen=f"127.0.0.1:{port}",
        log=tmp_path / "cp.log",
        task_retention=86400,
        forget_hosts_after=86400,
        retention_interval=0.1,
    )
    cp = Scraper(port)
    client_token = await token(database_url, Role.CLIENT)
    host_token = await token(database_url, Role.HOST, "old")
    await replica.start()
    try:
        async with (
            aio_channel(replica.address, client_token) as client,
            aio_channel(replica.address, host_token) as host,
        ):
            scheduler = scheduler_pb2_grpc.SchedulerStub(client)
            task = await scheduler.SubmitTask(
                scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap()))
            )
            await scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=task.task_id))
            await lease_pb2_grpc.LeaseStub(host).RegisterHost(
                lease_pb2.RegisterHostRequest(host_id="old", devices=[device("o1"), device("o2")])
            )
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute(
                "UPDATE tasks SET finished_at = now() - interval '2 days';"
                " UPDATE hosts SET last_seen_at = now() - interval '2 days'"
            )
        finally:
            await conn.close()
        await cp.reaches("amc_retention_removed_total", 1, kind="tasks")
        await cp.reaches("amc_retention_removed_total", 2, kind="task_events")
        await cp.reaches("amc_retention_removed_total", 1, kind="hosts")
        await cp.reaches("amc_retention_removed_total", 2, kind="devices")
        assert await cp.value("amc_retention_removed_total", kind="attempts") == 0
    finally:
        replica.stop()


def test_grafana_dashboard_uses_only_metrics_that_exist() -> None:
    """Every metric the importable dashboard queries is one the programs export."""
    import json
    import re

    from prometheus_client import REGISTRY

    import control_plane.metrics
    import host_agent.metrics
    from amc_common import build

    assert control_plane.metrics and host_agent.metrics and build
    dashboard = json.loads(
        (Path(__file__).parent.parent / "docs/grafana-dashboard.json").read_text()
    )
    exported = set()
    for family in REGISTRY.collect():
        exported |= {family.name + s for s in ("", "_total", "_bucket", "_count", "_sum")}
    used = {
        name
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
        for name in re.findall(r"\bamc_[a-z_]+", target["expr"])
    }
    assert used and used <= exported, used - exported
    assert dashboard["__inputs"][0]["pluginId"] == "prometheus"
