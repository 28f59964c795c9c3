"""The app library as this host sees it, on the wire: the app an install names
(Lease.FindApp) and the bytes of an app or a file (Lease.FetchFile), fetched into this
host's cache (host_agent.app_cache) only when it lacks them. The runner sees it as
host_agent.install's `Library`; a refusal of the control plane is a LibraryError naming
what was asked and the answer's code.

A call that fails for a reason that says nothing of the request (UNAVAILABLE: a replica
restarting, a connection reset; host_agent.retry's transient codes, but a try's own
deadline) is tried again with the agent's backoff, for up to RETRY_TOTAL seconds, while the
task's token lets it (the fetch is raced against it). A fetch cut off midway starts the
stream again and writes only the bytes past those it had: the same id is the same bytes,
and the cache checks them whole against their sha256."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import structlog
from tenacity import AsyncRetrying, retry_if_exception, stop_before_delay

from amc.v1 import lease_pb2, lease_pb2_grpc
from host_agent.app_cache import AppCache, CacheError, Fetch
from host_agent.install import LibraryApp, LibraryError
from host_agent.retry import backoff, is_transient, log_retry

log = structlog.get_logger(__name__)

# How long finding an app may take, and fetching its bytes (a large APK on a slow link).
FIND_TIMEOUT = 30.0
FETCH_TIMEOUT = 600.0
# How long a find or a fetch that failed for a transient reason is tried again.
RETRY_TOTAL = 60.0


def _worth_again(exc: BaseException) -> bool:
    """A transient failure, but not a try that ran out of its own (long) deadline."""
    own_deadline = grpc.StatusCode.DEADLINE_EXCEEDED
    return (
        is_transient(exc)
        and isinstance(exc, grpc.aio.AioRpcError)
        and exc.code() is not own_deadline
    )


def _tries(what: str) -> AsyncRetrying:
    return AsyncRetrying(
        retry=retry_if_exception(_worth_again),
        wait=backoff(0.2, 5.0),
        stop=stop_before_delay(RETRY_TOTAL),
        before_sleep=log_retry(log, what),
        reraise=True,
    )


class HostLibrary:
    def __init__(self, stub: lease_pb2_grpc.LeaseStub, cache: AppCache) -> None:
        self._stub = stub
        self.cache = cache

    async def find_app(self, ref: str) -> LibraryApp:
        request = lease_pb2.FindAppRequest(app=ref)
        try:
            async for attempt in _tries(f"finding app {ref}"):
                with attempt:
                    pb = await self._stub.FindApp(request, timeout=FIND_TIMEOUT)
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
            size, written = 0, 0  # the size announced; the bytes written, over every try
            async for attempt in _tries(f"fetching library file {file_id}"):
                with attempt:
                    seen: int | None = None  # this try's bytes so far (None: before its size)
                    async for message in self._stub.FetchFile(request, timeout=FETCH_TIMEOUT):
                        if seen is None:
                            size, seen = message.size_bytes, 0
                            continue
                        start, seen = seen, seen + len(message.chunk)
                        if seen > written:  # past what an earlier try wrote
                            write(message.chunk[written - start :])
                            written = seen
            return size

        return fetch


def _said(exc: grpc.aio.AioRpcError) -> str:
    return f"{exc.code().name}: {exc.details()}"
