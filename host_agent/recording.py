"""A task's recording of its phone's screen (TaskSpec.record_screen), kept as one artifact:
an MP4 of the phone's H.264 stream where it has one (kind "screen_video":
host_agent.recording_mp4), else an animated PNG of its still frames (kind
"screen_recording"), which a browser plays as an image (`Recorder` takes either).

The frames come from the live screens' capture loop (host_agent.screencast: one capture per
phone for the recording and any viewers together), at most `fps` a second while the task
runs. Bounded: at most `max_frames` frames and `max_bytes` bytes; frames past a bound are
left out (counted in `skipped`), the run goes on. Each frame is shown until the next one
was captured (its delay); the last one for a second. Frames must all be PNGs of the first
one's size and pixel format (screencap's are): another is left out too.

APNG: the first frame's IHDR, an `acTL` (frame count, loop forever), then per frame an
`fcTL` (its size and delay) and its image data: the first frame's IDAT chunks as they are,
the others' as `fdAT` chunks (a sequence number before the same bytes).
"""

from __future__ import annotations

import dataclasses
import struct
import zlib

from amc.v1 import scheduler_pb2
from host_agent import video_encoder
from host_agent.h264 import MIME
from host_agent.recording_mp4 import VideoRecording

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# What a run's recording is kept with: its last step, at an action index no action of a
# step reaches (a spec has at most 1,000 actions in all: index 999 is past them).
ACTION_INDEX = 999
LAST_FRAME_MS = 1000


@dataclasses.dataclass(frozen=True)
class Settings:
    fps: int
    max_frames: int
    max_bytes: int


SCREEN_RECORDING, SCREEN_VIDEO = "screen_recording", "screen_video"


def settings_from(fps: int, max_frames: int, max_bytes: int) -> Settings:
    """A TaskSpec.record_screen's settings (0: the defaults, 2 a second, 600 frames)."""
    return Settings(fps=fps or 2, max_frames=max_frames or 600, max_bytes=max_bytes)


def _chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    """(type, data) of each chunk of a PNG."""
    if not png.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG")
    at, found = len(PNG_SIGNATURE), []
    while at + 8 <= len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind = png[at + 4 : at + 8]
        found.append((kind, png[at + 8 : at + 8 + length]))
        at += 12 + length
    return found


def _chunk(kind: bytes, data: bytes) -> bytes:
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))


class Recording:
    """Frames kept while a task runs, then one APNG."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._ihdr: bytes | None = None
        self._frames: list[tuple[int, list[bytes]]] = []  # (captured_at_ms, IDAT datas)
        self._bytes = 0
        self.skipped = 0

    @property
    def frames(self) -> int:
        return len(self._frames)

    def add(self, frame: scheduler_pb2.ScreenFrame) -> None:
        try:
            chunks = _chunks(frame.data)
        except ValueError:
            self.skipped += 1
            return
        ihdr = next((data for kind, data in chunks if kind == b"IHDR"), None)
        idats = [data for kind, data in chunks if kind == b"IDAT"]
        size = sum(len(d) for d in idats) + 64
        full = len(self._frames) >= self.settings.max_frames
        if ihdr is None or not idats or full or self._bytes + size > self.settings.max_bytes:
            self.skipped += 1
            return
        if self._ihdr is None:
            self._ihdr = ihdr
        elif ihdr != self._ihdr:
            self.skipped += 1  # rotated, or another format: not in this animation
            return
        self._frames.append((frame.captured_at_ms, idats))
        self._bytes += size

    def apng(self) -> bytes | None:
        """The animation, or None without frames."""
        if self._ihdr is None or not self._frames:
            return None
        width, height = struct.unpack(">II", self._ihdr[:8])
        out = [PNG_SIGNATURE, _chunk(b"IHDR", self._ihdr)]
        out.append(_chunk(b"acTL", struct.pack(">II", len(self._frames), 0)))
        seq = 0
        for i, (at, idats) in enumerate(self._frames):
            following = self._frames[i + 1][0] if i + 1 < len(self._frames) else None
            delay = max(1, min(65535, following - at)) if following else LAST_FRAME_MS
            control = struct.pack(">IIIIIHHBB", seq, width, height, 0, 0, delay, 1000, 0, 0)
            out.append(_chunk(b"fcTL", control))
            seq += 1
            for data in idats:
                if i == 0:
                    out.append(_chunk(b"IDAT", data))
                else:
                    out.append(_chunk(b"fdAT", struct.pack(">I", seq) + data))
                    seq += 1
        out.append(_chunk(b"IEND", b""))
        return b"".join(out)


class Recorder:
    """A task's recording, whichever the phone gives: its stream's frames (when PyAV is
    here to mux them: `video`) kept as an MP4 of at most `max_frames / fps` seconds, or
    its still frames as an APNG of at most `max_frames` frames; both at most `max_bytes`."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.video = video_encoder.available()
        self._apng = Recording(settings)
        self._mp4 = VideoRecording(settings.max_frames / settings.fps, settings.max_bytes)

    def add(self, frame: scheduler_pb2.ScreenFrame) -> None:
        if frame.mime == MIME:
            self._mp4.add(frame)
        else:
            self._apng.add(frame)

    def kept(self) -> tuple[str, bytes, str] | None:
        """(kind, file, what it holds), or None without frames."""
        if self._mp4.frames:
            data = self._mp4.mp4()
            if data is not None:
                held = f"{self._mp4.frames} video frames, {self._mp4.skipped} left out"
                return SCREEN_VIDEO, data, held
        data = self._apng.apng()
        if data is None:
            return None
        return SCREEN_RECORDING, data, f"{self._apng.frames} frames, {self._apng.skipped} left out"
