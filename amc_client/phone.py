"""One interactive session's phone: each method is one action, sent on the session's
`Scheduler.OpenSession` stream and answered with its step (and what was observed).

One action is in flight at a time: callers that act at once (an MCP server's tools, a
program's tasks) take turns, each getting its own answer. An action's exchange (its write
and the read of its answer) runs apart from its caller, so a caller that stops waiting
(cancelled) neither cuts the stream nor leaves its answer to the next caller: the next
action first takes that answer off the stream. An action is checked with the shared
action table before it is sent; one the table refuses raises ActionRefused and is not
sent, and so is one the control plane refuses (`OpenSessionResponse.refused`).

How a session ends: whatever ended it (a close, a cancel, the idle timeout, a lost lease,
its longest duration), the control plane's last response is the finished task, as
recorded, and the session's exception is read from its status and error (errors.
session_ended). The Phone stops reading there and hangs up (closes its side, reads the
call's OK): the control plane holds the call open until then, because a client's write
after a call ended reads back as INTERNAL rather than the session's end. Only a call that
broke with no finished task (its replica died: UNAVAILABLE) leaves the end unsaid; the
Phone then waits a few seconds for the task's end as the host records it ("session relay
lost: …"), read through the Farm's channel, so the exception still carries the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from amc.v1 import scheduler_pb2, task_pb2
from amc_client import actions
from amc_client.errors import (
    ActionFailed,
    ActionRefused,
    AmcClientError,
    SessionEnded,
    session_ended,
)
from amc_common import statuses
from amc_common.channel import write_unless_ended

_EOF: Any = grpc.aio.EOF
# A client's close of its session, said (OpenSessionRequest.close).
CLOSE = scheduler_pb2.OpenSessionRequest(close=scheduler_pb2.SessionClose())
TERMINAL = statuses.numbers(statuses.TERMINAL, task_pb2.TaskStatus)
# The bounds of a UI dump's first node: the whole screen when it starts at its corner.
_FIRST_BOUNDS = re.compile(r'bounds="\[(-?\d+),(-?\d+)\]\[(\d+),(\d+)\]"')
# How long a phone whose call broke without its finished task (its replica died) waits for
# the task's end as its host records it, to say how the session ended.
ENDING_PATIENCE = 5.0
# How long a call whose session is over is read for its end (OK, once its side is closed)
# before it is cut.
HANG_UP_PATIENCE = 2.0

# The task of this id once it finished (Farm.wait).
TaskReader = Callable[[str], Awaitable[task_pb2.Task]]


class Phone:
    """The phone of an open session (`Farm.session`, `Farm.open_session`). An action that
    fails raises ActionFailed, one refused before it ran ActionRefused, and the session
    goes on; once the session is over every call raises the SessionEnded (a subclass saying
    why: SessionCancelled, SessionIdle, SessionLeaseLost, SessionDeadline) that ended it.

    `screen_size` is the phone's screen in its own pixels (the space of taps, swipes and
    UI-dump bounds), once a step said it: a screenshot may be smaller (a simulated phone's
    is a third of it)."""

    def __init__(
        self,
        call: Any,
        task: task_pb2.Task,
        *,
        finished: TaskReader | None = None,
    ) -> None:
        self._call = call
        self.task = task
        self.ended: task_pb2.Task | None = None
        self.end: SessionEnded | None = None
        self.screen_size: tuple[int, int] | None = None
        self._finished = finished
        self._turn = asyncio.Lock()
        self._exchange: asyncio.Future[Any] | None = None

    @property
    def task_id(self) -> str:
        return self.task.task_id

    @property
    def serial(self) -> str:
        return self.task.device_serial

    async def act(
        self,
        action: task_pb2.Action,
        *,
        screenshot: bool = False,
        ui_dump: bool = False,
        keep: bool = False,
    ) -> task_pb2.SessionStep:
        """Run `action`, then take a screenshot and/or a UI dump if asked (kept as the
        task's artifacts when `keep`). The step is returned whether it failed or not."""
        actions.check(action)
        observe = task_pb2.Observe(screenshot=screenshot, ui_dump=ui_dump, keep=keep)
        request = scheduler_pb2.OpenSessionRequest(
            action=task_pb2.SessionAction(action=action, observe=observe)
        )
        async with self._turn:
            await self._settle()
            if self.end is not None:
                raise self.end.with_traceback(None)
            self._exchange = asyncio.ensure_future(self._send(request))
            self._exchange.add_done_callback(_retrieved)
            response = await self._answer()
        return self._step(response)

    async def _send(self, request: scheduler_pb2.OpenSessionRequest) -> Any:
        await write_unless_ended(self._call, request)  # if ended, its last answer says how
        return await self._call.read()

    async def _answer(self) -> Any:
        """The answer of the exchange in flight (shielded: a caller cancelled here leaves
        it to the next one); None once the session ended, which `end` then says."""
        exchange = self._exchange
        assert exchange is not None
        try:
            response = await asyncio.shield(exchange)
        except grpc.aio.AioRpcError as exc:
            self._exchange = None
            await self._ending(None, exc)
            return None
        except BaseException:
            if exchange.done():  # the exchange failed, not its caller cancelled: it is over
                self._exchange = None
            raise
        self._exchange = None
        if response is _EOF or response.HasField("task"):
            await self._ending(response if response is not _EOF else None, None)
            return None
        return response

    async def _settle(self) -> None:
        """Take the answer of an action whose caller stopped waiting off the stream."""
        if self._exchange is not None:
            response = await self._answer()
            if response is not None and response.HasField("step"):
                self._saw(response.step)

    def _step(self, response: Any) -> task_pb2.SessionStep:
        if response is None:
            assert self.end is not None
            raise self.end.with_traceback(None)
        if response.HasField("refused"):
            code = _status(response.refused.code)
            raise ActionRefused(code, response.refused.message or code.name)
        step: task_pb2.SessionStep = response.step
        self._saw(step)
        return step

    def _saw(self, step: task_pb2.SessionStep) -> None:
        if step.screen_width > 0 and step.screen_height > 0:
            self.screen_size = (step.screen_width, step.screen_height)
        elif step.ui_dump_xml and (found := _FIRST_BOUNDS.search(step.ui_dump_xml)):
            # A host that does not say the size: a UI dump's first node is the whole screen.
            if found[1] == found[2] == "0":
                self.screen_size = (int(found[3]), int(found[4]))

    async def _ending(self, response: Any, error: grpc.aio.AioRpcError | None) -> None:
        """Record how the session ended, from its last response's finished task, then hang
        up; a call that broke (or ended) without it: from the task as its host records it."""
        task = response.task if response is not None else None
        if task is None or task.status not in TERMINAL:
            task = await self._recorded() or task
        end = session_ended(task)
        if error is not None:
            said = f"{error.code().name}: {error.details()}"
            if task is None or task.status not in TERMINAL:
                end = SessionEnded(task, f"the session's call ended: {said}")
            elif type(end) is SessionEnded:  # nothing more telling: say how the call ended
                end = SessionEnded(task, f"{end.reason} (its call ended {said})")
        self.ended = task or task_pb2.Task(task_id=self.task_id)
        self.end = end
        if error is None:
            await hang_up(self._call)

    async def _recorded(self) -> task_pb2.Task | None:
        """The session's task once finished, as the control plane recorded it (waited for
        up to ENDING_PATIENCE s): for a call that broke before its finished task came."""
        if self._finished is None:
            return None
        with contextlib.suppress(TimeoutError, grpc.aio.AioRpcError, AmcClientError):
            async with asyncio.timeout(ENDING_PATIENCE):
                return await self._finished(self.task_id)
        return None

    async def _do(self, action: task_pb2.Action, **observe: bool) -> task_pb2.SessionStep:
        answer = await self.act(action, **observe)
        if answer.step.status != task_pb2.STEP_STATUS_OK:
            raise ActionFailed(answer.step)
        return answer

    async def tap(self, x: int, y: int) -> None:
        """Tap at (x, y), in the screen's pixels (`screen_size`)."""
        await self._do(actions.tap(x, y))

    async def tap_on(self, text: str = "", resource_id: str = "", content_desc: str = "") -> None:
        """Tap the centre of the first element matching exactly one of these."""
        await self._do(actions.tap_on(text, resource_id, content_desc))

    async def swipe(self, x1: int, y1: int, x2: int, y2: int, duration: float = 0.3) -> None:
        await self._do(actions.swipe(x1, y1, x2, y2, duration))

    async def type(self, text: str) -> None:
        await self._do(actions.type_text(text))

    async def key(self, key: int | str) -> None:
        """Press a key: an Android keycode, or a name (`home`, `back`, `enter`…)."""
        await self._do(actions.key(key))

    async def launch_app(self, package: str, activity: str = "") -> None:
        await self._do(actions.launch_app(package, activity))

    async def stop_app(self, package: str) -> None:
        await self._do(actions.stop_app(package))

    async def install_app(
        self, app: str, *, replace: bool = True, grant_permissions: bool = False
    ) -> str:
        """Install an app of the farm's library (an app id, or a package name: its newest
        upload), replacing an installed copy unless told not to; what the host said
        (`installed io.appium.settings 3.0.0 (streamed)`)."""
        action = actions.install_app(app, replace=replace, grant_permissions=grant_permissions)
        return (await self._do(action)).step.output

    async def uninstall_app(self, package: str) -> None:
        await self._do(actions.uninstall_app(package))

    async def shell(self, command: str, timeout: float | None = None) -> str:
        """The command's output."""
        return (await self._do(actions.shell(command, timeout))).step.output

    async def wait(self, seconds: float) -> None:
        await self._do(actions.wait(seconds))

    async def wait_for(
        self, text: str = "", resource_id: str = "", content_desc: str = "", timeout: float = 10.0
    ) -> None:
        """Wait until an element with exactly this text, resource id or content description
        is on the screen, for at most `timeout` seconds (ActionFailed if it never is)."""
        await self._do(actions.wait_for(text, resource_id, content_desc, timeout))

    async def screenshot(self, *, keep: bool = False) -> bytes:
        """The screen as PNG bytes (its size may be smaller than `screen_size`)."""
        return (await self._do(actions.screenshot(), keep=keep)).screenshot_png

    async def ui_dump(self, *, keep: bool = False) -> str:
        """The screen's `uiautomator dump` XML (bounds in the screen's pixels)."""
        return (await self._do(actions.ui_dump(), keep=keep)).ui_dump_xml

    async def close(self) -> task_pb2.Task:
        """End the session (the task ends done, after the action in flight, if any) and
        return the finished task; a session already over returns how it ended."""
        async with self._turn:
            await self._settle()
            if self.end is not None:
                return self.ended or self.task
            with contextlib.suppress(
                grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError
            ):
                # Said, so the phone is freed at once (the end of the messages alone is
                # taken for a close only after a grace: it might be a vanished client's).
                await self._call.write(CLOSE)
                await self._call.done_writing()
            try:
                # No action is in flight: the next response is the finished task.
                while (response := await self._call.read()) is not _EOF:
                    if response.HasField("task"):
                        break
            except grpc.aio.AioRpcError as exc:
                await self._ending(None, exc)
            else:
                await self._ending(None if response is _EOF else response, None)
            assert self.ended is not None
            return self.ended

    def abandon(self) -> None:
        """Leave without closing (the task ends failed, "session abandoned"); every later
        call raises SessionEnded."""
        self._call.cancel()
        if self._exchange is not None:
            self._exchange.cancel()
            self._exchange = None
        if self.end is None:
            self.end = SessionEnded(self.task, "abandoned: its client left without closing it")


async def hang_up(call: Any) -> None:
    """End a session's call from the client's side: close it and read it to its end (the
    control plane then ends it OK, never a refused write's INTERNAL); cut if that does not
    come within HANG_UP_PATIENCE s."""
    try:
        async with asyncio.timeout(HANG_UP_PATIENCE):
            with contextlib.suppress(grpc.aio.UsageError, asyncio.InvalidStateError):
                await call.done_writing()
            while await call.read() is not _EOF:
                pass
    except (TimeoutError, grpc.aio.AioRpcError):
        pass
    finally:
        call.cancel()


def _retrieved(exchange: asyncio.Future[Any]) -> None:
    """An exchange's error is its next caller's to raise: not "never retrieved" meanwhile."""
    if not exchange.cancelled():
        exchange.exception()


def _status(code: int) -> grpc.StatusCode:
    """The gRPC status of a google.rpc.Code number (UNKNOWN for one it does not know)."""
    return next((s for s in grpc.StatusCode if s.value[0] == code), grpc.StatusCode.UNKNOWN)
