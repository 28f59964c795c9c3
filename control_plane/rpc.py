"""The gRPC border: authentication, authorization and the one table from domain errors
to status codes. Every servicer method is wrapped by `@rpc`; none picks a code itself."""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

import grpc
import structlog
from google.protobuf.message import DecodeError

from control_plane import errors, metrics, validate
from control_plane.auth import Authenticator, authorize, check_host
from control_plane.domain import ANONYMOUS, Principal

if TYPE_CHECKING:
    from control_plane.artifacts import Artifacts
    from control_plane.config import Settings
    from control_plane.effects import Effects
    from control_plane.library import LibraryBytes
    from control_plane.peers import Peers
    from control_plane.store import Store

log = structlog.get_logger(__name__)

CODES: list[tuple[type[errors.AmcError], grpc.StatusCode]] = [
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFound, grpc.StatusCode.NOT_FOUND),
    (errors.FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.Aborted, grpc.StatusCode.ABORTED),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.DataLoss, grpc.StatusCode.DATA_LOSS),
]


class Undecodable:
    """What a request that is not a valid message becomes, so that @rpc can refuse it with
    INVALID_ARGUMENT instead of gRPC answering UNKNOWN with a Python class name."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def check_decoded(request: Any) -> None:
    if isinstance(request, Undecodable):
        raise errors.InvalidArgument("request", "not a valid message of this method's type")


async def first_message(requests: AsyncIterator[Any], part: str, missing: str) -> Any:
    """A client stream's first message, which must be its `part` (of the `part` oneof):
    INVALID_ARGUMENT on `part`, saying `missing`, if the stream holds no such message."""
    first = await anext(aiter(requests), None)
    if first is None:
        raise errors.InvalidArgument(part, missing)
    check_decoded(first)
    if first.WhichOneof("part") != part:
        raise errors.InvalidArgument(part, missing)
    return first


async def calling_host(requests: AsyncIterator[Any]) -> str:
    """The host a host's call is for: its first message names it (the `host_id` part),
    and a host token acts only as its own host."""
    first = await first_message(requests, "host_id", "required: the first message names the host")
    host_id = validate.identifier(first.host_id, "host_id")
    check_host(principal(), host_id)
    return host_id


def _safe(deserialize: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except DecodeError as exc:
            return Undecodable(exc)

    return parse


class DecodeGuard(grpc.aio.ServerInterceptor):
    """Parse failures of our own services' requests become `Undecodable` values; `codecs`
    (by method: a request deserializer and a response serializer, each None for the
    generated one) replace how some methods' messages are read and written."""

    def __init__(self, codecs: Mapping[str, tuple[Any, Any]] | None = None) -> None:
        self._codecs = dict(codecs or {})

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or not details.method.startswith("/amc.v1."):
            return handler
        parse, write = self._codecs.get(details.method, (None, None))
        return handler._replace(
            request_deserializer=_safe(parse or handler.request_deserializer),
            response_serializer=write or handler.response_serializer,
        )


principal_var: contextvars.ContextVar[Principal] = contextvars.ContextVar(
    "principal", default=ANONYMOUS
)

S = TypeVar("S", bound="Servicer")
F = TypeVar("F", bound=Callable[..., Any])
# What every servicer method takes after its request.
Context: TypeAlias = grpc.aio.ServicerContext[Any, Any]


def code_for(exc: errors.AmcError) -> grpc.StatusCode:
    for cls, code in CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


def relayed_error(code: grpc.StatusCode, details: str) -> errors.AmcError:
    """What another replica refused a relayed call with, as the domain error it mapped
    (CODES read backwards), so the caller reads the far replica's own answer."""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        field, _, problem = details.partition(": ")
        return (
            errors.InvalidArgument(field, problem)
            if problem
            else errors.InvalidArgument("request", details)
        )
    for cls, mapped in CODES:
        if mapped == code:
            return cls(details)
    return errors.Unavailable(details)


def principal() -> Principal:
    return principal_var.get()


class Servicer:
    """Base of the servicers: `auth` checks callers. `DESCRIPTOR` is the proto service a
    subclass implements and `SERVICE` its full name, both taken from the generated servicer
    it derives from (`x_pb2_grpc.YServicer`: service Y of x_pb2), so the proto is the one
    place the name is written."""

    DESCRIPTOR: Any = None
    SERVICE = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for base in cls.__bases__:
            if base.__module__.endswith("_pb2_grpc") and base.__name__.endswith("Servicer"):
                messages = importlib.import_module(base.__module__.removesuffix("_grpc"))
                name = base.__name__.removesuffix("Servicer")
                cls.DESCRIPTOR = messages.DESCRIPTOR.services_by_name[name]
                cls.SERVICE = cls.DESCRIPTOR.full_name

    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth


class TaskServicer(Servicer):
    """A servicer that changes tasks: the store, what follows each committed transition
    (`effects`, and its hub), the settings, where the tasks' kept files are and the
    channels to the other replicas (`peers`: for the calls relayed to the one that holds
    the other end)."""

    def __init__(
        self,
        auth: Authenticator,
        store: Store,
        effects: Effects,
        settings: Settings,
        peers: Peers,
        artifacts: Artifacts,
        library: LibraryBytes | None = None,
    ) -> None:
        super().__init__(auth)
        self.store = store
        self.effects = effects
        self.hub = effects.hub
        self.settings = settings
        self.peers = peers
        self.artifacts = artifacts
        self.library = library


async def _enter(self: Servicer, method: str, context: Context) -> None:
    try:
        who = await self.auth.principal(context.invocation_metadata(), method)
        authorize(who, method)
    except errors.Unauthenticated as exc:
        metrics.AUTH_FAILURES.labels(exc.reason).inc()
        raise
    except errors.PermissionDenied:
        metrics.AUTH_FAILURES.labels("forbidden").inc()
        raise
    principal_var.set(who)


async def _fail(context: Context, method: str, exc: Exception) -> None:
    if isinstance(exc, errors.AmcError):
        await context.abort(code_for(exc), exc.message)
    log.exception("unexpected error", method=method)
    await context.abort(grpc.StatusCode.INTERNAL, "internal error")


def rpc(func: F) -> F:
    """Wrap a servicer method (unary or streaming response) with auth and error mapping."""
    name = func.__name__

    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def stream(self: Servicer, request: Any, context: Context) -> AsyncIterator[Any]:
            method = f"/{self.SERVICE}/{name}"
            try:
                await _enter(self, method, context)
                check_decoded(request)
                async for item in func(self, request, context):
                    yield item
            except (errors.AmcError, Exception) as exc:
                if isinstance(exc, grpc.aio.AbortError):
                    raise
                await _fail(context, method, exc)

        return stream  # type: ignore[return-value]

    @functools.wraps(func)
    async def unary(self: Servicer, request: Any, context: Context) -> Any:
        method = f"/{self.SERVICE}/{name}"
        try:
            await _enter(self, method, context)
            check_decoded(request)
            return await func(self, request, context)
        except Exception as exc:
            if isinstance(exc, grpc.aio.AbortError):
                raise
            await _fail(context, method, exc)

    return unary  # type: ignore[return-value]


class Conversation(Protocol):
    """What serves one bidirectional-streaming call: its requests in, its responses out."""

    def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]: ...


def conversation(
    make: Callable[[S, Context], Conversation],
) -> Callable[[S, AsyncIterator[Any], Context], AsyncIterator[Any]]:
    """A bidirectional-streaming method, named like `make`, served by the conversation
    `make` returns for each call: it runs `make(servicer, context).run(requests)` (under
    `@rpc`: authenticated, its errors mapped) and streams back what that yields."""

    async def serve(service: S, requests: AsyncIterator[Any], context: Context) -> Any:
        async for response in make(service, context).run(requests):
            yield response

    serve.__name__ = serve.__qualname__ = make.__name__
    return rpc(serve)
