"""A simulated phone's end of adb's sync protocol (AOSP SYNC.TXT), what `adb push`, `adb
pull` and `adb ls` speak after `sync:`: packets of a 4-byte id and a little-endian 32-bit
length. STAT (mode, size, mtime; mode 0: no such file), LIST (DENT entries, then DONE),
SEND (`path,mode`, then DATA packets and DONE; answered OKAY, or FAIL with why), RECV
(DATA packets, then DONE; or FAIL), QUIT. Files live in a dict of path → bytes (the
phone's `files`, as its pushes and pulls see them); as on a phone, a push outside the
shared storage and /data/local/tmp is refused (read-only file system). Served by the
simulated phones' adb doors (host_agent.simulated_door) and the tests' fake phones.

`stdin_size` reads the size an install from stdin announces (`cmd package install -S N`).
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Awaitable, Callable

_HEADER = struct.Struct("<4sI")
DATA_MAX = 64 * 1024
WRITABLE = ("/sdcard/", "/storage/emulated/0/", "/data/local/tmp/")
_SIZE = re.compile(r"(?:^|\s)-S\s+(\d+)")
_FILE = 0o100644
_DIRECTORY = 0o040755

Read = Callable[[int], Awaitable[bytes]]
Write = Callable[[bytes], Awaitable[object]]


def stdin_size(command: str) -> int | None:
    found = _SIZE.search(command)
    return int(found[1]) if found else None


async def serve_sync(
    files: dict[str, bytes],
    read: Read,
    write: Write,
    on_push: Callable[[str], None] | None = None,
) -> None:
    """Answer sync packets until QUIT or the end of the connection (`read` raising
    EOFError or ConnectionError); `on_push` is told each path pushed."""
    while True:
        try:
            kind, length = _HEADER.unpack(await read(_HEADER.size))
        except (EOFError, ConnectionError):
            return
        if kind == b"QUIT":
            return
        path = (await read(length)).decode(errors="replace")
        if kind == b"STAT":
            await write(_stat(files, path))
        elif kind == b"LIST":
            await _list(files, path, write)
        elif kind == b"SEND":
            target = path.rpartition(",")[0]
            if await _receive(files, target, read, write) and on_push is not None:
                on_push(target)
        elif kind == b"RECV":
            data = files.get(path)
            if data is None:
                await _fail(write, f"remote object '{path}' does not exist")
                continue
            for start in range(0, len(data), DATA_MAX):
                chunk = data[start : start + DATA_MAX]
                await write(_HEADER.pack(b"DATA", len(chunk)) + chunk)
            await write(_HEADER.pack(b"DONE", 0))
        else:
            await _fail(write, f"unknown sync command {kind!r}")
            return


def _stat(files: dict[str, bytes], path: str) -> bytes:
    data = files.get(path)
    now = int(time.time())
    if data is not None:
        return struct.pack("<4sIII", b"STAT", _FILE, len(data), now)
    folder = path.rstrip("/") + "/"
    if path in ("/", "") or any(name.startswith(folder) for name in files):
        return struct.pack("<4sIII", b"STAT", _DIRECTORY, 4096, now)
    if folder.startswith(WRITABLE) and folder in WRITABLE:
        return struct.pack("<4sIII", b"STAT", _DIRECTORY, 4096, now)
    return struct.pack("<4sIII", b"STAT", 0, 0, 0)


async def _list(files: dict[str, bytes], path: str, write: Write) -> None:
    folder = path.rstrip("/") + "/"
    now = int(time.time())
    names = sorted({n[len(folder) :].split("/")[0] for n in files if n.startswith(folder)})
    for name in names:
        data = files.get(folder + name)
        mode, size = (_FILE, len(data)) if data is not None else (_DIRECTORY, 4096)
        entry = name.encode()
        await write(struct.pack("<4sIIII", b"DENT", mode, size, now, len(entry)) + entry)
    await write(struct.pack("<4sIIII", b"DONE", 0, 0, 0, 0))


async def _receive(files: dict[str, bytes], path: str, read: Read, write: Write) -> bool:
    data = bytearray()
    while True:
        kind, length = _HEADER.unpack(await read(_HEADER.size))
        if kind == b"DONE":
            break
        if kind != b"DATA":
            await _fail(write, f"expected DATA or DONE, got {kind!r}")
            return False
        data += await read(length)
    if not path.startswith(WRITABLE):
        await _fail(write, f"couldn't create file: Read-only file system: {path}")
        return False
    files[path] = bytes(data)
    await write(_HEADER.pack(b"OKAY", 0))
    return True


async def _fail(write: Write, message: str) -> None:
    body = message.encode()
    await write(_HEADER.pack(b"FAIL", len(body)) + body)
