"""Still frames of a phone's screen (a PNG from `screencap`, a simulated phone's drawing):
their size and type read from their header, and a PNG too large to send made a JPEG.

A frame over MAX_FRAME_BYTES (the control plane takes messages up to 1 MiB) is sent as a
JPEG when Pillow is installed (the `jpeg` extra; a real phone's full-size PNG can be 1-3
MB), else not at all. Simulated phones' frames (~15 KB PNGs, smaller than as JPEGs) go as
they are.
"""

from __future__ import annotations

import asyncio
import io
import struct
import time

import structlog

from amc.v1 import scheduler_pb2
from host_agent import metrics
from host_agent.devices import Device

log = structlog.get_logger(__name__)

# The control plane's largest message is 1 MiB: a frame and its few fields must fit.
MAX_FRAME_BYTES = (1 << 20) - 4096
# A frame over MAX_FRAME_BYTES (a real phone's full-size PNG can be 1-3 MB) is sent as a
# JPEG of this quality instead, when Pillow is installed (~130-300 KB at 1080 x 2400).
JPEG_QUALITY = 80


def image_size(data: bytes) -> tuple[int, int, str]:
    """Width, height and MIME type of a PNG or JPEG (0, 0 and PNG when unreadable)."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return width, height, "image/png"
    if data[:2] == b"\xff\xd8":
        at = 2
        while at + 9 < len(data):
            if data[at] != 0xFF:
                break
            marker, length = data[at + 1], int.from_bytes(data[at + 2 : at + 4], "big")
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):
                height, width = struct.unpack(">HH", data[at + 5 : at + 9])
                return width, height, "image/jpeg"
            at += 2 + length
        return 0, 0, "image/jpeg"
    return 0, 0, "image/png"


def to_jpeg(image: bytes, quality: int = JPEG_QUALITY) -> bytes | None:
    """`image` (a PNG) as a JPEG, or None without Pillow (the `jpeg` extra) or when it
    cannot be read."""
    try:
        from PIL import Image
    except ImportError:
        return None
    try:
        with Image.open(io.BytesIO(image)) as picture:
            out = io.BytesIO()
            picture.convert("RGB").save(out, "JPEG", quality=quality)
            return out.getvalue()
    except (OSError, ValueError):
        return None


def still_frame(
    device: Device, seq: int, data: bytes, running: tuple[str, int] | None
) -> scheduler_pb2.ScreenFrame:
    """A captured image as its ScreenFrame: its width and height are the phone's screen in
    its own pixels (what a tap's coordinates are in), for a phone whose frames are drawn
    smaller too; `running` is the attempt the phone ran all through the capture."""
    width, height, mime = image_size(data)
    screen_size = getattr(device, "screen_size", None)
    if screen_size is not None:
        width, height = screen_size()
    task_id, attempt = running or ("", 0)
    return scheduler_pb2.ScreenFrame(
        serial=device.serial,
        seq=seq,
        width=width,
        height=height,
        mime=mime,
        captured_at_ms=int(time.time() * 1000),
        data=data,
        running=scheduler_pb2.FrameTask(task_id=task_id, attempt=attempt),
    )


_said_no_jpeg = False


async def smaller(frame: scheduler_pb2.ScreenFrame) -> scheduler_pb2.ScreenFrame:
    """A frame too large to send, as a JPEG (Pillow, off the event loop); as it is when
    Pillow is not installed or cannot read it (then it is not sent)."""
    global _said_no_jpeg
    data = await asyncio.to_thread(to_jpeg, frame.data)
    if data is None:
        if not _said_no_jpeg:
            _said_no_jpeg = True
            log.warning(
                "a screen frame is over 1 MiB and Pillow is not installed: such frames"
                " are not sent (pip install 'agentic-mobile-control[jpeg]')",
                device=frame.serial,
                size=len(frame.data),
            )
        return frame
    metrics.SCREEN_FRAMES_JPEG.inc()
    jpeg = scheduler_pb2.ScreenFrame()
    jpeg.CopyFrom(frame)
    jpeg.data, jpeg.mime = data, "image/jpeg"
    return jpeg
