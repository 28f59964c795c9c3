"""The MCP server's read_log tool: the recent lines of a session's phone log (logcat), as
Scheduler.StreamLogs reads them (`Farm.logs`: the running session's lines its host holds,
or the log an ended one kept), filtered by priority and tag on the control plane, and
bounded here (at most MAX_LINES lines and MAX_CHARS characters, each line at most
LINE_CHARS) before they reach the model.

Not an action: the phone is not touched and no step is added to the session. A session
is named as the other tools name it (`session`, or left out: the client's one open
session); one is never opened to read a log. A bad argument is a tool error of one line
(nothing read), as the control plane's refusal is.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Annotated

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult
from pydantic import Field

from amc_client.mcp_sessions import NoSession
from amc_client.mcp_tools import Lending, Session, client_name, text, tool_errors
from amc_client.phone import Phone
from amc_common import logcat

# What one answer holds at most: lines, characters in all, characters a line.
MAX_LINES = 500
MAX_CHARS = 16_000
LINE_CHARS = 400
# How long a read may take (a tool call must answer before the MCP client gives up).
READ_TIMEOUT = 30.0

Lines = Annotated[
    int, Field(description=f"How many of the newest lines, 1 to {MAX_LINES} (after the filters).")
]
Level = Annotated[
    str,
    Field(
        description="Only lines of this priority or higher: V, D, I, W, E, F (or verbose, "
        "debug, info, warn, error, fatal); empty: every priority."
    ),
]
Tags = Annotated[
    list[str],
    Field(
        description="Only lines of these tags (e.g. AndroidRuntime, ActivityManager); empty: any."
    ),
]


def register(server: MCPServer, lending: Lending) -> None:
    """read_log on `server`, on sessions of `lending`'s clients."""

    @server.tool()
    async def read_log(
        ctx: Context,
        lines: Lines = 50,
        level: Level = "",
        tags: Tags = [],  # noqa: B006 (the schema's default; never changed)
        session: Session = "",
    ) -> CallToolResult:
        """The newest lines of the session's phone log (logcat, as `logcat -v threadtime
        -v usec` prints them: time, pid, tid, priority, tag, message), oldest first. Lines
        of tag `amc` mark where each of the session's actions (steps) began and ended, and
        always show; an app's crash (`FATAL EXCEPTION`) or ANR (`ANR in`) is here with its
        stack. Not an action: the phone is not touched and no step is added. Costs a read
        of what the phone's host holds (its last 1,000 lines of a running session; an
        ended session's kept log): tens of ms, up to a few seconds the first time in a
        session (the host opens its log call). Returns at most 500 lines and 16,000
        characters (older lines left out first, a line cut at 400 characters)."""
        with tool_errors("read_log"):
            try:
                _check(lines, level, tags)
            except ValueError as exc:
                raise ToolError(f"read_log refused: {exc} (nothing read)") from None
            phone = await _phone(lending, ctx, session)
            sessions = await lending.client(ctx)
            newest: deque[str] = deque(maxlen=lines)
            async with asyncio.timeout(READ_TIMEOUT):
                async for line in sessions.farm.logs(phone.task_id, level=level, tags=tags):
                    newest.append(line)
        meta = {"amc/session": phone.task_id, "amc/phone": phone.serial}
        return CallToolResult(content=[text(shown(list(newest), phone))], _meta=meta)


def _check(lines: int, level: str, tags: list[str]) -> None:
    """ValueError naming what is wrong."""
    if not 1 <= lines <= MAX_LINES:
        raise ValueError(f"lines: {lines} is not 1 to {MAX_LINES}")
    try:
        logcat.level(level)
    except ValueError as exc:
        raise ValueError(f"level: {exc}") from None
    try:
        logcat.tags(tags)
    except ValueError as exc:
        raise ValueError(f"tags: {exc}") from None


async def _phone(lending: Lending, ctx: Context, session: str) -> Phone:
    """The session named (or the client's one open one), never one opened for this."""
    sessions = await lending.client(ctx)
    if not session and not sessions.held:
        raise NoSession("no session is open: open_session first")
    return await sessions.phone(session, client_name(ctx))


def shown(lines: list[str], phone: Phone) -> str:
    """The lines under a line saying what they are, within MAX_CHARS (the oldest left out
    first), each within LINE_CHARS."""
    cut = [x if len(x) <= LINE_CHARS else f"{x[: LINE_CHARS - 1]}…" for x in lines]
    total, keep = 0, len(cut)
    for i in range(len(cut) - 1, -1, -1):
        total += len(cut[i]) + 1
        if total > MAX_CHARS:
            keep = len(cut) - 1 - i
            break
    kept = cut[len(cut) - keep :]
    whose = f"session {phone.task_id} on phone {phone.serial}"
    if not kept:
        return f"no line of the phone's log ({whose}) passes the filters yet"
    left = len(cut) - len(kept)
    more = f"; {left} older left out (at most {MAX_CHARS:,} characters)" if left else ""
    head = f"{len(kept)} line{'s' if len(kept) != 1 else ''} of the phone's log ({whose}){more}"
    return "\n".join([head, *kept])
