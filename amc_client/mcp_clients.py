"""The MCP HTTP server's clients (`HttpClients`): each one's sessions, on the farm with its
own token, and whether it is still there.

A client is its bearer token and its MCP session (the `Mcp-Session-Id` the server gave it
at `initialize`); a client of the sessionless protocol (no MCP session) is its token. Its
phone sessions are opened with its token (a Farm over the server's one connection to the
control plane, sending that token on each call), so they count in its own fair share and
limits, and only requests bearing the same token reach them.

Whether a client is there is read from its requests: a client that ends its MCP session
(HTTP DELETE) has its sessions closed done; one that holds an event stream (the GET a
streaming client keeps open for the server's messages) is gone once that stream and every
call of its have been closed for its reconnect grace (10 s unless told; a client reconnects
a dropped stream within a second or two; the sessions' idle timeout, when shorter, bounds
it); one that never held a stream is gone once it made no request for the sessions' idle
timeout (when they ended by themselves anyway). A client gone has its sessions ended
failed ("session abandoned"), said on stderr.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from dataclasses import dataclass

import grpc
from mcp.server.mcpserver import Context

from amc.v1 import task_pb2
from amc_client.farm import Farm
from amc_client.mcp_sessions import ClientGone, ClientSessions, Defaults

# How long a client whose event stream closed has to open it again (or call) before its
# sessions are abandoned, unless told (--reconnect-grace).
RECONNECT_GRACE = 10.0
# How long a client that left (HTTP DELETE) waits for its sessions' actions in flight to
# answer before they are abandoned.
CLOSE_PATIENCE = 5.0
# The request's scope key under which the HTTP door leaves who is calling.
SCOPE_KEY = "amc.mcp"


def token_key(token: str) -> str:
    """A token's name in memory and keys: a hash, never the token itself."""
    return hashlib.sha256(token.encode()).hexdigest()[:32]


def client_key(token: str, mcp_session: str | None) -> str:
    return f"{token_key(token)}/{mcp_session or '-'}"


@dataclass
class Caller:
    """Who a request is from, as the HTTP door read it."""

    key: str
    token: str


@dataclass
class _Client:
    token: str
    sessions: ClientSessions | None = None
    calls: int = 0  # requests open now (calls, and the event stream)
    streamed: bool = False  # ever held an event stream
    timer: asyncio.TimerHandle | None = None


class HttpClients:
    """Every client of one MCP HTTP server, by `client_key`."""

    def __init__(
        self,
        address: str,
        channel: grpc.aio.Channel,
        defaults: Defaults,
        reconnect_grace: float = RECONNECT_GRACE,
    ) -> None:
        self._address = address
        self._channel = channel
        self.defaults = defaults
        self.reconnect_grace = reconnect_grace
        self._clients: dict[str, _Client] = {}
        self._leaving: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._clients)

    # -- Lending: whose sessions a tool call acts on --------------------------------------

    async def client(self, ctx: Context) -> ClientSessions:
        """The sessions of the client making this call (made on its first call)."""
        request = ctx.request_context.request
        caller = getattr(request, "scope", {}).get(SCOPE_KEY)
        if not isinstance(caller, Caller):
            raise ClientGone("this call came with no bearer token")
        record = self._clients.get(caller.key)
        if record is None:  # its DELETE, or its end, came as this call was made
            raise ClientGone("the MCP client's session ended")
        if record.sessions is None:
            farm = Farm(self._address, token=caller.token, channel=self._channel)
            await farm.__aenter__()  # a stub over the shared channel: nothing to close
            record.sessions = ClientSessions(farm, self.defaults)
        return record.sessions

    # -- presence: told by the HTTP door of each request ----------------------------------

    def began(self, caller: Caller, stream: bool) -> None:
        """A request of `caller`'s is open (`stream`: its event stream)."""
        record = self._clients.get(caller.key)
        if record is None:
            record = self._clients[caller.key] = _Client(caller.token)
        record.calls += 1
        record.streamed = record.streamed or stream
        if record.timer is not None:
            record.timer.cancel()
            record.timer = None

    def ended(self, caller: Caller) -> None:
        """A request of `caller`'s closed (answered, or cut)."""
        record = self._clients.get(caller.key)
        if record is None:
            return
        record.calls -= 1
        if record.calls == 0:
            idle = self.defaults.idle_timeout
            wait = min(self.reconnect_grace, idle) if record.streamed else idle
            loop = asyncio.get_running_loop()
            record.timer = loop.call_later(wait, self._quiet, caller.key, wait)

    def left(self, caller: Caller) -> None:
        """`caller` ended its MCP session: its sessions close done (in the background)."""
        record = self._clients.pop(caller.key, None)
        if record is None:
            return
        if record.timer is not None:
            record.timer.cancel()
        if record.sessions is not None:
            task = asyncio.ensure_future(_leave(record.sessions))
            self._leaving.add(task)
            task.add_done_callback(self._leaving.discard)

    def _quiet(self, key: str, waited: float) -> None:
        record = self._clients.get(key)
        if record is None or record.calls:
            return
        del self._clients[key]
        if record.sessions is None:
            return
        if record.streamed:
            why = f"the MCP client's event stream closed {waited:g} s ago and it did not come back"
        else:
            why = f"the MCP client made no request for {waited:g} s"
        _said(record.sessions.abandon(why), why)

    async def stop(self) -> None:
        """The server stops: every client's open sessions end abandoned, after the clients
        that left had theirs closed."""
        if self._leaving:
            await asyncio.gather(*self._leaving, return_exceptions=True)
        clients, self._clients = self._clients, {}
        for record in clients.values():
            if record.timer is not None:
                record.timer.cancel()
            if record.sessions is not None:
                _said(record.sessions.abandon("the MCP server stopped"), "the MCP server stopped")


async def _leave(sessions: ClientSessions) -> None:
    for task, closed in await sessions.leave(CLOSE_PATIENCE):
        if not closed:
            _said([task], "a session of a client that left did not close in time")


def _said(tasks: list[task_pb2.Task], why: str) -> None:
    for task in tasks:
        print(f"amc mcp: {why}; session {task.task_id} abandoned", file=sys.stderr, flush=True)
