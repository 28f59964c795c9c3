"""A phone that runs scrcpy's server (v3.3.4's wire protocol), for the agent's scrcpy path
(host_agent.scrcpy_link) behind the fake adb server: `ScrcpyPhone`, a `FakePhone` that
also answers

* (``sync:`` SEND, what `adb push` speaks, as every fake phone: tests.support.fakes.sync;
  the file lands in `files`)
* ``sha256sum PATH`` and ``wm size`` on its shell;
* ``CLASSPATH=PATH app_process / com.genymobile.scrcpy.Server VERSION key=value…`` on its
  shell: the server, if PATH holds the expected file (`jar`) and VERSION is the one it is
  (else it prints scrcpy's own error and exits, as the real one does), running until the
  shell connection closes; it listens on ``localabstract:scrcpy_<scid>`` (with
  ``tunnel_forward=true``);
* ``localabstract:NAME``: the server's sockets, in scrcpy's order: video (a dummy byte,
  the device's name in 64 bytes, the codec id "h264" and the video's width and height,
  then 12-byte headers and packets: the SPS and PPS as a configuration packet before each
  key frame, as MediaCodec gives them), then control (injected touches, keys and text,
  ControlMessageReader's format; a touch for another screen size is ignored, as the real
  server ignores it; a reset of the video encoder makes the next frame a key frame).

Its picture (encoded with PyAV at `max_fps`, a key frame every 10 s and after a reset of
the encoder, control message 17) is a flat colour,
a bar that moves every frame and a red square where the last touch went down; the
touches, keys and text it was sent are recorded with their arrival times. No file of
scrcpy's is used: the stand-in server file is a few bytes (`STAND_IN`).
"""

from __future__ import annotations

import asyncio
import hashlib
import shlex
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from host_agent import scrcpy
from host_agent.h264 import NAL_PPS, NAL_SPS, START_CODE, nal_type, nal_units
from host_agent.scrcpy_link import ServerJar
from host_agent.video_encoder import Encoder
from tests.support.fakes.phone import FakePhone

STAND_IN = b"stand-in for scrcpy-server v3.3.4: not scrcpy's file\n"
RED = (230, 20, 20)
MARK = 16


def stand_in_jar() -> ServerJar:
    """What an agent is given in place of scrcpy's file, checked as that one is."""
    return ServerJar(STAND_IN, scrcpy.VERSION, hashlib.sha256(STAND_IN).hexdigest())


@dataclass
class Received:
    """A control message as the server read it, and when (time.monotonic())."""

    at: float
    kind: str  # "touch", "key", "text", "ignored"
    fields: tuple[Any, ...]


@dataclass
class ScrcpyPhone(FakePhone):
    # The server file it runs (what the agent must have pushed), and its screen.
    jar: bytes = STAND_IN
    display: tuple[int, int] = (360, 800)
    # What `wm size` says, when it is not the video's size (the server streams a smaller
    # picture when its encoder refused the full size: downsize_on_error).
    physical: tuple[int, int] | None = None
    received: list[Received] = field(default_factory=list)
    # Every server started: its options (key=value), in order.
    servers: list[dict[str, str]] = field(default_factory=list)
    _sockets: dict[str, asyncio.Queue[Any]] = field(default_factory=dict)
    _mark: tuple[int, int] | None = None
    # A reset of the encoder asked for (its next frame: configuration and a key frame).
    _reset: bool = False

    # -- the shell ----------------------------------------------------------------------

    def _run_simple(self, argv: list[str], last_status: int) -> tuple[int, bytes]:
        if argv[:1] == ["sha256sum"]:
            paths = [a for a in argv[1:] if not a.startswith("2>")]
            found = [p for p in paths if p in self.files]
            out = "".join(f"{hashlib.sha256(self.files[p]).hexdigest()}  {p}\n" for p in found)
            return (0 if len(found) == len(paths) else 1), out.encode()
        if argv[:2] == ["wm", "size"]:
            width, height = self.physical or self.display
            return 0, f"Physical size: {width}x{height}\n".encode()
        return super()._run_simple(argv, last_status)

    async def stream_shell(self, command: str) -> AsyncIterator[bytes]:
        if "app_process" not in command:
            async for chunk in super().stream_shell(command):
                yield chunk
            return
        self.commands.append((time.monotonic(), command))
        words = shlex.split(command)
        path = words[0].removeprefix("CLASSPATH=")
        if self.files.get(path) != self.jar:
            yield b"Error: Could not find or load main class com.genymobile.scrcpy.Server\n"
            return
        version, options = words[4], dict(w.split("=", 1) for w in words[5:])
        if version != scrcpy.VERSION:
            yield (
                f"[server] ERROR: Exception on thread main: The server version"
                f" ({scrcpy.VERSION}) does not match the client ({version})\n"
            ).encode()
            return
        self.servers.append(options)
        name = scrcpy.socket_name(int(options["scid"], 16))
        self._sockets[name] = connections = asyncio.Queue()
        yield f"[server] INFO: Device: [Fake] {self.props['ro.product.model']}\n".encode()
        try:
            video = await connections.get()
            video[1].write(b"\0")  # the dummy byte
            control = await connections.get()
            await self._serve(video, control, int(options.get("max_fps", "30")))
        finally:
            del self._sockets[name]

    # -- services beyond the shell ------------------------------------------------------

    async def serve(
        self, payload: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """`localabstract:NAME` (the adb server has said OKAY to the transport)."""
        connections = self._sockets.get(payload.removeprefix("localabstract:"))
        if connections is None:
            writer.write(b"FAIL0006closed")  # nothing listens there: adbd closes it
            return
        writer.write(b"OKAY")
        done = asyncio.Event()
        connections.put_nowait((reader, writer, done))
        await done.wait()

    async def _serve(self, video: Any, control: Any, max_fps: int) -> None:
        """Frames out on the video socket, control messages in, until either closes."""
        tasks = [
            asyncio.ensure_future(self._stream(video[1], max_fps)),
            asyncio.ensure_future(self._control(control[0])),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            for _, writer, done in (video, control):
                writer.close()
                done.set()

    async def _stream(self, writer: asyncio.StreamWriter, max_fps: int) -> None:
        width, height = self.display
        name = self.props["ro.product.model"].encode()
        writer.write(name.ljust(scrcpy.DEVICE_NAME_BYTES, b"\0"))
        writer.write(scrcpy.VIDEO_META.pack(scrcpy.CODEC_H264, width, height))
        encoder, started, frame = Encoder(width, height, gop=10 * max_fps), time.monotonic(), 0
        while True:
            if self._reset:  # MediaCodec restarted: its first frame is a key frame
                self._reset, encoder = False, Encoder(width, height, gop=10 * max_fps)
            pts = int((time.monotonic() - started) * 1_000_000)
            for packet in encoder.encode(self._picture(frame), pts):
                if packet.key:  # MediaCodec's codec-config buffer, then the frame
                    config, rest = _split_config(packet.data)
                    writer.write(encode_packet(config, 0, config=True))
                    writer.write(encode_packet(rest, pts, key=True))
                else:
                    writer.write(encode_packet(packet.data, pts))
            await writer.drain()
            frame += 1
            await asyncio.sleep(1.0 / max_fps)

    def _picture(self, frame: int) -> bytes:
        width, height = self.display
        rows = bytearray(bytes((40, 90, 160)) * width * height)
        bar = (frame * 8) % height
        rows[bar * width * 3 : (bar + 4) * width * 3] = bytes((250, 250, 250)) * width * 4
        if self._mark is not None:
            x0, y0 = (max(0, v - MARK // 2) for v in self._mark)
            for y in range(y0, min(height, y0 + MARK)):
                at = (y * width + x0) * 3
                run = min(MARK, width - x0)
                rows[at : at + run * 3] = bytes(RED) * run
        return bytes(rows)

    async def _control(self, reader: asyncio.StreamReader) -> None:
        buffer = b""
        while chunk := await reader.read(4096):
            buffer += chunk
            while True:
                message, buffer = read_control(buffer)
                if message is None:
                    break
                self._apply(*message)

    def _apply(self, kind: int, fields: tuple[Any, ...]) -> None:
        now = time.monotonic()
        if kind == scrcpy.TYPE_INJECT_TOUCH_EVENT:
            action, _pointer, x, y, width, height, _pressure = fields
            if (width, height) != self.display:
                self.received.append(Received(now, "ignored", fields))
                return
            if action == scrcpy.TOUCH_DOWN:
                self._mark = (x, y)
            self.received.append(Received(now, "touch", (action, x, y)))
        elif kind == scrcpy.TYPE_INJECT_KEYCODE:
            self.received.append(Received(now, "key", fields[:2]))
        elif kind == scrcpy.TYPE_RESET_VIDEO:
            self.received.append(Received(now, "reset", ()))
            self._reset = True
        else:
            self.received.append(Received(now, "text", fields))

    def touches(self) -> list[tuple[int, int, int]]:
        return [r.fields for r in self.received if r.kind == "touch"]


def _split_config(data: bytes) -> tuple[bytes, bytes]:
    """A key frame's SPS and PPS, and the rest of it, each in Annex B form."""
    units = nal_units(data)
    config = [u for u in units if nal_type(u) in (NAL_SPS, NAL_PPS)]
    rest = [u for u in units if nal_type(u) not in (NAL_SPS, NAL_PPS)]
    join = lambda parts: b"".join(b"\0" + START_CODE + u for u in parts)  # noqa: E731
    return join(config), join(rest)


def encode_packet(data: bytes, pts_us: int, config: bool = False, key: bool = False) -> bytes:
    """A packet as the server writes it (device/Streamer.java's writeFrameMeta)."""
    flags = scrcpy.FLAG_CONFIG if config else pts_us | (scrcpy.FLAG_KEY_FRAME if key else 0)
    return scrcpy.PACKET_HEADER.pack(flags, len(data)) + data


CONTROL_SIZES = {
    scrcpy.TYPE_INJECT_KEYCODE: 14,
    scrcpy.TYPE_INJECT_TOUCH_EVENT: 32,
    scrcpy.TYPE_RESET_VIDEO: 1,
}


def read_control(data: bytes) -> tuple[tuple[int, tuple[Any, ...]] | None, bytes]:
    """The first control message in `data` as (type, fields) and what follows it, or None
    and `data` when it is not all there yet (ControlMessageReader.java's layouts)."""
    if not data:
        return None, data
    kind = data[0]
    if kind == scrcpy.TYPE_INJECT_TEXT:
        if len(data) < 5:
            return None, data
        (length,) = struct.unpack(">I", data[1:5])
        if len(data) < 5 + length:
            return None, data
        return (kind, (data[5 : 5 + length].decode(),)), data[5 + length :]
    size = CONTROL_SIZES.get(kind)
    if size is None:
        raise ValueError(f"control message type {kind}")
    if len(data) < size:
        return None, data
    if kind == scrcpy.TYPE_INJECT_KEYCODE:
        return (kind, struct.unpack(">Biii", data[1:size])), data[size:]
    if kind == scrcpy.TYPE_RESET_VIDEO:
        return (kind, ()), data[size:]
    action, pointer, x, y, w, h, pressure, _, _ = struct.unpack(">BQiiHHHii", data[1:size])
    return (kind, (action, pointer, x, y, w, h, pressure)), data[size:]
