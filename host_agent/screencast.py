"""Live screens on the host: phones captured only while someone watches them.

The agent opens its `Lease.ScreenFrames` call only when the control plane asks for it
(`want()`: a push with `screen_wanted` on the renewal stream, when a viewer waits for one
of its phones), keeps it while any phone is watched (opened again after a pause if it
breaks meanwhile), and closes it once none has been watched for `linger` (SCREEN_LINGER,
30 s: a viewer flipping between phones does not reopen it each time); an idle host holds
no call. An old control plane that never asks gets no call: no live screen until it is
upgraded. The control plane sends the set of this host's phones watched, with the frame
rate asked (a phone watched by thumbnails alone: once per `interval_ms`, a few seconds) and
whether its viewers take still images, the H.264 stream, or both.

Each watched phone gets one capture of each kind asked: still frames (`screencap -p` over
adb, a simulated phone's drawing), at most `screen_max_fps` a second and `screen_max_rate`
bytes a second (a large frame waits longer before the next), whatever the viewers ask;
and its stream (host_agent.videocast: scrcpy's server on a real phone, PyAV's encoder on
a simulated one), at most `video_max_fps` frames a second. A phone without a stream here
(VideoUnavailable) is sent still frames for its stream's viewers too. A phone no longer
watched stops being captured at once; with nobody watching, nothing is captured
(amc_agent_screen_captures_total stays put).

Still frames go up latest-first: each phone has one slot, a newer frame replaces one not
yet sent (amc_agent_screen_frames_dropped_total{reason="superseded"}); a stream's frames
go in order, bounded (videocast.VideoQueue: past its bound, dropped up to the next key
frame, reason "behind"). The sender writes one frame at a time, so a slow link costs
frames, never a growing queue, and never delays the renewal stream (another call). A still
frame too large to send becomes a JPEG (host_agent.stills).

Local watchers (`watch()`: a task's screen recording) share the same captures: one
capture per phone for the viewers and the recording together; they need no call open.
Capturing is not an action: it is not in the task's steps or the simulated phones' action
log, and it does not wait for the phone's running action. Each frame says which task
attempt the phone ran all through its capture (`running`, from the agent's workers: set
before an attempt's worker starts, cleared only once it ended, before the phone is
offered for work again), so the control plane sends a task's viewer only its own
attempt's frames.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from functools import partial

import grpc
import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc, scheduler_pb2
from host_agent import metrics, videocast
from host_agent.devices import Device, DeviceError, VideoStream
from host_agent.on_demand_call import Call, OnDemandCall
from host_agent.screen_wants import Pace, Want, want_of
from host_agent.stills import MAX_FRAME_BYTES, smaller, still_frame
from host_agent.videocast import VideoQueue

log = structlog.get_logger(__name__)

# How long one capture may take before it counts as failed; the pause after a failure.
CAPTURE_TIMEOUT = 10.0
FAILURE_PAUSE = 1.0
# How long the call stays open with no phone watched before it is closed.
SCREEN_LINGER = 30.0
# A frame to a local watcher: what a recording takes.
Sink = Callable[[scheduler_pb2.ScreenFrame], None]
# The task attempt a phone (by serial) runs now, or None.
Running = Callable[[str], tuple[str, int] | None]
IMAGES, VIDEO = "images", "video"


class Screencaster(OnDemandCall):
    """The host's live screens: the ScreenFrames call, the captures of the watched phones."""

    ABSENT = "the control plane has no live screens; not capturing"
    ENDED = "screen call ended"
    LINGERED = "no phone watched for the linger: screen call closed"

    def __init__(
        self,
        stub: lease_pb2_grpc.LeaseStub,
        host_id: str,
        device: Callable[[str], Device],
        max_fps: int,
        max_rate: int,
        linger: float = SCREEN_LINGER,
        running: Running = lambda _serial: None,
        video_max_fps: int = 30,
    ) -> None:
        super().__init__(linger)
        self._stub = stub
        # Which task attempt each phone runs: every frame says it (ScreenFrame.running).
        self._running = running
        self._host_id = host_id
        self._device = device
        self._max_fps = max_fps
        self._video_max_fps = video_max_fps
        self._max_rate = max_rate
        # What the control plane asked for (a thumbnail's rate below one frame a second),
        # and the local watchers.
        self._watched: dict[str, Want] = {}
        self._sinks: dict[str, dict[int, tuple[Want, Sink]]] = {}
        # One capture per phone and kind (IMAGES, VIDEO).
        self._loops: dict[tuple[str, str], asyncio.Task[None]] = {}
        # Phones with no stream here: their stream's viewers get still frames.
        self._no_video: set[str] = set()
        self._streams: dict[str, VideoStream] = {}
        self._seq: dict[str, int] = {}
        # The newest still frame of each phone not sent yet, each phone's stream in order,
        # and a wake-up for the sender.
        self._outbox: dict[str, scheduler_pb2.ScreenFrame] = {}
        self._video: dict[str, VideoQueue] = {}
        self._ready = asyncio.Event()
        # Each phone's still captures wait for their next at its rate, read again when what
        # is watched changed.
        self._pace = Pace()
        self._next_sink = 0

    @property
    def capturing(self) -> frozenset[str]:
        return frozenset(serial for serial, _ in self._loops)

    def captures(self, serial: str) -> frozenset[str]:
        """The kinds of capture running for a phone (IMAGES, VIDEO)."""
        return frozenset(kind for s, kind in self._loops if s == serial)

    async def run(self) -> None:
        """The ScreenFrames call, for the agent's life, whenever it is wanted: opened when
        asked, closed after the linger with nothing watched, reopened after a pause when
        it broke while a phone was watched."""
        try:
            await self._keep()
        finally:
            for loop in self._loops.values():
                loop.cancel()

    def _open(self) -> Call:
        call: Call = self._stub.ScreenFrames()
        return call

    def _hello(self) -> lease_pb2.ScreenFramesRequest:
        return lease_pb2.ScreenFramesRequest(host_id=self._host_id)

    def _in_use(self) -> bool:
        return bool(self._watched)

    def _heard(self, message: lease_pb2.ScreenFramesResponse) -> None:
        self._set_watched({w.serial: want_of(w) for w in message.watched})
        for serial in message.key_frames:
            if (stream := self._streams.get(serial)) is not None:
                stream.want_key_frame()

    def _forget(self) -> None:
        self._set_watched({})

    async def _send(self, call: Call) -> None:
        """Each phone's newest still frame and its stream's frames in order, one write at a
        time, until a write fails: then the call is over, and its read (in `_call`) says
        why."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while frame := self._next_out():
                try:
                    await call.write(lease_pb2.ScreenFramesRequest(frame=frame))
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                    return
                metrics.SCREEN_FRAMES_SENT.inc()
                metrics.SCREEN_BYTES_SENT.inc(len(frame.data))

    def _next_out(self) -> scheduler_pb2.ScreenFrame | None:
        """The next frame to send: a stream's first (so they are not held up behind still
        frames), else a still one; phones taken in turn."""
        for serial in list(self._video):
            queue = self._video[serial]
            frame = queue.pop()
            if frame is not None:
                self._video[serial] = self._video.pop(serial)  # to the back: phones in turn
                return frame
        while self._outbox:
            serial = next(iter(self._outbox))
            frame = self._outbox.pop(serial)
            if serial in self._watched:
                return frame
        return None

    def _set_watched(self, watched: dict[str, Want]) -> None:
        if watched != self._watched:
            log.info("phones watched", serials=sorted(watched))
        self._watched = watched
        for serial in list(self._outbox):
            if serial not in watched:
                del self._outbox[serial]
        for serial in list(self._video):
            if serial not in watched or not watched[serial].video:
                del self._video[serial]
        self._sync()

    @contextlib.contextmanager
    def watch(self, serial: str, fps: int, sink: Sink, video: bool = False) -> Iterator[None]:
        """`sink` is given each frame of `serial` captured meanwhile (at most `fps` a
        second of them are captured for it): the stream's when `video` and the phone has
        one, else still frames."""
        self._next_sink += 1
        key = self._next_sink
        self._sinks.setdefault(serial, {})[key] = (Want(fps, not video, video), sink)
        self._sync()
        stream = self._streams.get(serial)
        if video and stream is not None:
            stream.want_key_frame()  # a recording starts at a key frame
        try:
            yield
        finally:
            sinks = self._sinks.get(serial, {})
            sinks.pop(key, None)
            if not sinks:
                self._sinks.pop(serial, None)
            self._sync()

    def _wants(self, serial: str) -> list[Want]:
        wants = [w for w, _ in self._sinks.get(serial, {}).values()]
        if serial in self._watched:
            wants.append(self._watched[serial])
        return wants

    def _fps(self, serial: str, kind: str) -> float:
        """Frames a second to capture of a kind: the most its viewers ask, within the
        host's bound (a phone watched by thumbnails alone: less than one)."""
        wants = self._wants(serial)
        if kind == VIDEO:
            asked = max([w.fps for w in wants if w.video], default=1)
            return max(1, min(self._video_max_fps, round(asked)))
        no_video = serial in self._no_video
        stills = [w.still_fps(no_video) for w in wants if self._takes_images(serial, w)]
        asked = max(stills, default=1)
        return min(self._max_fps, asked) if asked > 0 else 1.0

    def _interval(self, serial: str, size: int) -> float:
        """Seconds from a still capture of `size` bytes to the next (its rate, the byte rate)."""
        return max(1.0 / self._fps(serial, IMAGES), size / self._max_rate)

    def _takes_images(self, serial: str, want: Want) -> bool:
        return want.images or (want.video and serial in self._no_video)

    def _sync(self) -> None:
        needed: set[tuple[str, str]] = set()
        for serial in set(self._watched) | set(self._sinks):
            wants = self._wants(serial)
            if any(w.video for w in wants) and serial not in self._no_video:
                needed.add((serial, VIDEO))
            if any(self._takes_images(serial, w) for w in wants):
                needed.add((serial, IMAGES))
        for key in [k for k in self._loops if k not in needed]:
            self._loops.pop(key).cancel()
        for serial in {s for s, _ in self._loops} | self._no_video:
            if serial not in self._watched and serial not in self._sinks:
                self._no_video.discard(serial)  # tried again when next watched
        loop = asyncio.get_running_loop()
        for serial, kind in needed - set(self._loops):
            run = self._stream if kind == VIDEO else self._capture
            self._loops[(serial, kind)] = loop.create_task(
                run(serial), name=f"screen {kind} {serial}"
            )
        self._pace.changed({s for s, kind in self._loops if kind == IMAGES})

    async def _stream(self, serial: str) -> None:
        """The phone's stream until it is no longer watched; still frames instead when it
        has none here."""
        device = self._device(serial)
        while True:
            try:
                stream = await videocast.open_stream(device, lambda: int(self._fps(serial, VIDEO)))
            except DeviceError as exc:  # none here (VideoUnavailable), or it did not start
                log.info("no video stream: still frames instead", device=serial, why=str(exc))
                self._no_video.add(serial)
                self._loops.pop((serial, VIDEO), None)
                self._sync()
                return
            self._streams[serial] = stream
            try:
                first = self._seq.get(serial, 0)
                await videocast.stream_frames(
                    device, stream, self._running, self._deliver_video, first
                )
            except DeviceError as exc:
                metrics.SCREEN_CAPTURE_FAILURES.inc()
                log.info("video stream broke", device=serial, error=str(exc))
            finally:
                if self._streams.get(serial) is stream:
                    del self._streams[serial]
                await stream.close()
            await asyncio.sleep(FAILURE_PAUSE)

    def _deliver_video(self, frame: scheduler_pb2.ScreenFrame) -> None:
        serial = frame.serial
        self._seq[serial] = frame.seq
        watched = self._watched.get(serial)
        if watched is not None and watched.video:
            queue = self._video.setdefault(serial, VideoQueue())
            if not queue.put(frame):
                stream = self._streams.get(serial)
                if stream is not None:
                    stream.want_key_frame()
            self._ready.set()
        for want, sink in list(self._sinks.get(serial, {}).values()):
            if want.video:
                sink(frame)

    async def _capture(self, serial: str) -> None:
        """Still frames of `serial` until it is no longer watched."""
        device = self._device(serial)
        capture = getattr(device, "screen_frame", None) or device.screenshot
        clock = asyncio.get_running_loop()
        while True:
            started = clock.time()
            before = self._running(serial)
            try:
                async with asyncio.timeout(CAPTURE_TIMEOUT):
                    data: bytes = await capture()
            except (DeviceError, TimeoutError) as exc:
                metrics.SCREEN_CAPTURE_FAILURES.inc()
                log.info("screen capture failed", device=serial, error=str(exc) or "timeout")
                await asyncio.sleep(FAILURE_PAUSE)
                continue
            metrics.SCREEN_CAPTURES.inc()
            self._seq[serial] = seq = self._seq.get(serial, 0) + 1
            # The attempt the phone ran all through the capture (none if it changed).
            during = before if self._running(serial) == before else None
            frame = still_frame(device, seq, data, during)
            if serial in self._watched and len(data) > MAX_FRAME_BYTES:
                frame = await smaller(frame)
            self._offer(serial, frame)
            for want, sink in list(self._sinks.get(serial, {}).values()):
                if self._takes_images(serial, want):
                    sink(frame)
            await self._pace.until_due(serial, started, partial(self._interval, serial, len(data)))

    def _offer(self, serial: str, frame: scheduler_pb2.ScreenFrame) -> None:
        watched = self._watched.get(serial)
        if watched is None or not self._takes_images(serial, watched):
            return
        if len(frame.data) > MAX_FRAME_BYTES:
            metrics.SCREEN_FRAMES_DROPPED.labels("too_large").inc()
            return
        if serial in self._outbox:
            metrics.SCREEN_FRAMES_DROPPED.labels("superseded").inc()
        self._outbox[serial] = frame
        self._ready.set()
