"""Live screens: a phone's frames from its host to the viewers watching it.

    host agent ──Lease.ScreenFrames──▶ replica B ──Scheduler.WatchScreen (relayed)──▶ replica A
                                        │                                             │
                                   viewers on B                                  viewers on A

A host opens its `Lease.ScreenFrames` call only when asked: a viewer waiting here for one
of its phones with no feed here has `screen_wanted` pushed onto the host's renewal stream
here (`Screens.ask`; again when the feed ends while a viewer waits, and when the stream
opens while one waits), and the host closes the call a while after nothing is watched. The
replica keeps the call as the host's feed (control_plane.screen_feed) and sends it the set
of the host's phones watched on this replica (each at the highest frame rate its viewers
asked for) whenever that set changes: the host captures those phones and nothing else. Each
frame it sends replaces the phone's latest frame (`Screen.frame`) and wakes its viewers; a
viewer takes the latest frame when it is ready for one, so a slow viewer skips frames (the
latest wins) and no frame ever queues.

A viewer whose phone's host is connected to another replica (`hosts.replica_id`, and that
replica's advertised address) is served by one relay per phone on this replica: a
`Scheduler.WatchScreen` call to that replica over `Peers`, a device watch made as this
replica (control_plane.auth's replica proof, never a viewer's credentials: viewers are
authorized here, where they watch), whose frames feed the local `Screen` as a host's would.
That replica counts the relay as one viewer: the phone is captured once for every viewer on
every replica. A relayed call is never relayed on. No database work per frame; one read
when a watch starts (where the phone's host is, and the task's phone for a task's watch),
and a task's watch is bound to that attempt (control_plane.screen_tasks). Each token may
hold `max_viewers_per_token` watches on a replica, and apart from them
`max_thumbnails_per_token` thumbnails (a frame every few seconds at most:
control_plane.frames has the host's budget for them). A relay asks the rate its phone's
viewers here want (one relay per kind they take: still images, the stream; a thumbnail is a
still image), and is started again when that changes (a Control page opened on a phone a
wall of thumbnails watches, and closed). Watching touches nothing of a task: no lease, step
or action.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import structlog

from amc.v1 import scheduler_pb2
from control_plane import metrics, screen_tasks, validate
from control_plane.config import Settings
from control_plane.domain import Principal, Role
from control_plane.errors import (
    DeviceNotFound,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    TaskNotFound,
    TooManyViewers,
    Unavailable,
)
from control_plane.frames import THUMBNAIL_EVERY, Patience, Screen, Screens, Viewer
from control_plane.rpc import TaskServicer, check_decoded, principal
from control_plane.screen_tasks import RUNNING, Attempt, Followed
from control_plane.video import CODECS, H264, IMAGE

log = structlog.get_logger(__name__)

# Metadata of a call relayed by another replica for its viewers (that replica's id, for
# the logs: what marks a relayed call is the replica's proof).
RELAYED_BY = "amc-screen-relayed-by"
DEFAULT_FPS = 10
MAX_FPS = 30
# Seconds a viewer waits for a frame without its phone's host connected here (no feed, no
# relay) before it is told to watch again: the host may have reconnected elsewhere.
STALE = 10.0
# Counted for every frame sent to every viewer: the series bound once.
SENT = metrics.SCREEN_FRAMES.labels("sent")


@dataclasses.dataclass(frozen=True)
class Target:
    task_id: uuid.UUID | None
    host_id: str
    serial: str
    max_fps: int
    codec: str = IMAGE
    thumbnail: bool = False


def target(request: scheduler_pb2.WatchScreenRequest) -> Target:
    """What a WatchScreen asks to watch, checked."""
    fps = request.max_fps or DEFAULT_FPS
    if not 1 <= fps <= MAX_FPS:
        raise InvalidArgument("max_fps", f"must be 1 to {MAX_FPS} (0: {DEFAULT_FPS})")
    codec = request.codec or IMAGE
    if codec not in CODECS:
        raise InvalidArgument(
            "codec", f"{request.codec[:40]!r} is not one of: {', '.join(CODECS)} ('': image)"
        )
    if request.thumbnail:
        if request.max_fps:
            raise InvalidArgument("max_fps", "a thumbnail has no frame rate of its own: 0")
        if codec != IMAGE:
            raise InvalidArgument("codec", "a thumbnail is a still image: '' or 'image'")
        fps = 0
    if request.task_id:
        if request.host_id or request.serial:
            raise InvalidArgument(
                "task_id", "name a task, or a device (host_id and serial), not both"
            )
        return Target(validate.task_id(request.task_id), "", "", fps, codec, request.thumbnail)
    if not request.host_id and not request.serial:
        raise InvalidArgument("task_id", "required: a task, or a device (host_id and serial)")
    host_id = validate.identifier(request.host_id, "host_id")
    serial = validate.identifier(request.serial, "serial")
    return Target(None, host_id, serial, fps, codec, request.thumbnail)


class ScreenWatch:
    """One WatchScreen call: a viewer of one phone on this replica."""

    def __init__(self, service: TaskServicer) -> None:
        self._svc = service

    async def run(self, request: Any, context: Any) -> AsyncIterator[scheduler_pb2.ScreenFrame]:
        check_decoded(request)
        want = target(request)
        who = principal()
        if want.task_id is None and who.role is Role.CLIENT:
            raise PermissionDenied(
                "watching a phone by its device is for operators; watch a task's phone by"
                " its task_id"
            )
        svc, settings = self._svc, self._svc.settings
        source = await svc.store.replicas.screen_source(
            want.task_id, want.host_id, want.serial, settings.lease_ttl
        )
        bound: Attempt | None = None
        if want.task_id is not None:
            if source is None or not source["task_found"]:
                raise TaskNotFound(f"task {want.task_id} not found")
            screen_tasks.authorize(who, want.task_id, source)
            if source["task_status"] not in RUNNING or source["host_id"] is None:
                raise FailedPrecondition(
                    f"task {want.task_id} is not running ({source['task_status']}): only a"
                    " running task's phone can be watched"
                )
            bound = Attempt(source["attempt"], source["host_id"], source["serial"])
        if source is None or not source["device_found"]:
            raise DeviceNotFound(f"device {want.host_id}/{want.serial} not found")
        host_id, serial = str(source["host_id"]), str(source["serial"])
        hub = svc.hub
        screens = hub.screens
        # A call relayed by another replica for its viewers (who were authorized there).
        relayed = who.replica
        elsewhere = (
            source["replica_id"] is not None
            and source["replica_id"] != hub.replica
            and source["alive"]
            and bool(source["address"])
        )
        # The host's feed, or its renewal stream (which asks it for the feed), is here.
        here = screens.has_feed(host_id) or hub.connected(host_id)
        if not here and not elsewhere and not relayed:
            if source["replica_id"] is None or not source["alive"]:
                raise FailedPrecondition(f"host {host_id} is not connected")
        address = str(source["address"]) if not relayed and not here and elsewhere else None
        with contextlib.ExitStack() as stack:
            stack.enter_context(_admitted(screens, who, settings, want.thumbnail))
            followed: Followed | None = None
            if bound is not None and want.task_id is not None:
                every = settings.watch_refresh.total_seconds()
                read = svc.store.replicas.screen_attempt
                followed = stack.enter_context(hub.following.follow(want.task_id, read, every))
                followed.join(bound)
            screen, viewer = stack.enter_context(self._watching(host_id, serial, want, address))
            if followed is not None:
                stack.enter_context(followed.waking(viewer.ready))  # a read wakes the viewer
            patience = stack.enter_context(Patience(viewer.ready, STALE))
            # No feed here yet: the host's renewal stream here asks it to open one.
            screens.ask(host_id)
            await context.send_initial_metadata(())
            log.info(
                "screen watched", host_id=host_id, serial=serial, relayed=relayed, codec=want.codec
            )
            metrics.SCREEN_VIEWERS.inc()
            try:
                async for frame in self._frames(screen, viewer, followed, bound, patience):
                    yield frame
            finally:
                metrics.SCREEN_VIEWERS.dec()

    async def _frames(
        self,
        screen: Screen,
        viewer: Viewer,
        followed: Followed | None,
        bound: Attempt | None,
        patience: Patience,
    ) -> AsyncIterator[scheduler_pb2.ScreenFrame]:
        """A viewer of still images: the latest frame whenever there is a newer one, at
        most max_fps a second. A viewer of the stream: its every frame in order from the
        latest key frame on (a skip to a newer key frame when it fell behind), or the
        latest still frame while the phone has no stream. A task's watch sends a frame
        only while its attempt is the task's current one (`followed`, checked before each
        frame), and ends when it is not."""
        hub = self._svc.hub
        loop = asyncio.get_running_loop()
        interval = THUMBNAIL_EVERY if viewer.thumbnail else 1.0 / viewer.max_fps
        # A task's watch starts with the first frame that comes after it was bound: the
        # one the phone's screen holds may be older than the task's attempt.
        sent: scheduler_pb2.ScreenFrame | None = screen.frame if followed else None
        sent_at = -interval
        while True:
            if hub.screens.closing:
                raise Unavailable("control plane shutting down; watch again")
            if screen.lost is not None:
                raise Unavailable(screen.lost)
            if followed is not None and bound is not None:
                verdict = followed.check(bound)
                if verdict == screen_tasks.FINISHED:
                    return
                if verdict == screen_tasks.WAIT:
                    # Until the task's next read, a frame or the replica stopping: each
                    # sets the viewer's `ready`.
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(STALE):
                            await viewer.ready.wait()
                    viewer.ready.clear()
                    continue
            if viewer.codec == H264 and screen.streams:
                frame = hub.screens.next_of_stream(screen, viewer)
                if frame is None:
                    await self._wait(screen, viewer, patience)
                elif (
                    followed is not None
                    and bound is not None
                    and not _during(frame, followed, bound)
                ):
                    # Never sent; the frames after it need it: on from the next key frame.
                    hub.screens.await_key_frame(screen, viewer)
                    metrics.SCREEN_FRAMES.labels("other_attempt").inc()
                else:
                    SENT.inc()
                    yield frame
                continue
            frame = screen.frame
            if frame is None or frame is sent:
                await self._wait(screen, viewer, patience)
                continue
            if followed is not None and bound is not None and not _during(frame, followed, bound):
                sent = frame  # its host says the phone ran another attempt: never sent
                metrics.SCREEN_FRAMES.labels("other_attempt").inc()
                continue
            wait = sent_at + interval - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue  # the newest frame after the wait, checked again
            sent, sent_at = frame, loop.time()
            SENT.inc()
            yield frame

    async def _wait(self, screen: Screen, viewer: Viewer, patience: Patience) -> None:
        """Until the screen has something new for the viewer (or the task was read again);
        a viewer whose phone's host left this replica (nothing came for STALE seconds) is
        told to watch again."""
        patience.begin()
        try:
            await viewer.ready.wait()
        finally:
            out = patience.end()
        if out:
            if screen.source is None and not self._svc.hub.screens.has_feed(screen.host_id):
                # The host left this replica (gone, or reconnected elsewhere).
                raise Unavailable(
                    f"host {screen.host_id} is no longer connected here: watch again"
                ) from None
        viewer.ready.clear()

    @contextlib.contextmanager
    def _watching(
        self, host_id: str, serial: str, want: Target, address: str | None
    ) -> Iterator[tuple[Screen, Viewer]]:
        """A viewer of the phone here (`address`: the replica its frames are relayed from,
        None when they come from a feed here), whose relay, if any, asks what the phone's
        viewers here want, the viewer counted in and, once it left, out."""
        screens = self._svc.hub.screens
        watch = screens.watch(host_id, serial, want.max_fps, want.codec, want.thumbnail)
        with watch as (screen, viewer):
            self._relayed_as_wanted(screen, address)
            try:
                yield screen, viewer
            finally:
                screen.viewers.discard(viewer)
                if not screens.closing:
                    self._relayed_as_wanted(screen, address)

    def _relayed_as_wanted(self, screen: Screen, address: str | None) -> None:
        """A screen whose frames come from another replica (`address`) has a relay per kind
        its viewers here take, asking the rate they want: started, started again when that
        changed (a viewer came or went), ended when none takes its kind. None: its frames
        come from a feed here."""
        if address is None or not screen.viewers:
            return
        for codec in CODECS:
            wanted = screen.takes(codec)
            if not wanted and codec not in screen.sources:
                continue
            fps = screen.rate(codec)
            if wanted and codec in screen.sources and screen.source_fps[codec] == fps:
                continue
            relay = (
                asyncio.get_running_loop().create_task(self._relay(screen, address, fps, codec))
                if wanted
                else None
            )
            self._svc.hub.screens.relaying(screen, codec, relay)

    async def _relay(self, screen: Screen, address: str, fps: int, codec: str) -> None:
        """The phone's frames (of what `codec` takes) from the replica holding its host's
        feed, into `screen`: a device watch as this replica (its proof, not a viewer's
        credentials), at `fps`, or as a thumbnail when 0."""
        metadata = [
            ("authorization", self._svc.auth.replica_proof()),
            (RELAYED_BY, self._svc.hub.replica),
        ]
        request = scheduler_pb2.WatchScreenRequest(
            host_id=screen.host_id,
            serial=screen.serial,
            max_fps=fps,
            codec=codec,
            thumbnail=not fps,
        )
        call = self._svc.peers.scheduler(address).WatchScreen(request, metadata=metadata)
        log.info("screen relayed", host_id=screen.host_id, serial=screen.serial, to=address)
        try:
            async for frame in call:
                metrics.SCREEN_FRAMES.labels("relayed").inc()
                screen.put(frame)
            screen.fail(f"screen relay ended: the replica holding its host ({address}) left")
        except grpc.aio.AioRpcError as exc:
            screen.fail(
                f"screen relay lost: the replica holding its host ({address}) answered "
                f"{exc.code().name}: {exc.details()}"
            )
        finally:
            call.cancel()


def _during(frame: scheduler_pb2.ScreenFrame, followed: Followed, bound: Attempt) -> bool:
    """The frame was captured while its phone ran the attempt (as its host says; a frame
    of an older agent says nothing, and the watch's attempt check alone holds it)."""
    if not frame.HasField("running"):
        return True
    running = frame.running
    return running.task_id == str(followed.task_id) and running.attempt == bound.attempt


@contextlib.contextmanager
def _admitted(
    screens: Screens, who: Principal, settings: Settings, thumbnail: bool
) -> Iterator[None]:
    """One more viewer of the caller's token on this replica, up to its limit (a
    thumbnail: one more of its thumbnails, up to theirs); a replica's relays and callers
    without a token are not counted."""
    token = who.token_id
    if token is None or who.replica:
        yield
        return
    counted = screens.thumbnails_by_token if thumbnail else screens.by_token
    limit = settings.max_thumbnails_per_token if thumbnail else settings.max_viewers_per_token
    if counted[token] >= limit:
        what, flag = ("thumbnails", "thumbnails") if thumbnail else ("screens", "viewers")
        raise TooManyViewers(
            f"this token watches {counted[token]} {what} on this replica, its limit"
            f" (--max-{flag}-per-token {limit}): close one first"
        )
    counted[token] += 1
    try:
        yield
    finally:
        counted[token] -= 1
        if not counted[token]:
            del counted[token]
