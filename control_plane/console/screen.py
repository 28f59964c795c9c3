"""A phone's live screen for the console: `GET /api/screen`, a WebSocket.

    GET /api/screen?host_id=H&serial=S     a device's screen (operators)
    GET /api/screen?task_id=T              a running task's phone (its submitter's team,
                                           operators; a Control session: operators)
    optional &max_fps=N                    1 to 30 (default 10)
    optional &codec=image|h264             still images (default), or the phone's H.264
                                           stream where its host has one (see
                                           WatchScreenRequest.codec)

Authorization as for the other /api routes: the `Authorization` header, or (a browser
cannot set headers on a WebSocket) the token offered as the subprotocol
`amc.bearer.<token>` beside `amc.v1`, the one the server answers with. The call goes to the
servicer's own WatchScreen (the same roles, validation and messages as over gRPC).

A socket opened by another site's page (its `Origin`) is refused PERMISSION_DENIED (see
control_plane.console.calls). A refusal before streaming (no token, a role that may not,
bad input, NOT_FOUND, a task not running or a host not connected: FAILED_PRECONDITION) is
an HTTP reply `{"code", "message"}` with the HTTP status of the gRPC code, as the other
routes answer, and no WebSocket. Once upgraded, every frame is one BINARY message:

    4 bytes   N, the header's length, big-endian unsigned
    N bytes   the header, UTF-8 JSON: {"seq": int, "width": int, "height": int,
              "mime": "image/png" | "image/jpeg" | "video/h264", "captured_at_ms": int,
              "host_id": str, "serial": str}; a frame of the stream adds
              "key_frame": bool, "pts_us": int, and on a key frame "video":
              {"codec": "avc1.…", "coded_width": int, "coded_height": int}
    the rest  the image's bytes (a whole PNG or JPEG file), or the frame's H.264 access
              unit (Annex B; a key frame with its SPS and PPS): what WebCodecs'
              VideoDecoder takes as an EncodedVideoChunk

`width` and `height` are the phone's screen in its own pixels, the coordinates a tap takes:
the image may be smaller (a simulated phone's is drawn at a third), so a click on it is
scaled by width / the image's own width.

A viewer of still images that reads slower than frames come gets the latest frame when
it is ready for one (frames in between are dropped, never queued); a viewer of the stream
gets every frame in order, and one that falls behind skips to the next key frame. Closing
the socket stops watching (when the phone's last viewer leaves, its host stops capturing
it). The server closes it
with code 1000 when a watched task finished, or 1011 and the reason after an error
(UNAVAILABLE: the host left the replica, a relay was lost, the replica is stopping;
ABORTED: the task moved to another phone, or waits for one; either way open it again).
Messages from the page are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import AsyncGenerator
from typing import Any, cast

import grpc
import structlog
from aiohttp import WSCloseCode, web

from amc.v1 import scheduler_pb2
from control_plane.console.calls import SUBPROTOCOL, CallContext, Refused, socket_authorization
from control_plane.scheduler_service import SchedulerService
from control_plane.video import MIME

log = structlog.get_logger(__name__)

# The longest close reason a WebSocket close frame carries (125 bytes less the code's 2).
REASON_BYTES = 123
# The messages last made, by the frame each was made of (every viewer of a phone on this
# replica is sent the same frame objects, so a frame is made into its message once, not
# once per viewer: ~17 us each), at most this many or these many bytes at once.
MADE_MOST = 32
MADE_MOST_BYTES = 16 << 20
_made: dict[int, tuple[Any, bytes]] = {}
_made_bytes = 0


class WatchContext(CallContext):
    """A console caller's context that also hears when the watch is accepted."""

    def __init__(self, authorization: str | None) -> None:
        super().__init__(authorization)
        self.accepted = asyncio.Event()

    async def send_initial_metadata(self, metadata: Any) -> None:
        self.accepted.set()


def frame_message(frame: scheduler_pb2.ScreenFrame) -> bytes:
    """One frame as its WebSocket message: length, JSON header, image or access unit; the
    same bytes for each of its viewers (made once while it is among the last made)."""
    global _made_bytes
    made = _made.get(id(frame))
    if made is not None and made[0] is frame:
        return made[1]
    message = _message(frame)
    if len(_made) >= MADE_MOST or _made_bytes + len(message) > MADE_MOST_BYTES:
        _made.clear()
        _made_bytes = 0
    _made[id(frame)] = (frame, message)
    _made_bytes += len(message)
    return message


def _message(frame: scheduler_pb2.ScreenFrame) -> bytes:
    fields: dict[str, Any] = {
        "seq": frame.seq,
        "width": frame.width,
        "height": frame.height,
        "mime": frame.mime,
        "captured_at_ms": frame.captured_at_ms,
        "host_id": frame.host_id,
        "serial": frame.serial,
    }
    if frame.mime == MIME:
        fields["key_frame"], fields["pts_us"] = frame.key_frame, frame.pts_us
        if frame.HasField("video"):
            fields["video"] = {
                "codec": frame.video.codec,
                "coded_width": frame.video.coded_width,
                "coded_height": frame.video.coded_height,
            }
    header = json.dumps(fields, separators=(",", ":")).encode()
    return struct.pack(">I", len(header)) + header + frame.data


def _request(query: Any) -> scheduler_pb2.WatchScreenRequest:
    fps = query.get("max_fps", "") or "0"
    if not fps.isdigit() or len(fps) > 3:
        raise Refused(grpc.StatusCode.INVALID_ARGUMENT, "max_fps: must be 1 to 30")
    return scheduler_pb2.WatchScreenRequest(
        task_id=query.get("task_id", ""),
        host_id=query.get("host_id", ""),
        serial=query.get("serial", ""),
        max_fps=int(fps),
        codec=query.get("codec", "")[:40],
    )


async def serve(
    scheduler: SchedulerService, request: web.Request, refusal: Any
) -> web.StreamResponse:
    """The route: `refusal(code, message)` makes the routes' JSON error reply."""
    try:
        watch = _request(request.query)
    except Refused as exc:
        return cast(web.StreamResponse, refusal(exc.code, exc.message))
    context = WatchContext(socket_authorization(request))
    frames = cast(
        AsyncGenerator[scheduler_pb2.ScreenFrame, None],
        scheduler.WatchScreen(watch, cast(Any, context)),
    )
    first: asyncio.Future[scheduler_pb2.ScreenFrame] = asyncio.ensure_future(anext(frames))
    accepted: asyncio.Future[Any] = asyncio.ensure_future(context.accepted.wait())
    try:
        await asyncio.wait([first, accepted], return_when=asyncio.FIRST_COMPLETED)
        failure = first.exception() if first.done() else None
        if isinstance(failure, Refused):
            return cast(web.StreamResponse, refusal(failure.code, failure.message))
        if isinstance(failure, StopAsyncIteration):
            reply = refusal(grpc.StatusCode.FAILED_PRECONDITION, "the task is no longer running")
            return cast(web.StreamResponse, reply)
        if failure is not None:
            raise failure
        # No per-message deflate, which browsers offer on every socket: H.264 and PNG do
        # not compress, and deflating each frame for each page cost ~4 us a viewer a frame.
        socket = web.WebSocketResponse(protocols=(SUBPROTOCOL,), heartbeat=30.0, compress=False)
        await socket.prepare(request)
        await _stream(socket, frames, first)
        return socket
    finally:
        accepted.cancel()
        await _withdraw(first)
        await frames.aclose()


async def _stream(
    socket: web.WebSocketResponse,
    frames: AsyncGenerator[scheduler_pb2.ScreenFrame, None],
    first: asyncio.Future[scheduler_pb2.ScreenFrame],
) -> None:
    """Frames out until the page closes the socket or the watch ends: one task sends them,
    each awaited as it comes (no task and no wait of two per frame: ~10 us a frame a
    viewer), and is cancelled if the page leaves first."""
    reader: asyncio.Future[Any] = asyncio.ensure_future(_read_until_closed(socket))
    sender = asyncio.ensure_future(_send(socket, frames, first))
    code, reason = WSCloseCode.OK, ""
    try:
        await asyncio.wait([sender, reader], return_when=asyncio.FIRST_COMPLETED)
        if sender.done():
            code, reason = sender.result()
        # else the page left: stop watching
    finally:
        reader.cancel()
        await _withdraw(sender)
        if not socket.closed:
            message = reason.encode()[:REASON_BYTES]
            with contextlib.suppress(Exception):
                await socket.close(code=code, message=message)


async def _send(
    socket: web.WebSocketResponse,
    frames: AsyncGenerator[scheduler_pb2.ScreenFrame, None],
    first: asyncio.Future[scheduler_pb2.ScreenFrame],
) -> tuple[WSCloseCode, str]:
    """Every frame of the watch to the page; how to close the socket when it ends."""
    try:
        frame = await first
        while True:
            try:
                await socket.send_bytes(frame_message(frame))
            except ConnectionError:
                return WSCloseCode.OK, ""
            frame = await anext(frames)
    except StopAsyncIteration:
        return WSCloseCode.OK, "the task is no longer running"
    except Refused as exc:
        return WSCloseCode.INTERNAL_ERROR, f"{exc.code.name}: {exc.message}"


async def _withdraw(future: asyncio.Future[Any]) -> None:
    """Cancel `future` if it is still pending, and let it end."""
    if not future.done():
        future.cancel()
        with contextlib.suppress(BaseException):
            await future


async def _read_until_closed(socket: web.WebSocketResponse) -> None:
    async for _ in socket:
        pass  # messages from the page are ignored
