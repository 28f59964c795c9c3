"""An MCP server that lends AI agents phones of the farm: tools list_phones (free, busy, held
or offline, and why), open_session, screenshot (a PNG image and its size against the
screen's), ui_dump (compact, or the full XML), tap, tap_element (a UI selector), swipe,
type_text, press_key (a key name or number), launch_app, stop_app, install_app, wait_for,
read_log (the phone's recent log lines) and close_session, each on an interactive session
(Scheduler.OpenSession) of the calling agent's. Needs the `mcp` extra (`pip install
agentic-mobile-control[mcp]`); the rest of amc_client does not.

    amc --addr amc.example:50051 --token-file token mcp --label model="Pixel 8"
    amc --addr amc.example:50051 mcp --http 127.0.0.1:8765
    python -m amc_client.mcp_server --address amc.example:50051 --token-file token

The first two speak MCP on stdin/stdout, for the one agent that started the server; with
--http, the streamable-HTTP transport at http://127.0.0.1:8765/mcp, for many agents, each
with its own bearer token (amc_client.mcp_http, amc_client.mcp_clients). The tools are
amc_client.mcp_session_tools, amc_client.mcp_tools and amc_client.mcp_log (what each says
and costs, and how a failure is a tool error of one line); an agent's sessions are
amc_client.mcp_sessions' (named by their id, never replaced behind the agent's back). A
session is opened by open_session (over stdio, also by the first action) with the MCP
client's name in its metadata; close_session ends it done, and one the agent forgets ends
failed after its idle timeout.

How the stdio server ends: when its stdin closes. An MCP client that shuts down closes the
server's stdin and reads its stdout until the server exits (the spec's shutdown); one that
crashed or was killed closed both, so the server tells the two apart by whether anyone
still reads its stdout: a clean leave ends the open session done, a vanished client's
ends failed, "session abandoned", as a gRPC client's that vanishes does. Either way the
server exits 0, saying nothing (a vanished client's session: one line on stderr). The HTTP
server runs until SIGINT or SIGTERM; how it tells a client left: amc_client.mcp_clients.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import socket
import ssl
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn, TypeVar

import anyio
from mcp.server.mcpserver import MCPServer

from amc_client import mcp_http, mcp_log, mcp_session_tools, mcp_stdio, mcp_tools
from amc_client.mcp_clients import RECONNECT_GRACE, HttpClients
from amc_client.mcp_http import HttpOptions, http_options
from amc_client.mcp_phones import phones_text
from amc_client.mcp_sessions import ClientSessions, Defaults
from amc_client.mcp_stdio import OneClient
from amc_client.mcp_text import compact_ui
from amc_client.mcp_tools import Lending
from amc_common import durations
from amc_common.channel import aio_channel, read_token
from amc_common.command_line import OneLineParser
from amc_common.version import version

T = TypeVar("T")

__all__ = [
    "ClientSessions",
    "Defaults",
    "HttpOptions",
    "OneClient",
    "build_server",
    "compact_ui",
    "main",
    "phones_text",
    "run",
    "serve",
]

# The control plane's range for a session's idle timeout (SessionOpen.idle_timeout).
IDLE = (1.0, 3600.0)
DEFAULT_IDLE_TIMEOUT = 300.0
# The class of the MCP SDK's middleware that traces every message (OpenTelemetry).
TRACING = "OpenTelemetryMiddleware"
# How long open_session waits for a phone by default: a tool call must answer before the
# MCP client gives up on it (60 s in most clients).
DEFAULT_QUEUE_TIMEOUT = 30.0
QUEUE = (1.0, 30 * 86400.0)
# Sessions a client may hold at once unless told: a stdio server's one agent one (as it
# always had), each agent of an HTTP server a few (phones side by side).
SESSIONS_STDIO = 1
SESSIONS_HTTP = 4
SESSIONS = (1, 100)
GRACE = (1.0, 3600.0)

INSTRUCTIONS = (
    "Drive Android phones of the farm: list_phones, open_session (with apps of the "
    "farm's library installed first, if asked; it answers the session's id), look "
    "(screenshot, ui_dump), then act (tap, tap_element, swipe, type_text, press_key, "
    "launch_app, stop_app, install_app, wait_for), each on the session named by `session` "
    "(left out: your one open session); close_session when done. Coordinates are the "
    "screen's pixels, as ui_dump's centres are; a screenshot says how its image maps onto "
    "them. A session that ended (idle, cancelled, its phone lost) stays ended: "
    "open_session again."
)


def build_server(lending: Lending, defaults: Defaults) -> MCPServer:
    """The MCP server whose tools act on the sessions of `lending`'s clients."""
    server: MCPServer = MCPServer(
        "amc-phone", version=version(), instructions=INSTRUCTIONS, log_level="WARNING"
    )
    mcp_session_tools.register(
        server, lending, limit=defaults.limit, idle_timeout=defaults.idle_timeout
    )
    mcp_tools.register(server, lending)
    mcp_log.register(server, lending)
    untraced(server)
    return server


def untraced(server: MCPServer) -> None:
    """`server` without the SDK's tracing middleware, which opens an OpenTelemetry span
    around every message: this product installs no OpenTelemetry exporter, so the spans go
    nowhere, and opening them cost the HTTP server a few percent of its CPU per action.
    The SDK documents the list's entries as removable."""
    server.middleware[:] = [m for m in server.middleware if type(m).__name__ != TRACING]


async def serve(
    address: str,
    *,
    token: str | None = None,
    ca_file: str | Path | None = None,
    tls: bool = False,
    defaults: Defaults | None = None,
) -> None:
    """Serve MCP on stdin/stdout (amc_client.mcp_stdio) until the agent closes it; the open
    session ends done, or abandoned when the agent vanished."""
    await mcp_stdio.serve(
        build_server,
        address,
        token=token,
        ca_file=ca_file,
        tls=tls,
        defaults=defaults or Defaults(implicit=True),
    )


async def serve_http(
    address: str,
    http: HttpOptions,
    *,
    ca_file: str | Path | None = None,
    tls: bool = False,
    defaults: Defaults | None = None,
) -> None:
    """Serve MCP over streamable HTTP (amc_client.mcp_http) until SIGINT or SIGTERM: each
    client's sessions opened with its own bearer token."""
    defaults = defaults or Defaults(limit=SESSIONS_HTTP)
    listening = _listening(http)
    channel = aio_channel(address, None, ca_file, tls=tls)
    try:
        clients = HttpClients(address, channel, defaults, http.reconnect_grace)
        await mcp_http.serve(
            build_server(clients, defaults),
            clients,
            channel,
            listening,
            origins=http.origins,
            cert_file=http.cert_file,
            key_file=http.key_file,
            idle_timeout=defaults.idle_timeout,
        )
    finally:
        await channel.close()


def _listening(http: HttpOptions) -> socket.socket:
    """The socket to serve on, and the TLS files checked; a one-line exit if not."""
    host, port = http.listen
    if http.cert_file or http.key_file:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                http.cert_file or "", http.key_file
            )
        except (OSError, ssl.SSLError) as exc:
            raise SystemExit(f"amc mcp: --http-cert/--http-key: {exc.strerror or exc}") from None
    try:
        return mcp_http.listen_on(host, port)
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise SystemExit(f"amc mcp: cannot listen on {host}:{port}: {why}") from None


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
    sessions_per_client: int | None = None,
    http: HttpOptions | None = None,
) -> NoReturn:
    """`serve` (stdio) or `serve_http` (`http` given) from synchronous code (a command
    line), then the process's end (exit 0, `exit_served`)."""
    defaults = Defaults(
        labels=dict(labels or {}),
        serial=serial,
        idle_timeout=idle_timeout,
        queue_timeout=queue_timeout,
        limit=sessions_per_client or (SESSIONS_HTTP if http else SESSIONS_STDIO),
        implicit=http is None,
    )
    if http is not None:
        serving = functools.partial(
            serve_http, address, http, ca_file=ca_file, tls=tls, defaults=defaults
        )
    else:
        serving = functools.partial(
            serve, address, token=token, ca_file=ca_file, tls=tls, defaults=defaults
        )
    anyio.run(serving)
    exit_served()


def exit_served() -> NoReturn:
    """End the process once it served (exit 0): at once, since finalizing the MCP
    SDK's modules takes about a second, which the MCP client's shutdown (SIGTERM 2 s after
    it closed our stdin) may not give. Nothing is left to do: the sessions are over."""
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
        description="Serve MCP on stdin/stdout (or over HTTP for many agents, --http): AI"
        " agents drive phones of an AMC farm through interactive sessions (the same server"
        " as `amc mcp`).",
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
    parser.add_argument(
        "--sessions-per-client",
        type=_typed(sessions_per_client),
        metavar="N",
        help=f"sessions an agent may hold at once (default {SESSIONS_STDIO}; with --http"
        f" {SESSIONS_HTTP})",
    )
    _http_flags(parser)
    args = parser.parse_args(argv)
    try:
        token = read_token(args.token, args.token_file)
    except OSError as exc:
        parser.error(f"argument --token-file: {exc.strerror or exc}: {args.token_file}")
    try:
        http = http_options(
            args.http, args.allow_origin, args.http_cert, args.http_key, args.reconnect_grace
        )
    except ValueError as exc:
        parser.error(str(exc))
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
            sessions_per_client=args.sessions_per_client,
            http=http,
        )


def _http_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--http",
        metavar="[HOST:]PORT",
        help="serve MCP's streamable HTTP at http://HOST:PORT/mcp (HOST 127.0.0.1 unless"
        " given) instead of stdio: each client with its own bearer token (its AMC token)",
    )
    parser.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin whose requests are taken (repeatable; none by default)",
    )
    parser.add_argument("--http-cert", metavar="FILE", help="serve HTTPS with this certificate")
    parser.add_argument("--http-key", metavar="FILE", help="and this private key")
    parser.add_argument(
        "--reconnect-grace",
        type=functools.partial(within, low=GRACE[0], high=GRACE[1]),
        default=RECONNECT_GRACE,
        metavar="DURATION",
        help="how long a client whose event stream dropped has to come back before its"
        " sessions are abandoned (1s to 1h; default 10s)",
    )


def sessions_per_client(text: str) -> int:
    """`--sessions-per-client`: a whole number from 1 to 100."""
    if not text.strip().isdigit() or not SESSIONS[0] <= int(text) <= SESSIONS[1]:
        raise ValueError(f"expected a number from {SESSIONS[0]} to {SESSIONS[1]}, got {text!r}")
    return int(text)


if __name__ == "__main__":
    main()
