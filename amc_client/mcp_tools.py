"""The MCP server's tools that look at and act on a phone, each parameter described for the
model: screenshot, ui_dump, tap, tap_element, swipe, type_text, press_key, launch_app,
stop_app, install_app and wait_for, each on a session of the calling client's (`Lending`),
named by `session` or, left out, its one open session; the session tools are
amc_client.mcp_session_tools'.

Each answer carries, in its `_meta`, the session (`amc/session`), its phone (`amc/phone`)
and the step the action was (`amc/step`): what a client checks an answer against.
Whatever stops a tool is a tool error (isError true) whose text is one line saying why:
an argument the shared action table refuses (checked before anything is sent, so the
session goes on), an action that failed on the phone (a tap_element that found nothing),
the session's end (cancelled, idle, its lease lost, past its longest duration: the agent
must open_session again), no such session. Coordinates are the screen's own pixels (taps,
swipes and ui_dump's centres); a screenshot may be smaller, and its tool says by how much.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Annotated, Protocol

import grpc
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from mcp_types import CallToolResult, ContentBlock, TextContent
from pydantic import Field

from amc.v1 import task_pb2
from amc_client import actions
from amc_client.errors import ActionFailed, ActionRefused, AmcClientError, SessionEnded
from amc_client.mcp_sessions import ClientSessions
from amc_client.mcp_text import compact_ui, screenshot_note
from amc_client.phone import Phone
from amc_common.action_table import MAX_COORD

# The longest wait_for here: a tool call must answer before the MCP client gives up on it
# (60 s in most clients).
MAX_WAIT_FOR = 50.0
# What one action costs, as the descriptions say it.
ONE_ACTION = "One action on the phone (a step of the session's task; tens to hundreds of ms)."

Session = Annotated[
    str,
    Field(
        description="The session to act on: the id open_session answered. Leave it out "
        "while you hold one session."
    ),
]
Coord = Annotated[
    int,
    Field(
        description=f"In the screen's own pixels, 0 to {MAX_COORD}: ui_dump gives each "
        "element's centre in them; screenshot says how its image maps onto them."
    ),
]
Text = Annotated[str, Field(description="Exactly this visible text (as ui_dump shows it).")]
ResourceId = Annotated[
    str, Field(description='Exactly this resource id, e.g. "com.example:id/login".')
]
ContentDesc = Annotated[
    str, Field(description="Exactly this content description (accessibility label).")
]
Package = Annotated[str, Field(description='An Android package name, e.g. "com.android.settings".')]


class Lending(Protocol):
    """Whose sessions a tool call acts on: the calling client's."""

    async def client(self, ctx: Context) -> ClientSessions: ...


def client_name(ctx: Context) -> str:
    """The MCP client's name and version, as its initialize request gave them."""
    try:
        params = ctx.request_context.session.client_params
    except (AttributeError, ValueError, RuntimeError):
        return ""
    if params is None:
        return ""
    return f"{params.client_info.name} {params.client_info.version}".strip()


@contextlib.contextmanager
def tool_errors(what: str) -> Iterator[None]:
    """Whatever stops `what`, as a tool error of one line."""
    try:
        yield
    except ActionRefused as exc:
        raise _error(f"{what} refused: {exc.message} (nothing ran)") from exc
    except ActionFailed as exc:
        raise _error(f"{what} failed: {exc.step.error}") from exc
    except SessionEnded as exc:
        raise _error(f"{exc}; open_session to get a phone again") from exc
    except AmcClientError as exc:
        raise _error(str(exc)) from exc
    except grpc.aio.AioRpcError as exc:
        raise _error(f"{what}: the farm answered {exc.code().name}: {exc.details()}") from exc


def _error(text: str) -> ToolError:
    return ToolError(" ".join(text.split()))


def answered(
    content: list[ContentBlock], phone: Phone, step: task_pb2.StepResult
) -> CallToolResult:
    """A tool's answer, with the session, phone and step it is of in its `_meta`."""
    meta = {"amc/session": phone.task_id, "amc/phone": phone.serial, "amc/step": step.index}
    return CallToolResult(content=content, _meta=meta)


def text(said: str) -> TextContent:
    return TextContent(type="text", text=said)


async def step(
    lending: Lending,
    ctx: Context,
    session: str,
    what: str,
    build: Callable[[], task_pb2.Action],
    **observe: bool,
) -> tuple[Phone, task_pb2.SessionStep]:
    """One action on the session's phone, its step ok (else a tool error saying why)."""
    with tool_errors(what):
        action = build()  # a bad argument is refused here: nothing opened, nothing sent
        phone = await (await lending.client(ctx)).phone(session, client_name(ctx))
        answer = await phone.act(action, **observe)
        if answer.step.status != task_pb2.STEP_STATUS_OK:
            raise ActionFailed(answer.step)
    return phone, answer


async def act(
    lending: Lending, ctx: Context, session: str, what: str, build: Callable[[], task_pb2.Action]
) -> CallToolResult:
    """One action, said in a line (its output after it, if any)."""
    phone, answer = await step(lending, ctx, session, what, build)
    said = f"{what}: ok" + (f"\n{answer.step.output}" if answer.step.output else "")
    return answered([text(said)], phone, answer.step)


def register(server: MCPServer, lending: Lending) -> None:
    """The tools that look and act, on `server`, on sessions of `lending`'s clients."""
    _look_tools(server, lending)
    _action_tools(server, lending)
    _app_tools(server, lending)


def _look_tools(server: MCPServer, lending: Lending) -> None:
    @server.tool()
    async def screenshot(ctx: Context, session: Session = "") -> CallToolResult:
        """The phone's screen as a PNG image (MCP image content), with a line saying its
        size against the screen's pixels, which tap and swipe take (a screenshot may be
        smaller). One action on the phone: milliseconds on a simulated phone, 0.3 to 2 s
        and hundreds of KB on a real one."""
        # The screen's size: the session's steps say it (or a UI dump of it did).
        phone, answer = await step(lending, ctx, session, "screenshot", actions.screenshot)
        png = answer.screenshot_png
        image = Image(data=png, format="png").to_image_content()
        return answered([image, text(screenshot_note(png, phone.screen_size))], phone, answer.step)

    @server.tool()
    async def ui_dump(
        ctx: Context,
        session: Session = "",
        full: Annotated[
            bool, Field(description="The whole uiautomator XML instead of the short list.")
        ] = False,
    ) -> CallToolResult:
        """The screen's elements worth acting on, one a line, indented by depth, with the
        centre to tap in screen pixels: `text="OK" id=… desc=… Button clickable @(540,1200)`.
        One action on the phone (a uiautomator dump: 0.5 to 3 s on a real phone); far
        fewer tokens than a screenshot."""
        phone, answer = await step(lending, ctx, session, "ui_dump", actions.ui_dump)
        xml = answer.ui_dump_xml
        if full:
            return answered([text(xml)], phone, answer.step)
        size = phone.screen_size
        head = f"screen {size[0]}x{size[1]} pixels\n" if size else ""
        return answered([text(head + compact_ui(xml))], phone, answer.step)


def _action_tools(server: MCPServer, lending: Lending) -> None:
    @server.tool(description=f"Tap the screen at (x, y), in the screen's pixels. {ONE_ACTION}")
    async def tap(ctx: Context, x: Coord, y: Coord, session: Session = "") -> CallToolResult:
        return await act(lending, ctx, session, f"tap {x},{y}", lambda: actions.tap(x, y))

    @server.tool(
        description="Tap the centre of the first element with exactly this text, resource "
        "id or content description (give one; as ui_dump shows them). An element not on "
        f"the screen is a tool error. {ONE_ACTION}"
    )
    async def tap_element(
        ctx: Context,
        text: Text = "",
        resource_id: ResourceId = "",
        content_desc: ContentDesc = "",
        session: Session = "",
    ) -> CallToolResult:
        what = f"tap {text or resource_id or content_desc!r}"
        build = lambda: actions.tap_on(text, resource_id, content_desc)  # noqa: E731
        return await act(lending, ctx, session, what, build)

    @server.tool(
        description="Swipe from (x1, y1) to (x2, y2), in the screen's pixels, in `seconds`."
        f" {ONE_ACTION}"
    )
    async def swipe(
        ctx: Context,
        x1: Coord,
        y1: Coord,
        x2: Coord,
        y2: Coord,
        seconds: Annotated[float, Field(description="How long the swipe takes.")] = 0.3,
        session: Session = "",
    ) -> CallToolResult:
        build = lambda: actions.swipe(x1, y1, x2, y2, seconds)  # noqa: E731
        return await act(lending, ctx, session, "swipe", build)

    @server.tool(
        description=f"Type text into the focused field (tap the field first). {ONE_ACTION}"
    )
    async def type_text(
        ctx: Context,
        text: Annotated[str, Field(description="The text to type.")],
        session: Session = "",
    ) -> CallToolResult:
        return await act(lending, ctx, session, "type", lambda: actions.type_text(text))

    @server.tool(description=f"Press a key of the phone (HOME, BACK, ENTER…). {ONE_ACTION}")
    async def press_key(
        ctx: Context,
        key: Annotated[
            str | int,
            Field(
                description="A key name: HOME, BACK, ENTER, TAB, DEL, SPACE, ESCAPE, MENU, "
                "SEARCH, APP_SWITCH, POWER, VOLUME_UP, VOLUME_DOWN, DPAD_UP, DPAD_DOWN, "
                "DPAD_LEFT, DPAD_RIGHT, DPAD_CENTER, PAGE_UP, PAGE_DOWN (any case), or an "
                "Android keycode number."
            ),
        ],
        session: Session = "",
    ) -> CallToolResult:
        return await act(lending, ctx, session, f"key {key}", lambda: actions.key(key))

    @server.tool()
    async def wait_for(
        ctx: Context,
        text: Text = "",
        resource_id: ResourceId = "",
        content_desc: ContentDesc = "",
        timeout: Annotated[
            float,
            Field(description=f"Seconds to look for it, at most {MAX_WAIT_FOR:g} (0: once)."),
        ] = 10.0,
        session: Session = "",
    ) -> CallToolResult:
        """Wait until an element with exactly this text, resource id or content description
        (give one) is on the screen; a tool error if it is not there within `timeout`. One
        action that looks at the screen again and again (a UI dump each time) until then."""
        what = f"wait for {text or resource_id or content_desc!r}"

        def build() -> task_pb2.Action:
            if timeout > MAX_WAIT_FOR:
                raise ActionRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"wait_for.timeout: at most {MAX_WAIT_FOR:g} s here (a tool call must"
                    " answer before the MCP client gives up on it)",
                )
            return actions.wait_for(text, resource_id, content_desc, timeout)

        return await act(lending, ctx, session, what, build)


def _app_tools(server: MCPServer, lending: Lending) -> None:
    @server.tool(description=f"Start an app by package name. {ONE_ACTION}")
    async def launch_app(
        ctx: Context,
        package: Package,
        activity: Annotated[
            str, Field(description="An activity to start; empty: the app's default one.")
        ] = "",
        session: Session = "",
    ) -> CallToolResult:
        build = lambda: actions.launch_app(package, activity)  # noqa: E731
        return await act(lending, ctx, session, f"launch {package}", build)

    @server.tool(description=f"Force-stop an app by package name. {ONE_ACTION}")
    async def stop_app(ctx: Context, package: Package, session: Session = "") -> CallToolResult:
        build = lambda: actions.stop_app(package)  # noqa: E731
        return await act(lending, ctx, session, f"stop {package}", build)

    @server.tool()
    async def install_app(
        ctx: Context,
        app: Annotated[
            str,
            Field(
                description="An app of the farm's library: a package name (e.g. \"com.example"
                ".app\": its newest upload) or an app id (an APK's sha256)."
            ),
        ],
        grant_permissions: Annotated[
            bool, Field(description="Grant it every runtime permission it asks for.")
        ] = False,
        session: Session = "",
    ) -> CallToolResult:
        """Install an app of the farm's library on the phone, replacing an installed copy
        (its data kept); one the library does not have is a tool error. One action: the
        APK goes from the library to the phone's host (once per host) and is installed,
        seconds for a small app, up to a minute for a large one. Says what was installed."""
        build = lambda: actions.install_app(  # noqa: E731
            app, replace=True, grant_permissions=grant_permissions
        )
        return await act(lending, ctx, session, f"install {app}", build)
