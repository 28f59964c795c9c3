"""One interactive session's phone: each method is one action, sent on the session's
`Scheduler.OpenSession` stream and answered with its step (and what was observed)."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from amc.v1 import scheduler_pb2, task_pb2
from amc_client import actions
from amc_client.errors import ActionFailed, SessionEnded
from amc_common.channel import write_unless_ended

_EOF: Any = grpc.aio.EOF


class Phone:
    """The phone of an open session (`Farm.session`). An action that fails raises
    ActionFailed and the session goes on; once the session is over (cancelled, its lease
    lost, idle too long, past its longest duration) every call raises SessionEnded."""

    def __init__(self, call: Any, task: task_pb2.Task) -> None:
        self._call = call
        self.task = task
        self.ended: task_pb2.Task | None = None

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
        if self.ended is not None:
            raise SessionEnded(self.ended)
        observe = task_pb2.Observe(screenshot=screenshot, ui_dump=ui_dump, keep=keep)
        request = scheduler_pb2.OpenSessionRequest(
            action=task_pb2.SessionAction(action=action, observe=observe)
        )
        await write_unless_ended(self._call, request)  # if ended, its last answer says how
        response = await self._call.read()
        if response is _EOF or response.HasField("task"):
            self.ended = response.task if response is not _EOF else task_pb2.Task()
            raise SessionEnded(self.ended)
        step: task_pb2.SessionStep = response.step
        return step

    async def _do(self, action: task_pb2.Action, **observe: bool) -> task_pb2.SessionStep:
        answer = await self.act(action, **observe)
        if answer.step.status != task_pb2.STEP_STATUS_OK:
            raise ActionFailed(answer.step)
        return answer

    async def tap(self, x: int, y: int) -> None:
        await self._do(actions.tap(x, y))

    async def tap_on(self, text: str = "", resource_id: str = "", content_desc: str = "") -> None:
        """Tap the centre of the first element matching exactly one of these."""
        await self._do(actions.tap_on(text, resource_id, content_desc))

    async def swipe(self, x1: int, y1: int, x2: int, y2: int, duration: float = 0.3) -> None:
        await self._do(actions.swipe(x1, y1, x2, y2, duration))

    async def type(self, text: str) -> None:
        await self._do(actions.type_text(text))

    async def key(self, keycode: int) -> None:
        await self._do(actions.key(keycode))

    async def launch_app(self, package: str, activity: str = "") -> None:
        await self._do(actions.launch_app(package, activity))

    async def stop_app(self, package: str) -> None:
        await self._do(actions.stop_app(package))

    async def shell(self, command: str, timeout: float | None = None) -> str:
        """The command's output."""
        return (await self._do(actions.shell(command, timeout))).step.output

    async def wait(self, seconds: float) -> None:
        await self._do(actions.wait(seconds))

    async def screenshot(self, *, keep: bool = False) -> bytes:
        """The screen as PNG bytes."""
        return (await self._do(actions.screenshot(), keep=keep)).screenshot_png

    async def ui_dump(self, *, keep: bool = False) -> str:
        """The screen's `uiautomator dump` XML."""
        return (await self._do(actions.ui_dump(), keep=keep)).ui_dump_xml

    async def close(self) -> task_pb2.Task:
        """End the session (the task ends done) and return the finished task."""
        if self.ended is not None:
            return self.ended
        try:
            await self._call.done_writing()
        except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
            pass
        while (response := await self._call.read()) is not _EOF:
            if response.HasField("task"):
                self.ended = response.task
        self.ended = self.ended or task_pb2.Task()
        return self.ended

    def abandon(self) -> None:
        """Leave without closing (the task ends failed, "session abandoned")."""
        self._call.cancel()
