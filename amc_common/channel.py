"""Client channels to the control plane, with the bearer token on every call; a streaming
write that leaves an ended call to the next read."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Self

import grpc

# The control plane's port when an address names only the host.
DEFAULT_PORT = 50051

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


def with_default_port(address: str, port: int = DEFAULT_PORT) -> str:
    """`host` or `[v6]` with the control plane's port added: gRPC itself would take 443,
    the HTTPS port. `host:port`, `[v6]:port` and target URIs (`dns:///…`) stay as given."""
    if "/" in address or "]:" in address:
        return address
    if address.startswith("[") and address.endswith("]"):
        return f"{address}:{port}"
    colons = address.count(":")
    if colons == 0:
        return f"{address}:{port}"
    if colons > 1:  # a bare IPv6 address
        return f"[{address}]:{port}"
    return f"{address}{port}" if address.endswith(":") else address


class _BearerAuth(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        callback(self._metadata, None)


class WrappedChannel(grpc.aio.Channel):
    """A channel that hands everything to the channel it wraps: a subclass changes what it
    needs (the multi-callables it makes, usually) and inherits the rest."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.unary_unary(*args, **kwargs)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.unary_stream(*args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.stream_unary(*args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return self._channel.stream_stream(*args, **kwargs)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._channel.close(None)

    async def close(self, grace: float | None = None) -> None:
        await self._channel.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._channel.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._channel.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._channel.channel_ready()


class TokenChannel(WrappedChannel):
    """A plaintext channel that sends the bearer token as metadata of every call.

    Not an interceptor: grpc.aio turns the writes of an intercepted stream into a request
    iterator served by a task of its own, which is left pending (then destroyed) whenever
    the call ends first; per-call metadata costs nothing of the kind."""

    def __init__(self, channel: grpc.aio.Channel, token: str) -> None:
        super().__init__(channel)
        self._metadata = (("authorization", f"Bearer {token}"),)

    def unary_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _WithMetadata(super().unary_unary(*args, **kwargs), self._metadata)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _WithMetadata(super().unary_stream(*args, **kwargs), self._metadata)

    def stream_unary(self, *args: Any, **kwargs: Any) -> Any:
        return _WithMetadata(super().stream_unary(*args, **kwargs), self._metadata)

    def stream_stream(self, *args: Any, **kwargs: Any) -> Any:
        return _WithMetadata(super().stream_stream(*args, **kwargs), self._metadata)


class _WithMetadata:
    """A multi-callable that adds fixed metadata to the call's own."""

    def __init__(self, call: Any, metadata: tuple[tuple[str, str], ...]) -> None:
        self._call = call
        self._metadata = metadata

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        combined = (*tuple(metadata or ()), *self._metadata)
        return self._call(*args, metadata=combined, **kwargs)


def with_token(channel: grpc.aio.Channel, token: str | None) -> grpc.aio.Channel:
    """`channel` sending `token` on every call (as it is when there is no token)."""
    return TokenChannel(channel, token) if token else channel


def read_token(token: str | None = None, token_file: str | Path | None = None) -> str | None:
    if token:
        return token.strip()
    if token_file:
        return Path(token_file).read_text().strip() or None
    return None


def aio_channel(
    address: str,
    token: str | None = None,
    ca_file: str | Path | None = None,
    *,
    tls: bool = False,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A channel for asyncio code. TLS when a CA file is given (or `tls`), else plaintext.
    `options` are added to (and override) CHANNEL_OPTIONS."""
    merged = list({k: v for k, v in [*CHANNEL_OPTIONS, *options]}.items())
    if ca_file or tls:
        creds = grpc.ssl_channel_credentials(Path(ca_file).read_bytes() if ca_file else None)
        if token:
            creds = grpc.composite_channel_credentials(
                creds, grpc.metadata_call_credentials(_BearerAuth(token))
            )
        return grpc.aio.secure_channel(address, creds, options=merged)
    return with_token(grpc.aio.insecure_channel(address, options=merged), token)


async def write_unless_ended(call: Any, request: Any) -> bool:
    """Write `request` on a streaming call; False if the other end had already ended it.
    grpc.aio then raises InvalidStateError, or, when the end came as the write went, an
    error of its own (an INTERNAL in place of the peer's status: grpc/grpc#36066). Either
    way the caller's next read says how the call ended (its last message, EOF or the
    status), so the caller reads on rather than fail on the write."""
    try:
        await call.write(request)
    except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError):
        return False
    return True
