"""An MCP server that lends AI agents phones of the farm: tools list_phones, open_session,
screenshot (a PNG image and its size against the screen's), ui_dump (compact, or the full
XML), tap, tap_element (a UI selector), swipe, type_text, press_key (a key name or number),
launch_app, stop_app, install_app, wait_for and close_session, over one interactive session
(Scheduler.OpenSession) at a time. Needs the `mcp` extra (`pip install
agentic-mobile-control[mcp]`); the rest of amc_client does not.

    amc --addr amc.example:50051 --token-file token mcp --label model="Pixel 8"
    python -m amc_client.mcp_server --address amc.example:50051 --token-file token

speak MCP on stdin/stdout. The tools are amc_client.mcp_tools (what each says, and how a
failure is a tool error of one line), the session amc_client.mcp_lender's (one at a time,
never replaced behind the agent's back). The session is opened by open_session (or the
first action) with the MCP client's name in its metadata; close_session ends it done, and
one the agent forgets ends failed after its idle timeout.

How the server ends: when its stdin closes. An MCP client that shuts down closes the
server's stdin and reads its stdout until the server exits (the spec's shutdown); one that
crashed or was killed closed both, so the server tells the two apart by whether anyone
still reads its stdout: a clean leave ends the open session done, a vanished client's
ends failed, "session abandoned", as a gRPC client's that vanishes does. Either way the
server exits 0, saying nothing (a vanished client's session: one line on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import select
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn, TypeVar

import anyio
from mcp.server.mcpserver import MCPServer

from amc.v1 import task_pb2
from amc_client.farm import Farm
from amc_client.mcp_lender import PhoneLender
from amc_client.mcp_text import compact_ui, phones_text
from amc_client.mcp_tools import register
from amc_common import durations
from amc_common.channel import read_token
from amc_common.command_line import OneLineParser
from amc_common.version import version

T = TypeVar("T")

__all__ = ["PhoneLender", "build_server", "compact_ui", "main", "phones_text", "run", "serve"]

# The control plane's range for a session's idle timeout (SessionOpen.idle_timeout).
IDLE = (1.0, 3600.0)
DEFAULT_IDLE_TIMEOUT = 300.0
# How long open_session waits for a phone by default: a tool call must answer before the
# MCP client gives up on it (60 s in most clients).
DEFAULT_QUEUE_TIMEOUT = 30.0
QUEUE = (1.0, 30 * 86400.0)
# After stdin closed, how long the server watches for its stdout's reader to be gone too
# (a client's death closes both at once) before it takes the leave for a clean one.
LEFT_GRACE = 0.1
# How long a clean leave waits for the session to close (after the action running, if
# any): the MCP SDK's client sends SIGKILL 4 s after it closed the server's stdin.
CLOSE_PATIENCE = 3.5

INSTRUCTIONS = (
    "Drive one Android phone of the farm: list_phones, open_session (with apps of the "
    "farm's library installed first, if asked), look (screenshot, ui_dump), then act (tap, "
    "tap_element, swipe, type_text, press_key, launch_app, stop_app, install_app, "
    "wait_for); close_session when done. Coordinates are the screen's pixels, "
    "as ui_dump's centres are; a screenshot says how its image maps onto them. A session "
    "that ended (idle, cancelled, its phone lost) stays ended: open_session again."
)


def build_server(lender: PhoneLender) -> MCPServer:
    """The MCP server whose tools act on `lender`'s phone."""
    server: MCPServer = MCPServer(
        "amc-phone", version=version(), instructions=INSTRUCTIONS, log_level="WARNING"
    )
    register(server, lender)
    return server


async def serve(
    address: str,
    *,
    token: str | None = None,
    ca_file: str | Path | None = None,
    tls: bool = False,
    labels: Mapping[str, str] | None = None,
    serial: str = "",
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    queue_timeout: float | None = DEFAULT_QUEUE_TIMEOUT,
) -> None:
    """Serve MCP on stdin/stdout until the agent closes it; the open session ends done, or
    abandoned when the agent vanished."""
    reader = os.dup(sys.stdout.fileno())  # our own hold on the pipe the client reads
    try:
        async with Farm(address, token=token, ca_file=ca_file, tls=tls) as farm:
            lender = PhoneLender(farm, labels, idle_timeout, serial, queue_timeout)
            vanished = False
            try:
                await build_server(lender).run_stdio_async()
            except* (BrokenPipeError, ConnectionResetError, anyio.BrokenResourceError):
                vanished = True  # an answer could not be written: no one reads
            if vanished or await anyio.to_thread.run_sync(_reader_gone, reader, LEFT_GRACE):
                _said_abandoned(lender.abandon(), "the MCP client left without closing")
            else:
                await _close(lender)
    finally:
        os.close(reader)


async def _close(lender: PhoneLender) -> None:
    """End the session done, for a client that left as the MCP shutdown says: it closed
    our stdin, waits a moment, then sends SIGTERM and, a moment later, SIGKILL. A SIGTERM
    does not cut the close short (the session would be abandoned); a close that outlasts
    CLOSE_PATIENCE (an action still running on the phone) gives up and abandons it."""
    phone = lender.phone
    previous = None
    with contextlib.suppress(ValueError):  # only the main thread handles signals
        previous = signal.signal(signal.SIGTERM, lambda number, frame: None)
    try:
        with anyio.move_on_after(CLOSE_PATIENCE) as waited:
            await lender.close()
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if waited.cancelled_caught and phone is not None:
        phone.abandon()
        _said_abandoned(phone.task, "its session did not close in time")


def _said_abandoned(task: task_pb2.Task | None, why: str) -> None:
    if task is not None:
        print(f"amc mcp: {why}; session {task.task_id} abandoned", file=sys.stderr)


def _reader_gone(fd: int, within: float) -> bool:
    """Whether the read end of the pipe (or socket) `fd` writes to is closed, within
    `within` seconds: poll reports POLLERR (POLLHUP for a socket) for it, asked or not."""
    if not hasattr(select, "poll"):
        return False
    poller = select.poll()
    poller.register(fd, 0)
    return bool(poller.poll(within * 1000))


def run(
    address: str,
    *,
    token: str | None = None,
    ca_file: str | Path | None = None,
    tls: bool = False,
    labels: Mapping[str, str] | None = None,
    serial: str = "",
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    queue_timeout: float | None = DEFAULT_QUEUE_TIMEOUT,
) -> NoReturn:
    """`serve` from synchronous code (a command line), then the process's end (exit 0,
    `exit_served`)."""
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
            queue_timeout=queue_timeout,
        )
    )
    exit_served()


def exit_served() -> NoReturn:
    """End the process once it served (exit 0): at once, since finalizing the MCP
    SDK's modules takes about a second, which the MCP client's shutdown (SIGTERM 2 s after
    it closed our stdin) may not give. Nothing is left to do: the session is over."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- python -m amc_client.mcp_server ---------------------------------------------------------


def within(text: str, low: float, high: float) -> float:
    """A duration in every AMC program's grammar (amc_common.durations: `30s`, `5m`,
    `1m30s`, `90`) from `low` to `high` seconds, as seconds; argparse's ArgumentTypeError of
    one line, in the grammar's words, for anything else (the caller names the flag)."""
    return durations.within(text, low, high)


def _label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def _typed(read: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type whose ValueError is its one-line message."""

    def convert(text: str) -> T:
        try:
            return read(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(
        prog="amc-mcp",
        description="Serve MCP on stdin/stdout: an AI agent drives phones of an AMC farm"
        " through interactive sessions (the same server as `amc mcp`).",
    )
    parser.add_argument("--address", required=True)
    parser.add_argument("--token")
    parser.add_argument("--token-file")
    parser.add_argument("--ca-file")
    parser.add_argument("--tls", action="store_true")
    parser.add_argument(
        "--label",
        action="append",
        default=[],
        type=_typed(_label),
        metavar="KEY=VALUE",
        help="labels a session's phone must have unless the agent names others (repeatable)",
    )
    parser.add_argument("--serial", default="", help="the phone a session asks for, by serial")
    parser.add_argument(
        "--idle-timeout",
        type=functools.partial(within, low=IDLE[0], high=IDLE[1]),
        default=DEFAULT_IDLE_TIMEOUT,
        metavar="DURATION",
        help="a session left idle this long ends (1s to 1h; default 5m)",
    )
    parser.add_argument(
        "--queue-timeout",
        type=functools.partial(within, low=QUEUE[0], high=QUEUE[1]),
        default=DEFAULT_QUEUE_TIMEOUT,
        metavar="DURATION",
        help=f"how long open_session waits for a free phone (default 30s). {durations.GRAMMAR}",
    )
    args = parser.parse_args(argv)
    try:
        token = read_token(args.token, args.token_file)
    except OSError as exc:
        parser.error(f"argument --token-file: {exc.strerror or exc}: {args.token_file}")
    with contextlib.suppress(KeyboardInterrupt):
        run(
            args.address,
            token=token,
            ca_file=args.ca_file,
            tls=args.tls,
            labels=dict(args.label),
            serial=args.serial,
            idle_timeout=args.idle_timeout,
            queue_timeout=args.queue_timeout,
        )


if __name__ == "__main__":
    main()
