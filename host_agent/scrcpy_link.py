"""scrcpy's server running on a real phone, through the adb server: one `Link` per phone,
shared by its stream's viewers (host_agent.videocast), its recording and its input.

Started on demand (`Links.hold`): the pinned server (host_agent.scrcpy; its bytes checked
against the pinned SHA-256 when the agent starts, `ServerJar`) is pushed to the phone
once (adb's sync SEND, skipped when `sha256sum` there already says the same), started
with `app_process` on a shell connection kept open (the server's life), and reached over
adb's `localabstract:` service (what `adb forward tcp:N localabstract:scrcpy_…` opens per
connection, with no local port to allocate or leak): the video socket first (its dummy
byte says the server took it), then the control socket. The video socket is read all the
time the link is up: its frames go to whoever takes them, else nowhere. The link ends
when its last holder lets go (the server ends with its sockets), or when the phone breaks
it; then taps go through `input` again until it is held again.

Input: a tap is a finger down and up, a swipe a finger down, moves every 16 ms and up,
a key a down and an up, text in messages of at most 300 bytes; positions are sent in the
video's pixels with the video's size (the server drops a touch given for another size),
scaled from the phone's (`wm size`). The control socket has no acknowledgement: an
action through it is done once written.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import random
import re
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from host_agent import scrcpy
from host_agent.adb_protocol import AdbFailure, ClientAsync, Session, device_session, guard
from host_agent.devices import CommandFailed, DeviceError, VideoUnavailable
from host_agent.h264 import Merger, VideoPacket, codec_string

log = structlog.get_logger(__name__)

# How long the server has to start listening, and the pause between tries.
START_TIMEOUT = 10.0
CONNECT_PAUSE = 0.05
SYNC_DATA_MAX = 64 * 1024
SWIPE_STEP = 0.016
_SIZE = re.compile(r"(Override|Physical) size:\s*(\d+)x(\d+)")
# Frames waiting for the stream's taker before it is deemed behind (and skips).
WAITING_FRAMES = 60
# The least time between two resets of the server's encoder for a key frame.
KEY_FRAME_INTERVAL = 1.0


@dataclass(frozen=True)
class ServerJar:
    """The server file, as checked: its bytes and the version they are."""

    data: bytes = field(repr=False)
    version: str = scrcpy.VERSION
    sha256: str = scrcpy.SHA256


def load_jar(path: Path) -> ServerJar:
    """The server at `path`, refused (ValueError, one line) unless it is the pinned one."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read: {exc.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != scrcpy.SHA256:
        raise ValueError(
            f"{path}: its SHA-256 is {digest}, not scrcpy-server"
            f" v{scrcpy.VERSION}'s ({scrcpy.SHA256})"
        )
    return ServerJar(data)


def jar_flag(text: str) -> ServerJar:
    """--scrcpy-server's value: the file, checked (argparse's one-line error if not)."""
    try:
        return load_jar(Path(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Link:
    """One phone's running server: its shell, its video and control sockets."""

    def __init__(self, client: ClientAsync, serial: str, jar: ServerJar, max_fps: int) -> None:
        self.serial = serial
        self._client, self._jar, self._fps = client, jar, max_fps
        self._stack = contextlib.AsyncExitStack()
        self._video: Session | None = None
        self._control: Session | None = None
        self._lock = asyncio.Lock()
        self.video_size = (0, 0)
        self.phone_size = (0, 0)
        self.name = ""
        self.broken: str | None = None
        # The stream's taker (a queue of packets), if any, and the reader's task.
        self.taker: asyncio.Queue[VideoPacket | None] | None = None
        # The taker is sent nothing up to the next key frame (it starts, or fell behind).
        self._await_key = True
        self._reader: asyncio.Task[None] | None = None
        self._shell_out: asyncio.Task[bytes] | None = None
        self._merger = Merger()
        self._reset_at = -KEY_FRAME_INTERVAL
        self._resets: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        try:
            async with guard(self.serial, "starting scrcpy's server", START_TIMEOUT):
                await self._install()
                self.phone_size = await self._phone_size()
                scid = random.getrandbits(31)
                shell = await self._stack.enter_async_context(
                    device_session(self._client, self.serial)
                )
                command = scrcpy.server_command(scid, self._fps, self._jar.version)
                await shell.request(f"shell:{command}")
                self._shell_out = asyncio.get_running_loop().create_task(shell.read_to_end())
                self._stack.callback(self._shell_out.cancel)
                self._video = await self._connect(scrcpy.socket_name(scid), dummy=True)
                self._control = await self._connect(scrcpy.socket_name(scid), dummy=False)
                self.name = scrcpy.device_name(await self._video.read_exactly(64))
                meta = scrcpy.video_meta(await self._video.read_exactly(12))
                self.video_size = (meta.width, meta.height)
        except scrcpy.ProtocolError as exc:
            await self.close()
            raise DeviceError(f"{self.serial}: scrcpy's server: {exc}") from None
        except BaseException:
            await self.close()
            raise
        self._reader = asyncio.get_running_loop().create_task(self._read())
        log.info("scrcpy server started", device=self.serial, video=self.video_size)

    async def _install(self) -> None:
        """The server on the phone, pushed unless the same file is there."""
        answer = await self._shell(f"sha256sum {scrcpy.REMOTE_PATH} 2>/dev/null")
        if answer.split(maxsplit=1)[:1] == [self._jar.sha256]:
            return
        async with device_session(self._client, self.serial) as phone:
            await phone.request("sync:")
            spec = f"{scrcpy.REMOTE_PATH},{0o100644}".encode()
            await phone.write(struct.pack("<4sI", b"SEND", len(spec)) + spec)
            data = self._jar.data
            for at in range(0, len(data), SYNC_DATA_MAX):
                chunk = data[at : at + SYNC_DATA_MAX]
                await phone.write(struct.pack("<4sI", b"DATA", len(chunk)) + chunk)
            await phone.write(struct.pack("<4sI", b"DONE", int(time.time())))
            kind, length = struct.unpack("<4sI", await phone.read_exactly(8))
            if kind != b"OKAY":
                problem = (await phone.read_exactly(length)).decode(errors="replace")
                raise CommandFailed(f"push of scrcpy's server failed: {problem}")
            await phone.write(struct.pack("<4sI", b"QUIT", 0))

    async def _phone_size(self) -> tuple[int, int]:
        sizes = {
            kind: (int(w), int(h)) for kind, w, h in _SIZE.findall(await self._shell("wm size"))
        }
        return sizes.get("Override") or sizes.get("Physical") or (0, 0)

    async def _shell(self, command: str) -> str:
        async with device_session(self._client, self.serial) as phone:
            await phone.request(f"shell:{command}")
            return (await phone.read_to_end()).decode("utf-8", errors="replace")

    async def _connect(self, name: str, dummy: bool) -> Session:
        """A connection to the server's socket, tried until it listens (or it exited)."""
        while True:
            out = self._shell_out
            if out is not None and out.done():
                said = "" if out.exception() else out.result().decode(errors="replace").strip()
                raise DeviceError(f"{self.serial}: scrcpy's server exited: {said[-300:]}")
            session = await self._stack.enter_async_context(
                device_session(self._client, self.serial)
            )
            try:
                await session.request(f"localabstract:{name}")
                if dummy:
                    await session.read_exactly(1)
                return session
            except (AdbFailure, DeviceError, EOFError, asyncio.IncompleteReadError):
                session.close()
                await asyncio.sleep(CONNECT_PAUSE)

    async def _read(self) -> None:
        """The video socket's packets, to the taker if there is one, until it breaks."""
        video = self._video
        assert video is not None
        width, height = self.video_size
        try:
            while True:
                header = scrcpy.packet_header(await video.read_exactly(12))
                data = await video.read_exactly(header.size)
                if header.config:
                    self._merger.config(data)
                    continue
                data = self._merger.frame(data, header.key)
                codec = codec_string(data) if header.key else ""
                packet = VideoPacket(data, header.key, header.pts_us, codec, width, height)
                taker = self.taker
                if taker is None:
                    continue
                if taker.qsize() >= WAITING_FRAMES:
                    _drain(taker)
                    self._await_key = True
                    self.want_key_frame()
                if self._await_key and not packet.key:
                    continue
                self._await_key = False
                taker.put_nowait(packet)
        except (OSError, EOFError, asyncio.IncompleteReadError, scrcpy.ProtocolError) as exc:
            self.broken = f"scrcpy's video socket ended: {exc!r}"
        finally:
            if self.taker is not None:
                self.taker.put_nowait(None)

    @contextlib.asynccontextmanager
    async def frames(self) -> AsyncIterator[asyncio.Queue[VideoPacket | None]]:
        """The stream's packets while the block runs (None: the link broke)."""
        queue: asyncio.Queue[VideoPacket | None] = asyncio.Queue()
        self.taker, self._await_key = queue, True
        self.want_key_frame()  # rather than wait for the encoder's next one
        try:
            yield queue
        finally:
            if self.taker is queue:
                self.taker = None

    # -- input ----------------------------------------------------------------------------

    def _at(self, x: int, y: int) -> tuple[int, int]:
        (vw, vh), (pw, ph) = self.video_size, self.phone_size
        if pw and ph:
            x, y = x * vw // pw, y * vh // ph
        return min(max(0, x), vw - 1), min(max(0, y), vh - 1)

    async def _send(self, *messages: bytes) -> None:
        if self._control is None or self.broken:
            raise DeviceError(f"{self.serial}: scrcpy's control socket is closed")
        async with self._lock, guard(self.serial, "scrcpy control", 5.0):
            await self._control.write(b"".join(messages))

    def _touch(self, action: int, x: int, y: int) -> bytes:
        vx, vy = self._at(x, y)
        width, height = self.video_size
        return scrcpy.touch(action, vx, vy, width, height, scrcpy.PRESSURE_FULL)

    async def tap(self, x: int, y: int) -> None:
        await self._send(self._touch(scrcpy.TOUCH_DOWN, x, y), self._touch(scrcpy.TOUCH_UP, x, y))

    async def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int) -> None:
        await self._send(self._touch(scrcpy.TOUCH_DOWN, x1, y1))
        steps = max(1, round(duration_ms / 1000 / SWIPE_STEP))
        for step in range(1, steps + 1):
            await asyncio.sleep(SWIPE_STEP)
            x, y = x1 + (x2 - x1) * step // steps, y1 + (y2 - y1) * step // steps
            await self._send(self._touch(scrcpy.TOUCH_MOVE, x, y))
        await self._send(self._touch(scrcpy.TOUCH_UP, x2, y2))

    def want_key_frame(self) -> None:
        """Resets the server's encoder (its next packets: a configuration and a key frame),
        at most once each KEY_FRAME_INTERVAL."""
        now = time.monotonic()
        if now - self._reset_at < KEY_FRAME_INTERVAL or self._control is None or self.broken:
            return
        self._reset_at = now
        task = asyncio.get_running_loop().create_task(self._reset())
        self._resets.add(task)
        task.add_done_callback(self._resets.discard)

    async def _reset(self) -> None:
        try:
            await self._send(scrcpy.reset_video())
        except DeviceError as exc:
            log.info("scrcpy reset failed", device=self.serial, error=str(exc))

    async def key(self, code: int) -> None:
        await self._send(scrcpy.keycode(scrcpy.KEY_DOWN, code), scrcpy.keycode(scrcpy.KEY_UP, code))

    async def text(self, value: str) -> None:
        chunks, chunk = [], ""
        for char in value:
            if len((chunk + char).encode()) > scrcpy.TEXT_MAX_BYTES:
                chunks.append(chunk)
                chunk = ""
            chunk += char
        await self._send(*(scrcpy.text(c) for c in [*chunks, chunk] if c))

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        self.broken = self.broken or "closed"
        await self._stack.aclose()


def _drain(queue: asyncio.Queue[VideoPacket | None]) -> None:
    while not queue.empty():
        queue.get_nowait()


class Links:
    """The running servers of an adb source's phones, each held by whoever needs it (a
    stream, a session) and ended when the last one lets go."""

    def __init__(self, client: ClientAsync, jar: ServerJar | None, max_fps: int) -> None:
        self._client, self.jar, self._fps = client, jar, max_fps
        self._links: dict[str, Link] = {}
        self._holders: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def running(self, serial: str) -> Link | None:
        link = self._links.get(serial)
        return link if link is not None and link.broken is None else None

    @contextlib.asynccontextmanager
    async def hold(self, serial: str) -> AsyncIterator[Link]:
        """The phone's link, started if it is not up (DeviceError if it cannot start;
        VideoUnavailable without a server configured)."""
        if self.jar is None:
            raise VideoUnavailable(f"{serial}: no scrcpy server configured (--scrcpy-server)")
        async with self._locks.setdefault(serial, asyncio.Lock()):
            link = self.running(serial)
            if link is None:
                old = self._links.pop(serial, None)
                if old is not None:
                    await old.close()
                link = Link(self._client, serial, self.jar, self._fps)
                await link.start()
                self._links[serial] = link
            self._holders[serial] = self._holders.get(serial, 0) + 1
        try:
            yield link
        finally:
            self._holders[serial] -= 1
            if not self._holders[serial] and self._links.get(serial) is link:
                del self._links[serial], self._holders[serial]
                await link.close()
                log.info("scrcpy server ended", device=serial)


class ScrcpyVideo:
    """A phone's stream from its link (a `host_agent.devices.VideoStream`)."""

    def __init__(self, links: Links, serial: str) -> None:
        self._links, self._serial = links, serial
        self._stack = contextlib.AsyncExitStack()
        self._queue: asyncio.Queue[VideoPacket | None] | None = None
        self._link: Link | None = None

    async def open(self) -> ScrcpyVideo:
        try:
            self._link = await self._stack.enter_async_context(self._links.hold(self._serial))
            self._queue = await self._stack.enter_async_context(self._link.frames())
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def next(self) -> VideoPacket:
        assert self._queue is not None and self._link is not None
        packet = await self._queue.get()
        if packet is None:
            raise DeviceError(f"{self._serial}: {self._link.broken}")
        return packet

    def want_key_frame(self) -> None:
        if self._link is not None:
            self._link.want_key_frame()

    async def close(self) -> None:
        await self._stack.aclose()
