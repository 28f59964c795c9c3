"""What the viewers of a host's phones ask of its captures: a phone's `Want` (a frame rate,
still images or the H.264 stream) as the control plane's ScreenWatch says it, and the
`Pace` of each phone's still captures, which waits for the next one due at the phone's
rate and looks at that rate again whenever what is watched changed (a phone watched by
thumbnails, a frame every few seconds, that a live viewer starts watching is captured
again at once)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

from amc.v1 import lease_pb2


@dataclasses.dataclass(frozen=True)
class Want:
    """What a phone's viewers (or a local watcher) take: its frame rate, which kinds, and
    the rate of its still images when they are thumbnails alone (below one frame a
    second; 0: `fps`)."""

    fps: float
    images: bool = True
    video: bool = False
    thumbnail_fps: float = 0.0

    def still_fps(self, no_video: bool) -> float:
        """Still images a second it wants (with its stream's viewers', when the phone has
        no stream: `no_video`)."""
        return self.fps if self.video and no_video else (self.thumbnail_fps or self.fps)


def want_of(watch: lease_pb2.ScreenWatch) -> Want:
    """A phone as the control plane lists it (neither kind named: an older control plane,
    which takes still frames); its still images are thumbnails alone when `interval_ms` is
    set: one per `interval_ms`, while `max_fps` is its stream's rate."""
    images = watch.images or not watch.video
    thumbnail = 1000 / watch.interval_ms if watch.interval_ms > 0 else 0.0
    return Want(float(watch.max_fps), images, watch.video, thumbnail)


class Pace:
    """The still captures' waits, by phone: each until its next capture is due."""

    def __init__(self) -> None:
        self._changed: dict[str, asyncio.Event] = {}

    def changed(self, captured: set[str]) -> None:
        """What is watched changed: every wait looks at its rate again; the phones not in
        `captured` are forgotten."""
        for serial in [s for s in self._changed if s not in captured]:
            del self._changed[serial]
        for event in self._changed.values():
            event.set()

    async def until_due(self, serial: str, started: float, interval: Callable[[], float]) -> None:
        """Until `interval()` seconds after `started` (the loop's clock), read again each
        time what is watched changed: at once when a faster rate makes it due."""
        clock = asyncio.get_running_loop()
        changed = self._changed.setdefault(serial, asyncio.Event())
        while True:
            changed.clear()
            due = started + interval() - clock.time()
            if due <= 0:
                return
            try:
                async with asyncio.timeout(due):
                    await changed.wait()
            except TimeoutError:
                return
