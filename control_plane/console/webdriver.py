"""The WebDriver endpoint (Selenium Grid's and Appium's routes, on the console's HTTP
server): a new-session request becomes an interactive session of the farm, and each of its
commands is carried to the Appium server its phone's host runs for it.

Routes, under `/wd/hub` (Selenium Grid's, Appium 1's) and at the root (Appium 2's):
`POST /session`, `GET|POST|DELETE /session/{id}/...`, `DELETE /session/{id}`, and `GET
/status`. The caller's token is the `Authorization: Bearer` header, as on gRPC.

- **New session**: the capabilities (control_plane.console.webdriver_caps) become a
  Scheduler.OpenSession called in process, as the console's Control does: the same queue,
  fair shares, priorities, roles and checks. The request waits while the session is queued;
  once its host has joined, the first command creates the Appium session on the phone
  (host_agent.webdriver) and Appium's answer is the client's, its session id replaced by
  the farm's: the session's task id. A session that is not had within `amc:queueTimeout`
  is answered `session not created` with the reason it waited; Appium's own refusal is
  passed on, and the farm's session closed. A client that leaves while its session waits
  (its connection closed, looked at every second) withdraws it.
- **Commands**: one at a time per session (each a step of the task), carried as the
  session's actions (SessionAction.webdriver) through its relay to the host; Appium's
  status and body are the answer. Only the token that made a session reaches it. A body
  or an answer larger than one message crosses in parts, each an action and its step
  (amc_common.webdriver_body), joined before the command runs and before the client is
  answered, once; either is at most MAX_BODY (64 MiB): a larger request is answered
  `invalid argument` naming its size and the cap, and nothing is sent.
- **The end**: `DELETE /session/{id}` deletes the Appium session and closes the farm's
  (done; the call answers once the task is finished, so the phone is free, and answers
  `unknown error` saying so where that end is not recorded within END_WAIT); the idle
  timeout, a cancel or a lost lease end it as any session (the host deletes the Appium
  session). A session unknown, ended, or of another token is answered `invalid session
  id` (404). Sessions live on the replica that made them: a balancer in front of
  several replicas must send a session's requests to one (by the session id in the path).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from aiohttp import web

from amc.v1 import scheduler_pb2, task_pb2
from amc_common.webdriver_body import MAX_BODY, parts, too_big
from control_plane.auth import Authenticator
from control_plane.console.calls import CallContext, Refused
from control_plane.console.webdriver_caps import parse
from control_plane.errors import AmcError, InvalidArgument
from control_plane.rpc import code_for
from control_plane.scheduler_service import SchedulerService

PREFIXES = ("", "/wd/hub")
READ_CHUNK = 1 << 16
# How long DELETE waits for the session's task to be finished (its phone freed), and how
# often it reads the task where the session's call ended without its end.
END_WAIT = 10.0
END_READ = 0.25
# How often a new-session request waiting in the queue looks whether its client left.
LOOK_EVERY = 1.0
_FINISHED = (
    task_pb2.TASK_STATUS_DONE,
    task_pb2.TASK_STATUS_FAILED,
    task_pb2.TASK_STATUS_CANCELLED,
)
_STATUS = {"invalid argument": 400, "invalid session id": 404, "unknown command": 404}


def w3c_error(error: str, message: str) -> web.Response:
    """A W3C error answer: its HTTP status, `{"value": {error, message, stacktrace}}`."""
    body = {"value": {"error": error, "message": message, "stacktrace": ""}}
    return web.json_response(body, status=_STATUS.get(error, 500))


def _refusal(code: grpc.StatusCode, message: str) -> web.Response:
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
        return w3c_error("invalid argument", message)
    return w3c_error("session not created", f"{code.name}: {message}")


class _Session:
    """One WebDriver session: its OpenSession, read by `_read`, and its commands' answers
    waiting in order."""

    def __init__(self, caller: str) -> None:
        self.caller = caller
        self.id = ""
        self.requests: asyncio.Queue[scheduler_pb2.OpenSessionRequest | None] = asyncio.Queue()
        self.answers: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.turn = asyncio.Lock()
        self.dispatched = asyncio.Event()
        self.finished = asyncio.Event()
        self.task: task_pb2.Task | None = None
        self.pending = ""
        self.refused: Refused | None = None

    async def stream(
        self, opening: scheduler_pb2.SessionOpen
    ) -> AsyncIterator[scheduler_pb2.OpenSessionRequest]:
        yield scheduler_pb2.OpenSessionRequest(open=opening)
        while (item := await self.requests.get()) is not None:
            yield item

    async def read(self, responses: AsyncIterator[scheduler_pb2.OpenSessionResponse]) -> None:
        try:
            async for response in responses:
                if response.HasField("task"):
                    self._task(response.task)
                elif self.answers:
                    answer = self.answers.popleft()
                    if not answer.done():
                        answer.set_result(response)
        except Refused as exc:
            self.refused = exc
        finally:
            self.finished.set()
            self.dispatched.set()  # wakes a new-session request still waiting
            while self.answers:
                self.answers.popleft().cancel()

    def _task(self, task: task_pb2.Task) -> None:
        self.task, self.id = task, task.task_id
        if task.pending_reason:
            self.pending = task.pending_reason
        if task.status == task_pb2.TASK_STATUS_DISPATCHED:
            self.dispatched.set()
        if task.status in _FINISHED:
            self.finished.set()
            self.requests.put_nowait(None)  # over: the session's stream ends

    async def command(self, method: str, path: str, body: bytes) -> task_pb2.WebDriverReply | None:
        """The command's answer from Appium, whole; None once the session is over. A body
        larger than PART goes in parts first, and a larger answer is asked for part by
        part: one command at a time, so a session holds at most one body and one answer."""
        async with self.turn:
            pieces = parts(body)
            last = next(pieces)
            for piece in pieces:  # `last` was not the last: it goes as a part
                reply = await self._exchange(task_pb2.WebDriverCommand(part=True, body=last))
                if reply is None or reply.status:  # the session's end, or refused
                    return reply
                last = piece
            command = task_pb2.WebDriverCommand(method=method, path=path, body=last)
            reply = await self._exchange(command)
            if reply is None or reply.size <= len(reply.body):
                return reply
            return await self._rest(reply)

    async def _rest(self, first: task_pb2.WebDriverReply) -> task_pb2.WebDriverReply | None:
        """A large answer whole: its first part, then the others asked for in turn."""
        if first.size > MAX_BODY:
            return _error(500, "unknown error", too_big("Appium's answer", first.size))
        data = bytearray(first.body)
        while len(data) < first.size:
            reply = await self._exchange(task_pb2.WebDriverCommand(rest=True))
            if reply is None or reply.status:
                return reply
            if not reply.body or len(data) + len(reply.body) > first.size:
                return _error(500, "unknown error", "Appium's answer came back cut")
            data += reply.body
        return task_pb2.WebDriverReply(status=first.status, body=bytes(data))

    async def _exchange(self, command: task_pb2.WebDriverCommand) -> task_pb2.WebDriverReply | None:
        """One action of the session and its answer; None once the session is over."""
        if self.finished.is_set():
            return None
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.answers.append(answer)
        action = task_pb2.SessionAction(webdriver=command)
        self.requests.put_nowait(scheduler_pb2.OpenSessionRequest(action=action))
        try:
            response = await answer
        except asyncio.CancelledError:
            if self.finished.is_set():
                return None
            raise
        if response.HasField("refused"):
            return _error(400, "invalid argument", response.refused.message)
        reply: task_pb2.WebDriverReply = response.step.webdriver
        return reply

    def close(self) -> None:
        self.requests.put_nowait(None)


class WebDriver:
    """The endpoint's routes and the WebDriver sessions of this replica, by id."""

    def __init__(self, scheduler: SchedulerService, auth: Authenticator) -> None:
        self.scheduler = scheduler
        self.auth = auth
        self.sessions: dict[str, _Session] = {}
        self._readers: set[asyncio.Task[None]] = set()

    def add_routes(self, app: web.Application) -> None:
        for prefix in PREFIXES:
            app.router.add_get(f"{prefix}/status", self.status)
            app.router.add_post(f"{prefix}/session", self.new_session)
            app.router.add_route("*", prefix + "/session/{id}{tail:(/.*)?}", self.command)
        app.router.add_route("*", "/wd/hub/{tail:.*}", self.unknown)

    async def unknown(self, request: web.Request) -> web.Response:
        return w3c_error("unknown command", f"no WebDriver command at {request.path}")

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response({"value": {"ready": True, "message": "AMC's WebDriver endpoint"}})

    async def new_session(self, request: web.Request) -> web.Response:
        context, metadata = _who(request)
        try:
            who = await self.auth.principal(metadata)
            asked = parse(await _body(request))
        except AmcError as exc:
            return _refusal(code_for(exc), exc.message)
        session = _Session(who.caller)
        servicer: Any = self.scheduler
        responses = servicer.OpenSession(session.stream(asked.open), context)
        reader = asyncio.create_task(session.read(responses))
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)
        try:
            while not await _within(session.dispatched.wait(), LOOK_EVERY):
                if _gone(request):  # the client left while its session waited: withdrawn
                    session.close()
                    return w3c_error("session not created", "the client left")
        except asyncio.CancelledError:
            session.close()
            raise
        if session.refused is not None:
            return _refusal(session.refused.code, session.refused.message)
        if session.finished.is_set():
            task = session.task
            why = task.result.error if task is not None else ""
            why = why or "the session ended"
            pending = f" (it waited: {session.pending})" if session.pending else ""
            return w3c_error("session not created", f"{why}{pending}")
        reply = await session.command("POST", "", asked.appium_request())
        if reply is None:
            return w3c_error("session not created", "the session ended as it started")
        try:
            document = json.loads(reply.body)
            document["value"]["sessionId"] = session.id
        except (ValueError, KeyError, TypeError):
            session.close()
            return _passed_on(reply)
        if reply.status != 200:
            session.close()
            return _passed_on(reply)
        if _gone(request):  # nobody to tell the session's id: it ends at once
            session.close()
            return w3c_error("session not created", "the client left")
        self.sessions[session.id] = session
        reader.add_done_callback(lambda _: self.sessions.pop(session.id, None))
        return web.json_response(document)

    async def command(self, request: web.Request) -> web.Response:
        session_id, tail = request.match_info["id"], request.match_info["tail"]
        session = self.sessions.get(session_id)
        try:
            who = await self.auth.principal(_who(request)[1])
            body = await _body(request)
        except AmcError as exc:
            error = "invalid argument" if isinstance(exc, InvalidArgument) else "invalid session id"
            return w3c_error(error, f"{code_for(exc).name}: {exc.message}")
        if session is None or session.caller != who.caller or session.finished.is_set():
            return w3c_error("invalid session id", f"no session {session_id} open for this token")
        if request.method not in ("GET", "POST", "DELETE"):
            return w3c_error("unknown method", f"{request.method} is no WebDriver method")
        reply = await session.command(request.method, tail, body)
        if reply is None:
            why = session.task.result.error if session.task is not None else ""
            return w3c_error("invalid session id", f"session {session_id} ended: {why or 'over'}")
        if request.method == "DELETE" and not tail:
            session.close()
            self.sessions.pop(session_id, None)
            if not await self._ended(session, _who(request)[0]):
                why = "its end is not recorded yet, so its phone may not be free"
                return w3c_error("unknown error", f"session {session_id} closed, but {why}")
        return _passed_on(reply)

    async def _ended(self, session: _Session, context: CallContext) -> bool:
        """Whether the session's task is finished (its phone free) within END_WAIT: the
        last answer of its OpenSession, or read again where that call ended without it (its
        replica lost the database as the session closed, or the host's report is late)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + END_WAIT
        await _within(session.finished.wait(), END_WAIT)
        request = scheduler_pb2.GetTaskRequest(task_id=session.id)
        servicer: Any = self.scheduler  # called in process, with the console's context
        while session.task is None or session.task.status not in _FINISHED:
            if loop.time() >= until:
                return False
            await asyncio.sleep(END_READ)
            with contextlib.suppress(AmcError, Refused):
                session.task = await servicer.GetTask(request, context)
        return True

    async def close(self) -> None:
        """The replica's end: every session closed as its client closing."""
        for session in list(self.sessions.values()):
            session.close()
        if self._readers:
            await asyncio.wait(self._readers, timeout=END_WAIT)


async def _body(request: web.Request) -> bytes:
    """The request's body, refused past MAX_BODY (by its Content-Length before any of it
    is read, where it says one)."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise InvalidArgument("body", too_big("the request's body", request.content_length))
    data = bytearray()
    while chunk := await request.content.read(READ_CHUNK):
        data += chunk
        if len(data) > MAX_BODY:
            raise InvalidArgument("body", too_big("the request's body", None))
    return bytes(data)


def _error(status: int, error: str, message: str) -> task_pb2.WebDriverReply:
    """A W3C error answer as Appium's would come (no answer of Appium's to pass on)."""
    body = {"value": {"error": error, "message": message, "stacktrace": ""}}
    return task_pb2.WebDriverReply(status=status, body=json.dumps(body).encode())


async def _within(aw: Any, seconds: float) -> bool:
    try:
        await asyncio.wait_for(aw, seconds)
    except TimeoutError:
        return False
    return True


def _gone(request: web.Request) -> bool:
    """The client's connection is closed (it stopped waiting for its new session)."""
    transport = request.transport
    return transport is None or transport.is_closing()


def _who(request: web.Request) -> tuple[CallContext, Any]:
    context = CallContext(request.headers.get("Authorization"))
    return context, context.invocation_metadata()


def _passed_on(reply: task_pb2.WebDriverReply) -> web.Response:
    return web.Response(
        status=reply.status, body=reply.body, content_type="application/json", charset="utf-8"
    )
