"""Phones watched on this replica and the hosts' screen feeds here, wire-free (the hub
holds one `Screens`; control_plane.screens puts it on the wire). A frame is whatever the
host sent (an amc.v1.ScreenFrame): here only its `serial`, `host_id`, its kind (a still
image, or a frame of the H.264 stream, control_plane.video) and its checks are read.

A phone's screen holds its latest still frame and its stream's frames since the latest
key frame (`video.Gop`); a viewer takes still images (the latest when it is ready) or the
stream (every frame in order, skipping to a newer key frame when it fell behind), as it
asked (`Viewer.codec`), and the host is told which kinds each phone's viewers take.

A host opens its feed only when asked (`want`, control_plane.host_feeds, which the hub pushes
onto the host's renewal streams here): when a viewer here waits for one of its phones with no
feed here (`ask`), and again when its feed ends while a viewer here still waits for one.

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

from control_plane import host_feeds
from control_plane.video import H264, Gop, RateGate, check_frame, is_video

# A frame as it came (amc.v1.ScreenFrame), passed on as it is.
Frame = Any
# A viewer of the stream that joins gets the frames since the latest key frame at once if
# they are at most this many (else it waits for a key frame, asked for); one that falls
# this many frames behind has a key frame asked for, to skip to.
JOIN_BURST = 30
LAG_FRAMES = 60
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
    # video.IMAGE or video.H264.
    codec: str = "image"
    # A thumbnail's viewer (still images): no rate of its own (max_fps 0).
    thumbnail: bool = False
    ready: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    # A viewer of the stream: the number of the stream's next frame it is due (None: not
    # started, it starts at the latest key frame), and whether it waits for the next key
    # frame (it may not decode what comes before one).
    position: int | None = None
    awaiting_key: bool = False


class Patience:
    """How long a viewer has waited for its next frame: `begin` and `end` around each
    wait, and `end` says whether it lasted `seconds` (its `ready` is then set, which ends
    the wait). One timer per viewer, moved on only when it fires: a viewer of a 30-frame
    stream waits 30 times a second, and arming and cancelling a timeout each time cost it
    more than the rest of its wait. Used as a context manager for the viewer's life."""

    def __init__(self, ready: asyncio.Event, seconds: float) -> None:
        self._ready, self._seconds = ready, seconds
        self._loop = asyncio.get_running_loop()
        self._since: float | None = None
        self._out = False
        self._timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> Patience:
        self._timer = self._loop.call_later(self._seconds, self._check)
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def begin(self) -> None:
        self._since, self._out = self._loop.time(), False

    def end(self) -> bool:
        """Whether the wait begun last lasted `seconds` (it ran out)."""
        self._since = None
        return self._out

    def _check(self) -> None:
        waited = 0.0 if self._since is None else self._loop.time() - self._since
        if waited >= self._seconds:
            self._out, waited = True, 0.0
            self._ready.set()
        self._timer = self._loop.call_later(self._seconds - waited, self._check)


class Screen:
    """One phone watched on this replica: its viewers and its latest frame."""

    def __init__(self, host_id: str, serial: str) -> None:
        self.host_id = host_id
        self.serial = serial
        self.viewers: set[Viewer] = set()
        # The latest still frame, and the stream's frames since its latest key frame.
        self.frame: Frame | None = None
        self.gop = Gop()
        # A frame of the stream has come: its viewers take no still frames.
        self.streams = False
        # The relays from the replica holding the host's feed, when that is another one,
        # one per kind its viewers here take (video.IMAGE, video.H264), and the rate each
        # asks there (`rate(codec)` when it was started: 0 for thumbnails).
        self.sources: dict[str, asyncio.Task[None]] = {}
        self.source_fps: dict[str, int] = {}
        # Why no frame will come any more (the relay was lost).
        self.lost: str | None = None
        # What the host may send for this phone a second.
        self.gate = RateGate()

    @property
    def source(self) -> asyncio.Task[None] | None:
        """A relay of this phone, if it is relayed here."""
        return next(iter(self.sources.values()), None)

    @property
    def fps(self) -> int:
        """The highest frame rate its viewers asked for; 0: thumbnails only."""
        return max((v.max_fps for v in self.viewers if not v.thumbnail), default=0)

    def rate(self, codec: str) -> int:
        """The highest frame rate its viewers of `codec` asked for; 0: thumbnails only."""
        return max((v.max_fps for v in self.viewers if v.codec == codec), default=0)

    def takes(self, codec: str) -> bool:
        return any(v.codec == codec for v in self.viewers)

    def put(self, frame: Frame) -> None:
        if is_video(frame):
            self.streams = True
            if not self.gop.add(frame):
                return
        else:
            self.frame = frame
            if not self.takes("image"):
                self.streams = False  # still frames for the stream's viewers: it has none
        for viewer in self.viewers:
            viewer.ready.set()

    def fail(self, why: str) -> None:
        self.lost = why
        for viewer in self.viewers:
            viewer.ready.set()


class Feed(host_feeds.Feed):
    """A host's ScreenFrames call on this replica."""

    def __init__(self) -> None:
        super().__init__()
        # Phones whose stream's viewers here want a key frame soon, not yet told.
        self.key_frames: set[str] = set()

    def pending(self) -> bool:
        return bool(self.key_frames)


class Screens(host_feeds.HostFeeds[Feed]):
    """This replica's watched phones and the hosts' feeds (their ScreenFrames calls);
    wire-free."""

    def __init__(self, want: Callable[[str], None] = lambda _host_id: None) -> None:
        super().__init__(Feed, want)
        self._screens: dict[tuple[str, str], Screen] = {}
        # The viewers here of each token, and its thumbnails (control_plane.screens holds
        # them to their limits).
        self.by_token: Counter[uuid.UUID] = Counter()
        self.thumbnails_by_token: Counter[uuid.UUID] = Counter()

    def viewers(self) -> int:
        return sum(len(s.viewers) for s in self._screens.values())

    def watched(self, host_id: str) -> list[tuple[str, int, bool, bool, int]]:
        """The host's phones watched here, by serial: the frame rate asked for (1 for a
        phone watched by thumbnails alone), whether their viewers take still images, the
        stream, and when their still images are thumbnails alone (its viewers of the stream
        aside), the milliseconds between two of them (its share of the host's thumbnails),
        else 0."""
        screens = [
            s
            for (host, _), s in self._screens.items()
            if host == host_id and s.viewers and s.source is None
        ]
        thumbnails = {s for s in screens if s.takes("image") and not s.rate("image")}
        every = round(1000 * thumbnail_interval(len(thumbnails)))
        return sorted(
            (s.serial, s.fps or 1, s.takes("image"), s.takes(H264), every * (s in thumbnails))
            for s in screens
        )

    def wants(self, host_id: str) -> list[tuple[str, int, bool, bool, int]]:
        """What this replica wants of the host's feed: its phones watched here, and how."""
        return self.watched(host_id)

    @contextlib.contextmanager
    def watch(
        self, host_id: str, serial: str, max_fps: int, codec: str = "image", thumbnail: bool = False
    ) -> Iterator[tuple[Screen, Viewer]]:
        key = (host_id, serial)
        screen = self._screens.get(key)
        if screen is None:
            screen = self._screens[key] = Screen(host_id, serial)
        viewer = Viewer(0 if thumbnail else max_fps, codec, thumbnail)
        if codec == H264 and screen.gop.broken:
            # No stream yet (or broken): the viewer starts at its next key frame, whenever.
            viewer.position, viewer.awaiting_key = screen.gop.end, True
        screen.viewers.add(viewer)
        self._tell(host_id)
        try:
            yield screen, viewer
        finally:
            screen.viewers.discard(viewer)
            if not screen.viewers and self._screens.get(key) is screen:
                del self._screens[key]
                for source in screen.sources.values():
                    source.cancel()
            self._tell(host_id)

    def relaying(self, screen: Screen, codec: str, source: asyncio.Task[None] | None) -> None:
        """The screen's frames of a kind come from `source` (a relay asking the rate its
        viewers of that kind want), not a feed here; a relay of that kind asking another
        rate, or no longer wanted (None), is ended."""
        old = screen.sources.pop(codec, None)
        if old is not None and old is not source:
            old.cancel()
        if source is not None:
            screen.sources[codec], screen.source_fps[codec] = source, screen.rate(codec)
        self._tell(screen.host_id)

    def want_key_frame(self, screen: Screen) -> None:
        """Asks the phone's host for a key frame soon (a viewer of its stream here cannot
        go on without one); a relayed phone's is asked for where its host is."""
        feed = self._feeds.get(screen.host_id)
        if feed is not None and screen.source is None and screen.serial not in feed.key_frames:
            feed.key_frames.add(screen.serial)
            feed.changed.set()

    def next_of_stream(self, screen: Screen, viewer: Viewer) -> Frame | None:
        """The stream's frame the viewer is sent next, if it has one. A viewer that joins
        starts at the latest key frame, or (that group long already, or broken) waits for
        the next one, asked of the host; one that falls LAG_FRAMES behind has the host
        asked for a key frame to skip to."""
        gop = screen.gop
        if viewer.position is None:
            if gop.broken or len(gop.frames) > JOIN_BURST:
                self.await_key_frame(screen, viewer)
            else:
                viewer.position = gop.base
        assert viewer.position is not None
        if gop.end - viewer.position > LAG_FRAMES and not viewer.awaiting_key:
            self.want_key_frame(screen)
        while True:
            frame, viewer.position = gop.at(viewer.position)
            if frame is None or frame.key_frame or not viewer.awaiting_key:
                break
        if frame is not None:
            viewer.awaiting_key = False
        return frame

    def await_key_frame(self, screen: Screen, viewer: Viewer) -> None:
        viewer.position, viewer.awaiting_key = screen.gop.end, True
        self.want_key_frame(screen)

    def deliver(self, host_id: str, frame: Frame) -> str:
        """A host's frame to its phone's viewers here; what became of it: "received",
        "unwatched" (nobody here watches it), "over_rate" (past what the host may send
        for a phone a second) or "malformed" (a frame of the stream that cannot be passed
        on: control_plane.video.check_frame). A dropped frame of the stream has the
        frames after it wait for a key frame."""
        screen = self._screens.get((host_id, frame.serial))
        if screen is None or screen.source is not None:
            return "unwatched"
        video = is_video(frame)
        if not screen.gate.admit(len(frame.data)):
            if video:
                screen.gop.lose()
            return "over_rate"
        if video and check_frame(frame) is not None:
            screen.gop.lose()
            return "malformed"
        frame.host_id = host_id
        screen.put(frame)
        return "received"

    def close(self) -> None:
        super().close()
        for screen in self._screens.values():
            for viewer in screen.viewers:
                viewer.ready.set()
