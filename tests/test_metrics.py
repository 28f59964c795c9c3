"""Prometheus metrics of the control plane move with what happens."""

from __future__ import annotations

from prometheus_client import REGISTRY

from amc.v1 import lease_pb2, scheduler_pb2
from tests.support import Farm, actions_spec, eventually


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


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
