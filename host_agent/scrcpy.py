"""scrcpy's server, its wire protocol as of scrcpy v3.3.4 (the version the agent pins, with
its checksum): how it is started, what its sockets carry, and its control messages.

Read from scrcpy's own source at the tag v3.3.4: server/…/Options.java (the arguments:
the version first, then key=value), device/DesktopConnection.java (with
`tunnel_forward=true` the server listens on the abstract socket `scrcpy_<scid as 8 hex
digits>` and takes its connections in order: video, then control; the first one gets one
dummy byte, then the device's name in 64 bytes, NUL-padded), device/Streamer.java (the
video socket: the codec id as 4 bytes, "h264" big-endian, and the size as two 4-byte
integers; then each packet behind a 12-byte header: the PTS in 8 bytes whose top bit
marks a configuration packet and the next a key frame, and the packet's size in 4),
app/src/demuxer.c (the client reading that), control/ControlMessageReader.java (the
control socket: a type byte, then the message's fields, big-endian: an injected key
event, text, a touch event, a reset of the video encoder).

Everything here is bytes in and out; host_agent.scrcpy_link runs the server on a phone
through the adb server.
"""

from __future__ import annotations

import dataclasses
import struct

# The server this agent speaks to: its version (the server refuses any other client's)
# and the SHA-256 scrcpy publishes for its release file, scrcpy-server-v3.3.4.
VERSION = "3.3.4"
SHA256 = "8588238c9a5a00aa542906b6ec7e6d5541d9ffb9b5d0f6e1bc0e365e2303079e"
# Where it is pushed on the phone (it stays there: `cleanup=false`).
REMOTE_PATH = f"/data/local/tmp/amc-scrcpy-server-{VERSION}.jar"

CODEC_H264 = int.from_bytes(b"h264", "big")
# The codec ids that say the stream is off: disabled (0), or failed to configure (1).
CODEC_DISABLED, CODEC_ERROR = 0, 1
DEVICE_NAME_BYTES = 64
VIDEO_META = struct.Struct(">III")
PACKET_HEADER = struct.Struct(">QI")
FLAG_CONFIG = 1 << 63
FLAG_KEY_FRAME = 1 << 62
PTS_MASK = FLAG_KEY_FRAME - 1
# The largest packet taken from a phone (a key frame at 8 Mbit/s is far smaller).
MOST_PACKET_BYTES = 8 << 20

# Control messages (ControlMessage.java) and Android's actions.
TYPE_INJECT_KEYCODE, TYPE_INJECT_TEXT, TYPE_INJECT_TOUCH_EVENT = 0, 1, 2
# The encoder restarted: a configuration packet and a key frame follow (Controller.java).
TYPE_RESET_VIDEO = 17
KEY_DOWN, KEY_UP = 0, 1  # KeyEvent.ACTION_*
TOUCH_DOWN, TOUCH_UP, TOUCH_MOVE = 0, 1, 2  # MotionEvent.ACTION_*
# A touch by a finger (SC_POINTER_ID_GENERIC_FINGER: app/src/control_msg.h).
POINTER_FINGER = (1 << 64) - 2
PRESSURE_FULL = 0xFFFF
# The most bytes of text one message injects (ControlMessageReader.INJECT_TEXT_MAX_LENGTH).
TEXT_MAX_BYTES = 300


class ProtocolError(Exception):
    """The server sent something its protocol does not allow."""


def socket_name(scid: int) -> str:
    return f"scrcpy_{scid:08x}"


def server_command(scid: int, max_fps: int, version: str = VERSION) -> str:
    """The shell command that runs the server: video (H.264) and control, no audio, over a
    forwarded tunnel (the server listens), the jar left on the phone for next time. Its
    key frames: its encoder's every 10 s, and one whenever the agent resets it."""
    options = [
        f"scid={scid:08x}",
        "log_level=info",
        "tunnel_forward=true",
        "audio=false",
        "control=true",
        "video_codec=h264",
        f"max_fps={max_fps}",
        "cleanup=false",
        "send_device_meta=true",
        "send_frame_meta=true",
        "send_dummy_byte=true",
        "send_codec_meta=true",
    ]
    return (
        f"CLASSPATH={REMOTE_PATH} app_process / com.genymobile.scrcpy.Server {version} "
        + " ".join(options)
    )


def device_name(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", errors="replace")


@dataclasses.dataclass(frozen=True)
class VideoMeta:
    codec: int
    width: int
    height: int


def video_meta(data: bytes) -> VideoMeta:
    """The video socket's first 12 bytes: codec id, width, height."""
    codec, width, height = VIDEO_META.unpack(data)
    if codec == CODEC_DISABLED:
        raise ProtocolError("the phone disabled the video stream")
    if codec == CODEC_ERROR:
        raise ProtocolError("the phone could not configure its video encoder")
    if codec != CODEC_H264:
        raise ProtocolError(f"the phone streams codec {codec:#010x}, not h264")
    if not (0 < width <= 16384 and 0 < height <= 16384):
        raise ProtocolError(f"the phone's video size {width} x {height} is not a size")
    return VideoMeta(codec, width, height)


@dataclasses.dataclass(frozen=True)
class PacketHeader:
    config: bool
    key: bool
    pts_us: int
    size: int


def packet_header(data: bytes) -> PacketHeader:
    """A packet's 12-byte header."""
    flags, size = PACKET_HEADER.unpack(data)
    if not 0 < size <= MOST_PACKET_BYTES:
        raise ProtocolError(f"a packet of {size} bytes")
    config = bool(flags & FLAG_CONFIG)
    return PacketHeader(
        config, bool(flags & FLAG_KEY_FRAME), 0 if config else flags & PTS_MASK, size
    )


# -- control messages ---------------------------------------------------------------------


def touch(action: int, x: int, y: int, width: int, height: int, pressure: int) -> bytes:
    """An injected touch (a finger) at (x, y) of a screen `width` x `height` (the video's
    size: the server drops a touch given for another size)."""
    return struct.pack(
        ">BBQiiHHHii",
        TYPE_INJECT_TOUCH_EVENT,
        action,
        POINTER_FINGER,
        x,
        y,
        width,
        height,
        pressure,
        0,  # action button
        0,  # buttons
    )


def reset_video() -> bytes:
    return bytes([TYPE_RESET_VIDEO])


def keycode(action: int, code: int, repeat: int = 0, meta_state: int = 0) -> bytes:
    return struct.pack(">BBiii", TYPE_INJECT_KEYCODE, action, code, repeat, meta_state)


def text(value: str) -> bytes:
    """Injected text, at most TEXT_MAX_BYTES of UTF-8 (split longer text)."""
    data = value.encode()
    if len(data) > TEXT_MAX_BYTES:
        raise ValueError(f"scrcpy injects at most {TEXT_MAX_BYTES} bytes of text at once")
    return struct.pack(">BI", TYPE_INJECT_TEXT, len(data)) + data
