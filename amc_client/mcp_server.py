"""An MCP server that lends AI agents phones of the farm: tools list_phones, open_session,
screenshot (a PNG image), ui_dump (compact, or the full XML), tap, tap_element (a UI
selector), swipe, type_text, press_key, launch_app, stop_app and close_session, over one
interactive session (Scheduler.OpenSession) at a time. Needs the `mcp` extra (`pip install
agentic-mobile-control[mcp]`); the rest of amc_client does not.

    amc --addr amc.example:50051 --token-file token mcp --label model="Pixel 8"
    python -m amc_client.mcp_server --address amc.example:50051 --token-file token

speak MCP on stdin/stdout. The session opens with the first action (or open_session) and
ends done with close_session; one the agent forgets ends failed ("session abandoned") after
its idle timeout.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from pathlib import Path

import anyio
import grpc
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.utilities.types import Image

from amc.v1 import scheduler_pb2, task_pb2
from amc_client import actions
from amc_client.errors import ActionFailed, SessionEnded
from amc_client.farm import Farm
from amc_client.phone import Phone
from amc_common import durations
from amc_common.channel import read_token


class PhoneLender:
    """At most one open session, opened on demand, for the tools to act on."""

    def __init__(
        self,
        farm: Farm,
        labels: Mapping[str, str] | None = None,
        idle_timeout: float = 300.0,
        serial: str = "",
    ) -> None:
        self.farm = farm
        self.labels = dict(labels or {})
        self.serial = serial
        self.idle_timeout = idle_timeout
        self._stack: contextlib.AsyncExitStack | None = None
        self._phone: Phone | None = None

    @property
    def phone(self) -> Phone | None:
        """The open session's phone, if one is open."""
        return self._phone

    async def open(self, labels: Mapping[str, str] | None = None, serial: str = "") -> Phone:
        if self._phone is not None and self._phone.ended is None:
            return self._phone
        await self.close()
        stack = contextlib.AsyncExitStack()
        chosen = dict(labels or {}) if labels or serial else self.labels
        session = self.farm.session(
            labels=chosen,
            serial=serial or ("" if labels else self.serial),
            idle_timeout=self.idle_timeout,
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


def _condition(device: scheduler_pb2.Device) -> str:
    name: str = scheduler_pb2.DeviceCondition.Name(device.condition)
    return name.removeprefix("DEVICE_CONDITION_").lower().replace("unspecified", "ready")


async def phones_text(farm: Farm, labels: Mapping[str, str] | None = None) -> str:
    """The farm's online phones (matching `labels`), one line each: serial, model, free or
    busy, condition, labels. Listing hosts takes an operator token."""
    try:
        hosts = (await farm.scheduler.ListHosts(scheduler_pb2.ListHostsRequest())).hosts
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            return "listing phones needs an operator token; open_session with labels instead"
        raise
    lines = []
    for host in hosts:
        for d in host.devices:
            wanted = all(d.labels.get(k) == v for k, v in (labels or {}).items())
            if not (host.connected and d.state == scheduler_pb2.DEVICE_STATE_DEVICE and wanted):
                continue
            use = f"busy ({d.task_id})" if d.task_id else "free"
            tags = ",".join(f"{k}={v}" for k, v in sorted(d.labels.items()))
            lines.append(f"{d.serial}  model={d.model}  {use}  {_condition(d)}  {tags}")
    return "\n".join(lines) or "no phone is online" + (" with those labels" if labels else "")


def compact_ui(xml: str) -> str:
    """A UI dump as one line per element worth acting on (text, id, description, or
    clickable), indented by depth: `text="OK" id=… desc=… Button clickable @(540,1200)`,
    the @ being the centre to tap."""
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError:
        return xml
    lines: list[str] = []

    def walk(node: ElementTree.Element, depth: int) -> None:
        a = node.attrib
        parts = [f'text="{a["text"]}"'] if a.get("text") else []
        parts += [f"id={a['resource-id']}"] if a.get("resource-id") else []
        parts += [f'desc="{a["content-desc"]}"'] if a.get("content-desc") else []
        if parts or a.get("clickable") == "true":
            parts.append(a.get("class", node.tag).rsplit(".", 1)[-1])
            if a.get("clickable") == "true":
                parts.append("clickable")
            bounds = a.get("bounds", "").replace("][", ",").strip("[]").split(",")
            if len(bounds) == 4 and all(b.lstrip("-").isdigit() for b in bounds):
                x1, y1, x2, y2 = (int(b) for b in bounds)
                parts.append(f"@({(x1 + x2) // 2},{(y1 + y2) // 2})")
            lines.append("  " * depth + " ".join(parts))
        for child in node:
            walk(child, depth + 1)

    walk(root, 0)
    return "\n".join(lines) or "(no element with text, id, description or a click)"


def build_server(lender: PhoneLender) -> MCPServer:
    """The MCP server whose tools act on `lender`'s phone."""
    server: MCPServer = MCPServer(
        "amc-phone",
        instructions="Drive one Android phone of the farm: list_phones, open_session (or just "
        "act), look (screenshot, ui_dump), then act (tap, tap_element, swipe, type_text, "
        "press_key, launch_app, stop_app); close_session when done.",
    )

    @server.tool()
    async def list_phones(labels: dict[str, str] | None = None) -> str:
        """The farm's online phones (those with these labels): serial, model, free or busy,
        condition, labels."""
        return await phones_text(lender.farm, labels)

    @server.tool()
    async def open_session(labels: dict[str, str] | None = None, serial: str = "") -> str:
        """Get a phone (matching these labels, e.g. {"model": "Pixel 8"}, or this serial);
        waits for one."""
        phone = await lender.open(labels, serial)
        return f"session {phone.task_id} on phone {phone.serial}"

    @server.tool()
    async def screenshot() -> Image | str:
        """The phone's screen as a PNG image."""
        phone = await lender.open()
        try:
            return Image(data=await phone.screenshot(), format="png")
        except (SessionEnded, ActionFailed) as exc:
            return str(exc)

    @server.tool()
    async def ui_dump(full: bool = False) -> str:
        """The screen's elements worth acting on, one a line with their centre to tap
        (`full`: the whole uiautomator XML)."""
        phone = await lender.open()
        try:
            xml = await phone.ui_dump()
        except (SessionEnded, ActionFailed) as exc:
            return str(exc)
        return xml if full else compact_ui(xml)

    @server.tool()
    async def close_session() -> str:
        """Give the phone back; the session's task ends done."""
        return _said(await lender.close())

    _action_tools(server, lender)
    return server


async def _act(lender: PhoneLender, what: str, action: task_pb2.Action) -> str:
    """One action on the lent phone (a session opened for it if none is), said in a line."""
    phone = await lender.open()
    try:
        answer = await phone.act(action)
    except SessionEnded as ended:
        return f"the session is over: {_said(ended.task)}"
    step = answer.step
    if step.status != task_pb2.STEP_STATUS_OK:
        return f"{what} failed: {step.error}"
    return f"{what}: ok" + (f"\n{step.output}" if step.output else "")


def _action_tools(server: MCPServer, lender: PhoneLender) -> None:
    @server.tool()
    async def tap(x: int, y: int) -> str:
        """Tap the screen at (x, y) pixels."""
        return await _act(lender, f"tap {x},{y}", actions.tap(x, y))

    @server.tool()
    async def tap_element(text: str = "", resource_id: str = "", content_desc: str = "") -> str:
        """Tap the centre of the first element with exactly this text, resource id or
        content description (as ui_dump shows them)."""
        what = f"tap {text or resource_id or content_desc!r}"
        return await _act(lender, what, actions.tap_on(text, resource_id, content_desc))

    @server.tool()
    async def swipe(x1: int, y1: int, x2: int, y2: int, seconds: float = 0.3) -> str:
        """Swipe from (x1, y1) to (x2, y2) in `seconds`."""
        return await _act(lender, "swipe", actions.swipe(x1, y1, x2, y2, seconds))

    @server.tool()
    async def type_text(text: str) -> str:
        """Type text into the focused field."""
        return await _act(lender, "type", actions.type_text(text))

    @server.tool()
    async def press_key(keycode: int) -> str:
        """Press an Android key (3 home, 4 back, 66 enter)."""
        return await _act(lender, f"key {keycode}", actions.key(keycode))

    @server.tool()
    async def launch_app(package: str, activity: str = "") -> str:
        """Start an app by package name (its default activity unless one is named)."""
        return await _act(lender, f"launch {package}", actions.launch_app(package, activity))

    @server.tool()
    async def stop_app(package: str) -> str:
        """Force-stop an app by package name."""
        return await _act(lender, f"stop {package}", actions.stop_app(package))


def _labels(values: list[str]) -> dict[str, str]:
    pairs = (v.split("=", 1) for v in values)
    return {k: v for k, v in pairs}


async def serve(
    address: str,
    *,
    token: str | None = None,
    ca_file: str | Path | None = None,
    tls: bool = False,
    labels: Mapping[str, str] | None = None,
    serial: str = "",
    idle_timeout: float = 300.0,
) -> None:
    """Serve MCP on stdin/stdout until the agent closes it; the open session ends done."""
    async with Farm(address, token=token, ca_file=ca_file, tls=tls) as farm:
        lender = PhoneLender(farm, labels, idle_timeout, serial)
        try:
            await build_server(lender).run_stdio_async()
        finally:
            await lender.close()


def run(
    address: str,
    *,
    token: str | None = None,
    ca_file: str | Path | None = None,
    tls: bool = False,
    labels: Mapping[str, str] | None = None,
    serial: str = "",
    idle_timeout: float = 300.0,
) -> None:
    """`serve` from synchronous code (a command line)."""
    anyio.run(
        functools.partial(
            serve,
            address,
            token=token,
            ca_file=ca_file,
            tls=tls,
            labels=labels,
            serial=serial,
            idle_timeout=idle_timeout,
        )
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="amc-mcp", description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True)
    parser.add_argument("--token")
    parser.add_argument("--token-file")
    parser.add_argument("--ca-file")
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--label", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--serial", default="")
    parser.add_argument(
        "--idle-timeout",
        type=durations.above_zero,
        default=300.0,
        metavar="DURATION",
        help=f"a session left idle this long ends (default 5m). {durations.GRAMMAR}",
    )
    args = parser.parse_args(argv)
    token = read_token(args.token, args.token_file)
    run(
        args.address,
        token=token,
        ca_file=args.ca_file,
        tls=args.tls,
        labels=_labels(args.label),
        serial=args.serial,
        idle_timeout=args.idle_timeout,
    )


if __name__ == "__main__":
    main()
