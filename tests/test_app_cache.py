"""A host's app cache (host_agent.app_cache): one fetch per id however many tasks want it
at once, checked against its sha256, bounded with the least recently used out (never one
in use), and read back after a restart."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from host_agent.app_cache import AppCache, CacheError, Fetch


def blob(size: int, seed: int) -> tuple[str, bytes]:
    data = bytes([seed]) * size
    return hashlib.sha256(data).hexdigest(), data


class Control:
    """A fake control plane: what it was asked for, and the bytes it sends."""

    def __init__(self, delay: float = 0.0) -> None:
        self.fetched: list[str] = []
        self.delay = delay

    def fetch(self, file_id: str, data: bytes) -> Fetch:
        async def send(write: Callable[[bytes], None]) -> int:
            self.fetched.append(file_id)
            await asyncio.sleep(self.delay)
            for start in range(0, len(data), 1000):
                write(data[start : start + 1000])
            return len(data)

        return send


async def read(cache: AppCache, file_id: str, fetch: Fetch) -> bytes:
    async with cache.use(file_id, fetch) as path:
        return await asyncio.to_thread(path.read_bytes)


async def test_twenty_tasks_wanting_one_file_at_once_fetch_it_once(tmp_path: Path) -> None:
    file_id, data = blob(50_000, 1)
    control, cache = Control(delay=0.05), AppCache(tmp_path, 10_000_000)
    got = await asyncio.gather(
        *(read(cache, file_id, control.fetch(file_id, data)) for _ in range(20))
    )
    assert got == [data] * 20
    assert control.fetched == [file_id]


async def test_bytes_that_are_not_the_id_asked_for_are_refused_and_not_kept(
    tmp_path: Path,
) -> None:
    file_id, _ = blob(10_000, 1)
    _, other = blob(10_000, 2)
    cache = AppCache(tmp_path, 10_000_000)
    with pytest.raises(CacheError, match="arrived damaged"):
        await read(cache, file_id, Control().fetch(file_id, other))
    assert os.listdir(tmp_path) == [] and cache.ids() == set()


async def test_the_least_recently_used_go_first_and_never_one_in_use(tmp_path: Path) -> None:
    """THEN with room for two files, a third pushes out the one used longest ago; a file
    in use stays (the cache runs over its size meanwhile) and goes once it is free."""
    (a, da), (b, db), (c, dc) = blob(400, 1), blob(400, 2), blob(400, 3)
    control, cache = Control(), AppCache(tmp_path, 1000)
    await read(cache, a, control.fetch(a, da))
    await read(cache, b, control.fetch(b, db))
    await read(cache, a, control.fetch(a, da))  # a used last: b is the oldest
    await read(cache, c, control.fetch(c, dc))
    assert cache.ids() == {a, c} and control.fetched == [a, b, c]
    async with cache.use(a, control.fetch(a, da)):
        await read(cache, b, control.fetch(b, db))  # c goes (a is in use)
        assert cache.ids() == {a, b}
        big, dbig = blob(900, 4)
        async with cache.use(big, control.fetch(big, dbig)):
            assert cache.ids() == {a, big}  # over its size while both are in use
        assert cache.ids() == {a}  # big went once free; a stays while used
    assert cache.held <= 1000


async def test_a_restarted_agent_finds_its_cache_and_drops_what_a_crash_left(
    tmp_path: Path,
) -> None:
    a, da = blob(300, 1)
    control = Control()
    await read(AppCache(tmp_path, 1000), a, control.fetch(a, da))
    (tmp_path / f".{a}.deadbeef.part").write_bytes(b"half")
    again = AppCache(tmp_path, 1000)
    assert await read(again, a, control.fetch(a, da)) == da
    assert control.fetched == [a] and sorted(os.listdir(tmp_path)) == [a]
