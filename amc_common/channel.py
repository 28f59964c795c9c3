"""Client channels to the control plane, with the bearer token on every call."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_receive_message_length", 8 << 20),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


class _BearerAuth(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._metadata = (("authorization", f"Bearer {token}"),)

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        callback(self._metadata, None)


class _AddMetadata:
    """Adds fixed metadata (the bearer token) to every call on a plaintext channel."""

    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(tuple(details.metadata or ()) + self._metadata))
        return details._replace(metadata=metadata)  # type: ignore[attr-defined, no-any-return]

    async def _call(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


# grpc.aio files an interceptor under the first call type it matches, so each type needs
# its own object.
class _UnaryUnary(_AddMetadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await self._call(continuation, details, request)


class _UnaryStream(_AddMetadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        return await self._call(continuation, details, request)


class _StreamUnary(_AddMetadata, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await self._call(continuation, details, request_iterator)


class _StreamStream(_AddMetadata, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation, details, request_iterator):  # type: ignore[no-untyped-def]
        return await self._call(continuation, details, request_iterator)


def bearer_interceptors(token: str) -> list[Any]:
    metadata = [("authorization", f"Bearer {token}")]
    return [cls(metadata) for cls in (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)]


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
    interceptors = bearer_interceptors(token) if token else []
    return grpc.aio.insecure_channel(address, options=merged, interceptors=interceptors)
