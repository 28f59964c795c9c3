"""The device end of adb's sync protocol (AOSP's SYNC.TXT), for the fake phones: after
`sync:`, packets of a 4-byte id and a little-endian 32-bit length. STAT (mode, size,
mtime; mode 0: no such file), SEND (`path,mode`, then DATA packets and DONE; answered OKAY
or FAIL with why), RECV (DATA packets, then DONE; or FAIL), QUIT. Files live in the
phone's `files`; as on a phone, a push outside the shared storage and /data/local/tmp is
refused (read-only file system).

`stdin_size` reads the size an install from stdin announces (`cmd package install -S N`).
"""

from __future__ import annotations

import re
import struct
import time
from collections.abc import Awaitable, Callable

from tests.support.fakes.phone import FakePhone

_HEADER = struct.Struct("<4sI")
DATA_MAX = 64 * 1024
WRITABLE = ("/sdcard/", "/storage/emulated/0/", "/data/local/tmp/")
_SIZE = re.compile(r"(?:^|\s)-S\s+(\d+)")


def stdin_size(command: str) -> int | None:
    found = _SIZE.search(command)
    return int(found[1]) if found else None


async def serve_sync(
    phone: FakePhone,
    read: Callable[[int], Awaitable[bytes]],
    write: Callable[[bytes], Awaitable[object]],
) -> None:
    """Answer sync packets until QUIT or the end of the connection."""
    while True:
        try:
            kind, length = _HEADER.unpack(await read(_HEADER.size))
        except (EOFError, ConnectionError):
            return
        if kind == b"QUIT":
            return
        body = await read(length)
        path = body.decode(errors="replace")
        if kind == b"STAT":
            data = phone.files.get(path)
            mode = 0o100644 if data is not None else 0
            await write(struct.pack("<4sIII", b"STAT", mode, len(data or b""), int(time.time())))
        elif kind == b"SEND":
            await _receive(phone, path.rpartition(",")[0], read, write)
        elif kind == b"RECV":
            data = phone.files.get(path)
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


async def _receive(
    phone: FakePhone,
    path: str,
    read: Callable[[int], Awaitable[bytes]],
    write: Callable[[bytes], Awaitable[object]],
) -> None:
    data = bytearray()
    while True:
        kind, length = _HEADER.unpack(await read(_HEADER.size))
        if kind == b"DONE":
            break
        if kind != b"DATA":
            await _fail(write, f"expected DATA or DONE, got {kind!r}")
            return
        data += await read(length)
    if not path.startswith(WRITABLE):
        await _fail(write, f"couldn't create file: Read-only file system: {path}")
        return
    phone.commands.append((time.monotonic(), f"push {path}"))
    phone.files[path] = bytes(data)
    await write(_HEADER.pack(b"OKAY", 0))


async def _fail(write: Callable[[bytes], Awaitable[object]], message: str) -> None:
    body = message.encode()
    await write(_HEADER.pack(b"FAIL", len(body)) + body)
