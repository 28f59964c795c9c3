"""The app library: how an upload is received and checked, the one small interface behind
which its bytes are kept, their way to a host, and the check that what a task names is
in the library.

- **Receiving.** An upload's bytes are spooled to a temporary file of the replica (not
  held in memory: an APK may be hundreds of MiB) while their SHA-256 is computed, refused
  as soon as more than the header announced arrives (control_plane.artifacts.checked, as
  an artifact's), and checked against the header's size and sha256 at the end. An app's
  manifest is then read from the file (amc_common.apk). Only then is anything written,
  in one transaction: so a refused upload keeps nothing. The uploads a replica spools at
  once are bounded (`Settings.max_library_spool`: UNAVAILABLE past it).
- **Keeping.** `LibraryBytes` is what the servicers use, as `Artifacts` is for the files
  steps keep; `PostgresLibrary` keeps the bytes as artifacts are kept (chunked bytea rows,
  read a few chunks per round trip), once per sha256 (store/library.sql). An
  S3-compatible store would be a second implementation, chosen where the replica is
  assembled (server.py), as for artifacts.
- **Fetching.** A host fetches an app's APK (or a file to push) once, by its sha256
  (Lease.FetchFile: `fetch`), and keeps it in a cache of its own; `amc_library_fetches_total`
  counts what was sent, so one APK installed on a host's twenty phones shows one fetch.
- **References.** A submit whose spec names an app (install_app, TaskSpec.apps) or a file
  (push_file) the library does not have is refused NOT_FOUND, naming the field, before
  anything is queued: `check_references`, one query for the whole submit, none for a spec
  that names nothing of the library.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Protocol

from amc.v1 import lease_pb2, task_pb2
from amc_common.apk import ApkFacts, NotAnApk, read_apk
from control_plane import errors, metrics
from control_plane.artifacts import CHUNK, checked, read_chunks
from control_plane.domain import (
    App,
    Blob,
    LibraryFile,
    NewApp,
    Principal,
    Role,
    Uploader,
)
from control_plane.store import Store

# ListApps and ListFiles answer at most this many.
MAX_LISTED = 1000


class LibraryBytes(Protocol):
    """Where the library's bytes are kept."""

    async def put_app(self, new: NewApp, uploader: Uploader, spool: Spool) -> tuple[App, bool]:
        """Keep the app and its bytes: (the app, whether this call kept it; False: the
        same bytes were an app of the library already, answered instead)."""
        ...

    async def put_file(
        self, blob: Blob, file_name: str, uploader: Uploader, spool: Spool
    ) -> tuple[LibraryFile, bool]: ...

    def read(self, blob: Blob) -> AsyncIterator[bytes]:
        """The bytes, in order, a chunk at a time."""
        ...


class PostgresLibrary:
    """The library's bytes in PostgreSQL: CHUNK-sized bytea rows, once per sha256."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def put_app(self, new: NewApp, uploader: Uploader, spool: Spool) -> tuple[App, bool]:
        return await self._store.library.put_app(new, uploader, spool.chunks)

    async def put_file(
        self, blob: Blob, file_name: str, uploader: Uploader, spool: Spool
    ) -> tuple[LibraryFile, bool]:
        return await self._store.library.put_file(blob, file_name, uploader, spool.chunks)

    def read(self, blob: Blob) -> AsyncIterator[bytes]:
        return read_chunks(
            lambda first, limit: self._store.library.chunks(blob.sha256, first, limit)
        )


@dataclass
class Spool:
    """An upload received whole and checked, on the replica's disk until closed."""

    file: IO[bytes]
    blob: Blob

    def chunks(self) -> Iterable[bytes]:
        """Its bytes from the start, CHUNK at a time (each call reads them again)."""
        self.file.seek(0)
        while data := self.file.read(CHUNK):
            yield data

    def apk(self) -> ApkFacts:
        """What its manifest says; NotAnApk when it is not an APK."""
        self.file.seek(0)
        return read_apk(self.file)


@contextlib.asynccontextmanager
async def spooled(blob: Blob, chunks: AsyncIterator[bytes]) -> AsyncIterator[Spool]:
    """The upload's bytes in a temporary file, checked against `blob` (its announced size
    and sha256: ChecksumMismatch otherwise); the file is gone when the block ends."""
    with tempfile.TemporaryFile(prefix="amc-library-") as file:
        async for chunk in checked(blob.size_bytes, blob.sha256, chunks):
            file.write(chunk)
        file.flush()
        yield Spool(file, blob)


def new_app(spool: Spool, file_name: str) -> NewApp:
    """The app an upload holds; InvalidArgument (one line: why) when it is not an APK."""
    try:
        facts = spool.apk()
    except NotAnApk as exc:
        raise errors.InvalidArgument("file", f"{exc}; nothing was kept") from None
    return NewApp(
        blob=spool.blob,
        package=facts.package,
        version_name=facts.version_name[:255],
        version_code=facts.version_code,
        min_sdk=facts.min_sdk,
        target_sdk=facts.target_sdk,
        file_name=file_name,
    )


def uploader(who: Principal) -> Uploader:
    name = who.name or (str(who.token_id) if who.token_id else "anonymous")
    return Uploader(name=name, token_id=who.token_id, team=who.team)


def may_remove(who: Principal, kept: Uploader) -> bool:
    """Operators (and everyone without authentication) may remove anything; a client what
    its own token or a token of its team uploaded."""
    if who.role is None or who.role is Role.OPERATOR:
        return True
    if who.token_id is not None and who.token_id == kept.token_id:
        return True
    return bool(who.team) and who.team == kept.team


def removal_refused(who: Principal, what: str, kept: Uploader) -> errors.PermissionDenied:
    team = f" of team {kept.team!r}" if kept.team else ""
    return errors.PermissionDenied(
        f"{what} was uploaded by {kept.name}{team}: only an operator, that token or its"
        " team may remove it"
    )


async def fetch(
    store: Store, library: LibraryBytes, sha256: bytes
) -> AsyncIterator[lease_pb2.FetchFileResponse]:
    """A blob for a host: its size first, then its bytes; counted when it went whole."""
    blob = await store.library.blob(sha256)
    if blob is None:
        raise errors.LibraryItemNotFound(f"the library has no app or file {sha256.hex()}")
    yield lease_pb2.FetchFileResponse(size_bytes=blob.size_bytes)
    sent, whole = 0, False
    try:
        async for chunk in library.read(blob):
            yield lease_pb2.FetchFileResponse(chunk=chunk)
            sent += len(chunk)
        whole = True
    finally:
        metrics.LIBRARY_FETCHES.labels("sent" if whole else "cut").inc()
        metrics.LIBRARY_FETCH_BYTES.inc(sent)


# -- what a task names ----------------------------------------------------------------------


def _named(spec: task_pb2.TaskSpec, field: str) -> Iterator[tuple[str, str, str]]:
    """(kind, reference, field) of every app and file the spec names."""
    for i, app in enumerate(spec.apps):
        yield _app_kind(app.app), app.app, f"{field}.apps[{i}].app"
    lists: list[tuple[str, Sequence[task_pb2.Action]]] = []
    if spec.HasField("actions"):
        lists.append((f"{field}.actions.actions", spec.actions.actions))
    for s, step in enumerate(spec.workflow.steps):
        lists.append((f"{field}.workflow.steps[{s}].actions", step.actions))
    for where, actions in lists:
        for a, action in enumerate(actions):
            kind = action.WhichOneof("kind")
            if kind == "install_app":
                app = action.install_app.app
                yield _app_kind(app), app, f"{where}[{a}].install_app.app"
            elif kind == "push_file":
                yield "file_id", action.push_file.file, f"{where}[{a}].push_file.file"


def _app_kind(ref: str) -> str:
    return "package" if "." in ref else "app_id"


async def check_references(store: Store, specs: Sequence[tuple[str, task_pb2.TaskSpec]]) -> None:
    """Every app and file the specs name is in the library, or LibraryItemNotFound naming
    the first that is not (its field, as `specs` names each spec's). One query when they
    name any; none otherwise."""
    named = [n for field, spec in specs for n in _named(spec, field)]
    if not named:
        return
    app_ids = sorted({bytes.fromhex(r) for k, r, _ in named if k == "app_id"})
    packages = sorted({r for k, r, _ in named if k == "package"})
    file_ids = sorted({bytes.fromhex(r) for k, r, _ in named if k == "file_id"})
    found = await store.library.references(app_ids, packages, file_ids)
    for kind, ref, field in named:
        if (kind, ref) not in found:
            what = {"app_id": "app", "package": "app of package", "file_id": "file"}[kind]
            raise errors.LibraryItemNotFound(
                f"{field}: the library has no {what} {ref}; nothing was queued"
            )
