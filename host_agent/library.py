"""The app library as this host sees it, on the wire: the app an install names
(Lease.FindApp) and the bytes of an app or a file (Lease.FetchFile), fetched into this
host's cache (host_agent.app_cache) only when it lacks them. The runner sees it as
host_agent.install's `Library`; a refusal of the control plane is a LibraryError naming
what was asked and the answer's code."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc

from amc.v1 import lease_pb2, lease_pb2_grpc
from host_agent.app_cache import AppCache, CacheError, Fetch
from host_agent.install import LibraryApp, LibraryError

# How long finding an app may take, and fetching its bytes (a large APK on a slow link).
FIND_TIMEOUT = 30.0
FETCH_TIMEOUT = 600.0


class HostLibrary:
    def __init__(self, stub: lease_pb2_grpc.LeaseStub, cache: AppCache) -> None:
        self._stub = stub
        self.cache = cache

    async def find_app(self, ref: str) -> LibraryApp:
        try:
            pb = await self._stub.FindApp(lease_pb2.FindAppRequest(app=ref), timeout=FIND_TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            raise LibraryError(f"install_app {ref}: {_said(exc)}") from None
        return LibraryApp(
            app_id=pb.app_id,
            package=pb.package,
            version_name=pb.version_name,
            version_code=pb.version_code,
            min_sdk=pb.min_sdk,
            size_bytes=pb.size_bytes,
        )

    @contextlib.asynccontextmanager
    async def file(self, file_id: str) -> AsyncIterator[Path]:
        try:
            async with self.cache.use(file_id, self._fetch(file_id)) as path:
                yield path
        except CacheError as exc:
            raise LibraryError(str(exc)) from None
        except grpc.aio.AioRpcError as exc:
            raise LibraryError(f"fetching library file {file_id}: {_said(exc)}") from None

    def _fetch(self, file_id: str) -> Fetch:
        async def fetch(write: Callable[[bytes], None]) -> int:
            request = lease_pb2.FetchFileRequest(file_id=file_id)
            size: int | None = None
            async for message in self._stub.FetchFile(request, timeout=FETCH_TIMEOUT):
                if size is None:
                    size = message.size_bytes
                else:
                    write(message.chunk)
            return size or 0

        return fetch


def _said(exc: grpc.aio.AioRpcError) -> str:
    return f"{exc.code().name}: {exc.details()}"
