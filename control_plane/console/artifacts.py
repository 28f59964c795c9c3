"""A file a step kept, for the console: `GET /api/artifacts/<task_id>/<artifact_id>`, its
bytes (a screenshot's PNG, a ui_dump's XML, a recording, a phone log's gzip) as the
servicer's own GetArtifact streams them (the same roles, validation and errors), with its
content type, length and SHA-256 (`X-Amc-Sha256`), checked as it is sent."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncGenerator
from typing import Any, cast

import structlog
from aiohttp import web

from amc.v1 import scheduler_pb2
from control_plane.console.calls import CallContext, Refused
from control_plane.scheduler_service import SchedulerService

log = structlog.get_logger(__name__)
# A kept file's name when saved, by its content type.
EXTENSIONS = {
    "image/png": "png",
    "image/apng": "png",
    "video/mp4": "mp4",
    "application/xml": "xml",
    "application/gzip": "gz",
}


async def serve(
    scheduler: SchedulerService, request: web.Request, refusal: Any, headers: dict[str, str]
) -> web.StreamResponse:
    """The artifact's bytes as the servicer's GetArtifact streams them: refusals (no
    token, a role that may not, a malformed id, NOT_FOUND) come before the first byte
    and are answered like the API's (`refusal(code, message)`: the routes' JSON error
    reply); the SHA-256 is checked before the last chunk goes out, and a mismatch cuts the
    connection, so a browser never takes a wrong file as whole. `headers`: the console's
    own, on the head written here."""
    get = scheduler_pb2.GetArtifactRequest(
        task_id=request.match_info["task_id"], artifact_id=request.match_info["artifact_id"]
    )
    # The servicer's own stream (@rpc: the same auth and errors), with the console's
    # context in place of grpc.aio's; an async generator, closed below.
    context: Any = CallContext(request.headers.get("Authorization"))
    messages = cast(
        AsyncGenerator[scheduler_pb2.GetArtifactResponse, None],
        scheduler.GetArtifact(get, context),
    )
    try:
        artifact = (await anext(messages)).artifact
    except Refused as exc:
        return cast(web.StreamResponse, refusal(exc.code, exc.message))
    response = web.StreamResponse(
        headers={
            "Content-Type": artifact.content_type or "application/octet-stream",
            "Content-Disposition": f'inline; filename="{_file_name(artifact)}"',
            "X-Amc-Sha256": artifact.sha256,
            "Cache-Control": "no-store",
            **headers,
        }
    )
    response.content_length = artifact.size_bytes
    digest = hashlib.sha256()
    held = b""
    try:
        await response.prepare(request)
        async for message in messages:
            if held:
                await response.write(held)
            held = message.chunk
            digest.update(held)
    except (Refused, ConnectionError) as exc:
        log.warning("artifact not sent whole", artifact_id=artifact.artifact_id, error=str(exc))
        return _cut(request, response)
    finally:
        await messages.aclose()
    if digest.hexdigest() != artifact.sha256:
        log.error("artifact bytes do not match their sha256", artifact_id=artifact.artifact_id)
        return _cut(request, response)
    await response.write(held)
    await response.write_eof()
    return response


def _file_name(artifact: Any) -> str:
    extension = EXTENSIONS.get(artifact.content_type, "bin")
    return f"{artifact.kind}-{artifact.artifact_id}.{extension}"


def _cut(request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
    """End a response whose head is sent but whose body cannot be completed: close the
    connection short of its Content-Length, which the browser sees as a failed fetch."""
    if request.transport is not None:
        request.transport.abort()
    return response
