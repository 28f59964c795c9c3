"""A task's phone log for the console's Task page: `GET /api/logs/<task_id>`.

    ?attempt=N      the attempt (default 0: the latest)
    &level=E        only lines of this priority or higher (V, D, I, W, E, F)
    &tag=T          only lines of this tag (repeated: any of them)
    &follow=1       keep the answer open while the attempt runs, its lines as they come

The call goes to the servicer's own StreamLogs (the same roles, validation and messages as
over gRPC), with the `Authorization` header the page sends (it reads the answer with
`fetch`, so the token never goes in a URL, and another site's page cannot send that header
without a preflight this server never grants). A refusal before the first line (no token,
another team's task, bad input, NOT_FOUND, no log to read) is answered `{"code", "message"}`
with the HTTP status of the gRPC code, as the other routes answer. Then the answer is
newline-delimited JSON (`application/x-ndjson`), one object per StreamLogs message:

    {"lines": ["12-04 23:03:01.123  4242  4242 E AndroidRuntime: …", …],
     "attempt": 1, "caught_up": false}

and, if the log ends in error once streaming (the host's replica lost, say), a last
object `{"code", "message"}`. An empty line is sent when nothing else was for KEEPALIVE
seconds, so a page that left is noticed while a follow waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, cast

import grpc
from aiohttp import web

from amc.v1 import scheduler_pb2
from control_plane.console.calls import CallContext, Refused
from control_plane.scheduler_service import SchedulerService

KEEPALIVE = 15.0
HEADERS = {
    "Content-Type": "application/x-ndjson",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class _Context(CallContext):
    """A console caller's context that also hears when the call was accepted."""

    def __init__(self, authorization: str | None) -> None:
        super().__init__(authorization)
        self.accepted = asyncio.Event()

    async def send_initial_metadata(self, metadata: Any) -> None:
        self.accepted.set()


def _request(task_id: str, query: Any) -> scheduler_pb2.StreamLogsRequest:
    attempt = query.get("attempt", "") or "0"
    if not attempt.isdigit() or len(attempt) > 6:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "attempt: must be 0 (the latest) or more")
    return scheduler_pb2.StreamLogsRequest(
        task_id=task_id,
        attempt=int(attempt),
        follow=query.get("follow", "") in ("1", "true"),
        min_level=query.get("level", ""),
        tags=[t for t in query.getall("tag", []) if t],
    )


def _line(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode() + b"\n"


def route(
    scheduler: SchedulerService, refusal: Any
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The route's handler (`refusal(code, message)` makes the routes' JSON error reply)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return await serve(scheduler, request, refusal)

    return handle


async def serve(
    scheduler: SchedulerService, request: web.Request, refusal: Any
) -> web.StreamResponse:
    """The route: `refusal(code, message)` makes the routes' JSON error reply."""
    try:
        ask = _request(request.match_info["task_id"], request.query)
    except Refused as exc:
        return cast(web.StreamResponse, refusal(exc.code, exc.message))
    context = _Context(request.headers.get("Authorization"))
    messages = cast(
        AsyncGenerator[scheduler_pb2.StreamLogsResponse, None],
        scheduler.StreamLogs(ask, cast(Any, context)),
    )
    # The next message asked for (the one future that reads `messages`, replaced as it ends).
    following: list[asyncio.Future[Any]] = [asyncio.ensure_future(anext(messages))]
    accepted: asyncio.Future[Any] = asyncio.ensure_future(context.accepted.wait())
    try:
        await asyncio.wait([following[0], accepted], return_when=asyncio.FIRST_COMPLETED)
        failure = following[0].exception() if following[0].done() else None
        if isinstance(failure, Refused):
            return cast(web.StreamResponse, refusal(failure.code, failure.message))
        if failure is not None and not isinstance(failure, StopAsyncIteration):
            raise failure
        response = web.StreamResponse(headers=HEADERS)
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            await _stream(response, messages, following)
            await response.write_eof()
        return response
    finally:
        accepted.cancel()
        if not following[0].done():
            following[0].cancel()
            with contextlib.suppress(BaseException):
                await following[0]
        await messages.aclose()


async def _stream(
    response: web.StreamResponse,
    messages: AsyncGenerator[scheduler_pb2.StreamLogsResponse, None],
    following: list[asyncio.Future[Any]],
) -> None:
    while True:
        done, _ = await asyncio.wait(following, timeout=KEEPALIVE)
        if not done:
            await response.write(b"\n")
            continue
        try:
            message = following[0].result()
        except StopAsyncIteration:
            return
        except Refused as exc:
            await response.write(_line({"code": exc.code.name, "message": exc.message}))
            return
        document = {"lines": list(message.lines), "attempt": message.attempt}
        await response.write(_line({**document, "caught_up": message.caught_up}))
        following[0] = asyncio.ensure_future(anext(messages))
