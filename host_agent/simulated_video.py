"""A simulated phone's screen as H.264: its live frames (host_agent.simulated_screen, the
same drawing as its still frames) encoded with PyAV (host_agent.video_encoder) as they are
drawn, at the frame rate its viewers ask, a key frame every KEY_INTERVAL seconds and
when one is asked for (a viewer joined or fell behind: at most one each ASKED_INTERVAL).

Like a still frame, a stream's frame is not an action: it is not in the phone's action
log and never waits for a running action; an unplugged phone's stream ends DeviceLost,
a hung one's waits and then times out as its `screencap` would.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from host_agent import video_encoder
from host_agent.devices import DeviceLost, DeviceTimeout, VideoFps, VideoUnavailable
from host_agent.h264 import VideoPacket
from host_agent.simulated_screen import SCREENSHOT_SIZE, live_pixels

if TYPE_CHECKING:
    from host_agent.simulated import SimulatedSource

# A key frame at least this often, in seconds (scrcpy's server's own interval), and one
# asked for at most this often.
KEY_INTERVAL = 10.0
ASKED_INTERVAL = 0.5
# How long a hung phone's stream waits for a frame before it times out.
HUNG_TIMEOUT = 10.0


class SimulatedVideo:
    """One simulated phone's stream (a `host_agent.devices.VideoStream`)."""

    def __init__(self, source: SimulatedSource, serial: str, fps: VideoFps) -> None:
        width, height = SCREENSHOT_SIZE
        self._encoder = video_encoder.Encoder(width, height, gop=10_000)
        self._source, self._serial, self._fps = source, serial, fps
        self._started = time.monotonic()
        self._due = self._started
        self._key_at = 0.0  # the next key frame's time (the first one at once)
        self._asked_at = -ASKED_INTERVAL

    async def next(self) -> VideoPacket:
        clock = time.monotonic
        wait = self._due - clock()
        if wait > 0:
            await asyncio.sleep(wait)
        self._due = max(clock(), self._due) + 1.0 / max(1, self._fps())
        source, serial = self._source, self._serial
        if not source.is_plugged(serial):
            raise DeviceLost(f"device lost: {serial} is not attached")
        if source.body(serial).hung:
            await asyncio.sleep(HUNG_TIMEOUT)
            raise DeviceTimeout(f"{serial}: screen stream: no answer")
        now = clock()
        key = now >= self._key_at
        if key:
            self._key_at = now + KEY_INTERVAL
        source.captures += 1
        rgb = live_pixels(serial, source.screens[serial])
        pts = int((now - self._started) * 1_000_000)
        packets = await asyncio.to_thread(self._encoder.encode, rgb, pts, key)
        if not packets:  # an encoder that buffers (not libx264 with zerolatency)
            return await self.next()
        return packets[0]

    def want_key_frame(self) -> None:
        now = time.monotonic()
        if now - self._asked_at >= ASKED_INTERVAL:
            self._asked_at, self._key_at = now, 0.0

    async def close(self) -> None:
        """Nothing held but the encoder, which goes with this object."""


def open_stream(source: SimulatedSource, serial: str, fps: VideoFps) -> SimulatedVideo:
    """The phone's stream; VideoUnavailable without PyAV or with the source's video off."""
    if not source.video:
        raise VideoUnavailable(f"{serial}: this simulated phone has no video stream")
    if not video_encoder.available():
        raise VideoUnavailable(f"{serial}: no H.264 encoder (pip install '…[video]': PyAV)")
    return SimulatedVideo(source, serial, fps)
