"""A host's ScreenFrames call (its screen feed): the phones of the host watched on this
replica and how (control_plane.frames.Screens.watched: a rate, still images or the stream,
a thumbnail's share of the host's budget) sent down whenever that changes, with the key
frames its viewers want; the host's frames up, to their viewers here."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import structlog

from amc.v1 import lease_pb2
from control_plane import metrics
from control_plane.frames import Feed
from control_plane.rpc import TaskServicer, calling_host
from control_plane.video import check_frame

log = structlog.get_logger(__name__)

# What became of a host's frame (Screens.deliver), each series bound once: one is counted
# for every frame a host sends.
RESULTS = {r: metrics.SCREEN_FRAMES.labels(r) for r in ("received", "unwatched", "over_rate")}


class HostFeed:
    """A host's ScreenFrames call: the phones to capture down, their frames up."""

    def __init__(self, service: TaskServicer) -> None:
        self._svc = service

    def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        feeds = self._svc.hub.screens
        return feeds.serve(requests, calling_host, self._frames, metrics.SCREEN_FEEDS, _watched)

    async def _frames(self, host_id: str, requests: AsyncIterator[Any]) -> None:
        screens = self._svc.hub.screens
        warned = False
        with contextlib.suppress(Exception):  # the host left: its call ends here
            async for request in requests:
                if request.WhichOneof("part") != "frame":
                    return
                result = screens.deliver(host_id, request.frame)
                (RESULTS.get(result) or metrics.SCREEN_FRAMES.labels(result)).inc()
                if result == "malformed" and not warned:
                    warned = True  # once per call: a broken host sends many
                    log.warning(
                        "a host's frame could not be passed on",
                        host_id=host_id,
                        serial=request.frame.serial,
                        why=check_frame(request.frame),
                    )


def _watched(
    watched: list[tuple[str, int, bool, bool, int]], feed: Feed
) -> lease_pb2.ScreenFramesResponse:
    """The phones to capture, and the key frames wanted since the host was last told."""
    keys = sorted(feed.key_frames)
    feed.key_frames.clear()
    return lease_pb2.ScreenFramesResponse(
        watched=[
            lease_pb2.ScreenWatch(serial=s, max_fps=f, images=i, video=v, interval_ms=ms)
            for s, f, i, v, ms in watched
        ],
        key_frames=keys,
    )
