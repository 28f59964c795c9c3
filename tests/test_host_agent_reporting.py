"""Reports and releases (host_agent.reporting) against a real control plane: retried on
transport errors, idempotent across a lost response, never retried when refused."""

from __future__ import annotations

import time
import uuid

import grpc

from amc.v1 import lease_pb2, lease_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from control_plane.domain import Role
from host_agent.reporting import release_lease, report_result
from host_agent.retry import RetryPolicy
from host_agent.simulated import SimulatedSource
from tests.support import Farm, HostClient, actions_spec, eventually
from tests.support.agent import finished, running_agent, status_is, submit
from tests.support.fakes.tcp_proxy import TcpProxy

FAST_RETRY = RetryPolicy(total=3.0, call_timeout=2.0, initial_backoff=0.05, max_backoff=0.2)


async def assigned(farm: Farm) -> tuple[HostClient, lease_pb2.Assignment]:
    host = await farm.host("h1", "s1")
    await submit(await farm.client(), actions_spec())
    a = await host.acquire_one("s1")
    await host.renew(a.lease_id)
    return host, a


def report(a: lease_pb2.Assignment, outcome: lease_pb2.Outcome) -> lease_pb2.ReportResultRequest:
    return lease_pb2.ReportResultRequest(
        task_id=a.task_id,
        attempt=a.attempt,
        lease_id=a.lease_id,
        outcome=outcome,
        result=task_pb2.TaskResult(),
    )


async def test_retry_a_result_after_response_loss(farm: Farm) -> None:
    """THEN the control plane returns the recorded terminal result without creating a new
    attempt or error: the agent's retry gets it, and one report transition is recorded."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with (
        TcpProxy("127.0.0.1", int(farm.address.rsplit(":", 1)[1])) as proxy,
        running_agent(farm, source, address=proxy.address) as agent,
    ):
        # Only the report carries the step's output (the marker) upstream: forward it,
        # then let nothing through, and drop the connection once it is recorded.
        marker = uuid.uuid4().hex
        report_sent = proxy.freeze_after("up", marker.encode())
        echo = task_pb2.Action(shell=task_pb2.Shell(command=f"echo {marker}"))
        task_id = await submit(client, actions_spec(echo))
        await eventually(report_sent.is_set, what="the report to reach the control plane")
        await status_is(farm, task_id, "done")
        proxy.cut(refuse=False)
        record = await finished(agent, task_id)
    delivery = record.delivery
    assert delivery is not None and delivery.response is not None, delivery
    assert delivery.tries >= 2  # the first response never arrived
    assert delivery.response.status == task_pb2.TASK_STATUS_DONE
    assert delivery.response.result.steps[0].output == f"{marker}\n"
    events = await farm.events(task_id)
    assert [e["to_status"] for e in events if e["kind"] == "report"] == ["done"]
    assert len(await farm.attempts(task_id)) == 1


async def test_identical_report_repeated_returns_the_recorded_task(farm: Farm) -> None:
    """THEN sending the same report twice yields the same recorded task, one transition."""
    host, a = await assigned(farm)
    first = await report_result(host.c.lease, report(a, lease_pb2.OUTCOME_DONE), FAST_RETRY)
    again = await report_result(host.c.lease, report(a, lease_pb2.OUTCOME_DONE), FAST_RETRY)
    assert first.accepted and again.accepted
    assert first.response == again.response
    assert [e["kind"] for e in await farm.events(a.task_id)].count("report") == 1


async def test_stale_report_is_refused_once_and_not_retried(farm: Farm) -> None:
    """THEN ABORTED (lease expired) ends the report at once, with nothing recorded."""
    host, a = await assigned(farm)
    await farm.expire_now(a.lease_id)
    await status_is(farm, a.task_id, "queued")
    delivery = await report_result(host.c.lease, report(a, lease_pb2.OUTCOME_DONE), FAST_RETRY)
    assert delivery.code == grpc.StatusCode.ABORTED
    assert delivery.refused and delivery.tries == 1
    assert await farm.status(a.task_id) == "queued"


async def test_cancelled_report_without_a_cancellation_is_refused_and_not_retried(
    farm: Farm,
) -> None:
    """THEN FAILED_PRECONDITION ends the report at once and the task is still running."""
    host, a = await assigned(farm)
    delivery = await report_result(host.c.lease, report(a, lease_pb2.OUTCOME_CANCELLED), FAST_RETRY)
    assert delivery.code == grpc.StatusCode.FAILED_PRECONDITION
    assert delivery.tries == 1
    assert await farm.status(a.task_id) == "dispatched"


async def test_report_gives_up_after_its_total_time_when_the_control_plane_is_unreachable(
    farm: Farm,
) -> None:
    """THEN a report to an unreachable control plane is retried, then given up, in bounded
    time, and says it was not refused but undelivered."""
    _, a = await assigned(farm)
    policy = RetryPolicy(total=1.0, call_timeout=0.5, initial_backoff=0.05, max_backoff=0.2)
    async with TcpProxy("127.0.0.1", int(farm.address.rsplit(":", 1)[1])) as proxy:
        channel = aio_channel(proxy.address, await farm.token(Role.HOST, "h1"))
        proxy.cut()
        started = time.monotonic()
        delivery = await report_result(
            lease_pb2_grpc.LeaseStub(channel), report(a, lease_pb2.OUTCOME_DONE), policy
        )
        elapsed = time.monotonic() - started
        await channel.close()
    assert not delivery.accepted and not delivery.refused
    assert delivery.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    assert delivery.tries >= 2
    assert elapsed < 1.0 + 0.5 + 0.5
    assert await farm.status(a.task_id) == "dispatched"


async def test_released_lease_requeues_its_task_at_once(farm: Farm) -> None:
    """THEN ReleaseLease ends the attempt as released and the task is queued again."""
    host, a = await assigned(farm)
    delivery = await release_lease(host.c.lease, a.lease_id, "host: test", FAST_RETRY)
    assert delivery.accepted
    assert await farm.status(a.task_id) == "queued"
    (attempt,) = await farm.attempts(a.task_id)
    assert attempt["state"] == "released"
