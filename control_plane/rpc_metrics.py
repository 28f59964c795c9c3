"""Per-RPC request counts and durations, by method and status code: one grpc.aio server
interceptor. (py-grpc-prometheus serves only the threaded server; grpcio-observability
exports OpenTelemetry, not the Prometheus registry the rest of our metrics live in.)

Cardinality is bounded: `method` is one of the server's own methods (`Service/Method`),
anything else is `other`; `code` is a gRPC status code name."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import grpc

from control_plane import metrics


def _code(context: Any, default: str) -> str:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return str(code.name)
    if isinstance(code, int) and code:
        return next((c.name for c in grpc.StatusCode if c.value[0] == code), default)
    return default


def _observe(method: str, code: str, started: float) -> None:
    metrics.RPC_REQUESTS.labels(method, code).inc()
    metrics.RPC_SECONDS.labels(method, code).observe(time.perf_counter() - started)


def _failure(exc: BaseException, context: Any) -> str:
    if isinstance(exc, grpc.aio.AbortError):
        return _code(context, "UNKNOWN")
    if isinstance(exc, asyncio.CancelledError):
        return "CANCELLED"
    return "UNKNOWN"


@contextlib.contextmanager
def _observed(method: str, context: Any) -> Iterator[None]:
    """Counts and times what runs inside, by the code the call ends with."""
    started, code = time.perf_counter(), None
    try:
        yield
    except BaseException as exc:
        code = _failure(exc, context)
        raise
    finally:
        _observe(method, code or _code(context, "OK"), started)


def _wrap(behavior: Callable[..., Any], method: str) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
            with _observed(method, context):
                async for item in behavior(request, context):
                    yield item

        return stream

    async def call(request: Any, context: Any) -> Any:
        with _observed(method, context):
            return await behavior(request, context)

    return call


class RpcMetrics(grpc.aio.ServerInterceptor):
    """Counts and times every call of the methods named (`/package.Service/Method`)."""

    def __init__(self, methods: Iterable[str]) -> None:
        self.labels = {m: label(m) for m in methods}

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None:
            return handler
        method = self.labels.get(details.method, "other")
        for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            behavior = getattr(handler, kind)
            if behavior is not None:
                return handler._replace(**{kind: _wrap(behavior, method)})
        return handler


def label(method: str) -> str:
    """`/amc.v1.Scheduler/SubmitTask` -> `Scheduler/SubmitTask`."""
    service, _, name = method.lstrip("/").rpartition("/")
    return f"{service.rsplit('.', 1)[-1]}/{name}"
