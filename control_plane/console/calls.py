"""How the console's routes call the servicers in-process: a context standing in for grpc.aio's
(the caller's authorization, and abort()), and where a WebSocket's authorization comes from.

A browser cannot set headers on a WebSocket; its page offers the token as a subprotocol
instead, `amc.bearer.<token>` beside `amc.v1` (the one the server picks and echoes). The
token's characters (`amc_`, hex, URL-safe base64) are all allowed in a subprotocol name.

A WebSocket is not held to the same-origin rules a fetch is (no preflight): another site's
page could open one to the console, which matters most with authentication off (on
loopback). A browser always says which page opened it (`Origin`), so a socket whose origin
is not the console's own is refused (`foreign_origin`: the console's own as the request
names it, through a proxy's X-Forwarded-Proto/Host too, or one of --console-origin); a
client that is not a browser sends no Origin.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import NoReturn
from urllib.parse import urlsplit

import grpc
from aiohttp import web

# The subprotocol the console's WebSockets speak (and answer with).
SUBPROTOCOL = "amc.v1"
# A subprotocol offered as this prefix and a token carries the caller's bearer token.
TOKEN_PROTOCOL = "amc.bearer."


class Refused(Exception):
    """What `context.abort()` raises for a console call: the gRPC code and message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class CallContext:
    """The part of a grpc.aio ServicerContext the servicers use: the caller's metadata,
    and abort()."""

    def __init__(self, authorization: str | None) -> None:
        self._metadata = (("authorization", authorization),) if authorization else ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise Refused(code, details)


def socket_authorization(request: web.Request) -> str | None:
    """The Authorization header, else the bearer token a page offered as a subprotocol."""
    header = request.headers.get("Authorization")
    if header is not None:
        return header
    for offered in request.headers.getall("Sec-WebSocket-Protocol", ()):
        for name in offered.split(","):
            name = name.strip()
            if name.startswith(TOKEN_PROTOCOL):
                return f"Bearer {name[len(TOKEN_PROTOCOL) :]}"
    return None


def foreign_origin(request: web.Request, trusted: Collection[str] = ()) -> str | None:
    """The `Origin` of a browser page of another site than the console, else None.

    The console's own origin is the scheme and host the request was made to: behind a
    proxy that ends TLS (or listens on another name) the request arrives as plain http for
    an internal name, so the proxy's `X-Forwarded-Proto` and `X-Forwarded-Host` (their
    first value) stand for them when present. A page cannot set those headers on a
    WebSocket, so honouring them lets no other site's page in. `trusted` (the replica's
    --console-origin) are origins accepted whatever the request says (a proxy that
    rewrites Host and says nothing)."""
    origin = request.headers.get("Origin")
    if origin is None:
        return None
    if origin.lower().rstrip("/") in trusted:
        return None
    parts = urlsplit(origin)
    scheme = _first(request, "X-Forwarded-Proto") or ("https" if request.secure else "http")
    host = _first(request, "X-Forwarded-Host") or request.host
    if parts.scheme == scheme.lower() and _netloc(parts.netloc, scheme) == _netloc(host, scheme):
        return None
    return origin


def _first(request: web.Request, header: str) -> str:
    """A forwarded header's first value (a chain of proxies adds theirs after it)."""
    return request.headers.get(header, "").split(",")[0].strip()


def _netloc(netloc: str, scheme: str) -> str:
    """host[:port] lower-cased, without the scheme's own port."""
    default = {"http": ":80", "https": ":443"}.get(scheme.lower(), "")
    netloc = netloc.lower()
    return netloc.removesuffix(default) if default else netloc
