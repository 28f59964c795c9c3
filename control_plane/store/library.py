"""The app library: apps and files, their bytes kept once by sha256 in chunks (library.sql;
amc_delete_library_app, amc_delete_library_file and amc_forget_blob above its statements
there)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import asyncpg

from control_plane.domain import App, Blob, LibraryFile, NewApp, Uploader
from control_plane.errors import LibraryItemNotFound
from control_plane.store.database import Aggregate
from control_plane.store.rows import as_is
from control_plane.store.sql import QUERIES as Q

# The longest one upload's transaction may take to write its chunks (a 200 MiB APK takes a
# few seconds on a local database).
COPY_TIMEOUT = 300.0


class Library(Aggregate):
    async def put_app(
        self, app: NewApp, uploader: Uploader, chunks: Callable[[], Iterable[bytes]]
    ) -> tuple[App, bool]:
        """Keep the app and its bytes (`chunks()` gives them, in order, each time it is
        called): (the app kept, whether this call kept it; False when the library had
        these bytes as an app already, which is answered instead)."""
        row = await self._put(
            app.blob,
            chunks,
            Q["library_put_app"],
            app.package,
            app.version_name,
            app.version_code,
            app.min_sdk,
            app.target_sdk,
            app.file_name,
            uploader.name,
            uploader.token_id,
            uploader.team,
        )
        if row is not None:
            return _app(row), True
        return await self.app(app.blob.sha256, None), False

    async def put_file(
        self,
        blob: Blob,
        file_name: str,
        uploader: Uploader,
        chunks: Callable[[], Iterable[bytes]],
    ) -> tuple[LibraryFile, bool]:
        """As put_app, for a file."""
        args = (file_name, uploader.name, uploader.token_id, uploader.team)
        row = await self._put(blob, chunks, Q["library_put_file"], *args)
        if row is not None:
            return _file(row), True
        found = await self.file(blob.sha256)
        assert found is not None, "a file row found in its upload's transaction"
        return found, False

    async def _put(
        self, blob: Blob, chunks: Callable[[], Iterable[bytes]], statement: str, *args: object
    ) -> asyncpg.Record | None:
        """One transaction: the blob (its chunks by COPY when it is new), then the row
        naming it (`statement`, its SQL); that row, or None when there was one already."""

        async def run() -> asyncpg.Record | None:
            async with self._db.pool.acquire() as conn, conn.transaction():
                if await conn.fetchval(Q["library_put_blob"], blob.sha256, blob.size_bytes):
                    records = ((blob.sha256, seq, data) for seq, data in enumerate(chunks()))
                    await conn.copy_records_to_table(
                        "library_chunks",
                        records=records,
                        columns=("sha256", "seq", "data"),
                        timeout=COPY_TIMEOUT,
                    )
                row: asyncpg.Record | None = await conn.fetchrow(
                    statement, blob.sha256, *args, blob.size_bytes
                )
                return row

        return await self._db.checked(run)

    async def app(self, sha256: bytes | None, package: str | None) -> App:
        """An app by its sha256, else the newest of `package`; LibraryItemNotFound if none."""
        row = await self._db.fetchrow("library_app", sha256, package)
        if row is None:
            what = f"app {sha256.hex()}" if sha256 else f"app of package {package}"
            raise LibraryItemNotFound(f"the library has no {what}")
        return _app(row)

    async def apps(self, package: str | None, limit: int) -> list[App]:
        return [_app(r) for r in await self._db.fetch("library_apps", package, limit)]

    async def file(self, sha256: bytes) -> LibraryFile | None:
        row = await self._db.fetchrow("library_file", sha256)
        return _file(row) if row else None

    async def files(self, limit: int) -> list[LibraryFile]:
        return [_file(r) for r in await self._db.fetch("library_files", limit)]

    async def delete_app(self, sha256: bytes) -> bool:
        """Whether an app was removed (its bytes too, when no file names them)."""
        return bool(await self._db.fetch("library_delete_app", sha256))

    async def delete_file(self, sha256: bytes) -> bool:
        return bool(await self._db.fetch("library_delete_file", sha256))

    async def blob(self, sha256: bytes) -> Blob | None:
        row = await self._db.fetchrow("library_blob", sha256)
        return Blob(bytes(row["sha256"]), row["size_bytes"]) if row else None

    async def chunks(self, sha256: bytes, first: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` chunks of the blob from chunk `first` on, in order."""
        rows = await self._db.fetch("library_chunks", sha256, first, limit)
        return [(r["seq"], bytes(r["data"])) for r in rows]

    async def references(
        self, app_ids: list[bytes], packages: list[str], file_ids: list[bytes]
    ) -> set[tuple[str, str]]:
        """Which of these the library has: ("app_id", hex), ("package", name), ("file_id",
        hex)."""
        rows = await self._db.fetch("library_references", app_ids, packages, file_ids)
        return {(r["kind"], r["ref"]) for r in rows}


def _uploader(row: asyncpg.Record) -> Uploader:
    return Uploader(row["uploaded_by"], row["token_id"], row["team"])


def _blob(row: asyncpg.Record) -> Blob:
    return Blob(bytes(row["sha256"]), row["size_bytes"])


_APP_COLUMNS = (
    "package", "version_name", "version_code", "min_sdk", "target_sdk", "file_name",
    "created_at",
)  # fmt: skip


def _app(row: asyncpg.Record) -> App:
    return App(blob=_blob(row), uploader=_uploader(row), **as_is(row, *_APP_COLUMNS))


def _file(row: asyncpg.Record) -> LibraryFile:
    return LibraryFile(
        blob=_blob(row),
        file_name=row["file_name"],
        uploader=_uploader(row),
        created_at=row["created_at"],
    )
