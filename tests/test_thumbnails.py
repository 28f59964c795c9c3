"""Thumbnails (WatchScreenRequest.thumbnail, the console's /api/thumbnails): a phone watched
by thumbnails alone is captured every few seconds at most, a host's thumbnails share a
budget whatever the number of phones, a live viewer of the same phone has it at its own
rate, and thumbnails are counted apart from a token's live screens. A real agent on
simulated phones, through the real API and the console's socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import aiohttp
import grpc
import pytest

from amc.v1 import lease_pb2, scheduler_pb2
from control_plane import frames, screens
from control_plane.domain import Role
from control_plane.errors import InvalidArgument
from host_agent import metrics as agent_metrics
from host_agent.screen_wants import want_of
from host_agent.simulated import SimulatedSource
from tests.support import Farm, eventually
from tests.support.agent import running_agent
from tests.support.console import SETTINGS, console_farm, console_url

HOST = "host-1"


@pytest.fixture
async def farm(database_url: str) -> AsyncIterator[Farm]:
    limited = replace(SETTINGS, max_viewers_per_token=1, max_thumbnails_per_token=3)
    async with console_farm(database_url, settings=limited) as f:
        yield f


def captures() -> float:
    return float(agent_metrics.SCREEN_CAPTURES._value.get())


def thumbnail(serial: str) -> scheduler_pb2.WatchScreenRequest:
    return scheduler_pb2.WatchScreenRequest(host_id=HOST, serial=serial, thumbnail=True)


def test_a_hosts_thumbnails_share_its_budget_and_a_live_viewer_keeps_its_rate() -> None:
    """THEN a host's phones watched by thumbnails alone are each captured once per
    THUMBNAIL_EVERY, or less often when there are more than HOST_THUMBNAILS a second of
    them; a phone also watched live is asked at the viewer's rate; a phone whose live
    viewer takes its H.264 stream keeps its thumbnails' interval for its still images and
    is asked the stream's rate; another host's phones are not counted in."""
    screens = frames.Screens()
    with (
        screens.watch("h1", "a", 0, thumbnail=True),
        screens.watch("h1", "b", 0, thumbnail=True),
        screens.watch("h2", "c", 0, thumbnail=True),
    ):
        assert screens.watched("h1") == [("a", 1, True, False, 3000), ("b", 1, True, False, 3000)]
        with screens.watch("h1", "a", 10):
            assert screens.watched("h1") == [
                ("a", 10, True, False, 0),
                ("b", 1, True, False, 3000),
            ]
        with screens.watch("h1", "a", 30, "h264"):
            assert screens.watched("h1") == [
                ("a", 30, True, True, 3000),
                ("b", 1, True, False, 3000),
            ]
    with contextlib.ExitStack() as stack:
        for i in range(40):
            stack.enter_context(screens.watch("h1", f"p{i}", 0, thumbnail=True))
        # 40 phones at 4 thumbnails a second: each every 10 s.
        assert {(fps, every) for _, fps, _, _, every in screens.watched("h1")} == {(1, 10_000)}


def test_a_thumbnail_is_a_still_image_with_no_rate_of_its_own() -> None:
    """THEN a thumbnail that asks for a frame rate or for the H.264 stream is refused,
    naming the field."""
    for field, request in [
        ("max_fps", replace_request(max_fps=5)),
        ("codec", replace_request(codec="h264")),
    ]:
        with pytest.raises(InvalidArgument) as caught:
            screens.target(request)
        assert caught.value.field == field
    assert screens.target(replace_request(codec="image")).thumbnail


def test_a_hosts_still_captures_keep_the_thumbnails_interval_beside_a_phones_stream() -> None:
    """THEN the host reads a phone watched by thumbnails and by a viewer of its stream as
    still images every interval_ms and the stream at max_fps; an older control plane's
    watch (no interval) as still images at max_fps."""
    both = want_of(
        lease_pb2.ScreenWatch(serial="a", max_fps=30, images=True, video=True, interval_ms=4000)
    )
    assert (both.fps, both.still_fps(no_video=False)) == (30, 0.25)
    # A phone with no stream here: its stream's viewer takes still frames at its rate.
    assert both.still_fps(no_video=True) == 30
    old = want_of(lease_pb2.ScreenWatch(serial="a", max_fps=5))
    assert (old.images, old.video, old.still_fps(no_video=False)) == (True, False, 5)


def replace_request(**fields: object) -> scheduler_pb2.WatchScreenRequest:
    request = thumbnail("sim-0")
    for name, value in fields.items():
        setattr(request, name, value)
    return request


async def test_thumbnails_come_every_few_seconds_and_are_counted_apart_from_live_screens(
    farm: Farm,
) -> None:
    """GIVEN --max-viewers-per-token 1 and --max-thumbnails-per-token 3 THEN a token holds
    one live screen and three thumbnails at once, a fourth thumbnail is RESOURCE_EXHAUSTED
    naming --max-thumbnails-per-token; a thumbnail's frames come THUMBNAIL_EVERY apart at
    most, and a phone watched by a thumbnail alone is captured no oftener than that."""
    operator = await farm.operator()
    source = SimulatedSource(4, delay=0.01)
    async with running_agent(farm, source):
        live = operator.scheduler.WatchScreen(
            scheduler_pb2.WatchScreenRequest(host_id=HOST, serial="sim-3", max_fps=10)
        )
        assert (await asyncio.wait_for(live.read(), 20)).serial == "sim-3"
        calls = [operator.scheduler.WatchScreen(thumbnail(s)) for s in ("sim-0", "sim-1", "sim-2")]
        for call in calls:
            await asyncio.wait_for(call.read(), 20)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await asyncio.wait_for(operator.scheduler.WatchScreen(thumbnail("sim-3")).read(), 20)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-thumbnails-per-token 3" in (caught.value.details() or "")
        live.cancel()
        for call in calls[1:]:
            call.cancel()
        # One phone watched by its thumbnail alone: frames, and captures, 3 s apart.
        first = await asyncio.wait_for(calls[0].read(), 20)
        captured, started = captures(), time.monotonic()
        second = await asyncio.wait_for(calls[0].read(), 20)
        gap = (second.captured_at_ms - first.captured_at_ms) / 1000
        assert gap >= frames.THUMBNAIL_EVERY - 0.3, gap
        await asyncio.wait_for(calls[0].read(), 20)
        elapsed = time.monotonic() - started
        assert captures() - captured <= elapsed / frames.THUMBNAIL_EVERY + 2
        calls[0].cancel()


async def test_the_consoles_thumbnails_socket_sends_each_shown_phones_frames_and_ends_them(
    farm: Farm,
) -> None:
    """THEN /api/thumbnails, told the phones a page shows, sends frames of each (their
    header naming the phone), says in one line which watch ended and why, refuses a
    malformed message and goes on; a client token is refused before the socket opens;
    closing it stops the captures."""
    source = SimulatedSource(2, delay=0.01)
    url = console_url(farm, "/api/thumbnails").replace("http", "ws", 1)
    async with running_agent(farm, source), aiohttp.ClientSession() as http:
        client = await farm.token(Role.CLIENT)
        async with http.get(url, headers={"Authorization": f"Bearer {client}"}) as refused:
            assert refused.status == 403
            assert "thumbnails are for operators" in (await refused.json())["message"]
        token = await farm.token(Role.OPERATOR)
        socket = await http.ws_connect(
            url,
            protocols=("amc.v1", f"amc.bearer.{token}"),
            compress=15,  # as a browser
        )
        assert socket.compress == 0  # images do not compress: no per-message deflate
        await socket.send_str("not json")
        assert "not JSON" in (await socket.receive_json(timeout=10))["error"]["message"]
        watch = [[HOST, "sim-0"], [HOST, "sim-1"], [HOST, "nowhere"]]
        await socket.send_str(json.dumps({"watch": watch}))
        seen: set[str] = set()
        ended: dict[str, str] = {}
        while len(seen) < 2 or "nowhere" not in ended:
            message = await socket.receive(timeout=20)
            if message.type is aiohttp.WSMsgType.TEXT:
                note = json.loads(message.data)
                ended[note["phone"][1]] = note["ended"]
                continue
            (length,) = struct.unpack(">I", message.data[:4])
            header = json.loads(message.data[4 : 4 + length])
            assert header["host_id"] == HOST
            seen.add(header["serial"])
        assert seen == {"sim-0", "sim-1"}
        assert ended["nowhere"].startswith("NOT_FOUND: device host-1/nowhere")
        await socket.close()
        assert farm.plane is not None
        screens = farm.plane.hub.screens
        await eventually(lambda: screens.viewers() == 0, what="the watches to end")
        stopped = captures()
        await asyncio.sleep(1.0)
        assert captures() == stopped


async def test_a_live_viewer_of_a_phone_shown_as_a_thumbnail_gets_frames_at_once(
    farm: Farm,
) -> None:
    """GIVEN 20 phones of a host watched as thumbnails (each captured every 5 s) WHEN an
    operator watches one of them live THEN its frames come at the live rate at once, not
    after the thumbnail's wait."""
    source = SimulatedSource(20, delay=0.01)
    operator = await farm.operator()
    async with running_agent(farm, source):
        # This farm lets a token hold 3 thumbnails: 7 tokens for the 20.
        walls = [farm.clients(await farm.token(Role.OPERATOR)) for _ in range(7)]
        calls = [
            walls[i // 3].scheduler.WatchScreen(thumbnail(serial))
            for i, serial in enumerate(source.serials)
        ]
        for call in calls:
            await asyncio.wait_for(call.read(), 30)
        await asyncio.wait_for(calls[0].read(), 30)  # a thumbnail just captured: 5 s to go
        live = operator.scheduler.WatchScreen(
            scheduler_pb2.WatchScreenRequest(host_id=HOST, serial="sim-0", max_fps=10)
        )
        await asyncio.wait_for(live.read(), 20)  # the phone's latest frame
        started = time.monotonic()
        seqs = [(await asyncio.wait_for(live.read(), 20)).seq for _ in range(5)]
        assert time.monotonic() - started < 2.5, seqs
        live.cancel()
        for call in calls:
            call.cancel()
