"""The host's final word on an attempt: ReportResult, or ReleaseLease when it gives up.

Both are safe to repeat (an identical report returns the recorded outcome; releasing an
ended lease changes nothing), so both retry with exponential backoff on errors that may
have happened before *or after* the control plane acted: the connection dropped, the
deadline ran out, the server was busy or restarting. They stop at once on refusals (the
lease is stale or foreign, a different outcome is recorded, the request is malformed),
which retrying cannot change, and give up after a bounded total time: the lease then runs
out on the control plane, which requeues the task or fails it. (How they retry:
`host_agent.retry`.)

`FinalCalls` runs these final calls shielded, so cancelling the worker that made one cannot
cut it off half-way; the agent awaits them all before it returns.

`ResultBatcher` sends the results of tasks that end at nearly the same moment together:
while one report call is in flight, the results that come meanwhile wait and then go in one
ReportResults call (one transaction on the control plane). Nothing waits for company: a
result that ends alone goes at once, as a plain ReportResult.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc, task_pb2
from host_agent.retry import Delivery, Logger, RetryPolicy, call_with_retries

T = TypeVar("T")
log = structlog.get_logger(__name__)

# How long a report and a release try, unless the caller says otherwise.
REPORT_POLICY = RetryPolicy()
RELEASE_POLICY = RetryPolicy(total=10.0)


async def report_result(
    stub: lease_pb2_grpc.LeaseStub,
    request: lease_pb2.ReportResultRequest,
    policy: RetryPolicy = REPORT_POLICY,
) -> Delivery[task_pb2.Task]:
    """Send one report, resending the *same* message on transient errors."""
    bound = _bound(request)
    delivery = await call_with_retries(
        lambda timeout: stub.ReportResult(request, timeout=timeout), policy, bound, "report"
    )
    if delivery.accepted:
        assert delivery.response is not None
        status = task_pb2.TaskStatus.Name(delivery.response.status)
        bound.info("result reported", status=status, tries=delivery.tries)
    return delivery


def _bound(request: lease_pb2.ReportResultRequest) -> Logger:
    return log.bind(
        task_id=request.task_id,
        attempt=request.attempt,
        lease_id=request.lease_id,
        outcome=lease_pb2.Outcome.Name(request.outcome),
    )


async def release_lease(
    stub: lease_pb2_grpc.LeaseStub,
    lease_id: str,
    reason: str,
    policy: RetryPolicy = RELEASE_POLICY,
    *,
    device_lost: bool = False,
    cleans: bool = False,
) -> Delivery[lease_pb2.ReleaseLeaseResponse]:
    """Give a lease back so its task is requeued now rather than when the lease runs out
    (`device_lost`: because its phone was lost, which is not the task's failure; `cleans`:
    the host cleans the phone next, so the control plane marks it `cleaning`)."""
    bound = log.bind(lease_id=lease_id)
    request = lease_pb2.ReleaseLeaseRequest(
        lease_id=lease_id, reason=reason, device_lost=device_lost, cleans=cleans
    )
    delivery = await call_with_retries(
        lambda timeout: stub.ReleaseLease(request, timeout=timeout), policy, bound, "release"
    )
    if delivery.accepted:
        bound.info("lease released", reason=reason)
    return delivery


class FinalCalls:
    """Final calls (reports, releases) in flight, each shielded from its caller's
    cancellation; `wait()` until all of them are through."""

    def __init__(self) -> None:
        self._calls: set[asyncio.Future[Any]] = set()

    async def run(self, call: Coroutine[Any, Any, T]) -> T:
        task = asyncio.ensure_future(call)
        self._calls.add(task)
        task.add_done_callback(self._calls.discard)
        return await asyncio.shield(task)

    async def wait(self) -> None:
        if self._calls:
            await asyncio.wait(self._calls)


# A control plane answers at most this many results in one ReportResults call.
MAX_BATCH = 1000
# And takes a message of at most 1 MiB: a batch stops short of it (results carry the
# small files of their runs, up to 64 KiB each); a result larger than this goes alone.
MAX_BATCH_BYTES = 768 * 1024
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_EACH_ALONE = frozenset(
    {
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)


class ResultBatcher:
    """Reports results, several in one call when they end together (see the module doc)."""

    def __init__(self, stub: lease_pb2_grpc.LeaseStub, max_batch: int = MAX_BATCH) -> None:
        self._stub = stub
        self._max_batch = max_batch
        self._waiting: list[_Pending] = []
        self._sender: asyncio.Task[None] | None = None
        # Off once a control plane says it has no ReportResults (an older release).
        self._batches = True

    async def report(
        self, request: lease_pb2.ReportResultRequest, policy: RetryPolicy = REPORT_POLICY
    ) -> Delivery[task_pb2.Task]:
        pending = _Pending(request, policy, asyncio.get_running_loop().create_future())
        self._waiting.append(pending)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send_waiting())
        return await pending.delivered

    async def _send_waiting(self) -> None:
        while self._waiting:
            batch = self._next_batch()
            try:
                await self._send(batch)
            except Exception as exc:  # never leave a caller waiting for ever
                for p in batch:
                    if not p.delivered.done():
                        p.delivered.set_exception(exc)

    def _next_batch(self) -> list[_Pending]:
        """The waiting results that go next: up to MAX_BATCH_BYTES of them (one at least),
        up to max_batch."""
        size, n = 0, 0
        for p in self._waiting[: self._max_batch]:
            size += p.request.ByteSize()
            if n and size > MAX_BATCH_BYTES:
                break
            n += 1
        batch = self._waiting[:n]
        del self._waiting[:n]
        return batch

    async def _send(self, batch: list[_Pending]) -> None:
        if len(batch) == 1 or not self._batches:
            await self._send_each(batch)
            return
        request = lease_pb2.ReportResultsRequest(results=[p.request for p in batch])
        policy = max((p.policy for p in batch), key=lambda p: p.total)
        bound = log.bind(results=len(batch))
        delivery = await call_with_retries(
            lambda timeout: self._stub.ReportResults(request, timeout=timeout),
            policy,
            bound,
            "report",
        )
        if delivery.response is not None:
            for p, answer in zip(batch, delivery.response.answers, strict=True):
                p.delivered.set_result(_answered(p.request, answer, delivery.tries))
            return
        if delivery.code in _EACH_ALONE:
            # No batches there, or one result spoils the batch (or makes it too large):
            # each on its own, for its own answer.
            self._batches = delivery.code is not grpc.StatusCode.UNIMPLEMENTED
            await self._send_each(batch)
            return
        for p in batch:
            p.delivered.set_result(Delivery(None, delivery.tries, delivery.code, delivery.details))

    async def _send_each(self, batch: list[_Pending]) -> None:
        deliveries = await asyncio.gather(
            *(report_result(self._stub, p.request, p.policy) for p in batch)
        )
        for p, delivery in zip(batch, deliveries, strict=True):
            p.delivered.set_result(delivery)


@dataclass(frozen=True)
class _Pending:
    request: lease_pb2.ReportResultRequest
    policy: RetryPolicy
    delivered: asyncio.Future[Delivery[task_pb2.Task]]


def _answered(
    request: lease_pb2.ReportResultRequest, answer: lease_pb2.ReportResultAnswer, tries: int
) -> Delivery[task_pb2.Task]:
    bound = _bound(request)
    if answer.code == 0:
        status = task_pb2.TaskStatus.Name(answer.task.status)
        bound.info("result reported", status=status, tries=tries, batched=True)
        return Delivery(answer.task, tries)
    code = _CODES.get(answer.code, grpc.StatusCode.UNKNOWN)
    bound.warning(
        "report refused by the control plane", code=code.name, details=answer.message, tries=tries
    )
    return Delivery(None, tries, code, answer.message)
