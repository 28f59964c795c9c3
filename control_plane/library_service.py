"""amc.v1.Library: the app library, for clients and operators — upload, read and remove apps
(APKs) and files for tasks to push. How an upload is received and checked, and where the
bytes are kept, is control_plane.library's."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import structlog

from amc.v1 import library_pb2, library_pb2_grpc
from control_plane import errors, metrics, validate_library
from control_plane.artifacts import UploadMemory
from control_plane.convert import timestamp
from control_plane.domain import App, Blob, LibraryFile, Uploader
from control_plane.library import (
    MAX_LISTED,
    LibraryBytes,
    may_remove,
    new_app,
    removal_refused,
    spooled,
    uploader,
)
from control_plane.rpc import Context, TaskServicer, first_message, principal, rpc
from control_plane.uploads import chunks, drain

log = structlog.get_logger(__name__)

# A refused upload's error -> how amc_library_uploads_total counts it.
_REFUSALS: dict[type[errors.AmcError], str] = {
    errors.ResourceExhausted: "too_large",
    errors.DataLoss: "damaged",
    errors.InvalidArgument: "invalid",
    errors.UploadsBusy: "busy",
}


def app_to_pb(app: App) -> library_pb2.App:
    return library_pb2.App(
        app_id=app.blob.id,
        package=app.package,
        version_name=app.version_name,
        version_code=app.version_code,
        min_sdk=app.min_sdk,
        target_sdk=app.target_sdk,
        file_name=app.file_name,
        size_bytes=app.blob.size_bytes,
        uploaded_at=timestamp(app.created_at),
        **_uploaded_by(app.uploader),
    )


def file_to_pb(file: LibraryFile) -> library_pb2.LibraryFile:
    return library_pb2.LibraryFile(
        file_id=file.blob.id,
        file_name=file.file_name,
        size_bytes=file.blob.size_bytes,
        uploaded_at=timestamp(file.created_at),
        **_uploaded_by(file.uploader),
    )


def _uploaded_by(who: Uploader) -> dict[str, Any]:
    return {"uploaded_by": who.name, "team": who.team}


class LibraryService(TaskServicer, library_pb2_grpc.LibraryServicer):
    """The library's calls; its bytes are where `library` keeps them (server.py chooses)."""

    @property
    def _bytes(self) -> LibraryBytes:
        assert self.library is not None, "the replica gives its servicers the library"
        return self.library

    @functools.cached_property
    def _spool(self) -> UploadMemory:
        return UploadMemory(
            self.settings.max_library_spool, "app library uploads", metrics.LIBRARY_SPOOL
        )

    @rpc
    async def UploadApp(
        self, request_iterator: AsyncIterator[library_pb2.UploadAppRequest], context: Context
    ) -> library_pb2.App:
        kept = await self._upload(request_iterator, "app")
        assert isinstance(kept, App)
        return app_to_pb(kept)

    @rpc
    async def UploadFile(
        self, request_iterator: AsyncIterator[library_pb2.UploadFileRequest], context: Context
    ) -> library_pb2.LibraryFile:
        kept = await self._upload(request_iterator, "file")
        assert isinstance(kept, LibraryFile)
        return file_to_pb(kept)

    async def _upload(self, requests: AsyncIterator[Any], what: str) -> App | LibraryFile:
        """One upload, header then bytes: spooled and checked, then kept (or the one kept
        before answered); a refusal keeps nothing and is counted by why."""
        who = uploader(principal())
        kept: App | LibraryFile
        try:
            first = await first_message(
                requests, "header", "required: the first message is the header"
            )
            header = first.header
            sha256 = validate_library.upload_header(header, self.settings.max_app_bytes)
            blob = Blob(sha256, header.size_bytes)
            with self._spool.reserve(blob.size_bytes):
                async with spooled(blob, chunks(requests)) as spool:
                    if what == "app":
                        kept, stored = await self._bytes.put_app(
                            new_app(spool, header.file_name), who, spool
                        )
                    else:
                        kept, stored = await self._bytes.put_file(
                            blob, header.file_name, who, spool
                        )
        except errors.AmcError as exc:
            result = next((r for c, r in _REFUSALS.items() if isinstance(exc, c)), None)
            if isinstance(exc, errors.InvalidArgument) and exc.field == "file":
                result = "not_apk"
            if result is not None:
                metrics.LIBRARY_UPLOADS.labels(what, result).inc()
            await drain(requests)
            raise
        metrics.LIBRARY_UPLOADS.labels(what, "stored" if stored else "repeated").inc()
        log.info(
            f"library {what} " + ("kept" if stored else "uploaded again"),
            id=kept.blob.id,
            package=getattr(kept, "package", None),
            size=kept.blob.size_bytes,
            by=who.name,
        )
        return kept

    @rpc
    async def GetApp(self, request: library_pb2.GetAppRequest, context: Context) -> library_pb2.App:
        sha256, package = validate_library.app_ref(request.app)
        return app_to_pb(await self.store.library.app(sha256, package))

    @rpc
    async def ListApps(
        self, request: library_pb2.ListAppsRequest, context: Context
    ) -> library_pb2.ListAppsResponse:
        package = validate_library.package_filter(request.package)
        apps = await self.store.library.apps(package, MAX_LISTED)
        return library_pb2.ListAppsResponse(apps=[app_to_pb(a) for a in apps])

    @rpc
    async def DeleteApp(
        self, request: library_pb2.DeleteAppRequest, context: Context
    ) -> library_pb2.DeleteAppResponse:
        sha256 = validate_library.digest(request.app_id, "app_id")
        app = await self.store.library.app(sha256, None)
        who = principal()
        if not may_remove(who, app.uploader):
            raise removal_refused(who, f"app {app.blob.id} ({app.package})", app.uploader)
        if not await self.store.library.delete_app(sha256):
            raise errors.LibraryItemNotFound(f"the library has no app {app.blob.id}")
        log.info("library app removed", id=app.blob.id, package=app.package, by=who.caller)
        return library_pb2.DeleteAppResponse(app=app_to_pb(app))

    @rpc
    async def ListFiles(
        self, request: library_pb2.ListFilesRequest, context: Context
    ) -> library_pb2.ListFilesResponse:
        files = await self.store.library.files(MAX_LISTED)
        return library_pb2.ListFilesResponse(files=[file_to_pb(f) for f in files])

    @rpc
    async def DeleteFile(
        self, request: library_pb2.DeleteFileRequest, context: Context
    ) -> library_pb2.DeleteFileResponse:
        sha256 = validate_library.digest(request.file_id, "file_id")
        file = await self.store.library.file(sha256)
        missing = errors.LibraryItemNotFound(f"the library has no file {sha256.hex()}")
        if file is None:
            raise missing
        who = principal()
        if not may_remove(who, file.uploader):
            raise removal_refused(who, f"file {file.blob.id}", file.uploader)
        if not await self.store.library.delete_file(sha256):
            raise missing
        log.info("library file removed", id=file.blob.id, by=who.caller)
        return library_pb2.DeleteFileResponse(file=file_to_pb(file))
