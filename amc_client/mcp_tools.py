"""The MCP server's tools, each parameter described for the model: list_phones,
open_session, screenshot, ui_dump, tap, tap_element, swipe, type_text, press_key,
launch_app, stop_app, install_app, wait_for and close_session, over a PhoneLender's one
session.

Whatever stops a tool is a tool error (isError true) whose text is one line saying why:
an argument the shared action table refuses (checked before anything is sent, so the
session goes on), an action that failed on the phone (a tap_element that found nothing),
the session's end (cancelled, idle, its lease lost, past its longest duration: the agent
must open_session again), no phone for the session. Coordinates are the screen's own
pixels (taps, swipes and ui_dump's centres); a screenshot may be smaller, and its tool
says by how much.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Annotated

import grpc
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image
from pydantic import Field

from amc.v1 import task_pb2
from amc_client import actions
from amc_client.errors import ActionFailed, ActionRefused, AmcClientError, SessionEnded
from amc_client.mcp_lender import PhoneLender
from amc_client.mcp_text import compact_ui, phones_text, said, screenshot_note
from amc_common.action_table import MAX_COORD

# The longest wait_for here: a tool call must answer before the MCP client gives up on it
# (60 s in most clients).
MAX_WAIT_FOR = 50.0

Coord = Annotated[
    int,
    Field(
        description=f"In the screen's own pixels, 0 to {MAX_COORD}: ui_dump gives each "
        "element's centre in them; screenshot says how its image maps onto them."
    ),
]
Labels = Annotated[
    dict[str, str] | None,
    Field(description='Labels a phone must have, e.g. {"model": "Pixel 8"}.'),
]
Text = Annotated[str, Field(description="Exactly this visible text (as ui_dump shows it).")]
ResourceId = Annotated[
    str, Field(description='Exactly this resource id, e.g. "com.example:id/login".')
]
ContentDesc = Annotated[
    str, Field(description="Exactly this content description (accessibility label).")
]
Package = Annotated[str, Field(description='An Android package name, e.g. "com.android.settings".')]


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


async def act(
    lender: PhoneLender, ctx: Context, what: str, build: Callable[[], task_pb2.Action]
) -> str:
    """One action on the lent phone, said in a line (its output after it, if any)."""
    with tool_errors(what):
        action = build()  # a bad argument is refused here: nothing opened, nothing sent
        phone = await lender.current(client_name(ctx))
        answer = await phone.act(action)
        if answer.step.status != task_pb2.STEP_STATUS_OK:
            raise ActionFailed(answer.step)
    return f"{what}: ok" + (f"\n{answer.step.output}" if answer.step.output else "")


def register(server: MCPServer, lender: PhoneLender) -> None:
    """The tools, on `server`, acting on `lender`'s session."""
    _session_tools(server, lender)
    _look_tools(server, lender)
    _action_tools(server, lender)


def _session_tools(server: MCPServer, lender: PhoneLender) -> None:
    @server.tool()
    async def list_phones(labels: Labels = None) -> str:
        """The farm's online phones (those with these labels), one a line: serial, model,
        free or busy, condition, labels. Needs an operator token."""
        with tool_errors("list_phones"):
            return await phones_text(lender.farm, labels)

    @server.tool()
    async def open_session(
        ctx: Context,
        labels: Labels = None,
        serial: Annotated[str, Field(description="This phone, by serial.")] = "",
        queue_timeout: Annotated[
            float | None,
            Field(
                description="Seconds to wait for a free phone before giving up (default: "
                "the server's --queue-timeout, 30 s unless set)."
            ),
        ] = None,
        apps: Annotated[
            list[str] | None,
            Field(
                description="Apps of the farm's library to install before the first "
                'action: package names (e.g. "com.example.app": the newest upload) or app '
                "ids (an APK's sha256), replacing an installed copy (its data kept)."
            ),
        ] = None,
        grant_permissions: Annotated[
            bool, Field(description="Grant those apps every runtime permission they ask for.")
        ] = False,
        start_snapshot: Annotated[
            str,
            Field(
                description="An emulator snapshot to start from (an emulator of the farm "
                "that has it, reset to it before the first action)."
            ),
        ] = "",
    ) -> str:
        """Get a phone of one's own (a session) for the actions that follow: with these
        labels or this serial, else the server's defaults, with these apps installed first
        (and from this emulator snapshot: one no emulator has is refused at once).
        Waits for a free phone at most `queue_timeout` seconds (installing the apps takes
        longer); a phone no registered device could be is refused at once, with the
        reason, and so is an app the library does not have. A session still open is kept
        (close_session first for another)."""
        with tool_errors("open_session"):
            wanted = [
                task_pb2.InstallApp(app=a, replace=True, grant_permissions=grant_permissions)
                for a in apps or ()
            ]
            phone, opened = await lender.open(
                labels,
                serial,
                queue_timeout,
                client=client_name(ctx),
                apps=actions.apps(wanted),
                start_snapshot=start_snapshot,
            )
        if not opened:
            return f"session {phone.task_id} is open already on phone {phone.serial}"
        installed = f", {', '.join(apps)} installed" if apps else ""
        return f"session {phone.task_id} on phone {phone.serial}{installed}"

    @server.tool()
    async def close_session() -> str:
        """Give the phone back: the session's task ends done (or says how it had ended)."""
        with tool_errors("close_session"):
            return said(await lender.close())


def _look_tools(server: MCPServer, lender: PhoneLender) -> None:
    @server.tool(structured_output=False)
    async def screenshot(ctx: Context) -> list[Image | str]:
        """The phone's screen as a PNG image, with a line saying its size against the
        screen's pixels, which tap and swipe take (a screenshot may be smaller)."""
        # The screen's size: the session's steps say it (or a UI dump of it did).
        with tool_errors("screenshot"):
            phone = await lender.current(client_name(ctx))
            answer = await phone.act(actions.screenshot())
            if answer.step.status != task_pb2.STEP_STATUS_OK:
                raise ActionFailed(answer.step)
        png = answer.screenshot_png
        return [Image(data=png, format="png"), screenshot_note(png, phone.screen_size)]

    @server.tool()
    async def ui_dump(
        ctx: Context,
        full: Annotated[
            bool, Field(description="The whole uiautomator XML instead of the short list.")
        ] = False,
    ) -> str:
        """The screen's elements worth acting on, one a line, indented by depth, with the
        centre to tap in screen pixels: `text="OK" id=… desc=… Button clickable @(540,1200)`."""
        with tool_errors("ui_dump"):
            phone = await lender.current(client_name(ctx))
            xml = await phone.ui_dump()
        if full:
            return xml
        size = phone.screen_size
        head = f"screen {size[0]}x{size[1]} pixels\n" if size else ""
        return head + compact_ui(xml)


def _action_tools(server: MCPServer, lender: PhoneLender) -> None:
    @server.tool()
    async def tap(ctx: Context, x: Coord, y: Coord) -> str:
        """Tap the screen at (x, y), in the screen's pixels."""
        return await act(lender, ctx, f"tap {x},{y}", lambda: actions.tap(x, y))

    @server.tool()
    async def tap_element(
        ctx: Context, text: Text = "", resource_id: ResourceId = "", content_desc: ContentDesc = ""
    ) -> str:
        """Tap the centre of the first element with exactly this text, resource id or
        content description (give one; as ui_dump shows them). An element not on the
        screen is a tool error."""
        what = f"tap {text or resource_id or content_desc!r}"
        return await act(lender, ctx, what, lambda: actions.tap_on(text, resource_id, content_desc))

    @server.tool()
    async def swipe(
        ctx: Context,
        x1: Coord,
        y1: Coord,
        x2: Coord,
        y2: Coord,
        seconds: Annotated[float, Field(description="How long the swipe takes.")] = 0.3,
    ) -> str:
        """Swipe from (x1, y1) to (x2, y2), in the screen's pixels, in `seconds`."""
        return await act(lender, ctx, "swipe", lambda: actions.swipe(x1, y1, x2, y2, seconds))

    @server.tool()
    async def type_text(
        ctx: Context, text: Annotated[str, Field(description="The text to type.")]
    ) -> str:
        """Type text into the focused field (tap the field first)."""
        return await act(lender, ctx, "type", lambda: actions.type_text(text))

    @server.tool()
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
    ) -> str:
        """Press a key of the phone (HOME, BACK, ENTER…)."""
        return await act(lender, ctx, f"key {key}", lambda: actions.key(key))

    @server.tool()
    async def launch_app(
        ctx: Context,
        package: Package,
        activity: Annotated[
            str, Field(description="An activity to start; empty: the app's default one.")
        ] = "",
    ) -> str:
        """Start an app by package name."""
        what = f"launch {package}"
        return await act(lender, ctx, what, lambda: actions.launch_app(package, activity))

    @server.tool()
    async def stop_app(ctx: Context, package: Package) -> str:
        """Force-stop an app by package name."""
        return await act(lender, ctx, f"stop {package}", lambda: actions.stop_app(package))

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
    ) -> str:
        """Install an app of the farm's library on the phone, replacing an installed copy
        (its data kept); one the library does not have is a tool error."""
        return await act(
            lender,
            ctx,
            f"install {app}",
            lambda: actions.install_app(app, replace=True, grant_permissions=grant_permissions),
        )

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
    ) -> str:
        """Wait until an element with exactly this text, resource id or content description
        (give one) is on the screen; a tool error if it is not there within `timeout`."""
        what = f"wait for {text or resource_id or content_desc!r}"

        def build() -> task_pb2.Action:
            if timeout > MAX_WAIT_FOR:
                raise ActionRefused(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"wait_for.timeout: at most {MAX_WAIT_FOR:g} s here (a tool call must"
                    " answer before the MCP client gives up on it)",
                )
            return actions.wait_for(text, resource_id, content_desc, timeout)

        return await act(lender, ctx, what, build)
