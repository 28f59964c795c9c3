"""A host's bounded on-disk cache of the app library's bytes, by sha256: an APK (or a file
to push) is fetched from the control plane once however many of the host's phones take it,
checked against its sha256 as it arrives, and the least recently used go when the cache
is past its size (--app-cache-dir, --app-cache-size).

- **Once per id.** Tasks that need the same id wait for one another (a lock per id): the
  first fetches, the others find the file. Twenty phones installing one APK at once move
  it over the network once.
- **Checked.** The bytes are written to a temporary file beside the entries while their
  sha256 is computed; the file becomes the entry (renamed) only when that is its id and
  its size the announced one. A damaged fetch keeps nothing (CacheError).
- **Bounded, least recently used out.** After a fetch, and when a task is done with a
  file, entries are removed oldest use first until the cache is within its size; an entry
  a task is using (a push, an install reading it) is never removed. So a file larger than
  the whole cache is fetched, used, and removed.
- **Kept across restarts.** The entries are files named by their id; their last use is
  their mtime (touched on each use). A start reads the directory back and removes what is
  not an entry (a fetch cut short by a crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from host_agent import metrics

# A fetch: given where to write each chunk of the bytes, writes them all, in order; it
# returns their size as announced by the control plane.
Fetch = Callable[[Callable[[bytes], None]], Awaitable[int]]
_ID = re.compile(r"[0-9a-f]{64}")


class CacheError(Exception):
    """The bytes fetched are not the ones asked for; nothing was kept."""


@dataclass
class _Entry:
    size: int
    last_used: float


class AppCache:
    """The cache in `directory`, at most `max_bytes` (besides the files in use)."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self._entries: dict[str, _Entry] | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._in_use: Counter[str] = Counter()

    @property
    def held(self) -> int:
        """Bytes in the cache."""
        return sum(e.size for e in self._read().values())

    def ids(self) -> set[str]:
        """The ids kept."""
        return set(self._read())

    @contextlib.asynccontextmanager
    async def use(self, file_id: str, fetch: Fetch) -> AsyncIterator[Path]:
        """The file of `file_id`, from the cache or fetched into it, not removed before the
        block ends."""
        if not _ID.fullmatch(file_id):
            raise CacheError(f"not a library id: {file_id!r}")
        self._in_use[file_id] += 1
        try:
            yield await self._ensure(file_id, fetch)
        finally:
            self._in_use[file_id] -= 1
            if not self._in_use[file_id]:
                del self._in_use[file_id]
            self._evict()

    async def _ensure(self, file_id: str, fetch: Fetch) -> Path:
        entries = self._read()
        lock = self._locks.setdefault(file_id, asyncio.Lock())
        async with lock:
            path = self.directory / file_id
            entry = entries.get(file_id)
            if entry is not None and path.is_file():
                entry.last_used = time.time()
                with contextlib.suppress(OSError):
                    os.utime(path, (entry.last_used, entry.last_used))
                metrics.LIBRARY_FILES.labels("hit").inc()
                return path
            try:
                size = await self._fetch(file_id, path, fetch)
            except BaseException:
                metrics.LIBRARY_FILES.labels("failed").inc()
                raise
            entries[file_id] = _Entry(size, time.time())
            metrics.LIBRARY_FILES.labels("fetched").inc()
            metrics.LIBRARY_FETCH_BYTES.inc(size)
            self._evict()
            return path

    async def _fetch(self, file_id: str, path: Path, fetch: Fetch) -> int:
        temp = self.directory / f".{file_id}.{uuid.uuid4().hex}.part"
        digest, written = hashlib.sha256(), 0
        try:
            with temp.open("wb") as out:

                def write(chunk: bytes) -> None:
                    nonlocal written
                    digest.update(chunk)
                    written += len(chunk)
                    out.write(chunk)

                announced = await fetch(write)
            if written != announced or digest.hexdigest() != file_id:
                raise CacheError(
                    f"library file {file_id} arrived damaged ({written} of {announced} bytes,"
                    f" sha256 {digest.hexdigest()}); nothing was kept"
                )
            os.replace(temp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        return written

    def _read(self) -> dict[str, _Entry]:
        """The entries, read from the directory at first use (what is not one removed)."""
        if self._entries is None:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            entries: dict[str, _Entry] = {}
            for item in self.directory.iterdir():
                if _ID.fullmatch(item.name) and item.is_file():
                    stat = item.stat()
                    entries[item.name] = _Entry(stat.st_size, stat.st_mtime)
                elif item.is_file():
                    with contextlib.suppress(OSError):
                        item.unlink()
            self._entries = entries
            self._evict()
        return self._entries

    def _evict(self) -> None:
        """Oldest use first, entries not in use go until the cache is within its size."""
        entries = self._entries or {}
        held = sum(e.size for e in entries.values())
        for file_id, entry in sorted(entries.items(), key=lambda item: item[1].last_used):
            if held <= self.max_bytes:
                break
            lock = self._locks.get(file_id)
            if self._in_use[file_id] or (lock is not None and lock.locked()):
                continue
            with contextlib.suppress(FileNotFoundError):
                (self.directory / file_id).unlink()
            del entries[file_id]
            held -= entry.size
        metrics.LIBRARY_CACHE_BYTES.set(held)
