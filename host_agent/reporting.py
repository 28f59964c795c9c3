"""The host's final word on an attempt: ReportResult, or ReleaseLease when it gives up.

Both are safe to repeat (an identical report returns the recorded outcome; releasing an
ended lease changes nothing), so both retry with exponential backoff on errors that may
have happened before *or after* the control plane acted: the connection dropped, the
deadline ran out, the server was busy or restarting. They stop at once on refusals (the
lease is stale or foreign, a different outcome is recorded, the request is malformed),
which retrying cannot change, and give up after a bounded total time: the lease then runs
out on the control plane, which requeues the task or fails it.

`FinalCalls` runs these final calls shielded, so cancelling the worker that made one cannot
cut it off half-way; the agent awaits them all before it returns.

`ResultBatcher` sends the results of tasks that end at nearly the same moment together:
while one report call is in flight, the results that come meanwhile wait and then go in one
ReportResults call (one transaction on the control plane). Nothing waits for company: a
result that ends alone goes at once, as a plain ReportResult.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

import grpc
import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_before_delay,
    wait_exponential,
    wait_random,
)
from tenacity.wait import wait_base as WaitStrategy

from amc.v1 import lease_pb2, lease_pb2_grpc, task_pb2

log = structlog.get_logger(__name__)

T = TypeVar("T")
# structlog's bound loggers have no common static type worth spelling out.
Logger: TypeAlias = Any

# Errors that say nothing about the request itself. UNKNOWN and INTERNAL are what gRPC
# reports for a stream reset mid-call; CANCELLED reaching us (we never cancel final calls:
# they run shielded) means the server went away; RESOURCE_EXHAUSTED is an overloaded one.
TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)

# Retrying these cannot help on any call: the token or the request itself is wrong. Where
# they end a background loop (registration, Acquire, the renewal stream), the agent stops
# loudly instead of retrying for ever.
FATAL_CODES = frozenset(
    {
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)


def backoff(initial: float, cap: float) -> WaitStrategy:
    """Exponential backoff from `initial` up to `cap`, plus up to `initial` of jitter so many
    hosts that lost the control plane together do not come back in lockstep."""
    return wait_exponential(multiplier=initial, max=cap) + wait_random(0, initial)


def is_transient(exc: BaseException) -> bool:
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in TRANSIENT_CODES


def is_retryable(exc: BaseException) -> bool:
    """For loops that must go on (registration, Acquire): any gRPC error but a fatal one."""
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() not in FATAL_CODES


@dataclass(frozen=True)
class RetryPolicy:
    # Give up when the next attempt would start later than this after the first.
    total: float = 60.0
    # Each call's own deadline (a half-open connection must not hang the report).
    call_timeout: float = 10.0
    initial_backoff: float = 0.2
    max_backoff: float = 5.0


@dataclass(frozen=True)
class Delivery(Generic[T]):
    """How a final call ended: `response` when accepted, else the last error's code."""

    response: T | None
    tries: int
    code: grpc.StatusCode | None = None
    details: str = ""

    @property
    def accepted(self) -> bool:
        return self.response is not None

    @property
    def refused(self) -> bool:
        """The control plane said no (retrying could not help), as opposed to unreachable."""
        return self.code is not None and self.code not in TRANSIENT_CODES


async def report_result(
    stub: lease_pb2_grpc.LeaseStub,
    request: lease_pb2.ReportResultRequest,
    policy: RetryPolicy = RetryPolicy(),
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
    policy: RetryPolicy = RetryPolicy(total=10.0),
) -> Delivery[lease_pb2.ReleaseLeaseResponse]:
    """Give a lease back so its task is requeued now rather than when the lease runs out."""
    bound = log.bind(lease_id=lease_id)
    request = lease_pb2.ReleaseLeaseRequest(lease_id=lease_id, reason=reason)
    delivery = await call_with_retries(
        lambda timeout: stub.ReleaseLease(request, timeout=timeout), policy, bound, "release"
    )
    if delivery.accepted:
        bound.info("lease released", reason=reason)
    return delivery


async def call_with_retries(
    call: Callable[[float], Awaitable[T]], policy: RetryPolicy, bound: Logger, what: str
) -> Delivery[T]:
    """`call(timeout)` until it succeeds, fails for good, or `policy.total` runs out."""
    deadline = time.monotonic() + policy.total
    retrying = AsyncRetrying(
        retry=retry_if_exception(is_transient),
        wait=backoff(policy.initial_backoff, policy.max_backoff),
        stop=stop_before_delay(policy.total),
        before_sleep=_log_retry(bound, what),
        reraise=True,
    )
    try:
        async for attempt in retrying:
            with attempt:
                # The last attempt gets what is left, at least a second, so it can answer.
                timeout = min(policy.call_timeout, max(1.0, deadline - time.monotonic()))
                response = await call(timeout)
    except grpc.aio.AioRpcError as exc:
        tries = retrying.statistics.get("attempt_number", 1)
        _log_failure(bound, what, exc, tries)
        return Delivery(None, tries, exc.code(), exc.details() or "")
    return Delivery(response, retrying.statistics.get("attempt_number", 1))


def _log_retry(bound: Logger, what: str) -> Callable[[RetryCallState], None]:
    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        code = exc.code().name if isinstance(exc, grpc.aio.AioRpcError) else repr(exc)
        bound.warning(
            f"{what} failed; retrying",
            code=code,
            tries=state.attempt_number,
            retry_in=round(state.upcoming_sleep, 3),
        )

    return before_sleep


def _log_failure(bound: Logger, what: str, exc: grpc.aio.AioRpcError, tries: int) -> None:
    if exc.code() in TRANSIENT_CODES:
        bound.error(
            f"{what} undelivered; giving up (the lease will run out)",
            code=exc.code().name,
            details=exc.details(),
            tries=tries,
        )
    else:
        bound.warning(
            f"{what} refused by the control plane",
            code=exc.code().name,
            details=exc.details(),
            tries=tries,
        )


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
_CODES = {code.value[0]: code for code in grpc.StatusCode}


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
        self, request: lease_pb2.ReportResultRequest, policy: RetryPolicy = RetryPolicy()
    ) -> Delivery[task_pb2.Task]:
        pending = _Pending(request, policy, asyncio.get_running_loop().create_future())
        self._waiting.append(pending)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.ensure_future(self._send_waiting())
        return await pending.delivered

    async def _send_waiting(self) -> None:
        while self._waiting:
            batch = self._waiting[: self._max_batch]
            del self._waiting[: len(batch)]
            try:
                await self._send(batch)
            except Exception as exc:  # never leave a caller waiting for ever
                for p in batch:
                    if not p.delivered.done():
                        p.delivered.set_exception(exc)

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
        if delivery.code in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.INVALID_ARGUMENT):
            # No batches there, or one result spoils the batch: each on its own, for its
            # own answer.
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
