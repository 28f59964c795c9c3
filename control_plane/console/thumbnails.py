"""The console's thumbnails: `GET /api/thumbnails`, one WebSocket carrying a small, slow
picture of each phone a page shows (the Farm and Host pages' wall).

The page says which phones it shows, as JSON text `{"watch": [[host_id, serial], ...]}` (at
most MAX_PHONES), again whenever that changes; the server keeps a thumbnail watch of each
(the servicer's own WatchScreen with `thumbnail` set, in-process like the console's other
routes: the same roles, a device watch being for operators, and the same relays from the
replica holding the phone's host), and sends each frame as `/api/screen` does
(control_plane.console.screen has the layout; its header names the phone). The phone's host
sends a thumbnail every few seconds at most, within its own budget for them
(control_plane.frames). A phone whose watch ended (its host not connected, a refusal) is
told as text, `{"phone": [host_id, serial], "ended": "<CODE>: <message>"}`, and watched
again after a pause (RETRY_AFTER, doubling to RETRY_MOST) while the page shows it.

One socket is one viewer of the wall, not one per phone: its watches count against the
token's `--max-thumbnails-per-token` (1000 on each replica), never its
`--max-viewers-per-token`, so a wall of phones leaves the token its live screens. Each
phone's latest frame waits in one slot, written one at a time: a page that reads slowly
skips frames, never queues them. Closing the socket (leaving the page, hiding its tab) ends
every watch, and the hosts stop capturing what nobody else watches.

Refusals before the socket opens, as the other routes answer them: another site's page
(PERMISSION_DENIED, in http.py), no or a bad token, a role other than operator.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator
from typing import Any, cast

import grpc
from aiohttp import WSMsgType, web

from amc.v1 import scheduler_pb2
from control_plane import errors, validate
from control_plane.auth import Authenticator
from control_plane.console.calls import SUBPROTOCOL, CallContext, Refused, socket_authorization
from control_plane.console.screen import WatchContext, frame_message
from control_plane.domain import Role
from control_plane.rpc import code_for
from control_plane.scheduler_service import SchedulerService

# The most phones one socket watches (the token's thumbnails are bounded apart from it).
MAX_PHONES = 2000
MAX_MESSAGE = 256 * 1024
# Seconds before an ended watch is tried again, doubling up to the second figure.
RETRY_AFTER, RETRY_MOST = 10.0, 60.0
HEARTBEAT = 30.0

Phone = tuple[str, str]


async def serve(
    scheduler: SchedulerService, auth: Authenticator, request: web.Request, refusal: Any
) -> web.StreamResponse:
    """The route: `refusal(code, message)` makes the routes' JSON error reply."""
    authorization = socket_authorization(request)
    try:
        who = await auth.principal(CallContext(authorization).invocation_metadata())
        if who.role not in (None, Role.OPERATOR):
            raise errors.PermissionDenied(
                f"role '{who.role}' may not watch phones by device: thumbnails are for operators"
            )
    except errors.AmcError as exc:
        return cast(web.StreamResponse, refusal(code_for(exc), exc.message))
    socket = web.WebSocketResponse(  # images do not compress: no per-message deflate
        protocols=(SUBPROTOCOL,), heartbeat=HEARTBEAT, max_msg_size=MAX_MESSAGE, compress=False
    )
    await socket.prepare(request)
    await Wall(scheduler, socket, authorization).run()
    return socket


def phones(text: str) -> list[Phone]:
    """The phones a page's message names, checked (errors.InvalidArgument if not)."""
    try:
        message = json.loads(text)
    except ValueError:
        raise errors.InvalidArgument("message", "not JSON") from None
    if not isinstance(message, dict) or not isinstance(message.get("watch"), list):
        raise errors.InvalidArgument("watch", "required: a list of [host_id, serial]")
    if len(message["watch"]) > MAX_PHONES:
        raise errors.InvalidArgument("watch", f"at most {MAX_PHONES} phones")
    out = []
    for i, item in enumerate(message["watch"]):
        if not (
            isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)
        ):
            raise errors.InvalidArgument(f"watch[{i}]", "a [host_id, serial] pair")
        out.append(
            (
                validate.identifier(item[0], f"watch[{i}][0]"),
                validate.identifier(item[1], f"watch[{i}][1]"),
            )
        )
    return out


class Wall:
    """One thumbnails socket: a watch per phone shown, their frames written as they come."""

    def __init__(
        self, scheduler: SchedulerService, socket: web.WebSocketResponse, authorization: str | None
    ) -> None:
        self._scheduler = scheduler
        self._socket = socket
        self._authorization = authorization
        self._wanted: set[Phone] = set()
        self._watches: dict[Phone, asyncio.Task[None]] = {}
        # When an ended watch may be tried again, and its next pause.
        self._retry: dict[Phone, tuple[float, float]] = {}
        # What waits to be written: each phone's latest frame, and texts.
        self._frames: dict[Phone, scheduler_pb2.ScreenFrame] = {}
        self._texts: list[dict[str, Any]] = []
        self._ready = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        writer = loop.create_task(self._write())
        ticker = loop.create_task(self._tick())
        try:
            async for message in self._socket:
                if message.type is not WSMsgType.TEXT:
                    break
                try:
                    self._want(phones(message.data))
                except errors.AmcError as exc:
                    self._say({"error": {"code": code_for(exc).name, "message": exc.message}})
        finally:
            for task in (writer, ticker, *self._watches.values()):
                task.cancel()
            await asyncio.gather(writer, ticker, *self._watches.values(), return_exceptions=True)

    def _want(self, wanted: list[Phone]) -> None:
        self._wanted = set(wanted)
        for phone in [p for p in self._watches if p not in self._wanted]:
            self._watches.pop(phone).cancel()
            self._frames.pop(phone, None)
        for phone in [p for p in self._retry if p not in self._wanted]:
            del self._retry[phone]
        self._start_due()

    def _start_due(self) -> None:
        now = asyncio.get_running_loop().time()
        for phone in self._wanted:
            if phone in self._watches or self._retry.get(phone, (0.0, 0.0))[0] > now:
                continue
            self._watches[phone] = asyncio.get_running_loop().create_task(self._watch(phone))

    async def _tick(self) -> None:
        """Ended watches are tried again when their pause is over."""
        while True:
            await asyncio.sleep(RETRY_AFTER / 2)
            self._start_due()

    async def _watch(self, phone: Phone) -> None:
        """One phone's thumbnails, until the page no longer shows it or the watch ends."""
        request = scheduler_pb2.WatchScreenRequest(
            host_id=phone[0], serial=phone[1], thumbnail=True
        )
        context: Any = WatchContext(self._authorization)
        frames = cast(
            AsyncGenerator[scheduler_pb2.ScreenFrame, None],
            self._scheduler.WatchScreen(request, context),
        )
        ended = f"{grpc.StatusCode.OK.name}: the watch ended"
        try:
            async for frame in frames:
                self._retry.pop(phone, None)
                self._frames[phone] = frame
                self._ready.set()
        except Refused as exc:
            ended = f"{exc.code.name}: {exc.message}"
        finally:
            await frames.aclose()
        if self._watches.get(phone) is asyncio.current_task():
            del self._watches[phone]
            pause = self._retry.get(phone, (0.0, RETRY_AFTER))[1]
            self._retry[phone] = (
                asyncio.get_running_loop().time() + pause,
                min(RETRY_MOST, pause * 2),
            )
            self._say({"phone": list(phone), "ended": ended})

    def _say(self, text: dict[str, Any]) -> None:
        self._texts.append(text)
        self._ready.set()

    async def _write(self) -> None:
        """What waits, one message at a time, until the socket is gone."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._texts or self._frames:
                with contextlib.suppress(ConnectionError):
                    if self._texts:
                        await self._socket.send_json(self._texts.pop(0))
                    else:
                        phone = next(iter(self._frames))
                        await self._socket.send_bytes(frame_message(self._frames.pop(phone)))
                if self._socket.closed:
                    return
