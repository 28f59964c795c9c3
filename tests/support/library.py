"""Calls of the app library for the tests: uploads of apps and files, as a client would
make them (a header, then the bytes in 256 KiB chunks)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

from amc.v1 import library_pb2, library_pb2_grpc
from tests.support import Farm

CHUNK = 256 * 1024


def library(farm: Farm, token: str) -> library_pb2_grpc.LibraryStub:
    return library_pb2_grpc.LibraryStub(farm.clients(token).channel)


async def _requests(
    kind: Any, data: bytes, name: str, sha256: str | None, size: int | None
) -> AsyncIterator[Any]:
    header = library_pb2.UploadHeader(
        file_name=name,
        size_bytes=len(data) if size is None else size,
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
    )
    yield kind(header=header)
    for start in range(0, len(data), CHUNK):
        yield kind(chunk=data[start : start + CHUNK])


async def upload_app(
    stub: library_pb2_grpc.LibraryStub,
    data: bytes,
    name: str = "app.apk",
    *,
    sha256: str | None = None,
    size: int | None = None,
) -> library_pb2.App:
    requests = _requests(library_pb2.UploadAppRequest, data, name, sha256, size)
    return await stub.UploadApp(requests)


async def upload_file(
    stub: library_pb2_grpc.LibraryStub, data: bytes, name: str = "data.bin"
) -> library_pb2.LibraryFile:
    return await stub.UploadFile(_requests(library_pb2.UploadFileRequest, data, name, None, None))
