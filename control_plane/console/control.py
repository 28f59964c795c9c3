"""The console's remote control of one phone: `GET /api/control?host_id=H&serial=S`, a
WebSocket whose server side is an interactive session (Scheduler.OpenSession, called
in-process through the servicer, like the console's other routes: the same task kind, lease,
cancel and history as a session opened over gRPC).

Before the socket opens, the caller and the phone are checked, and a refusal is an HTTP
answer `{"code", "message"}`: operators only (PERMISSION_DENIED); the host and phone must
exist (NOT_FOUND), and the phone be online, ready, not cordoned, on a connected host that
takes work, and idle (FAILED_PRECONDITION). Nothing is created then. Query: `idle_timeout`
(seconds, default 300): a session sent no action for that long ends ("idle timeout");
`record=1`: the session keeps a recording of the screen (SessionOpen.record_screen, its
defaults), shown on its Task page; `maintenance=1`: a maintenance session
(SessionOpen.maintenance), which takes the phone although it or its host is cordoned or
drained (still online, ready and idle): an operator's look at a phone out of service.

The session asks for the phone by its serial and its host (the `host_id` label every
device has: another host's phone of the same serial never takes it), with a short queue
timeout (an idle phone is assigned at once), and is recorded with who opened it: the task's
submitter is the operator's token and its metadata says `control: console` and `operator:
<token name> (<token id>)`.

Messages in (JSON text, one action each): `{"tap": {"x", "y"}}`, `{"swipe": {"x1", "y1",
"x2", "y2", "duration_ms"?}}`, `{"type": {"text"}}`, `{"key": NAME}` (one of KEYS: the
page's buttons and the physical keyboard's keys), `{"rotate": "left" | "right"}` (a quarter
turn, auto-rotation off: a shell step, `settings put system user_rotation`). Out:
`{"task": Task}` as the session's task changes (queued, dispatched, finished: proto JSON),
`{"step": StepResult, "action": what was asked, "screen": {"width", "height"}}` for each
action (the screen: the phone's, in the pixels taps are in), and `{"error": {"code",
"message"}}` for a message refused (the session goes on; nothing was sent to the phone) or
for the session's own end by a refusal. Closing the socket ends the session as its client
closing (done) and frees the phone; the server closes the socket once the task is finished
(idle timeout, a cancel from elsewhere, a lost lease).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from aiohttp import WSMsgType, web
from google.protobuf import duration_pb2, json_format
from google.protobuf.message import Message

from amc.v1 import scheduler_pb2, task_pb2
from amc_common.device_selector import HOST_LABEL
from amc_common.keycodes import KEYCODES
from control_plane import validate
from control_plane.auth import Authenticator
from control_plane.console.calls import SUBPROTOCOL, CallContext, Refused
from control_plane.domain import Principal, Role
from control_plane.errors import (
    AmcError,
    DeviceNotFound,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
)
from control_plane.rpc import code_for
from control_plane.scheduler_service import SchedulerService
from control_plane.screen_tasks import CONTROL_KEY, CONTROL_VALUE

# A refusal's google.rpc.Code number, to the name the page is sent.
_CODES = {code.value[0]: code.name for code in grpc.StatusCode}
_FINISHED = (
    task_pb2.TASK_STATUS_DONE,
    task_pb2.TASK_STATUS_FAILED,
    task_pb2.TASK_STATUS_CANCELLED,
)
# The keys the page sends, by the names it sends (its buttons, and the computer's keys it
# passes on); their codes are amc_common.keycodes', the one table of Android keys.
KEYS = {
    name: KEYCODES[name.lower()]
    for name in (
        "BACK", "HOME", "APP_SWITCH", "POWER", "VOLUME_UP", "VOLUME_DOWN", "ENTER", "DEL",
        "FORWARD_DEL", "TAB", "ESCAPE", "DPAD_UP", "DPAD_DOWN", "DPAD_LEFT", "DPAD_RIGHT",
        "MOVE_HOME", "MOVE_END",
    )
}  # fmt: skip
# A quarter turn of the screen, auto-rotation off: `user_rotation` counts quarter turns
# counter-clockwise (0 to 3), so left adds one and right three.
ROTATE = (
    "settings put system accelerometer_rotation 0;"
    " r=$(settings get system user_rotation);"
    " settings put system user_rotation $(( (${{r:-0}} + {turn}) % 4 ))"
)
TURNS = {"left": 1, "right": 3}
DEFAULT_IDLE = 300.0
# An idle phone is assigned at once; a phone taken between the check and the session's
# submission fails the session ("queue timeout") instead of keeping the operator waiting.
QUEUE_TIMEOUT = 10
# Actions sent and not answered yet, per session: more are refused, not queued.
MAX_WAITING = 16
MAX_MESSAGE = 64 * 1024
HEARTBEAT = 20.0
SWIPE_MS = 300


@dataclass(frozen=True)
class Target:
    host_id: str
    serial: str
    idle: float
    record: bool
    maintenance: bool = False


class Controls:
    """The /api/control route's server side."""

    def __init__(self, scheduler: SchedulerService, auth: Authenticator) -> None:
        self.scheduler = scheduler
        self.auth = auth

    async def serve(self, request: web.Request, context: CallContext) -> web.StreamResponse:
        """Check the caller and the phone (an AmcError before the socket opens), then run
        the session for as long as the socket and the session both last."""
        who = await self.auth.principal(context.invocation_metadata())
        if who.role not in (None, Role.OPERATOR):
            raise PermissionDenied(
                f"role '{who.role}' may not control a phone: the console's Control is for operators"
            )
        target = _target(request.query)
        await self._check_free(target)
        ws = web.WebSocketResponse(
            protocols=(SUBPROTOCOL,), heartbeat=HEARTBEAT, max_msg_size=MAX_MESSAGE
        )
        await ws.prepare(request)
        await Remote(self.scheduler, context, ws, target, who).run()
        return ws

    async def _check_free(self, t: Target) -> None:
        store, settings = self.scheduler.store, self.scheduler.settings
        host = await store.hosts.get_host(settings.lease_ttl, t.host_id)
        device = next((d for d in host.devices if d.serial == t.serial), None)
        if device is None or device.state == "gone":
            raise DeviceNotFound(f"no phone '{t.serial}' on host '{t.host_id}'")
        condition = device.health.condition if device.health else "ready"
        if not host.connected:
            why = f"host '{t.host_id}' is not connected"
        elif (host.draining or host.cordoned) and not t.maintenance:
            why = f"host '{t.host_id}' is {'draining' if host.draining else 'cordoned'}"
        elif device.cordoned and not t.maintenance:
            why = f"phone '{t.serial}' is cordoned"
        elif device.state != "device":
            why = f"phone '{t.serial}' is {device.state}, not online"
        elif condition != "ready":
            why = f"phone '{t.serial}' is held: {condition}"
        elif device.task_id is not None:
            why = f"phone '{t.serial}' is busy with task {device.task_id}"
        else:
            return
        raise FailedPrecondition(f"{why}: only an idle ready phone can be controlled")


def _target(query: Mapping[str, str]) -> Target:
    host_id = validate.identifier(query.get("host_id", ""), "host_id")
    serial = validate.identifier(query.get("serial", ""), "serial")
    idle = DEFAULT_IDLE
    if "idle_timeout" in query:
        try:
            idle = float(query["idle_timeout"])
        except ValueError:
            raise InvalidArgument("idle_timeout", "seconds, a number") from None
        if not 1 <= idle <= validate.MAX_IDLE_TIMEOUT.total_seconds():
            raise InvalidArgument("idle_timeout", "must be between 1 and 3600 seconds")
    record = query.get("record", "0")
    if record not in ("0", "1"):
        raise InvalidArgument("record", "1 to keep a recording of the screen, else 0")
    maintenance = query.get("maintenance", "0")
    if maintenance not in ("0", "1"):
        raise InvalidArgument("maintenance", "1 for a maintenance session, else 0")
    return Target(host_id, serial, idle, record == "1", maintenance == "1")


def _seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromMilliseconds(round(value * 1000))
    return d


def _json(message: Message) -> dict[str, Any]:
    document: dict[str, Any] = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return document


class Remote:
    """One control socket and its session."""

    def __init__(
        self,
        scheduler: SchedulerService,
        context: CallContext,
        ws: web.WebSocketResponse,
        target: Target,
        who: Principal,
    ) -> None:
        self._scheduler = scheduler
        self._context = context
        self._ws = ws
        self._target = target
        self._who = who
        self._requests: asyncio.Queue[scheduler_pb2.OpenSessionRequest | None] = asyncio.Queue()
        # What each action not answered yet asked, in order (the host answers in order).
        self._asked: collections.deque[dict[str, Any]] = collections.deque()
        self._ready = False

    async def run(self) -> None:
        # The servicer's own stream (@rpc: the same auth and errors), with the console's
        # context in place of grpc.aio's.
        context: Any = self._context
        responses = self._scheduler.OpenSession(self._stream(), context)
        follower = asyncio.create_task(self._follow(responses))
        try:
            async for message in self._ws:
                if message.type is WSMsgType.TEXT:
                    await self._take(message.data)
                elif message.type is WSMsgType.ERROR:
                    break
                else:
                    await self._refuse(InvalidArgument("message", "send JSON text"))
        finally:
            # The socket closed (or the session ended and closed it): the session ends as
            # its client closing, and its host reports it; the socket's task lasts until then.
            self._requests.put_nowait(None)
            await follower

    def _opening(self) -> scheduler_pb2.OpenSessionRequest:
        who = self._who
        operator = f"{who.name} ({who.caller})" if who.name else who.caller
        return scheduler_pb2.OpenSessionRequest(
            open=scheduler_pb2.SessionOpen(
                selector=task_pb2.DeviceSelector(
                    serial=self._target.serial, labels={HOST_LABEL: self._target.host_id}
                ),
                idle_timeout=_seconds(self._target.idle),
                queue_timeout=_seconds(QUEUE_TIMEOUT),
                metadata={CONTROL_KEY: CONTROL_VALUE, "operator": operator},
                record_screen=task_pb2.ScreenRecording() if self._target.record else None,
                maintenance=self._target.maintenance,
            )
        )

    async def _stream(self) -> AsyncIterator[scheduler_pb2.OpenSessionRequest]:
        yield self._opening()
        while (item := await self._requests.get()) is not None:
            yield item

    async def _follow(self, responses: AsyncIterator[scheduler_pb2.OpenSessionResponse]) -> None:
        """The session's answers to the socket; the socket closed when the session ends."""
        try:
            async for response in responses:
                if response.HasField("task"):
                    await self._task(response.task)
                    continue
                asked = self._asked.popleft() if self._asked else {}
                if response.HasField("refused"):
                    refused = response.refused
                    code = _CODES.get(refused.code, "UNKNOWN")
                    await self._send({"error": {"code": code, "message": refused.message}})
                    continue
                answer = response.step
                screen = {"width": answer.screen_width, "height": answer.screen_height}
                await self._send({"step": _json(answer.step), "action": asked, "screen": screen})
        except Refused as exc:
            await self._send({"error": {"code": exc.code.name, "message": exc.message}})
        finally:
            with contextlib.suppress(ConnectionError):
                await self._ws.close()

    async def _task(self, task: task_pb2.Task) -> None:
        await self._send({"task": _json(task)})
        if task.status in _FINISHED:
            self._requests.put_nowait(None)  # over: the session's stream ends at once
        if task.status != task_pb2.TASK_STATUS_DISPATCHED or self._ready:
            return
        self._ready = True

    async def _take(self, text: str) -> None:
        try:
            asked, action = parse_action(text)
            validate.action(action, "action")
            if not self._ready:
                raise FailedPrecondition("the phone is not ready yet: wait for the session")
            if len(self._asked) >= MAX_WAITING:
                raise FailedPrecondition(
                    f"{MAX_WAITING} actions are waiting for the phone already: wait for"
                    " their answers"
                )
        except AmcError as exc:
            await self._refuse(exc)
            return
        self._asked.append(asked)
        self._requests.put_nowait(
            scheduler_pb2.OpenSessionRequest(action=task_pb2.SessionAction(action=action))
        )

    async def _refuse(self, exc: AmcError) -> None:
        await self._send({"error": {"code": code_for(exc).name, "message": exc.message}})

    async def _send(self, document: dict[str, Any]) -> None:
        if not self._ws.closed:
            with contextlib.suppress(ConnectionError):
                await self._ws.send_json(document)


def parse_action(text: str) -> tuple[dict[str, Any], task_pb2.Action]:
    """A page's message as (what was asked, in its normal form; the action)."""
    try:
        message = json.loads(text)
    except ValueError:
        raise InvalidArgument("message", "not JSON") from None
    kinds = ("tap", "swipe", "type", "key", "rotate")
    if not isinstance(message, dict) or len(message) != 1 or next(iter(message)) not in kinds:
        raise InvalidArgument(
            "message", "one of tap, swipe, type, key or rotate, as an object's one key"
        )
    kind, value = next(iter(message.items()))
    if kind == "key":
        if not isinstance(value, str) or value not in KEYS:
            raise InvalidArgument("key", f"one of {', '.join(KEYS)}")
        return {"key": value}, task_pb2.Action(key=task_pb2.Key(keycode=KEYS[value]))
    if kind == "rotate":
        if not isinstance(value, str) or value not in TURNS:
            raise InvalidArgument("rotate", "left or right")
        command = ROTATE.format(turn=TURNS[value])
        return {"rotate": value}, task_pb2.Action(shell=task_pb2.Shell(command=command))
    if not isinstance(value, dict):
        raise InvalidArgument(kind, "an object")
    if kind == "type":
        text_value = value.get("text")
        if not isinstance(text_value, str) or not text_value:
            raise InvalidArgument("type.text", "required: the text to type")
        try:
            text_value.encode()
        except UnicodeEncodeError:
            raise InvalidArgument("type.text", "not Unicode text (a lone surrogate)") from None
        return {"type": {"text": text_value}}, task_pb2.Action(
            input_text=task_pb2.InputText(text=text_value)
        )
    if kind == "tap":
        x, y = _whole(value, "tap", "x"), _whole(value, "tap", "y")
        return {"tap": {"x": x, "y": y}}, task_pb2.Action(tap=task_pb2.Tap(x=x, y=y))
    points = {name: _whole(value, "swipe", name) for name in ("x1", "y1", "x2", "y2")}
    ms = _whole(value, "swipe", "duration_ms") if "duration_ms" in value else SWIPE_MS
    swipe = task_pb2.Swipe(**points, duration=_seconds(ms / 1000))
    return {"swipe": {**points, "duration_ms": ms}}, task_pb2.Action(swipe=swipe)


def _whole(value: dict[str, Any], kind: str, name: str) -> int:
    number = value.get(name)
    if isinstance(number, bool) or not isinstance(number, int):
        raise InvalidArgument(f"{kind}.{name}", "required: a whole number of phone pixels")
    if not 0 <= number <= 1_000_000:
        raise InvalidArgument(f"{kind}.{name}", "out of range")
    return number
