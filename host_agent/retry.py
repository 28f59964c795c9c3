"""How the host agent tries its calls to the control plane again (with tenacity).

Which errors are worth another try, the backoff between tries and the warning logged
before each wait, for the two kinds of caller:

- the loops that must go on — registration, Acquire, the renewal stream's reconnects —
  try until they succeed or meet an error that retrying cannot change: `retrying()`;
- the final calls (a report, a release) try within a `RetryPolicy`'s total time and end
  in a `Delivery` saying how: `call_with_retries()`. They are safe to repeat, so they also
  retry errors that may have come *after* the control plane acted.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

import grpc
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_before_delay,
    wait_exponential,
    wait_random,
)
from tenacity.wait import wait_base as WaitStrategy

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


def retrying(
    what: str,
    bound: Logger,
    retry: Callable[[BaseException], bool] = is_retryable,
    initial: float = 0.2,
    cap: float = 10.0,
) -> AsyncRetrying:
    """Tries of `what` with no limit: every error `retry` accepts is logged and waited out;
    any other is raised."""
    return AsyncRetrying(
        retry=retry_if_exception(retry),
        wait=backoff(initial, cap),
        before_sleep=log_retry(bound, what),
    )


def log_retry(bound: Logger, what: str) -> Callable[[RetryCallState], None]:
    """tenacity's `before_sleep`: one warning per failed try, with what failed and the wait."""

    def before_sleep(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        why = (
            {"code": exc.code().name}
            if isinstance(exc, grpc.aio.AioRpcError)
            else {"error": str(exc) or repr(exc)}
        )
        bound.warning(
            f"{what} failed; retrying",
            **why,
            tries=state.attempt_number,
            retry_in=round(state.upcoming_sleep, 3),
        )

    return before_sleep


# -- final calls ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryPolicy:
    """How long a final call is tried, in seconds: tries stop when the next would start
    later than `total` after the first; each try has its own deadline, `call_timeout` (a
    half-open connection must not hang the report); the waits between tries grow from
    `initial_backoff` to `max_backoff`."""

    total: float = 60.0
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


async def call_with_retries(
    call: Callable[[float], Awaitable[T]],
    policy: RetryPolicy,
    bound: Logger,
    what: str,
    final: frozenset[grpc.StatusCode] = frozenset(),
) -> Delivery[T]:
    """`call(timeout)` until it succeeds, fails for good, or `policy.total` runs out.
    `final`: transient codes that this call takes as an answer (not tried again)."""
    deadline = time.monotonic() + policy.total

    def again(exc: BaseException) -> bool:
        return is_transient(exc) and not (
            isinstance(exc, grpc.aio.AioRpcError) and exc.code() in final
        )

    retrying = AsyncRetrying(
        retry=retry_if_exception(again),
        wait=backoff(policy.initial_backoff, policy.max_backoff),
        stop=stop_before_delay(policy.total),
        before_sleep=log_retry(bound, what),
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
