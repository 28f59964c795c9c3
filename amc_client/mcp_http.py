"""The MCP server over the streamable-HTTP transport (`amc mcp --http 127.0.0.1:8765`): one
server for many agents, each with its own sessions, served at /mcp by the MCP SDK's
transport behind a door (`Door`) that checks every request first.

What the door checks, as the MCP spec's transport security asks:

- the Host header, when the server listens on loopback: a loopback name and the port
  served (a DNS-rebinding page names its own host);
- the Origin header, when one is sent (browsers send it): refused 403 unless given with
  --allow-origin (clients that are programs send none);
- a bearer token, required of every request: the client's own AMC token, checked with the
  control plane (cached TOKEN_TTL seconds) and then sent on each of its sessions' calls, so
  an agent's sessions count in its own fair share and limits; 401 for none or one the farm
  does not know, 403 for a host's token.

Beyond loopback the server serves only over TLS (--http-cert, --http-key): tokens must not
cross a network in clear. Who is calling is left in the request's scope for the tools
(`HttpClients.client`), and each request's opening and closing is told to HttpClients,
which reads from them whether a client is still there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import uvicorn
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.authentication import AuthCredentials
from starlette.datastructures import Headers
from starlette.types import Message, Receive, Scope, Send

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc
from amc_client.mcp_clients import (
    RECONNECT_GRACE,
    SCOPE_KEY,
    Caller,
    HttpClients,
    client_key,
    token_key,
)

PATH = "/mcp"
# How long a token the control plane took is taken again without asking it.
TOKEN_TTL = 60.0
MAX_TOKENS_KEPT = 10_000
# A task id no task has: asking for it answers NOT_FOUND to a token that may read tasks.
NO_TASK = "00000000-0000-0000-0000-000000000000"
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
# How long a stopping server waits for open requests (event streams never end by
# themselves) before it cuts them.
STOP_PATIENCE = 3.0


def parse_listen(text: str) -> tuple[str, int]:
    """`--http`'s `[HOST:]PORT` (HOST a name, an IPv4 address or `[IPv6]`; 127.0.0.1 when
    left out; PORT 0: any free port) as (host, port); ValueError saying what is wrong."""
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        host = "127.0.0.1"
    host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected [HOST:]PORT with PORT 0 to 65535, got {text!r}")
    return host, int(port)


@dataclass(frozen=True)
class HttpOptions:
    """`--http` and what goes with it, checked (`http_options`)."""

    listen: tuple[str, int]
    origins: tuple[str, ...] = ()
    cert_file: str | None = None
    key_file: str | None = None
    # How long a client whose event stream dropped has to come back (HttpClients).
    reconnect_grace: float = RECONNECT_GRACE


def http_options(
    listen: str | None,
    origins: Sequence[str] = (),
    cert_file: str | None = None,
    key_file: str | None = None,
    reconnect_grace: float = RECONNECT_GRACE,
) -> HttpOptions | None:
    """The HTTP server's flags, checked: None for stdio (`listen` None); ValueError of one
    line naming the flag for what is wrong."""
    if listen is None:
        given = "--allow-origin" if origins else "--http-cert" if cert_file else "--http-key"
        if origins or cert_file or key_file:
            raise ValueError(f"{given} goes with --http")
        return None
    try:
        host, port = parse_listen(listen)
        allowed = tuple(origin(o) for o in origins)
    except ValueError as exc:
        raise ValueError(f"{'--http' if 'PORT' in str(exc) else '--allow-origin'}: {exc}") from None
    if bool(cert_file) != bool(key_file):
        raise ValueError("--http-cert and --http-key go together")
    if not loopback(host) and not cert_file:
        raise ValueError(
            f"--http: serving beyond this machine ({host}) needs --http-cert and --http-key"
            " (agents' tokens must not cross a network in clear)"
        )
    return HttpOptions((host, port), allowed, cert_file, key_file, reconnect_grace)


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin(text: str) -> str:
    """An origin as browsers send it: `scheme://host[:port]`, lower case, no slash."""
    said = text.strip().rstrip("/").lower()
    scheme, sep, rest = said.partition("://")
    if not sep or scheme not in ("http", "https") or not rest or "/" in rest:
        raise ValueError(f"expected an origin such as http://localhost:6274, got {text!r}")
    return said


class TokenChecks:
    """Whether a bearer token may drive phones, as the control plane says (GetTask of no
    task: NOT_FOUND for a client's or an operator's token), remembered TOKEN_TTL s."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = scheduler_pb2_grpc.SchedulerStub(channel)
        self._good: dict[str, float] = {}  # token_key -> until
        self._asking: dict[str, asyncio.Future[tuple[int, str] | None]] = {}

    async def refusal(self, token: str) -> tuple[int, str] | None:
        """None for a good token; else the HTTP status and one line saying why."""
        key = token_key(token)
        if self._good.get(key, 0.0) > time.monotonic():
            return None
        asking = self._asking.get(key)
        if asking is None:
            asking = self._asking[key] = asyncio.ensure_future(self._ask(token))
            asking.add_done_callback(lambda _: self._asking.pop(key, None))
        refused = await asyncio.shield(asking)
        if refused is None:
            if len(self._good) >= MAX_TOKENS_KEPT:
                self._good.clear()
            self._good[key] = time.monotonic() + TOKEN_TTL
        return refused

    async def _ask(self, token: str) -> tuple[int, str] | None:
        metadata = (("authorization", f"Bearer {token}"),)
        request = scheduler_pb2.GetTaskRequest(task_id=NO_TASK)
        try:
            await self._stub.GetTask(request, metadata=metadata, timeout=10)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.NOT_FOUND:
                return None
            if code == grpc.StatusCode.UNAUTHENTICATED:
                return 401, "the farm does not know this bearer token: give your AMC token"
            if code == grpc.StatusCode.PERMISSION_DENIED:
                return 403, "this token may not drive phones: give a client's or an operator's"
            return 503, f"the farm could not check the token: {code.name}: {exc.details()}"
        return None


@dataclass
class Door:
    """The ASGI app in front of the SDK's transport: path, Host, Origin, bearer token;
    then the request, told to the clients' presence."""

    manager: StreamableHTTPSessionManager
    clients: HttpClients
    tokens: TokenChecks
    origins: Collection[str]
    # The port served, when the Host header is checked (listening on loopback).
    port: int | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = Headers(scope=scope)
        refused = self._refused(scope, headers)
        token = _bearer(headers.get("authorization", ""))
        if refused is None and not token:
            refused = 401, "a bearer token is required: Authorization: Bearer <your AMC token>"
        if refused is None:
            refused = await self.tokens.refusal(token)
        if refused is not None:
            await _refuse(send, *refused)
            return
        caller = Caller(client_key(token, headers.get("mcp-session-id")), token)
        access = AccessToken(token=token_key(token), client_id=token_key(token), scopes=[])
        scope["user"] = AuthenticatedUser(access)  # the SDK keeps each MCP session to it
        scope["auth"] = AuthCredentials([])
        scope[SCOPE_KEY] = caller
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.clients.began(caller, stream=scope["method"] == "GET")
        try:
            await self.manager.handle_request(scope, receive, sending)
        finally:
            self.clients.ended(caller)
            if scope["method"] == "DELETE" and 200 <= status < 300:
                self.clients.left(caller)

    def _refused(self, scope: Scope, headers: Headers) -> tuple[int, str] | None:
        path = scope["path"].rstrip("/") or "/"
        if path != PATH:
            return 404, f"nothing is served at {scope['path']}: MCP is at {PATH}"
        if self.port is not None:
            name, _, port = headers.get("host", "").rpartition(":")
            if name.lower() not in LOOPBACK_NAMES or port != str(self.port):
                return 421, "the Host header must name this machine's loopback and port"
        said = headers.get("origin")
        if said is not None and said.strip().rstrip("/").lower() not in self.origins:
            return 403, f"origin {said!r} is not allowed (amc mcp --allow-origin)"
        return None


def _bearer(header: str) -> str:
    scheme, _, token = header.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


async def _refuse(send: Send, status: int, message: str) -> None:
    error = {401: "invalid_token", 403: "forbidden", 404: "not_found"}.get(status, "refused")
    body = json.dumps({"error": error, "error_description": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 401:
        said = f'Bearer realm="amc", error="invalid_token", error_description="{message}"'
        headers.append((b"www-authenticate", said.encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Server(uvicorn.Server):
    """uvicorn's server, its signals left to `serve`: its own handling raises the signal
    again once it stopped, which would end the process before the sessions are ended."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.serving = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.serving.set()


def listen_on(host: str, port: int) -> socket.socket:
    """The listening socket (OSError, e.g. the port in use, for the caller to say). Made as
    a TCP socket by name (IPPROTO_TCP): asyncio sets TCP_NODELAY only on connections whose
    socket says so, and without it a response's header and body wait on each other's
    acknowledgement (Nagle's algorithm against delayed ACKs: 40 ms an answer)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listening = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listening.bind((host, port))
        listening.listen(1024)
    except OSError:
        listening.close()
        raise
    return listening


async def serve(
    server: MCPServer,
    clients: HttpClients,
    channel: grpc.aio.Channel,
    listening: socket.socket,
    *,
    origins: Collection[str] = (),
    cert_file: str | None = None,
    key_file: str | None = None,
    idle_timeout: float = 300.0,
) -> None:
    """Serve `server` at http(s)://HOST:PORT/mcp on `listening` until SIGINT or SIGTERM,
    saying where on stderr once it serves; then every session still open ends abandoned."""
    host, port = listening.getsockname()[:2]
    server.streamable_http_app(
        # Each call is answered with its result as JSON, not an event stream: no tool sends
        # anything before its result, and the SDK's client keeps its connection for the
        # next call only then (it opens one per call for an event stream).
        json_response=True,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        session_idle_timeout=idle_timeout,
        host=host,
    )
    door = Door(server.session_manager, clients, TokenChecks(channel), frozenset(origins))
    door.port = port if loopback(host) else None
    config = uvicorn.Config(
        door,
        lifespan="off",
        log_level="warning",
        access_log=False,
        ssl_certfile=cert_file,
        ssl_keyfile=key_file,
        timeout_graceful_shutdown=int(STOP_PATIENCE),
    )
    http = _Server(config)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(number, _stop, http, stopping)
    serving = asyncio.ensure_future(http.serve(sockets=[listening]))
    try:
        # The MCP sessions end first (their event streams with them), then the server:
        # an open event stream would hold it for its whole graceful shutdown.
        async with server.session_manager.run():
            if await _first(http.serving.wait(), serving):
                scheme = "https" if cert_file else "http"
                shown = f"[{host}]" if ":" in host else host
                print(f"amc mcp: serving MCP at {scheme}://{shown}:{port}{PATH}", file=sys.stderr)
                sys.stderr.flush()
                await _first(stopping.wait(), serving)
        http.should_exit = True
        await serving
    finally:
        for number in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(number)
        await clients.stop()


def _stop(http: _Server, stopping: asyncio.Event) -> None:
    """SIGINT or SIGTERM: stop; a second one: at once."""
    http.force_exit = stopping.is_set()
    http.should_exit = http.force_exit
    stopping.set()


async def _first(wanted: Awaitable[Any], serving: asyncio.Future[None]) -> bool:
    """Whether `wanted` came before the server stopped serving (an error: raised)."""
    waiting = asyncio.ensure_future(wanted)
    try:
        await asyncio.wait({waiting, serving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
    if serving.done():
        serving.result()
        return False
    return True
