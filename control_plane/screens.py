"""Live screens: a phone's frames from its host to the viewers watching it.

    host agent ──Lease.ScreenFrames──▶ replica B ──Scheduler.WatchScreen (relayed)──▶ replica A
                                        │                                             │
                                   viewers on B                                  viewers on A

A host opens its `Lease.ScreenFrames` call only when asked: a viewer waiting here for one
of its phones with no feed here has `screen_wanted` pushed onto the host's renewal stream
here (`Screens.ask`; again when the feed ends while a viewer waits, and when the stream
opens while one waits), and the host closes the call a while after nothing is watched.
The replica keeps the call as the host's feed and sends it the set of the host's phones
watched on this replica (each at the highest frame rate its viewers asked for) whenever
that set changes: the host captures those phones and nothing else. Each frame it sends
replaces the phone's latest frame (`Screen.frame`) and wakes its viewers; a viewer takes
the latest frame when it is ready for one, so a slow viewer skips frames (the latest
wins) and no frame ever queues.

A viewer whose phone's host is connected to another replica (`hosts.replica_id`, and that
replica's advertised address) is served by one relay per phone on this replica: a
`Scheduler.WatchScreen` call to that replica over `Peers`, with the first viewer's
credentials and RELAYED_BY, whose frames feed the local `Screen` as a host's would. That
replica counts the relay as one viewer: the phone is captured once for every viewer on
every replica. A relayed call is never relayed on. No database work per frame; one read
when a watch starts (where the phone's host is, and the task's phone for a task's watch).
Watching touches nothing of a task: no lease, step or action.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from amc.v1 import lease_pb2, scheduler_pb2
from control_plane import metrics, validate
from control_plane.domain import Role, TaskId
from control_plane.errors import (
    DeviceNotFound,
    FailedPrecondition,
    InvalidArgument,
    PermissionDenied,
    TaskNotFound,
    Unavailable,
)
from control_plane.frames import Screen, Viewer
from control_plane.peers import RelayedCall
from control_plane.rpc import TaskServicer, check_decoded, first_message, principal

log = structlog.get_logger(__name__)

# Metadata of a viewer's call relayed by another replica (that replica's id).
RELAYED_BY = "amc-screen-relayed-by"
DEFAULT_FPS = 10
MAX_FPS = 30
RUNNING = ("assigned", "dispatched")
# Seconds a viewer waits for a frame without its phone's host connected here (no feed, no
# relay) before it is told to watch again: the host may have reconnected elsewhere.
STALE = 10.0


@dataclasses.dataclass(frozen=True)
class Target:
    task_id: uuid.UUID | None
    host_id: str
    serial: str
    max_fps: int


def target(request: scheduler_pb2.WatchScreenRequest) -> Target:
    """What a WatchScreen asks to watch, checked."""
    fps = request.max_fps or DEFAULT_FPS
    if not 1 <= fps <= MAX_FPS:
        raise InvalidArgument("max_fps", f"must be 1 to {MAX_FPS} (0: {DEFAULT_FPS})")
    if request.task_id:
        if request.host_id or request.serial:
            raise InvalidArgument(
                "task_id", "name a task, or a device (host_id and serial), not both"
            )
        return Target(validate.task_id(request.task_id), "", "", fps)
    if not request.host_id and not request.serial:
        raise InvalidArgument("task_id", "required: a task, or a device (host_id and serial)")
    host_id = validate.identifier(request.host_id, "host_id")
    serial = validate.identifier(request.serial, "serial")
    return Target(None, host_id, serial, fps)


class ScreenWatch(RelayedCall):
    """One WatchScreen call: a viewer of one phone on this replica."""

    RELAYED_BY = RELAYED_BY

    async def run(self, request: Any, context: Any) -> AsyncIterator[scheduler_pb2.ScreenFrame]:
        check_decoded(request)
        want = target(request)
        who = principal()
        if want.task_id is None and who.role is Role.CLIENT:
            raise PermissionDenied(
                "watching a phone by its device is for operators; watch a task's phone by"
                " its task_id"
            )
        settings = self._svc.settings
        source = await self._svc.store.replicas.screen_source(
            want.task_id, want.host_id, want.serial, settings.lease_ttl
        )
        if want.task_id is not None:
            if source is None or not source["task_found"]:
                raise TaskNotFound(f"task {want.task_id} not found")
            if source["task_status"] not in RUNNING or source["host_id"] is None:
                raise FailedPrecondition(
                    f"task {want.task_id} is not running ({source['task_status']}): only a"
                    " running task's phone can be watched"
                )
        if source is None or not source["device_found"]:
            raise DeviceNotFound(f"device {want.host_id}/{want.serial} not found")
        host_id, serial = str(source["host_id"]), str(source["serial"])
        screens = self._svc.hub.screens
        relayed = self.relayed
        elsewhere = (
            source["replica_id"] is not None
            and source["replica_id"] != self._svc.hub.replica
            and source["alive"]
            and bool(source["address"])
        )
        # The host's feed, or its renewal stream (which asks it for the feed), is here.
        here = screens.has_feed(host_id) or self._svc.hub.connected(host_id)
        if not here and not elsewhere and not relayed:
            if source["replica_id"] is None or not source["alive"]:
                raise FailedPrecondition(f"host {host_id} is not connected")
        with screens.watch(host_id, serial, want.max_fps) as (screen, viewer):
            if not relayed and not here and elsewhere and screen.source is None:
                relay = asyncio.get_running_loop().create_task(
                    self._relay(screen, str(source["address"]), want.max_fps)
                )
                screens.relaying(screen, relay)
            # No feed here yet: the host's renewal stream here asks it to open one.
            screens.ask(host_id)
            await context.send_initial_metadata(())
            log.info("screen watched", host_id=host_id, serial=serial, relayed=relayed)
            metrics.SCREEN_VIEWERS.inc()
            try:
                async for frame in self._frames(screen, viewer, want.task_id):
                    yield frame
            finally:
                metrics.SCREEN_VIEWERS.dec()

    async def _frames(
        self, screen: Screen, viewer: Viewer, task_id: uuid.UUID | None
    ) -> AsyncIterator[scheduler_pb2.ScreenFrame]:
        """The latest frame whenever there is a newer one, at most max_fps a second; a
        task's watch ends when the task stops running."""
        hub = self._svc.hub
        loop = asyncio.get_running_loop()
        interval = 1.0 / viewer.max_fps
        sent: scheduler_pb2.ScreenFrame | None = None
        sent_at = -interval
        with contextlib.ExitStack() as stack:
            changed = stack.enter_context(hub.watch(TaskId(task_id))) if task_id else None
            while True:
                if changed is not None and changed.is_set():
                    changed.clear()
                    task = await self._svc.store.tasks.get_task(TaskId(task_id))  # type: ignore[arg-type]
                    if task.status.value not in RUNNING:
                        return
                if hub.screens.closing:
                    raise Unavailable("control plane shutting down; watch again")
                if screen.lost is not None:
                    raise Unavailable(screen.lost)
                frame = screen.frame
                if frame is None or frame is sent:
                    try:
                        async with asyncio.timeout(STALE):
                            await _either(viewer.ready, changed)
                    except TimeoutError:
                        if screen.source is None and not hub.screens.has_feed(screen.host_id):
                            # The host left this replica (gone, or reconnected elsewhere).
                            raise Unavailable(
                                f"host {screen.host_id} is no longer connected here: watch again"
                            ) from None
                    viewer.ready.clear()
                    continue
                wait = sent_at + interval - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue  # the newest frame after the wait
                sent, sent_at = frame, loop.time()
                metrics.SCREEN_FRAMES.labels("sent").inc()
                yield frame

    async def _relay(self, screen: Screen, address: str, fps: int) -> None:
        """The phone's frames from the replica holding its host's feed, into `screen`."""
        metadata = self.forwarded()
        request = scheduler_pb2.WatchScreenRequest(
            host_id=screen.host_id, serial=screen.serial, max_fps=fps
        )
        call = self._peers.scheduler(address).WatchScreen(request, metadata=metadata)
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


async def _either(ready: asyncio.Event, changed: asyncio.Event | None) -> None:
    if changed is None:
        await ready.wait()
        return
    waits = [asyncio.ensure_future(ready.wait()), asyncio.ensure_future(changed.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


class HostFeed:
    """A host's ScreenFrames call: the phones to capture down, their frames up."""

    def __init__(self, service: TaskServicer) -> None:
        self._svc = service

    async def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        first = await first_message(
            requests, "host_id", "required: the first message names the host"
        )
        host_id = validate.identifier(first.host_id, "host_id")
        who = principal()
        if who.role is Role.HOST and who.host_id != host_id:
            raise PermissionDenied(f"this token acts for host {who.host_id}, not {host_id}")
        screens = self._svc.hub.screens
        with screens.feed(host_id) as feed:
            pump = asyncio.get_running_loop().create_task(self._frames(host_id, requests))
            told: list[tuple[str, int]] | None = None
            metrics.SCREEN_FEEDS.inc()
            try:
                while screens.current(host_id, feed) and not pump.done():
                    feed.changed.clear()
                    watched = screens.watched(host_id)
                    if watched != told:
                        told = watched
                        yield lease_pb2.ScreenFramesResponse(
                            watched=[lease_pb2.ScreenWatch(serial=s, max_fps=f) for s, f in watched]
                        )
                    changed = asyncio.ensure_future(feed.changed.wait())
                    try:
                        await asyncio.wait([pump, changed], return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        changed.cancel()
            finally:
                metrics.SCREEN_FEEDS.dec()
                pump.cancel()

    async def _frames(self, host_id: str, requests: AsyncIterator[Any]) -> None:
        screens = self._svc.hub.screens
        with contextlib.suppress(Exception):  # the host left: its call ends here
            async for request in requests:
                if request.WhichOneof("part") != "frame":
                    return
                delivered = screens.deliver(host_id, request.frame)
                metrics.SCREEN_FRAMES.labels("received" if delivered else "unwatched").inc()
