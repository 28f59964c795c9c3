"""Pictures drawn on the host (a simulated phone's live frames) encoded as H.264 with PyAV,
FFmpeg's maintained binding (its wheels ship FFmpeg with libx264): the `video` extra.

libx264 runs as a live encoder would on a phone: zerolatency (no B-frames, no look-ahead:
a frame in, its packet out), constrained baseline (what every browser's decoder takes), a
key frame every `gop` frames and on demand (`encode(..., key=True)`: a viewer that fell
behind, or a recording that starts), each key frame with its SPS and PPS in-band. Its
preset is veryfast, not ultrafast: ultrafast leaves out the intra analysis that text on
flat colours needs, and its key frames of a phone's screen are twice veryfast's (~30 kB
against ~16 kB at 360 x 800), its P-frames a fifth bigger, for no less encoding time
(~2 ms a frame either way; docs/performance.md). Without PyAV (`available()` is False)
a simulated phone has no stream and its viewers are sent still images.
"""

from __future__ import annotations

import importlib.util
from fractions import Fraction
from typing import Any

from host_agent.h264 import VideoPacket, codec_string

# A key frame at least this often (in frames) when none is asked for.
DEFAULT_GOP = 30
MICROSECONDS = Fraction(1, 1_000_000)


def available() -> bool:
    """Whether PyAV is installed (the `video` extra)."""
    return importlib.util.find_spec("av") is not None


class Encoder:
    """RGB pictures of one size in, H.264 packets out (Annex B), one packet per picture."""

    def __init__(self, width: int, height: int, gop: int = DEFAULT_GOP) -> None:
        import av

        self.width, self.height = width, height
        context: Any = av.CodecContext.create("libx264", "w")
        context.width, context.height = width, height
        context.pix_fmt = "yuv420p"
        context.time_base = MICROSECONDS
        context.gop_size = gop
        context.options = {
            "preset": "veryfast",
            "tune": "zerolatency",
            "profile": "baseline",
            "forced-idr": "1",
            "crf": "26",
        }
        self._context = context
        self._frame_type: Any = av.VideoFrame
        self._key_type: Any = av.video.frame.PictureType.I

    def encode(self, rgb: bytes, pts_us: int, key: bool = False) -> list[VideoPacket]:
        """One picture (`width` x `height` x 3 bytes of RGB) and its presentation time."""
        frame = self._frame_type(self.width, self.height, "rgb24")
        _fill(frame, rgb, self.width * 3)
        frame = frame.reformat(format="yuv420p")
        frame.pts = pts_us
        frame.time_base = MICROSECONDS
        if key:
            frame.pict_type = self._key_type
        return [self._packet(p) for p in self._context.encode(frame)]

    def close(self) -> list[VideoPacket]:
        """What the encoder still holds (none with zerolatency), and it is done."""
        return [self._packet(p) for p in self._context.encode(None)]

    def _packet(self, packet: Any) -> VideoPacket:
        data = bytes(packet)
        key = bool(packet.is_keyframe)
        return VideoPacket(
            data=data,
            key=key,
            pts_us=int(packet.pts or 0),
            codec=codec_string(data) if key else "",
            width=self.width if key else 0,
            height=self.height if key else 0,
        )


def _fill(frame: Any, rgb: bytes, stride: int) -> None:
    """`rgb`'s rows into the frame's first plane, whose rows may be padded."""
    plane = frame.planes[0]
    if plane.line_size == stride:
        plane.update(rgb)
        return
    padded = bytearray(plane.line_size * frame.height)
    for row in range(frame.height):
        at = row * plane.line_size
        padded[at : at + stride] = rgb[row * stride : (row + 1) * stride]
    plane.update(bytes(padded))
