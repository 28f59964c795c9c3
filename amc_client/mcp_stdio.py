"""The MCP server on stdin/stdout, for the one agent that started it (`OneClient`): it
serves until its stdin closes, then ends the agent's sessions.

An MCP client that shuts down closes the server's stdin and reads its stdout until the
server exits (the spec's shutdown); one that crashed or was killed closed both, so the
server tells the two apart by whether anyone still reads its stdout: a clean leave ends
the open sessions done, a vanished client's end failed, "session abandoned", as a gRPC
client's that vanishes do (one line on stderr each).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer

from amc.v1 import task_pb2
from amc_client.farm import Farm
from amc_client.mcp_sessions import ClientSessions, Defaults
from amc_client.mcp_tools import Lending

# After stdin closed, how long the server watches for its stdout's reader to be gone too
# (a client's death closes both at once) before it takes the leave for a clean one.
LEFT_GRACE = 0.1
# How long a clean leave waits for the session to close (after the action running, if
# any): the MCP SDK's client sends SIGKILL 4 s after it closed the server's stdin.
CLOSE_PATIENCE = 3.5


class OneClient:
    """The stdio server's one client: every tool call is its."""

    def __init__(self, sessions: ClientSessions) -> None:
        self.sessions = sessions

    async def client(self, ctx: Context) -> ClientSessions:
        return self.sessions


async def serve(
    build: Callable[[Lending, Defaults], MCPServer],
    address: str,
    *,
    token: str | None = None,
    ca_file: str | Path | None = None,
    tls: bool = False,
    defaults: Defaults,
) -> None:
    """Serve the MCP server `build` makes on stdin/stdout until the agent closes it."""
    reader = os.dup(sys.stdout.fileno())  # our own hold on the pipe the client reads
    try:
        async with Farm(address, token=token, ca_file=ca_file, tls=tls) as farm:
            sessions = ClientSessions(farm, defaults)
            vanished = False
            try:
                await build(OneClient(sessions), defaults).run_stdio_async()
            except* (BrokenPipeError, ConnectionResetError, anyio.BrokenResourceError):
                vanished = True  # an answer could not be written: no one reads
            if vanished or await anyio.to_thread.run_sync(_reader_gone, reader, LEFT_GRACE):
                why = "the MCP client left without closing"
                _said_abandoned(sessions.abandon(why), why)
            else:
                await _close(sessions)
    finally:
        os.close(reader)


async def _close(sessions: ClientSessions) -> None:
    """End the session done, for a client that left as the MCP shutdown says: it closed
    our stdin, waits a moment, then sends SIGTERM and, a moment later, SIGKILL. A SIGTERM
    does not cut the close short (the session would be abandoned); a close that outlasts
    CLOSE_PATIENCE (an action still running on the phone) gives up and abandons it."""
    previous = None
    with contextlib.suppress(ValueError):  # only the main thread handles signals
        previous = signal.signal(signal.SIGTERM, lambda number, frame: None)
    try:
        ended = await sessions.leave(CLOSE_PATIENCE)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    late = [task for task, closed in ended if not closed]
    _said_abandoned(late, "its session did not close in time")


def _said_abandoned(tasks: Sequence[task_pb2.Task], why: str) -> None:
    for task in tasks:
        print(f"amc mcp: {why}; session {task.task_id} abandoned", file=sys.stderr)


def _reader_gone(fd: int, within: float) -> bool:
    """Whether the read end of the pipe (or socket) `fd` writes to is closed, within
    `within` seconds: poll reports POLLERR (POLLHUP for a socket) for it, asked or not."""
    if not hasattr(select, "poll"):
        return False
    poller = select.poll()
    poller.register(fd, 0)
    return bool(poller.poll(within * 1000))
