"""Results of tasks that end together go to the control plane in one call (issue 10.2)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from amc.v1 import lease_pb2, scheduler_pb2
from host_agent.reporting import ResultBatcher
from host_agent.retry import RetryPolicy
from tests.support import Farm, HostClient, actions_spec, eventually


async def _assigned(farm: Farm, n: int) -> tuple[HostClient, list[lease_pb2.Assignment]]:
    client = await farm.client()
    serials = [f"s{i}" for i in range(n)]
    host = await farm.host("h1", *serials)
    for _ in range(n):
        await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))
    handed = await host.acquire(*serials, wait=5)
    assert len(handed) == n
    return host, handed


def _request(a: lease_pb2.Assignment) -> lease_pb2.ReportResultRequest:
    return lease_pb2.ReportResultRequest(
        task_id=a.task_id, attempt=a.attempt, lease_id=a.lease_id, outcome=lease_pb2.OUTCOME_DONE
    )


class Counting:
    """The real stub (a real channel to the real control plane), counting calls through it."""

    def __init__(self, stub: Any) -> None:
        self._stub = stub
        self.calls: list[tuple[str, int]] = []

    def ReportResult(self, request: lease_pb2.ReportResultRequest, **kw: Any) -> Any:
        self.calls.append(("ReportResult", 1))
        return self._stub.ReportResult(request, **kw)

    def ReportResults(self, request: lease_pb2.ReportResultsRequest, **kw: Any) -> Any:
        self.calls.append(("ReportResults", len(request.results)))
        return self._stub.ReportResults(request, **kw)


async def test_results_that_end_together_go_in_one_call(farm: Farm) -> None:
    """THEN results handed over together (or while a call is in flight) go in one call and
    one transaction, and every one is recorded."""
    host, handed = await _assigned(farm, 9)
    stub = Counting(host.c.lease)
    batcher = ResultBatcher(stub)  # type: ignore[arg-type]
    deliveries = await asyncio.gather(*(batcher.report(_request(a)) for a in handed))
    assert all(d.accepted for d in deliveries)
    assert stub.calls == [("ReportResults", 9)]
    for a in handed:
        assert await farm.status(a.task_id) == "done"
    assert farm.db is not None
    # One transaction: the reports of the batch were written with one transaction id.
    xids = await farm.db.fetchval(
        "SELECT count(DISTINCT xmin::text) FROM task_events WHERE kind = 'report'"
        " AND task_id = ANY($1::uuid[])",
        [a.task_id for a in handed],
    )
    assert xids == 1


async def test_a_refused_result_in_a_batch_is_refused_alone(farm: Farm) -> None:
    host, handed = await _assigned(farm, 3)
    await farm.expire_now(handed[2].lease_id)
    batcher = ResultBatcher(host.c.lease)
    first, second, stale = await asyncio.gather(*(batcher.report(_request(a)) for a in handed))
    assert first.accepted and second.accepted
    assert not stale.accepted and stale.refused
    assert stale.code is grpc.StatusCode.ABORTED
    assert await farm.status(handed[2].task_id) != "done"


class Old(Counting):
    """A control plane of a release without ReportResults."""

    def ReportResults(self, request: lease_pb2.ReportResultsRequest, **kw: Any) -> Any:
        self.calls.append(("ReportResults", len(request.results)))
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.UNIMPLEMENTED, grpc.aio.Metadata(), grpc.aio.Metadata()
        )


async def test_a_control_plane_without_batches_gets_each_result_alone(farm: Farm) -> None:
    host, handed = await _assigned(farm, 4)
    stub = Old(host.c.lease)
    batcher = ResultBatcher(stub)  # type: ignore[arg-type]
    policy = RetryPolicy(total=5)
    deliveries = await asyncio.gather(*(batcher.report(_request(a), policy) for a in handed))
    assert all(d.accepted for d in deliveries)
    assert [name for name, _ in stub.calls] == ["ReportResults"] + ["ReportResult"] * 4
    for a in handed:
        assert await farm.status(a.task_id) == "done"


async def test_results_ending_while_a_report_is_in_flight_follow_it_together(
    farm: Farm,
) -> None:
    host, handed = await _assigned(farm, 5)
    stub = Counting(host.c.lease)
    batcher = ResultBatcher(stub)  # type: ignore[arg-type]
    first = asyncio.ensure_future(batcher.report(_request(handed[0])))
    await eventually(lambda: stub.calls, what="the first call to be on its way")
    rest = [asyncio.ensure_future(batcher.report(_request(a))) for a in handed[1:]]
    deliveries = await asyncio.gather(first, *rest)
    assert all(d.accepted for d in deliveries)
    assert stub.calls == [("ReportResult", 1), ("ReportResults", 4)]


async def test_a_result_that_ends_alone_goes_at_once_as_a_plain_report(farm: Farm) -> None:
    host, handed = await _assigned(farm, 1)
    stub = Counting(host.c.lease)
    delivery = await ResultBatcher(stub).report(_request(handed[0]))  # type: ignore[arg-type]
    assert delivery.accepted and stub.calls == [("ReportResult", 1)]
