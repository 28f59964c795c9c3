"""The Apps page's upload: `POST /api/library/apps` (or `/api/library/files`), the file's
bytes as the body (`application/octet-stream`), its name (URL-encoded) in `X-Amc-File-Name`
and its SHA-256 (lowercase hex, as the page computed it) in `X-Amc-Sha256`.

The body is streamed into the servicer's own UploadApp (or UploadFile) as its chunks,
after a header made of those, with the console's call context: the same roles, limits,
checks and messages as a gRPC upload (too large: 413, damaged: 422, not an APK: 400),
the answer the App (or LibraryFile) as JSON. A browser cannot send such a body or such
headers to another site without asking first, which this server never grants: no other
page can upload with this one's token.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from aiohttp import web
from google.protobuf.message import Message

from amc.v1 import library_pb2
from control_plane.console.calls import CallContext, Refused
from control_plane.library_service import LibraryService

CONTENT_TYPE = "application/octet-stream"
# The body is read and passed on this much at a time (the artifacts' chunk).
CHUNK = 256 * 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")

Refusal = Callable[[grpc.StatusCode, str], web.Response]


async def upload(
    servicer: LibraryService,
    request: web.Request,
    refusal: Refusal,
    to_json: Callable[[Message], dict[str, Any]],
) -> web.Response:
    what = request.match_info["what"]
    if what not in ("apps", "files"):
        return refusal(grpc.StatusCode.NOT_FOUND, f"nothing at {request.path}")
    if request.content_type != CONTENT_TYPE:
        return refusal(grpc.StatusCode.INVALID_ARGUMENT, f"send the file's bytes as {CONTENT_TYPE}")
    size = request.content_length
    if size is None:
        return refusal(grpc.StatusCode.INVALID_ARGUMENT, "send the file's length (Content-Length)")
    sha256 = request.headers.get("X-Amc-Sha256", "")
    if not _SHA256.fullmatch(sha256):
        return refusal(
            grpc.StatusCode.INVALID_ARGUMENT,
            "X-Amc-Sha256: the file's sha256 is needed (a browser computes it on HTTPS or"
            " loopback only; `amc apps upload` works everywhere)",
        )
    header = library_pb2.UploadHeader(
        file_name=urllib.parse.unquote(request.headers.get("X-Amc-File-Name", "")),
        size_bytes=size,
        sha256=sha256,
    )
    context: Any = CallContext(request.headers.get("Authorization"))
    try:
        if what == "apps":
            apps = _messages(library_pb2.UploadAppRequest, header, request)
            answer: Message = await servicer.UploadApp(apps, context)
        else:
            files = _messages(library_pb2.UploadFileRequest, header, request)
            answer = await servicer.UploadFile(files, context)
    except Refused as exc:
        return refusal(exc.code, exc.message)
    return web.json_response(to_json(answer))


async def _messages(
    kind: Any, header: library_pb2.UploadHeader, request: web.Request
) -> AsyncIterator[Any]:
    """The upload's messages: the header, then the body in chunks as it arrives."""
    yield kind(header=header)
    async for chunk in request.content.iter_chunked(CHUNK):
        yield kind(chunk=chunk)
