"""The MCP server's session tools: list_phones (which phones could be had, and why not),
open_session (a phone of one's own: its id is the `session` the other tools take) and
close_session, for the calling client (`Lending`)."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from pydantic import Field

from amc.v1 import task_pb2
from amc_client import actions
from amc_client.mcp_phones import phones_text
from amc_client.mcp_text import said
from amc_client.mcp_tools import Lending, Session, client_name, tool_errors

Labels = Annotated[
    dict[str, str] | None,
    Field(description='Labels a phone must have, e.g. {"model": "Pixel 8"}.'),
]


def register(server: MCPServer, lending: Lending, *, limit: int, idle_timeout: float) -> None:
    """list_phones, open_session and close_session on `server`; their descriptions say
    how many sessions a client may hold (`limit`) and when an idle one ends."""
    many = (
        f"You may hold up to {limit} sessions at once (phones side by side); each call"
        " opens another."
        if limit > 1
        else "You hold one session at a time: a session still open is kept (close_session"
        " first for another)."
    )

    @server.tool()
    async def list_phones(ctx: Context, labels: Labels = None) -> str:
        """The farm's phones (those with these labels) and whether each could be had: a
        line counting them, then one line each: serial, model, `free`, `busy: your
        session ID` or `busy: task ID`, `held: why` (cordoned, charging, too hot,
        quarantined…) or `offline: why`, labels. One call to the farm, no phone used;
        needs an operator's token (a client's is told so)."""
        with tool_errors("list_phones"):
            sessions = await lending.client(ctx)
            mine = {p.task_id for p in sessions.held}
            return await phones_text(sessions.farm, labels, mine)

    @server.tool(
        description="Get a phone of one's own (a session) for the actions that follow: with"
        " these labels or this serial, else the server's defaults, with these apps installed"
        " first. Answers `session ID on phone SERIAL`: give ID as `session` to the other"
        f" tools. {many} A session holds its phone until close_session; one left"
        f" {idle_timeout:g} s without an action ends by itself. It counts in your token's"
        " fair share of the farm. Waits for a free phone at most `queue_timeout` seconds"
        " (installing the apps takes longer); a phone no registered device could be is"
        " refused at once, with the reason, and so is an app the library does not have."
    )
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
        snapshot: Annotated[
            str,
            Field(
                description="Start from this snapshot: an emulator of the farm loads it"
                " before the first action (e.g. login_screen); one no emulator has is refused."
            ),
        ] = "",
    ) -> str:
        with tool_errors("open_session"):
            wanted = [
                task_pb2.InstallApp(app=a, replace=True, grant_permissions=grant_permissions)
                for a in apps or ()
            ]
            sessions = await lending.client(ctx)
            phone, opened = await sessions.open(
                labels,
                serial,
                queue_timeout,
                client=client_name(ctx),
                apps=actions.apps(wanted),
                start_snapshot=snapshot,
            )
        if not opened:
            return f"session {phone.task_id} is open already on phone {phone.serial}"
        installed = f", {', '.join(apps)} installed" if apps else ""
        loaded = f", from snapshot {snapshot}" if snapshot else ""
        return f"session {phone.task_id} on phone {phone.serial}{loaded}{installed}"

    @server.tool()
    async def close_session(ctx: Context, session: Session = "") -> str:
        """Give the phone back: the session's task ends done (or says how it had ended), and
        its number of actions. Frees the phone at once."""
        with tool_errors("close_session"):
            return said(await (await lending.client(ctx)).close(session))
