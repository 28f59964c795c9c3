"""Phones watched on this replica and the hosts' screen feeds here, wire-free (the hub
holds one `Screens`; control_plane.screens puts it on the wire). A frame is whatever the
host sent (an amc.v1.ScreenFrame): here only its `serial` and `host_id` are read.

A host opens its feed only when asked (`want`, which the hub pushes onto the host's renewal
streams here): when a viewer here waits for one of its phones with no feed here (`ask`),
and again when its feed ends while a viewer here still waits for one.

A thumbnail's viewer (the console's Farm page) asks for no frame rate: a phone watched by
thumbnails alone is captured once per THUMBNAIL_EVERY seconds at most, and a host's phones
watched so share HOST_THUMBNAILS frames a second (a host with more of them sends each less
often), so a wall of a farm's phones costs each host a few captures a second whatever its
size. A viewer at its own rate on the same phone has the phone captured at that rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

# A frame as it came (amc.v1.ScreenFrame), passed on as it is.
Frame = Any
# A phone watched by thumbnails alone: one frame per this many seconds at most; and the
# frames a second a host's phones watched so share.
THUMBNAIL_EVERY = 3.0
HOST_THUMBNAILS = 4.0


def thumbnail_interval(phones: int) -> float:
    """Seconds between two thumbnails of each of `phones` phones of one host."""
    return max(THUMBNAIL_EVERY, phones / HOST_THUMBNAILS)


@dataclasses.dataclass(eq=False)
class Viewer:
    max_fps: int
    # A thumbnail's viewer: no rate of its own (max_fps 0).
    thumbnail: bool = False
    ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


class Screen:
    """One phone watched on this replica: its viewers and its latest frame."""

    def __init__(self, host_id: str, serial: str) -> None:
        self.host_id = host_id
        self.serial = serial
        self.viewers: set[Viewer] = set()
        self.frame: Frame | None = None
        # The relay from the replica holding the host's feed, when that is another one, and
        # the rate it asks there (the `fps` it was started for: 0 for thumbnails).
        self.source: asyncio.Task[None] | None = None
        self.source_fps = 0
        # Why no frame will come any more (the relay was lost).
        self.lost: str | None = None

    @property
    def fps(self) -> int:
        """The highest frame rate its viewers asked for; 0: thumbnails only."""
        return max((v.max_fps for v in self.viewers if not v.thumbnail), default=0)

    def put(self, frame: Frame) -> None:
        self.frame = frame
        for viewer in self.viewers:
            viewer.ready.set()

    def fail(self, why: str) -> None:
        self.lost = why
        for viewer in self.viewers:
            viewer.ready.set()


class Feed:
    """A host's ScreenFrames call on this replica."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()


class Screens:
    """This replica's watched phones and the hosts' feeds; wire-free."""

    def __init__(self, want: Callable[[str], None] = lambda _host_id: None) -> None:
        self._screens: dict[tuple[str, str], Screen] = {}
        self._feeds: dict[str, Feed] = {}
        self.closing = False
        # The viewers here of each token, and its thumbnails (control_plane.screens holds
        # them to their limits).
        self.by_token: Counter[uuid.UUID] = Counter()
        self.thumbnails_by_token: Counter[uuid.UUID] = Counter()
        # Asks a host (by id) to open its feed here.
        self._want = want

    def feeds(self) -> int:
        return len(self._feeds)

    def wanted(self, host_id: str) -> bool:
        """A viewer here waits for one of the host's phones, and the host has no feed here."""
        return not self.closing and host_id not in self._feeds and bool(self.watched(host_id))

    def ask(self, host_id: str) -> None:
        """Asks the host to open its feed here, if a viewer here waits for it without one."""
        if self.wanted(host_id):
            self._want(host_id)

    def viewers(self) -> int:
        return sum(len(s.viewers) for s in self._screens.values())

    def watched(self, host_id: str) -> list[tuple[str, int, int]]:
        """The host's phones watched here, by serial: the frame rate asked for, or for a
        phone watched by thumbnails alone 1 and the milliseconds between two frames (its
        share of the host's thumbnails), else 0."""
        screens = [
            s
            for (host, _), s in self._screens.items()
            if host == host_id and s.viewers and s.source is None
        ]
        thumbnails = sum(1 for s in screens if not s.fps)
        every = round(1000 * thumbnail_interval(thumbnails))
        return sorted((s.serial, s.fps, 0) if s.fps else (s.serial, 1, every) for s in screens)

    @contextlib.contextmanager
    def watch(
        self, host_id: str, serial: str, max_fps: int, thumbnail: bool = False
    ) -> Iterator[tuple[Screen, Viewer]]:
        key = (host_id, serial)
        screen = self._screens.get(key)
        if screen is None:
            screen = self._screens[key] = Screen(host_id, serial)
        viewer = Viewer(0 if thumbnail else max_fps, thumbnail)
        screen.viewers.add(viewer)
        self._tell(host_id)
        try:
            yield screen, viewer
        finally:
            screen.viewers.discard(viewer)
            if not screen.viewers and self._screens.get(key) is screen:
                del self._screens[key]
                if screen.source is not None:
                    screen.source.cancel()
            self._tell(host_id)

    def relaying(self, screen: Screen, source: asyncio.Task[None]) -> None:
        """The screen's frames come from `source` (a relay, asking its viewers' rate), not
        from a feed here; a relay asking another rate is ended."""
        if screen.source is not None and screen.source is not source:
            screen.source.cancel()
        screen.source, screen.source_fps = source, screen.fps
        self._tell(screen.host_id)

    @contextlib.contextmanager
    def feed(self, host_id: str) -> Iterator[Feed]:
        """The host's call: a newer one of the same host takes the older one's place."""
        feed = Feed()
        old = self._feeds.get(host_id)
        self._feeds[host_id] = feed
        if old is not None:
            old.changed.set()
        try:
            yield feed
        finally:
            if self._feeds.get(host_id) is feed:
                del self._feeds[host_id]
                self.ask(host_id)  # a viewer still waiting: the host opens it again

    def has_feed(self, host_id: str) -> bool:
        return host_id in self._feeds

    def current(self, host_id: str, feed: Feed) -> bool:
        return self._feeds.get(host_id) is feed and not self.closing

    def deliver(self, host_id: str, frame: Frame) -> bool:
        """A host's frame to its phone's viewers here; False when nobody here watches it."""
        screen = self._screens.get((host_id, frame.serial))
        if screen is None or screen.source is not None:
            return False
        frame.host_id = host_id
        screen.put(frame)
        return True

    def close(self) -> None:
        self.closing = True
        for feed in self._feeds.values():
            feed.changed.set()
        for screen in self._screens.values():
            for viewer in screen.viewers:
                viewer.ready.set()

    def _tell(self, host_id: str) -> None:
        feed = self._feeds.get(host_id)
        if feed is not None:
            feed.changed.set()
