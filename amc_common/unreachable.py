"""Why a gRPC call could not reach the control plane, in words that stay the same from one
try to the next (what gRPC's UNAVAILABLE details say, read by the CLI and the client
library alike)."""

from __future__ import annotations

import grpc

# What gRPC's details say (lower case), and the words for it.
_CONNECT_FAILURES = (
    ("connection refused", "connection refused"),
    ("socket closed", "connections closed as they open"),
    ("reset by peer", "connections closed as they open"),
    ("http/2", "it does not speak gRPC"),
    ("handshake", "the TLS handshake failed"),
    ("ssl", "the TLS handshake failed"),
    ("timed out", "connecting timed out"),
    ("timeout", "connecting timed out"),
    ("dns", "the name does not resolve"),
)


def _details(exc: BaseException | None) -> str:
    """A failed call's details in one line ("" for anything else)."""
    if isinstance(exc, grpc.Call | grpc.aio.AioRpcError):
        return " ".join((exc.details() or "").split())
    return ""


def connect_failure(exc: BaseException | None) -> str | None:
    """Why no connection could be made, or None when one was (or it is not a gRPC call's
    error): the control plane's own UNAVAILABLE (its database away) is not this."""
    if not isinstance(exc, grpc.Call | grpc.aio.AioRpcError):
        return None
    if exc.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    low = _details(exc).lower()
    if "failed to connect" not in low:
        return None
    return next((words for key, words in _CONNECT_FAILURES if key in low), "cannot connect")


def state(exc: BaseException | None) -> str:
    """What is wrong: why no connection could be made, or what the control plane said."""
    failure = connect_failure(exc)
    if failure:
        return failure
    return _details(exc) or "unavailable"
