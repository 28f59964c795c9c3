"""Live screens as video on the host: a phone's H.264 stream read from its driver (scrcpy's
server on a real phone, host_agent.scrcpy_link; PyAV's encoder on a simulated one,
host_agent.simulated_video) and made into ScreenFrames as it comes, with no decoding and
no re-encoding, and the bounded queue a phone's frames wait in to be sent.

A stream cannot drop a frame the way still frames do (a P-frame needs those before it), so
each phone's frames wait in order (`VideoQueue`); when they pile up past its bound (the
link to the control plane is slower than the stream), every waiting frame is dropped, the
stream is asked for a key frame, and the phone's frames are dropped until one comes: a slow
link costs a skip to the next key frame, never a growing queue.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from amc.v1 import scheduler_pb2
from host_agent import metrics
from host_agent.devices import Device, VideoStream, VideoUnavailable
from host_agent.h264 import MIME, VideoPacket

# What one phone's frames may pile up to before they are dropped for the next key frame:
# about three seconds of a 30-frame stream, and far more bytes than a screen's stream at
# a few Mbit/s makes meanwhile.
BACKLOG_FRAMES = 90
BACKLOG_BYTES = 4 << 20

Running = Callable[[str], tuple[str, int] | None]


class VideoQueue:
    """One phone's encoded frames waiting to be sent, in order."""

    def __init__(self, most_frames: int = BACKLOG_FRAMES, most_bytes: int = BACKLOG_BYTES):
        self._frames: collections.deque[scheduler_pb2.ScreenFrame] = collections.deque()
        self._bytes = 0
        self._most = (most_frames, most_bytes)
        # Dropping frames until the next key frame.
        self.skipping = False

    def __len__(self) -> int:
        return len(self._frames)

    def put(self, frame: scheduler_pb2.ScreenFrame) -> bool:
        """Queues the frame; False when it was dropped and a key frame is wanted (the queue
        overflowed, or it is skipping and this is no key frame)."""
        if self.skipping and not frame.key_frame:
            metrics.SCREEN_FRAMES_DROPPED.labels("behind").inc()
            return True  # already asked
        self.skipping = False
        most_frames, most_bytes = self._most
        if len(self._frames) >= most_frames or self._bytes + len(frame.data) > most_bytes:
            metrics.SCREEN_FRAMES_DROPPED.labels("behind").inc(len(self._frames) + 1)
            self.clear()
            self.skipping = True
            return False
        self._frames.append(frame)
        self._bytes += len(frame.data)
        return True

    def pop(self) -> scheduler_pb2.ScreenFrame | None:
        if not self._frames:
            return None
        frame = self._frames.popleft()
        self._bytes -= len(frame.data)
        return frame

    def clear(self) -> None:
        self._frames.clear()
        self._bytes = 0


def frame_of(
    serial: str,
    seq: int,
    packet: VideoPacket,
    screen: tuple[int, int],
    running: tuple[str, int] | None,
) -> scheduler_pb2.ScreenFrame:
    """A packet as the ScreenFrame the control plane relays: the phone's screen size (what
    a tap's coordinates are in), the attempt it ran, and on a key frame the decoder's
    parameters."""
    task_id, attempt = running or ("", 0)
    frame = scheduler_pb2.ScreenFrame(
        serial=serial,
        seq=seq,
        width=screen[0] or packet.width,
        height=screen[1] or packet.height,
        mime=MIME,
        captured_at_ms=int(time.time() * 1000),
        data=packet.data,
        running=scheduler_pb2.FrameTask(task_id=task_id, attempt=attempt),
        key_frame=packet.key,
        pts_us=packet.pts_us,
    )
    if packet.key:
        frame.video.CopyFrom(
            scheduler_pb2.VideoParameters(
                codec=packet.codec, coded_width=packet.width, coded_height=packet.height
            )
        )
    return frame


async def open_stream(device: Device, fps: Callable[[], int]) -> VideoStream:
    """The phone's stream; VideoUnavailable when its driver has none."""
    opener: Any = getattr(device, "open_video", None)
    if opener is None:
        raise VideoUnavailable(f"{device.serial}: no video stream for this kind of phone")
    stream: VideoStream = await opener(fps)
    return stream


async def stream_frames(
    device: Device,
    stream: VideoStream,
    running: Running,
    deliver: Callable[[scheduler_pb2.ScreenFrame], None],
    first_seq: int,
) -> None:
    """Every packet of `stream` to `deliver` as a frame, until the stream breaks (its
    DeviceError is raised) or the caller cancels this."""
    serial = device.serial
    sized = getattr(device, "screen_size", None)
    screen: tuple[int, int] = sized() if sized is not None else (0, 0)
    seq = first_seq
    before = running(serial)
    while True:
        packet = await stream.next()
        now = running(serial)
        # The attempt the phone ran since the previous frame (none if it changed).
        during = before if now == before else None
        before = now
        seq += 1
        metrics.SCREEN_CAPTURES.inc()
        deliver(frame_of(serial, seq, packet, screen, during))
