"""A task's screen recording as video: the phone's H.264 stream (the frames the live
screens' capture sends its viewers: host_agent.videocast) muxed into one MP4 with PyAV,
with no decoding and no re-encoding, kept as an artifact of kind "screen_video"
(video/mp4), which a browser plays in a <video> element.

It starts at the stream's first key frame (the worker asks for one as it starts) and
keeps every frame from there, each at its encoder's presentation time, so the video runs
as the screen did (a still screen makes few frames: scrcpy's server sends one only when
the screen changes or every 100 ms). Bounded: at most `max_seconds` of video and
`max_bytes` of frames; at the first frame past a bound, or of another size (a rotation),
the recording ends there (a stream cannot leave a frame out and go on) and the rest is
counted in `skipped`; the run goes on.
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any

from amc.v1 import scheduler_pb2
from host_agent.h264 import NAL_PPS, NAL_SPS, START_CODE, nal_type, nal_units

MICROSECONDS = Fraction(1, 1_000_000)
# The MP4 container's own bytes beside the frames (its moov index: ~16 bytes a frame).
OVERHEAD_PER_FRAME = 24


class VideoRecording:
    """Frames of the stream kept while a task runs, then one MP4."""

    def __init__(self, max_seconds: float, max_bytes: int) -> None:
        self._most_us = int(max_seconds * 1_000_000)
        self._most_bytes = max_bytes
        self._frames: list[tuple[int, bytes, bool]] = []  # (pts_us, data, key)
        self._bytes = 4096
        self._size: tuple[int, int] | None = None
        self._config = b""
        self._ended = False
        self.skipped = 0

    @property
    def frames(self) -> int:
        return len(self._frames)

    def add(self, frame: scheduler_pb2.ScreenFrame) -> None:
        if self._ended or (not self._frames and not frame.key_frame):
            self.skipped += 1  # not started at a key frame yet, or over
            return
        if frame.key_frame:
            size = (frame.video.coded_width, frame.video.coded_height)
            if self._size is None:
                self._size = size
                self._config = _config_of(frame.data)
            elif size != self._size:
                self._end()
                return
        first = self._frames[0][0] if self._frames else frame.pts_us
        size_after = self._bytes + len(frame.data) + OVERHEAD_PER_FRAME
        if frame.pts_us - first > self._most_us or size_after > self._most_bytes:
            self._end()
            return
        if self._frames and frame.pts_us <= self._frames[-1][0]:
            self.skipped += 1  # out of order: an encoder restarted under the recording
            return
        self._frames.append((frame.pts_us, frame.data, frame.key_frame))
        self._bytes = size_after

    def _end(self) -> None:
        self._ended = True
        self.skipped += 1

    def mp4(self) -> bytes | None:
        """The video, or None without frames."""
        if not self._frames or self._size is None:
            return None
        import av

        out = io.BytesIO()
        container: Any = av.open(out, "w", format="mp4")
        stream = container.add_stream("h264")
        stream.width, stream.height = self._size
        stream.pix_fmt = "yuv420p"
        stream.time_base = MICROSECONDS
        stream.codec_context.extradata = self._config
        start = self._frames[0][0]
        for pts, data, key in self._frames:
            packet = av.Packet(data)
            packet.stream = stream
            packet.pts = packet.dts = pts - start
            packet.time_base = MICROSECONDS
            packet.is_keyframe = key
            container.mux(packet)
        container.close()
        return out.getvalue()


def _config_of(data: bytes) -> bytes:
    """A key frame's SPS and PPS (Annex B): the MP4's decoder configuration."""
    units = [u for u in nal_units(data) if nal_type(u) in (NAL_SPS, NAL_PPS)]
    return b"".join(b"\0" + START_CODE + u for u in units)
