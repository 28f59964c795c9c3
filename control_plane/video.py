"""A phone's H.264 stream on a replica, wire-free: the frames since its latest key frame
(`Gop`), which every viewer of the stream reads at its own pace, and the checks a host's
frames pass before they go to viewers (`check_frame`, `RateGate`).

No frame is decoded or re-encoded here: a frame is passed on as the host sent it. A viewer
that joins starts at the latest key frame (the frames since it go at once, so its decoder
has a picture within one key-frame interval); a viewer that falls behind (its transport
takes frames slower than the stream makes them) finds, once a newer key frame has come,
that the frames it was due are gone and goes on from that key frame: it skips, it never
queues, and what a replica holds per phone is one group of pictures, whatever its viewers
number. A group that grows past its bound (a stream with no key frame for long) is dropped
and the stream waits for the next key frame.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from control_plane import metrics

MIME = "video/h264"
# A viewer's codec choice (WatchScreenRequest.codec): "" or "image", or the stream.
IMAGE, H264 = "image", "h264"
CODECS = (IMAGE, H264)
# The most one phone's group of pictures holds before it is dropped.
GOP_FRAMES = 600
GOP_BYTES = 16 << 20
# The most a host may send for one phone in a second: twice the fastest a viewer may ask
# (30 frames), and bytes far past a screen's stream (a few Mbit/s) or still frames (the
# agent's --screen-max-rate is 4 MB/s). Past it, frames are skipped.
MOST_FRAMES_PER_SECOND = 60
MOST_BYTES_PER_SECOND = 16 << 20

Frame = Any  # an amc.v1.ScreenFrame, passed on as it came


def is_video(frame: Frame) -> bool:
    return str(frame.mime) == MIME


def check_frame(frame: Frame) -> str | None:
    """Why a host's frame of the stream cannot be passed on (None: it can): not Annex B
    (cut short, or not H.264), or a key frame without its decoder's parameters."""
    data: bytes = frame.data
    if not (data.startswith(b"\x00\x00\x01") or data.startswith(b"\x00\x00\x00\x01")):
        return "not an H.264 access unit in Annex B form"
    if frame.key_frame and not frame.video.codec.startswith("avc1."):
        return "a key frame without its codec"
    if frame.key_frame and not (frame.video.coded_width > 0 and frame.video.coded_height > 0):
        return "a key frame without its coded size"
    return None


class RateGate:
    """What one phone's host may send in a second (a one-second window)."""

    def __init__(
        self, frames: int = MOST_FRAMES_PER_SECOND, size: int = MOST_BYTES_PER_SECOND
    ) -> None:
        self._most = (frames, size)
        self._window = 0.0
        self._frames = 0
        self._bytes = 0

    def admit(self, size: int, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if now - self._window >= 1.0:
            self._window, self._frames, self._bytes = now, 0, 0
        most_frames, most_bytes = self._most
        if self._frames + 1 > most_frames or self._bytes + size > most_bytes:
            return False
        self._frames += 1
        self._bytes += size
        return True


@dataclasses.dataclass
class Gop:
    """One phone's frames since its latest key frame, numbered from the stream's first."""

    frames: list[Frame] = dataclasses.field(default_factory=list)
    # The number of frames[0]; the next frame's number is base + len(frames).
    base: int = 0
    size: int = 0
    # Frames are dropped until the next key frame (a frame was skipped, or the group was
    # too big).
    broken: bool = True

    @property
    def end(self) -> int:
        return self.base + len(self.frames)

    def add(self, frame: Frame) -> bool:
        """The frame in its place: a key frame starts a new group. False when it was
        dropped (no key frame since the stream broke)."""
        if frame.key_frame:
            self.base, self.frames, self.size, self.broken = self.end, [], 0, False
        elif self.broken:
            metrics.SCREEN_FRAMES.labels("awaiting_key_frame").inc()
            return False
        if len(self.frames) >= GOP_FRAMES or self.size + len(frame.data) > GOP_BYTES:
            self.lose()
            metrics.SCREEN_FRAMES.labels("gop_too_big").inc()
            return False
        self.frames.append(frame)
        self.size += len(frame.data)
        return True

    def lose(self) -> None:
        """A frame of the stream was lost: those after it wait for a key frame."""
        self.base, self.frames, self.size, self.broken = self.end, [], 0, True

    def at(self, position: int) -> tuple[Frame | None, int]:
        """The frame a viewer due `position` is sent next, and the position after it: the
        same frame when it is still held, the group's key frame when the viewer was left
        behind (a skip), None when it has nothing newer yet (its position unchanged, or
        moved to the group's end when the group it was in is gone and none began)."""
        if position < self.base:
            if not self.frames:
                return None, self.base
            metrics.SCREEN_FRAMES.labels("skipped_to_key_frame").inc()
            position = self.base
        if position >= self.end:
            return None, position
        return self.frames[position - self.base], position + 1
