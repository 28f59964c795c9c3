"""Live screens on the host: phones captured only while someone watches them.

The agent opens its `Lease.ScreenFrames` call only when the control plane asks for it
(`want()`: a push with `screen_wanted` on the renewal stream, when a viewer waits for one
of its phones), keeps it while any phone is watched (opened again after a pause if it
breaks meanwhile), and closes it once none has been watched for `linger` (SCREEN_LINGER,
30 s: a viewer flipping between phones does not reopen it each time); an idle host holds
no call. An old control plane that never asks gets no call: no live screen until it is
upgraded. The control plane sends the set of this host's phones watched (with the frame
rate asked: a phone watched by thumbnails alone, once per `interval_ms`, a few seconds);
each watched phone gets a capture loop: `screencap -p` over adb (a simulated phone draws
its live frame), at most `screen_max_fps` frames a second and `screen_max_rate` bytes a
second (a large frame waits longer before the next), whatever the viewers ask. A phone no
longer watched stops being captured at once; with nobody watching, nothing is captured
(amc_agent_screen_captures_total stays put).

Frames go up latest-first: each phone has one slot, a newer frame replaces one not yet
sent (amc_agent_screen_frames_dropped_total{reason="superseded"}), and the sender writes
one frame at a time, so a slow link costs frames, never a queue, and never delays the
renewal stream (another call). A frame over MAX_FRAME_BYTES (the control plane takes
messages up to 1 MiB) is sent as a JPEG when Pillow is installed (the `jpeg` extra; a
real phone's full-size PNG can be 1-3 MB), else not at all. Simulated phones' frames
(~15 KB PNGs, smaller than as JPEGs) go as they are.

Local watchers (`watch()`: a task's screen recording) share the same capture loop: one
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
import io
import struct
import time
from collections.abc import Callable, Iterator

import grpc
import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc, scheduler_pb2
from host_agent import metrics
from host_agent.devices import Device, DeviceError

log = structlog.get_logger(__name__)

# The control plane's largest message is 1 MiB: a frame and its few fields must fit.
MAX_FRAME_BYTES = (1 << 20) - 4096
# How long one capture may take before it counts as failed; the pause after a failure.
CAPTURE_TIMEOUT = 10.0
FAILURE_PAUSE = 1.0
RECONNECT_FIRST, RECONNECT_MOST = 0.5, 10.0
# How long the call stays open with no phone watched before it is closed.
SCREEN_LINGER = 30.0
# A frame over MAX_FRAME_BYTES (a real phone's full-size PNG can be 1-3 MB) is sent as a
# JPEG of this quality instead, when Pillow is installed (~130-300 KB at 1080 x 2400).
JPEG_QUALITY = 80
# A frame to a local watcher: what a recording takes.
Sink = Callable[[scheduler_pb2.ScreenFrame], None]
# The task attempt a phone (by serial) runs now, or None.
Running = Callable[[str], tuple[str, int] | None]


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


def _rate(watch: lease_pb2.ScreenWatch) -> float:
    """Frames a second a watch asks: its max_fps, or for a thumbnail one per interval_ms."""
    return 1000 / watch.interval_ms if watch.interval_ms > 0 else float(watch.max_fps)


class Screencaster:
    """The host's live screens: the ScreenFrames call, one capture loop per watched phone."""

    def __init__(
        self,
        stub: lease_pb2_grpc.LeaseStub,
        host_id: str,
        device: Callable[[str], Device],
        max_fps: int,
        max_rate: int,
        linger: float = SCREEN_LINGER,
        running: Running = lambda _serial: None,
    ) -> None:
        self._stub = stub
        # Which task attempt each phone runs: every frame says it (ScreenFrame.running).
        self._running = running
        self._linger = linger
        # Set when the control plane asks for the call (`want()`).
        self._wanted = asyncio.Event()
        # The call is open now (it has had its first answer).
        self.calling = False
        # Set while no call is open at all (`closed()`).
        self._closed = asyncio.Event()
        self._closed.set()
        self._host_id = host_id
        self._device = device
        self._max_fps = max_fps
        self._max_rate = max_rate
        # What the control plane asked for (serial -> frames a second, below 1 for a
        # thumbnail), and the local watchers.
        self._watched: dict[str, float] = {}
        self._sinks: dict[str, dict[int, tuple[int, Sink]]] = {}
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._seq: dict[str, int] = {}
        # The newest frame of each phone not sent yet, and a wake-up for the sender.
        self._outbox: dict[str, scheduler_pb2.ScreenFrame] = {}
        self._ready = asyncio.Event()
        # Set when what is watched changed: each capture loop waiting for its next capture
        # looks at its rate again (_until_due).
        self._changed: dict[str, asyncio.Event] = {}
        self._next_sink = 0
        self._said_no_jpeg = False

    @property
    def capturing(self) -> frozenset[str]:
        return frozenset(self._loops)

    async def closed(self) -> None:
        """Returns when no ScreenFrames call is open (at once if none is). The renewal stream
        waits for it before moving to a new connection: the call, open on the old one, and
        the stream stay on one replica, where the host's viewers look for the feed."""
        await self._closed.wait()

    def want(self) -> None:
        """The control plane asks for the call (a viewer waits for one of this host's
        phones): opened now, or again as soon as the open one ends."""
        self._wanted.set()

    async def run(self) -> None:
        """The ScreenFrames call, for the agent's life, whenever it is wanted: opened when
        asked, closed after the linger with nothing watched, reopened after a pause when
        it broke while a phone was watched."""
        pause = RECONNECT_FIRST
        try:
            while True:
                await self._wanted.wait()
                self._wanted.clear()
                opened = time.monotonic()
                lingered = False
                try:
                    lingered = await self._call()
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                        log.info("the control plane has no live screens; not capturing")
                        return
                    log.info("screen call ended", code=exc.code().name, details=exc.details())
                if not lingered and self._watched:
                    self._wanted.set()  # broken while watched: open it again
                self._set_watched({})
                if lingered:
                    pause = RECONNECT_FIRST
                    continue
                if time.monotonic() - opened > RECONNECT_MOST:
                    pause = RECONNECT_FIRST
                await asyncio.sleep(pause)
                pause = min(RECONNECT_MOST, pause * 2)
        finally:
            for loop in self._loops.values():
                loop.cancel()

    async def _call(self) -> bool:
        """One call, until it ends (False) or nothing has been watched for the linger
        (True: closed here)."""
        call = self._stub.ScreenFrames()
        sender: asyncio.Task[None] | None = None
        self._closed.clear()
        try:
            await call.write(lease_pb2.ScreenFramesRequest(host_id=self._host_id))
            sender = asyncio.get_running_loop().create_task(self._send(call))
            while True:
                try:
                    async with asyncio.timeout(None if self._watched else self._linger):
                        message = await call.read()
                except TimeoutError:
                    log.info("no phone watched for the linger: screen call closed")
                    return True
                if message is grpc.aio.EOF:
                    return False
                self.calling = True
                self._set_watched({w.serial: _rate(w) for w in message.watched})
        finally:
            self.calling = False
            self._closed.set()
            if sender is not None:
                sender.cancel()
            call.cancel()

    async def _send(self, call: grpc.aio.StreamStreamCall[object, object]) -> None:
        """Each phone's newest frame, one write at a time, until a write fails: then the
        call is over, and its read (in `_call`) says why."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._outbox:
                serial = next(iter(self._outbox))
                frame = self._outbox.pop(serial)
                if serial not in self._watched:
                    continue
                try:
                    await call.write(lease_pb2.ScreenFramesRequest(frame=frame))
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                    return
                metrics.SCREEN_FRAMES_SENT.inc()
                metrics.SCREEN_BYTES_SENT.inc(len(frame.data))

    def _set_watched(self, watched: dict[str, float]) -> None:
        if watched != self._watched:
            log.info("phones watched", serials=sorted(watched))
        self._watched = watched
        for serial in list(self._outbox):
            if serial not in watched:
                del self._outbox[serial]
        self._sync()

    @contextlib.contextmanager
    def watch(self, serial: str, fps: int, sink: Sink) -> Iterator[None]:
        """`sink` is given each frame of `serial` captured meanwhile (at most `fps` a
        second of them are captured for it)."""
        self._next_sink += 1
        key = self._next_sink
        self._sinks.setdefault(serial, {})[key] = (fps, sink)
        self._sync()
        try:
            yield
        finally:
            sinks = self._sinks.get(serial, {})
            sinks.pop(key, None)
            if not sinks:
                self._sinks.pop(serial, None)
            self._sync()

    def _fps(self, serial: str) -> float:
        asked = max(
            [self._watched.get(serial, 0), *(f for f, _ in self._sinks.get(serial, {}).values())]
        )
        return min(self._max_fps, asked) if asked > 0 else 1.0

    def _sync(self) -> None:
        wanted = set(self._watched) | set(self._sinks)
        for serial in [s for s in self._loops if s not in wanted]:
            self._loops.pop(serial).cancel()
            self._changed.pop(serial, None)
        for serial in wanted - set(self._loops):
            self._loops[serial] = asyncio.get_running_loop().create_task(
                self._capture(serial), name=f"screen {serial}"
            )
        for changed in self._changed.values():
            changed.set()  # a loop waiting for its next capture looks at its rate again

    async def _until_due(self, serial: str, started: float, size: int) -> None:
        """Until the next capture of `serial` is due at its rate (and the byte rate), or
        at once when a faster rate makes it so: a phone watched by thumbnails (a frame
        every few seconds) that a live viewer starts watching is captured again at once."""
        clock = asyncio.get_running_loop()
        changed = self._changed.setdefault(serial, asyncio.Event())
        while True:
            changed.clear()
            interval = max(1.0 / self._fps(serial), size / self._max_rate)
            due = started + interval - clock.time()
            if due <= 0:
                return
            try:
                async with asyncio.timeout(due):
                    await changed.wait()
            except TimeoutError:
                return

    async def _capture(self, serial: str) -> None:
        """Frames of `serial` until it is no longer watched."""
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
            width, height, mime = image_size(data)
            # A frame's width and height are the phone's screen in its own pixels (what a
            # tap's coordinates are in): a phone whose frames are drawn smaller says so.
            screen_size = getattr(device, "screen_size", None)
            if screen_size is not None:
                width, height = screen_size()
            # The attempt the phone ran all through the capture (none if it changed).
            during = before if self._running(serial) == before else None
            task_id, attempt = during or ("", 0)
            frame = scheduler_pb2.ScreenFrame(
                serial=serial,
                seq=seq,
                width=width,
                height=height,
                mime=mime,
                captured_at_ms=int(time.time() * 1000),
                data=data,
                running=scheduler_pb2.FrameTask(task_id=task_id, attempt=attempt),
            )
            if serial in self._watched and len(data) > MAX_FRAME_BYTES:
                frame = await self._smaller(frame)
            self._offer(serial, frame)
            for _, sink in list(self._sinks.get(serial, {}).values()):
                sink(frame)
            await self._until_due(serial, started, len(data))

    async def _smaller(self, frame: scheduler_pb2.ScreenFrame) -> scheduler_pb2.ScreenFrame:
        """A frame too large to send, as a JPEG (Pillow, off the event loop); as it is
        when Pillow is not installed or cannot read it (then `_offer` drops it)."""
        data = await asyncio.to_thread(to_jpeg, frame.data)
        if data is None:
            if not self._said_no_jpeg:
                self._said_no_jpeg = True
                log.warning(
                    "a screen frame is over 1 MiB and Pillow is not installed: such frames"
                    " are not sent (pip install 'agentic-mobile-control[jpeg]')",
                    device=frame.serial,
                    size=len(frame.data),
                )
            return frame
        metrics.SCREEN_FRAMES_JPEG.inc()
        smaller = scheduler_pb2.ScreenFrame()
        smaller.CopyFrom(frame)
        smaller.data, smaller.mime = data, "image/jpeg"
        return smaller

    def _offer(self, serial: str, frame: scheduler_pb2.ScreenFrame) -> None:
        if serial not in self._watched:
            return
        if len(frame.data) > MAX_FRAME_BYTES:
            metrics.SCREEN_FRAMES_DROPPED.labels("too_large").inc()
            return
        if serial in self._outbox:
            metrics.SCREEN_FRAMES_DROPPED.labels("superseded").inc()
        self._outbox[serial] = frame
        self._ready.set()
