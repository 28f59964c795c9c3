"""An MCP server that lends AI agents a phone of the farm: tools open_session, tap, swipe,
type_text, press_key, screenshot, ui_dump and close_session, over one interactive session
(Scheduler.OpenSession) at a time. Needs the `mcp` extra (`pip install
agentic-mobile-control[mcp]`); the rest of amc_client does not.

    python -m amc_client.mcp_server --address amc.example:50051 --token-file token \\
        --label model="Pixel 8"

speaks MCP on stdin/stdout. The session opens with the first action (or open_session) and
ends done with close_session; one the agent forgets ends failed ("session abandoned") after
its idle timeout.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Mapping

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image

from amc.v1 import task_pb2
from amc_client.errors import ActionFailed, SessionEnded
from amc_client.farm import Farm
from amc_client.phone import Phone
from amc_common.channel import read_token


class PhoneLender:
    """At most one open session, opened on demand, for the tools to act on."""

    def __init__(
        self, farm: Farm, labels: Mapping[str, str] | None = None, idle_timeout: float = 300.0
    ) -> None:
        self.farm = farm
        self.labels = dict(labels or {})
        self.idle_timeout = idle_timeout
        self._stack: contextlib.AsyncExitStack | None = None
        self._phone: Phone | None = None

    @property
    def phone(self) -> Phone | None:
        """The open session's phone, if one is open."""
        return self._phone

    async def open(self, labels: Mapping[str, str] | None = None) -> Phone:
        if self._phone is not None and self._phone.ended is None:
            return self._phone
        await self.close()
        stack = contextlib.AsyncExitStack()
        session = self.farm.session(
            labels=dict(labels) if labels else self.labels, idle_timeout=self.idle_timeout
        )
        self._phone = await stack.enter_async_context(session)
        self._stack = stack
        return self._phone

    async def close(self) -> task_pb2.Task | None:
        """End the open session (done); its finished task, if there was one."""
        phone, stack = self._phone, self._stack
        self._phone = self._stack = None
        if phone is None or stack is None:
            return None
        if phone.ended is not None:
            return phone.ended
        await stack.aclose()
        return phone.ended


def _said(task: task_pb2.Task | None) -> str:
    if task is None:
        return "no session was open"
    status = task_pb2.TaskStatus.Name(task.status).removeprefix("TASK_STATUS_").lower()
    error = f": {task.result.error}" if task.result.error else ""
    return f"session {task.task_id} {status}{error} ({len(task.result.steps)} actions)"


def build_server(lender: PhoneLender) -> MCPServer:
    """The MCP server whose tools act on `lender`'s phone."""
    server: MCPServer = MCPServer(
        "amc-phone",
        instructions="Drive one Android phone of the farm: look (screenshot, ui_dump), then "
        "act (tap, swipe, type_text, press_key); close_session when done.",
    )

    async def act(what: str, action: task_pb2.Action) -> str:
        phone = await lender.open()
        try:
            answer = await phone.act(action)
        except SessionEnded as ended:
            return f"the session is over: {_said(ended.task)}"
        step = answer.step
        if step.status != task_pb2.STEP_STATUS_OK:
            return f"{what} failed: {step.error}"
        return f"{what}: ok" + (f"\n{step.output}" if step.output else "")

    @server.tool()
    async def open_session(labels: dict[str, str] | None = None) -> str:
        """Get a phone (matching these labels, e.g. {"model": "Pixel 8"}); waits for one."""
        phone = await lender.open(labels)
        return f"session {phone.task_id} on phone {phone.serial}"

    @server.tool()
    async def tap(x: int, y: int) -> str:
        """Tap the screen at (x, y) pixels."""
        return await act(f"tap {x},{y}", task_pb2.Action(tap=task_pb2.Tap(x=x, y=y)))

    @server.tool()
    async def swipe(x1: int, y1: int, x2: int, y2: int, seconds: float = 0.3) -> str:
        """Swipe from (x1, y1) to (x2, y2) in `seconds`."""
        move = task_pb2.Swipe(x1=x1, y1=y1, x2=x2, y2=y2)
        move.duration.FromNanoseconds(int(seconds * 1e9))
        return await act("swipe", task_pb2.Action(swipe=move))

    @server.tool()
    async def type_text(text: str) -> str:
        """Type text into the focused field."""
        return await act("type", task_pb2.Action(input_text=task_pb2.InputText(text=text)))

    @server.tool()
    async def press_key(keycode: int) -> str:
        """Press an Android key (3 home, 4 back, 66 enter)."""
        return await act(f"key {keycode}", task_pb2.Action(key=task_pb2.Key(keycode=keycode)))

    @server.tool()
    async def screenshot() -> Image | str:
        """The phone's screen as a PNG image."""
        phone = await lender.open()
        try:
            return Image(data=await phone.screenshot(), format="png")
        except (SessionEnded, ActionFailed) as exc:
            return str(exc)

    @server.tool()
    async def ui_dump() -> str:
        """The screen's UI hierarchy (uiautomator XML): texts, ids and bounds to tap."""
        phone = await lender.open()
        try:
            return await phone.ui_dump()
        except (SessionEnded, ActionFailed) as exc:
            return str(exc)

    @server.tool()
    async def close_session() -> str:
        """Give the phone back; the session's task ends done."""
        return _said(await lender.close())

    return server


def _labels(values: list[str]) -> dict[str, str]:
    pairs = (v.split("=", 1) for v in values)
    return {k: v for k, v in pairs}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="amc-mcp", description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--token")
    parser.add_argument("--token-file")
    parser.add_argument("--ca-file")
    parser.add_argument("--label", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--idle-timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    token = read_token(args.token, args.token_file)

    async def serve() -> None:
        async with Farm(args.address, token=token, ca_file=args.ca_file) as farm:
            lender = PhoneLender(farm, _labels(args.label), args.idle_timeout)
            try:
                await build_server(lender).run_stdio_async()
            finally:
                await lender.close()

    anyio.run(serve)


if __name__ == "__main__":
    main()
