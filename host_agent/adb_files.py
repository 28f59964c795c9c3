"""Files between the host and a phone behind the adb server: a file on a command's stdin
(adb's `exec:` service: what `cmd package install -S SIZE` reads an APK from), and the
sync protocol's SEND, RECV and STAT (what `adb push` and `adb pull` speak; AOSP's
SYNC.TXT: `sync:`, then packets of a 4-byte id and a little-endian 32-bit length).

Each call opens its own connection under the caller's `guard` (host_agent.adb_protocol),
so one deadline covers it and adb's failures become DeviceErrors; a phone's own refusal
(no such file, permission denied) is CommandFailed with its words.
"""

from __future__ import annotations

import struct
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from host_agent.adb_protocol import ClientAsync, Session, device_session
from host_agent.devices import CommandFailed, DeviceError

# What one sync DATA packet carries at most (adb's SYNC_DATA_MAX).
SYNC_DATA_MAX = 64 * 1024
# What a pushed file's mode is: a regular file, rw-r--r--.
PUSH_MODE = 0o100644
_HEADER = struct.Struct("<4sI")
_STAT = struct.Struct("<4sIII")


async def exec_in(client: ClientAsync, serial: str, command: str, data: Path) -> str:
    """Run `command` with adb's `exec:` service (no shell, no pty), the file on its stdin;
    everything it printed, once it ends."""
    async with device_session(client, serial) as phone:
        await phone.request(f"exec:{command}")
        async for chunk in _file_chunks(data, SYNC_DATA_MAX * 4):
            await phone.write(chunk)
        return (await phone.read_to_end()).decode("utf-8", errors="replace")


async def push(client: ClientAsync, serial: str, local: Path, remote: str) -> None:
    """`adb push`: the file to `remote` on the phone (replacing what is there)."""
    async with _sync(client, serial) as phone:
        spec = f"{remote},{PUSH_MODE}".encode()
        await phone.write(_HEADER.pack(b"SEND", len(spec)) + spec)
        async for chunk in _file_chunks(local, SYNC_DATA_MAX):
            await phone.write(_HEADER.pack(b"DATA", len(chunk)) + chunk)
        await phone.write(_HEADER.pack(b"DONE", int(time.time())))
        answer, length = _HEADER.unpack(await phone.read_exactly(_HEADER.size))
        if answer == b"FAIL":
            problem = (await phone.read_exactly(length)).decode(errors="replace")
            raise CommandFailed(f"push to {remote} failed: {problem}")
        if answer != b"OKAY":
            raise DeviceError(f"{serial}: push: the adb server sent {answer!r}, not OKAY")


async def pull(client: ClientAsync, serial: str, remote: str, limit: int) -> bytes:
    """`adb pull`: the file at `remote` on the phone, if it is at most `limit` bytes
    (CommandFailed naming its size otherwise, before any of it is read)."""
    async with _sync(client, serial) as phone:
        path = remote.encode()
        await phone.write(_HEADER.pack(b"STAT", len(path)) + path)
        _, mode, size, _ = _STAT.unpack(await phone.read_exactly(_STAT.size))
        if mode == 0:
            raise CommandFailed(f"pull of {remote} failed: no such file on the phone")
        if mode & 0o170000 != 0o100000:
            raise CommandFailed(f"pull of {remote} failed: not a regular file")
        if size > limit:
            raise CommandFailed(
                f"pull of {remote} failed: it is {size} bytes, over the {limit} bytes a task keeps"
            )
        await phone.write(_HEADER.pack(b"RECV", len(path)) + path)
        data = bytearray()
        while True:
            kind, length = _HEADER.unpack(await phone.read_exactly(_HEADER.size))
            if kind == b"DONE":
                return bytes(data)
            body = await phone.read_exactly(length)
            if kind == b"FAIL":
                problem = body.decode(errors="replace")
                raise CommandFailed(f"pull of {remote} failed: {problem}")
            if kind != b"DATA":
                raise DeviceError(f"{serial}: pull: the adb server sent {kind!r}")
            data += body
            if len(data) > limit:
                raise CommandFailed(f"pull of {remote} failed: it grew past {limit} bytes")


@asynccontextmanager
async def _sync(client: ClientAsync, serial: str) -> AsyncIterator[Session]:
    """A connection switched to `serial`'s sync service; QUIT once the block is through."""
    async with device_session(client, serial) as phone:
        await phone.request("sync:")
        yield phone
        await phone.write(_HEADER.pack(b"QUIT", 0))


async def _file_chunks(path: Path, size: int) -> AsyncIterator[bytes]:
    with path.open("rb") as file:
        while chunk := file.read(size):
            yield chunk
