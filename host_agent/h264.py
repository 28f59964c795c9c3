"""H.264 as the live screens carry it: one access unit per frame in Annex B form (NAL units
after 00 00 01 start codes), a key frame with its SPS and PPS in front, and the codec
string a decoder is set up with (RFC 6381 `avc1.PPCCLL`, read from the SPS).

Whatever encodes a phone's screen (scrcpy's server on a real phone, PyAV's libx264 for a
simulated one: host_agent.video_encoder) hands its packets to the live screens as
`VideoPacket`s; nothing here decodes or re-encodes a picture.
"""

from __future__ import annotations

import dataclasses

START_CODE = b"\x00\x00\x01"
# NAL unit types (ITU-T H.264 table 7-1) the live screens look at.
NAL_IDR, NAL_SPS, NAL_PPS = 5, 7, 8
MIME = "video/h264"


@dataclasses.dataclass(frozen=True)
class VideoPacket:
    """One encoded frame: an access unit in Annex B form."""

    data: bytes
    # Decodes alone: an IDR, its SPS and PPS in front.
    key: bool
    # The encoder's presentation time, in microseconds from its start.
    pts_us: int
    # On a key frame: the codec string and the decoded pictures' size.
    codec: str = ""
    width: int = 0
    height: int = 0


def is_annex_b(data: bytes) -> bool:
    """Whether `data` starts with a start code (00 00 01, or 00 00 00 01)."""
    return data.startswith(START_CODE) or data.startswith(b"\x00" + START_CODE)


def nal_units(data: bytes) -> list[bytes]:
    """The NAL units of an Annex B byte string, without their start codes."""
    units: list[bytes] = []
    at = data.find(START_CODE)
    while at >= 0:
        begin = at + len(START_CODE)
        following = data.find(START_CODE, begin)
        end = len(data) if following < 0 else following
        unit = data[begin:end]
        if following >= 0 and unit.endswith(b"\x00"):
            unit = unit[:-1]  # the leading zero of a four-byte start code
        if unit:
            units.append(unit)
        at = following
    return units


def nal_type(unit: bytes) -> int:
    return unit[0] & 0x1F if unit else 0


def codec_string(data: bytes) -> str:
    """`avc1.PPCCLL` from the first SPS in `data` (profile, constraint flags, level), or ""
    when it holds none."""
    for unit in nal_units(data):
        if nal_type(unit) == NAL_SPS and len(unit) >= 4:
            return "avc1." + unit[1:4].hex()
    return ""


def has_idr(data: bytes) -> bool:
    return any(nal_type(unit) == NAL_IDR for unit in nal_units(data))


class Merger:
    """Configuration packets (SPS and PPS, sent apart, as scrcpy's server and MediaCodec
    do) kept and put in front of the next frame, so that every key frame decodes alone (as
    scrcpy's own client merges them: app/src/packet_merger.c)."""

    def __init__(self) -> None:
        self._config = b""

    def config(self, data: bytes) -> None:
        self._config = data

    def frame(self, data: bytes, key: bool) -> bytes:
        """The frame, with the latest configuration in front when it is a key frame."""
        if key and self._config and codec_string(data) == "":
            return self._config + data
        return data
