"""Live screens (issue 24): Scheduler.WatchScreen and the console's /api/screen, through a
real control plane and a real host agent on simulated phones whose frames show the actions
done on them (a red square where the last tap landed)."""

from __future__ import annotations

import asyncio
import json
import random
import struct
import zlib
from datetime import timedelta
from typing import Any

import aiohttp
import grpc
import pytest
from prometheus_client import REGISTRY

from amc.v1 import lease_pb2, scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from control_plane import screens
from control_plane.config import Settings
from control_plane.console import screen as console_screen
from control_plane.console.screen import frame_message
from control_plane.domain import Role
from control_plane.frames import Patience
from host_agent.adb import AdbSource
from host_agent.screen import Canvas
from host_agent.simulated import SimulatedSource
from host_agent.simulated_screen import TAP_RGB, LiveScreen
from tests.support import Clients, Farm, actions_spec, eventually, tap, wait_action
from tests.support.agent import finished, get, running_agent, status_is, submit
from tests.support.console import console_farm, console_url
from tests.support.fakes.adb_server import FakeAdbServer
from tests.support.fakes.phone import FakePhone
from tests.support.replicas import Replica
from tests.test_grpc_clients import GRPCURL, run
from tests.test_sessions import act, dispatched, opening

HOST, SERIAL = "host-1", "sim-0"


def pixel(png: bytes, x: int, y: int) -> tuple[int, int, int]:
    """The RGB of (x, y) in a truecolour PNG whose scanlines are unfiltered (as the
    simulated phones write them)."""
    width = struct.unpack(">I", png[16:20])[0]
    at, idat = 8, b""
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        if png[at + 4 : at + 8] == b"IDAT":
            idat += png[at + 8 : at + 8 + length]
        at += 12 + length
    raw = zlib.decompress(idat)
    row = raw[y * (1 + 3 * width) : (y + 1) * (1 + 3 * width)]
    assert row[0] == 0, "a filtered scanline"
    r, g, b = row[1 + 3 * x : 4 + 3 * x]
    return r, g, b


def watch(client: Clients, **fields: Any) -> Any:
    return client.scheduler.WatchScreen(scheduler_pb2.WatchScreenRequest(**fields))


async def next_frame(call: Any, within: float = 20.0) -> scheduler_pb2.ScreenFrame:
    frame = await asyncio.wait_for(call.read(), within)
    assert frame is not grpc.aio.EOF
    return frame  # type: ignore[no-any-return]


async def frame_where(
    call: Any, check: Any, within: float = 20.0, what: str = "a frame"
) -> scheduler_pb2.ScreenFrame:
    """The first frame `check` accepts."""
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    while True:
        left = until - loop.time()
        assert left > 0, f"no {what} within {within}s"
        frame = await next_frame(call, left)
        if check(frame):
            return frame


async def session_tap(client: Clients, x: int, y: int) -> Any:
    """A session on the phone, with one tap answered; the open call (close it after)."""
    call = client.scheduler.OpenSession()
    await call.write(opening())
    await dispatched(call)
    await call.write(act(tap(x, y)))
    answer = (await asyncio.wait_for(call.read(), 20)).step
    assert answer.step.status == task_pb2.STEP_STATUS_OK
    return call


async def test_a_watched_phone_streams_frames_and_a_tap_shows_in_the_next_ones(
    farm: Farm,
) -> None:
    """THEN frames come (PNG, the phone's size, seq rising, host and serial said) and a
    tap done through a session shows where it landed in a later frame."""
    operator, client = await farm.operator(), await farm.client()
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source):
        call = watch(operator, host_id=HOST, serial=SERIAL, max_fps=15)
        first = await next_frame(call)
        assert (first.host_id, first.serial, first.mime) == (HOST, SERIAL, "image/png")
        # The phone's size in its own pixels (taps'); its image is drawn at a third.
        assert (first.width, first.height) == (1080, 2400) and first.seq >= 1
        assert pixel(first.data, 180, 400) != TAP_RGB
        second = await next_frame(call)
        assert second.seq > first.seq and second.data != first.data
        session = await session_tap(client, 540, 1200)
        shown = await frame_where(
            call, lambda f: pixel(f.data, 180, 400) == TAP_RGB, what="the tap's mark"
        )
        assert shown.seq > second.seq
        await session.done_writing()
        call.cancel()


async def test_nobody_watching_means_nothing_is_captured(farm: Farm) -> None:
    """THEN with a task running and nobody watching no frame is captured; a viewer starts
    the captures and its leaving stops them."""
    operator, client = await farm.operator(), await farm.client()
    source = SimulatedSource(2, delay=0.01)
    async with running_agent(farm, source) as agent:
        task_id = await submit(client, actions_spec(tap(), wait_action(0.5), tap()))
        await status_is(farm, task_id, "done")
        assert source.captures == 0 and agent.screens is not None
        assert not agent.screens.capturing
        call = watch(operator, host_id=HOST, serial="sim-1")
        await next_frame(call)
        assert agent.screens.capturing == {"sim-1"}
        call.cancel()
        await eventually(lambda: not agent.screens.capturing, what="the captures to stop")
        stopped = source.captures
        # A whole task on that phone later, nobody watching: no frame taken meanwhile.
        again = await submit(
            client,
            actions_spec(tap(), wait_action(0.5), tap()),
            selector=task_pb2.DeviceSelector(serial="sim-1"),
        )
        await status_is(farm, again, "done")
        assert source.captures == stopped


async def test_two_viewers_of_a_phone_share_one_capture(farm: Farm) -> None:
    """THEN both see the same frames (the same seqs from one capture loop) and the phone is
    captured no more often than for one."""
    operator = await farm.operator()
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source) as agent:
        one = watch(operator, host_id=HOST, serial=SERIAL, max_fps=10)
        two = watch(operator, host_id=HOST, serial=SERIAL, max_fps=10)
        seen_one = [(await next_frame(one)).seq for _ in range(8)]
        seen_two = [(await next_frame(two)).seq for _ in range(8)]
        assert agent.screens is not None and agent.screens.capturing == {SERIAL}
        # One capture loop: every frame either saw was captured once; at most the frames
        # in flight were captured beyond the highest seq seen.
        highest = max(seen_one + seen_two)
        assert source.captures <= highest + 3
        assert set(seen_one) & set(seen_two)
        one.cancel()
        two.cancel()


def feeds_gauge() -> float:
    return REGISTRY.get_sample_value("amc_screen_feeds") or 0.0


async def test_the_screen_call_is_open_only_while_wanted_and_closes_after_the_linger(
    farm: Farm,
) -> None:
    """THEN an idle agent holds no ScreenFrames call (the replica counts no feed); a viewer
    arriving has the host's renewal stream ask for it, and gets frames; the call outlives
    the last viewer by the agent's linger (a viewer flipping phones keeps it), then closes,
    and the next viewer opens it again."""
    operator = await farm.operator()
    assert farm.plane is not None
    hub = farm.plane.hub
    base = feeds_gauge()
    loop = asyncio.get_running_loop()
    source = SimulatedSource(2, delay=0.01)
    async with running_agent(farm, source, screen_linger=3.0) as agent:
        assert agent.screens is not None
        await eventually(lambda: hub.connected(HOST), what="the host's renewal stream")
        await asyncio.sleep(1.0)  # idle a while: nothing opens the call
        assert hub.screens.feeds() == 0 and not agent.screens.calling
        assert feeds_gauge() == base and source.captures == 0
        call = watch(operator, host_id=HOST, serial=SERIAL)
        first = await next_frame(call, 10)
        assert first.serial == SERIAL and agent.screens.calling
        assert hub.screens.feeds() == 1 and feeds_gauge() == base + 1
        call.cancel()
        other = watch(operator, host_id=HOST, serial="sim-1")
        assert (await next_frame(other, 10)).serial == "sim-1"
        other.cancel()
        await eventually(lambda: not agent.screens.capturing, what="the captures to stop")
        left = loop.time()
        # Nothing watched: the call stays for the linger, then closes.
        assert agent.screens.calling and hub.screens.feeds() == 1
        await eventually(
            lambda: hub.screens.feeds() == 0 and not agent.screens.calling,
            timeout=15,
            what="the call to close after the linger",
        )
        assert loop.time() - left >= 2.5 and feeds_gauge() == base
        again = watch(operator, host_id=HOST, serial=SERIAL)
        await next_frame(again, 10)
        assert hub.screens.feeds() == 1
        again.cancel()


async def test_a_viewer_asks_the_host_for_its_screen_call_on_its_renewal_stream(
    farm: Farm,
) -> None:
    """THEN a viewer of a phone whose host has no ScreenFrames call here pushes
    screen_wanted (no leases, the drain as the host was last told) onto the host's renewal
    stream, and again onto a stream reopened while the viewer waits; the call the host
    then opens is sent the phone watched, and its frames reach the viewer."""
    host = await farm.host("host-9", "p-1")
    operator = await farm.operator()
    stream = host.stream()
    await stream.renew()
    call = watch(operator, host_id="host-9", serial="p-1")
    push = await eventually(
        lambda: next((p for p in stream.pushes if p.screen_wanted), None),
        what="the push asking for the screen call",
    )
    assert not push.leases and not push.drain
    await stream.close()
    reopened = host.stream()
    await reopened.renew()
    await eventually(
        lambda: any(p.screen_wanted for p in reopened.pushes),
        what="the push again as the stream reopens",
    )
    feed = host.c.lease.ScreenFrames()
    await feed.write(lease_pb2.ScreenFramesRequest(host_id="host-9"))
    told = await asyncio.wait_for(feed.read(), 10)
    assert [w.serial for w in told.watched] == ["p-1"]
    frame = scheduler_pb2.ScreenFrame(serial="p-1", seq=7, mime="image/png", data=b"png")
    await feed.write(lease_pb2.ScreenFramesRequest(frame=frame))
    got = await next_frame(call, 10)
    assert (got.host_id, got.serial, got.seq) == ("host-9", "p-1", 7)
    call.cancel()
    feed.cancel()
    await reopened.close()


async def test_a_host_that_keeps_its_call_open_as_older_agents_do_is_watched_unasked(
    farm: Farm,
) -> None:
    """THEN a host whose ScreenFrames call is open before anyone watches (an agent older
    than screen_wanted) is sent the phone watched when a viewer comes, and never asked."""
    host = await farm.host("host-8", "p-1")
    operator = await farm.operator()
    stream = host.stream()
    await stream.renew()
    feed = host.c.lease.ScreenFrames()
    await feed.write(lease_pb2.ScreenFramesRequest(host_id="host-8"))
    assert not (await asyncio.wait_for(feed.read(), 10)).watched
    call = watch(operator, host_id="host-8", serial="p-1")
    told = await asyncio.wait_for(feed.read(), 10)
    assert [w.serial for w in told.watched] == ["p-1"]
    frame = scheduler_pb2.ScreenFrame(serial="p-1", seq=1, mime="image/png", data=b"png")
    await feed.write(lease_pb2.ScreenFramesRequest(frame=frame))
    assert (await next_frame(call, 10)).seq == 1
    assert not any(p.screen_wanted for p in stream.pushes)
    call.cancel()
    feed.cancel()
    await stream.close()


async def test_a_slow_viewer_misses_frames_and_slows_nobody(farm: Farm) -> None:
    """THEN a viewer that stops reading leaves the other viewer's frames and the phone's
    task as they were; when it reads again it gets recent frames, not a backlog."""
    operator, client = await farm.operator(), await farm.client()
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source) as agent:
        assert farm.plane is not None
        hub = farm.plane.hub
        await eventually(lambda: hub.connected(HOST), what="the host's renewal stream")
        # A viewer whose transport window stays small (no BDP probing): a few frames.
        channel = aio_channel(
            farm.address, await farm.token(Role.OPERATOR), options=[("grpc.http2.bdp_probe", 0)]
        )
        farm._channels.append(channel)
        slow = scheduler_pb2_grpc.SchedulerStub(channel).WatchScreen(
            scheduler_pb2.WatchScreenRequest(host_id=HOST, serial=SERIAL, max_fps=15)
        )
        fast = watch(operator, host_id=HOST, serial=SERIAL, max_fps=15)
        first_slow = await next_frame(slow)
        task_id = await submit(client, actions_spec(tap(), wait_action(1.0), tap()))
        seqs = [(await next_frame(fast)).seq for _ in range(30)]
        assert seqs == sorted(seqs) and len(set(seqs)) == 30
        done = await finished(agent, task_id)
        assert done.result is not None and done.result.outcome.name == "DONE"
        # The slow viewer gets what its transport held (its flow-control window: a few
        # frames), then the latest: a gap, never every frame it missed.
        read = [first_slow.seq]
        while read[-1] - read[-2 if len(read) > 1 else -1] <= 1:
            read.append((await next_frame(slow)).seq)
            assert len(read) < 200, "the slow viewer was sent every frame it missed"
        assert read[-1] >= seqs[-1]
        assert [s.name for s in (await get(client, task_id)).result.steps] == [
            "tap",
            "wait",
            "tap",
        ]
        slow.cancel()
        fast.cancel()


async def test_watching_a_running_task_changes_nothing_of_it(farm: Farm) -> None:
    """THEN the task's steps, attempts and the phone's actions are what they would be
    unwatched, and the watch ends when the task does."""
    client = await farm.client()
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source):
        task_id = await submit(client, actions_spec(tap(1, 2), wait_action(1.5), tap(3, 4)))
        await status_is(farm, task_id, "dispatched")
        call = watch(client, task_id=task_id)
        frames = 0
        while (frame := await asyncio.wait_for(call.read(), 20)) is not grpc.aio.EOF:
            frames += 1
            assert frame.serial == SERIAL and frame.host_id == HOST
        assert await call.code() == grpc.StatusCode.OK
        assert frames >= 3
        task = await get(client, task_id)
        assert task.status == task_pb2.TASK_STATUS_DONE
        assert [s.name for s in task.result.steps] == ["tap", "wait", "tap"]
        assert len(await farm.attempts(task_id)) == 1
        assert [(a.action, a.args) for a in source.actions_for(SERIAL)] == [
            ("tap", {"x": 1, "y": 2}),
            ("tap", {"x": 3, "y": 4}),
        ]
        assert source.captures >= frames


async def refusal(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call.read(), 20)
    return caught.value.code(), caught.value.details() or ""


async def test_watch_screen_refuses_bad_input_clearly(farm: Farm) -> None:
    """THEN each bad request is refused with its code and a message naming the problem."""
    operator, client = await farm.operator(), await farm.client()
    INVALID = grpc.StatusCode.INVALID_ARGUMENT
    cases: list[tuple[Clients, dict[str, Any], grpc.StatusCode, str]] = [
        (operator, {}, INVALID, "task_id"),
        (operator, {"task_id": "nope"}, INVALID, "task_id"),
        (operator, {"host_id": HOST}, INVALID, "serial"),
        (operator, {"task_id": "0" * 8 + "-0000-0000-0000-" + "0" * 12, "serial": "x"},
         INVALID, "not both"),
        (operator, {"host_id": HOST, "serial": SERIAL, "max_fps": 31}, INVALID, "max_fps"),
        (operator, {"host_id": HOST, "serial": SERIAL, "max_fps": -1}, INVALID, "max_fps"),
        (operator, {"host_id": "h\x00", "serial": SERIAL}, INVALID, "host_id"),
        (operator, {"task_id": "00000000-0000-0000-0000-000000000001"},
         grpc.StatusCode.NOT_FOUND, "not found"),
        (operator, {"host_id": "nowhere", "serial": SERIAL}, grpc.StatusCode.NOT_FOUND,
         "not found"),
        (client, {"host_id": HOST, "serial": SERIAL}, grpc.StatusCode.PERMISSION_DENIED,
         "operators"),
    ]  # fmt: skip
    for who, fields, code, words in cases:
        got, details = await refusal(watch(who, **fields))
        assert (got, words in details) == (code, True), (fields, got, details)
    queued = await submit(client, actions_spec(tap()))
    got, details = await refusal(watch(client, task_id=queued))
    assert got == grpc.StatusCode.FAILED_PRECONDITION and "not running" in details
    await farm.host("host-2", "a")  # registered, then gone: no stream open
    got, details = await refusal(watch(operator, host_id="host-2", serial="a"))
    assert got == grpc.StatusCode.FAILED_PRECONDITION and "not connected" in details
    assert await farm.status(queued) == "queued"


def parse_message(data: bytes) -> tuple[dict[str, Any], bytes]:
    (length,) = struct.unpack(">I", data[:4])
    return json.loads(data[4 : 4 + length]), data[4 + length :]


def test_a_frame_message_is_length_header_and_image() -> None:
    """THEN the console's layout: 4-byte big-endian length, the JSON header, the image."""
    frame = scheduler_pb2.ScreenFrame(
        host_id="h",
        serial="s",
        seq=7,
        width=2,
        height=3,
        mime="image/png",
        captured_at_ms=1234,
        data=b"\x89PNG-bytes",
    )
    header, image = parse_message(frame_message(frame))
    assert header == {
        "seq": 7,
        "width": 2,
        "height": 3,
        "mime": "image/png",
        "captured_at_ms": 1234,
        "host_id": "h",
        "serial": "s",
    }
    assert image == b"\x89PNG-bytes"


def test_a_frame_is_made_into_its_console_message_once_for_all_its_viewers() -> None:
    """THEN every console viewer of a frame is sent the same bytes, made once (a frame's
    JSON header costs ~17 us), while what is kept of them stays within its bounds."""
    frames = [
        scheduler_pb2.ScreenFrame(seq=n, mime="video/h264", data=b"\0\0\0\1" + b"p" * 100)
        for n in range(1, 101)
    ]
    for frame in frames:
        sent = [frame_message(frame) for _ in range(10)]
        assert all(message is sent[0] for message in sent)
        assert parse_message(sent[0])[0]["seq"] == frame.seq
    assert len(console_screen._made) <= console_screen.MADE_MOST


async def test_the_console_streams_a_phone_screen_over_a_websocket(database_url: str) -> None:
    """THEN /api/screen upgrades and sends binary frames in the documented layout, by
    device or by a running task (closed normally when it ends); bad input, a finished task
    and a missing token are JSON replies before any socket."""
    async with console_farm(database_url) as farm:
        source = SimulatedSource(1, delay=0.01)
        token = await farm.token(Role.OPERATOR)
        async with running_agent(farm, source), aiohttp.ClientSession() as http:
            url = console_url(farm, f"/api/screen?host_id={HOST}&serial={SERIAL}")
            # Offered per-message deflate, as a browser offers it: not taken (frames are
            # compressed already; deflating them per page is CPU for nothing).
            offered = {"protocols": ("amc.v1", f"amc.bearer.{token}"), "compress": 15}
            async with http.ws_connect(url, **offered) as ws:
                assert ws.compress == 0
                for _ in range(3):
                    message = await asyncio.wait_for(ws.receive(), 20)
                    assert message.type == aiohttp.WSMsgType.BINARY
                    header, image = parse_message(message.data)
                    assert (header["host_id"], header["serial"]) == (HOST, SERIAL)
                    assert header["mime"] == "image/png" and image.startswith(b"\x89PNG")
                assert farm.plane is not None and farm.plane.hub.screens.viewers() == 1
            # The page closed its socket: its viewer is gone from the replica.
            await eventually(
                lambda: farm.plane is not None and farm.plane.hub.screens.viewers() == 0,
                what="the closed socket's viewer to leave",
            )
            # A running task's phone: frames until the task ends, then a normal close.
            client = farm.clients(await farm.token(Role.CLIENT))
            task_id = await submit(client, actions_spec(tap(), wait_action(1.0), tap()))
            await status_is(farm, task_id, "dispatched")
            by_task = console_url(farm, f"/api/screen?task_id={task_id}")
            frames = 0
            async with http.ws_connect(by_task, headers={"Authorization": f"Bearer {token}"}) as ws:
                while (message := await asyncio.wait_for(ws.receive(), 20)).type == (
                    aiohttp.WSMsgType.BINARY
                ):
                    frames += 1
                assert message.type == aiohttp.WSMsgType.CLOSE, message
                assert message.data == aiohttp.WSCloseCode.OK
                assert "no longer running" in message.extra
            assert frames >= 2 and await farm.status(task_id) == "done"
            bad = console_url(farm, "/api/screen?host_id=host-1")
            async with http.get(bad, headers={"Authorization": f"Bearer {token}"}) as reply:
                assert reply.status == 400
                body = await reply.json()
                assert body["code"] == "INVALID_ARGUMENT" and "serial" in body["message"]
            done = console_url(farm, f"/api/screen?task_id={task_id}")
            async with http.get(done, headers={"Authorization": f"Bearer {token}"}) as reply:
                assert reply.status == 409
                assert (await reply.json())["code"] == "FAILED_PRECONDITION"
            async with http.get(url) as reply:
                assert reply.status == 401
                assert (await reply.json())["code"] == "UNAUTHENTICATED"


async def test_a_viewer_on_another_replica_than_the_phone_s_host_gets_its_frames(
    database_url: str, tmp_path: Any
) -> None:
    """THEN viewers on the replica without the host's feed get the phone's frames through
    one relay, the same frames as a viewer where the host is, from one capture loop."""
    farm = Farm(database_url, Settings(lease_ttl=timedelta(seconds=15)))
    await farm.start()
    pair = [Replica(database_url, log=tmp_path / f"replica{i}.log") for i in range(2)]
    try:
        await asyncio.gather(*(r.start() for r in pair))
        viewer_side, host_side = pair
        token = await farm.token(Role.OPERATOR)
        here = aio_channel(viewer_side.address, token)
        there = aio_channel(host_side.address, token)
        farm._channels += [here, there]
        source = SimulatedSource(1, delay=0.01)
        request = scheduler_pb2.WatchScreenRequest(host_id=HOST, serial=SERIAL, max_fps=10)
        async with running_agent(farm, source, address=host_side.address) as agent:

            async def first_frame() -> Any:
                call = scheduler_pb2_grpc.SchedulerStub(here).WatchScreen(request)
                try:
                    await next_frame(call, 10)
                except grpc.aio.AioRpcError as exc:
                    # Until the host's replica has said the host is connected to it.
                    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc
                    return None
                return call

            one = await eventually(first_frame, timeout=20, what="a relayed frame")
            two = scheduler_pb2_grpc.SchedulerStub(here).WatchScreen(request)
            local = scheduler_pb2_grpc.SchedulerStub(there).WatchScreen(request)
            seen = {
                name: [(await next_frame(call)).seq for _ in range(6)]
                for name, call in (("one", one), ("two", two), ("local", local))
            }
            for frames in seen.values():
                assert frames == sorted(frames) and len(set(frames)) == 6
            assert set(seen["one"]) & set(seen["two"]) and set(seen["two"]) & set(seen["local"])
            assert agent.screens is not None and agent.screens.capturing == {SERIAL}
            highest = max(max(frames) for frames in seen.values())
            assert source.captures <= highest + 3  # one capture loop for all three
            for call in (one, two, local):
                call.cancel()
            await eventually(lambda: not agent.screens.capturing, what="the captures to stop")
            # The replica holding the host's feed dies: the relayed viewer is told.
            three = scheduler_pb2_grpc.SchedulerStub(here).WatchScreen(request)
            await next_frame(three)
            host_side.kill()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                while True:
                    await next_frame(three)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "screen relay lost" in (caught.value.details() or "")
    finally:
        for r in pair:
            r.stop()
        await farm.stop()


def apng_frames(data: bytes) -> tuple[int, int]:
    """(frames the acTL says, fcTL chunks) of an animated PNG."""
    at, declared, controls = 8, -1, 0
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind = data[at + 4 : at + 8]
        if kind == b"acTL":
            declared = struct.unpack(">I", data[at + 8 : at + 12])[0]
        elif kind == b"fcTL":
            controls += 1
        at += 12 + length
    return declared, controls


async def test_a_task_that_asks_for_a_recording_keeps_its_screen_as_an_animated_png(
    farm: Farm,
) -> None:
    """THEN the task's artifacts hold one screen_recording (image/apng) of its phone (one
    without a video stream), within its frame bound, and with nobody watching nothing is
    sent up for it."""
    client = await farm.client()
    source = SimulatedSource(1, delay=0.01)
    source.video = False
    async with running_agent(farm, source) as agent:
        spec = actions_spec(tap(540, 1200), wait_action(1.5), tap(300, 600))
        spec.record_screen.CopyFrom(task_pb2.ScreenRecording(fps=5, max_frames=4))
        task_id = await submit(client, spec)
        await status_is(farm, task_id, "done")
        assert agent.screens is not None and not agent.screens.capturing
    listed = await client.scheduler.ListArtifacts(
        scheduler_pb2.ListArtifactsRequest(task_id=task_id)
    )
    (recording,) = [a for a in listed.artifacts if a.kind == "screen_recording"]
    assert recording.content_type == "image/apng" and recording.step_index == 2
    data = b"".join(
        [
            m.chunk
            async for m in client.scheduler.GetArtifact(
                scheduler_pb2.GetArtifactRequest(task_id=task_id, artifact_id=recording.artifact_id)
            )
        ]
    )
    assert data.startswith(b"\x89PNG") and len(data) == recording.size_bytes
    assert apng_frames(data) == (4, 4)
    assert 4 <= source.captures <= 20
    steps = (await get(client, task_id)).result.steps
    assert steps[-1].data["screen_recording"].startswith("4 frames")


async def test_a_recording_asked_for_badly_is_refused(farm: Farm) -> None:
    """THEN fps and max_frames out of range are INVALID_ARGUMENT naming the field."""
    client = await farm.client()
    for fields, where in (({"fps": 11}, "fps"), ({"max_frames": 3001}, "max_frames")):
        spec = actions_spec(tap())
        spec.record_screen.CopyFrom(task_pb2.ScreenRecording(**fields))
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await submit(client, spec)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"record_screen.{where}" in (caught.value.details() or "")


async def test_a_session_that_asks_for_a_recording_keeps_one(farm: Farm) -> None:
    """THEN a session opened with record_screen ends with a screen_recording artifact (an
    MP4 of its phone's stream: kind screen_video)."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = client.scheduler.OpenSession()
        await call.write(opening(record_screen=task_pb2.ScreenRecording(fps=10, max_frames=50)))
        task = await dispatched(call)
        for x in (100, 500, 900):
            await call.write(act(tap(x, 1200)))
            assert (await asyncio.wait_for(call.read(), 20)).step.step.status == (
                task_pb2.STEP_STATUS_OK
            )
        await call.done_writing()
        while await asyncio.wait_for(call.read(), 20) is not grpc.aio.EOF:
            pass
    await status_is(farm, task.task_id, "done")
    listed = await client.scheduler.ListArtifacts(
        scheduler_pb2.ListArtifactsRequest(task_id=task.task_id)
    )
    assert [a.kind for a in listed.artifacts] == ["logcat", "screen_video"]


async def test_a_phone_over_adb_is_watched_through_screencap_and_shows_a_tap(
    farm: Farm,
) -> None:
    """THEN a phone driven over the adb protocol (fake adb server and phone) is captured
    with `screencap -p` while watched, and a session's `input tap` shows in its frames."""
    phone = FakePhone("emu-1", screen=LiveScreen())
    operator, client = await farm.operator(), await farm.client()
    async with FakeAdbServer([phone]) as server:
        source = AdbSource(server.host, server.port, call_timeout=5.0)
        async with running_agent(farm, source):
            call = watch(operator, host_id=HOST, serial="emu-1", max_fps=15)
            first = await next_frame(call)
            assert first.mime == "image/png" and pixel(first.data, 180, 400) != TAP_RGB
            session = await session_tap(client, 540, 1200)
            await frame_where(
                call, lambda f: pixel(f.data, 180, 400) == TAP_RGB, what="the tap's mark"
            )
            await session.done_writing()
            call.cancel()
    commands = phone.shell_commands()
    assert any(c.startswith("input tap 540 1200") for c in commands)
    assert sum(c.startswith("screencap -p") for c in commands) >= 2


async def test_a_viewer_whose_host_left_is_told_to_watch_again(
    farm: Farm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """THEN with the phone's host gone from the replica, the watch ends UNAVAILABLE (the
    host may be back elsewhere) instead of waiting for frames that cannot come."""
    monkeypatch.setattr(screens, "STALE", 0.5)
    operator = await farm.operator()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        call = watch(operator, host_id=HOST, serial=SERIAL)
        await next_frame(call)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        while True:
            await next_frame(call)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no longer connected" in (caught.value.details() or "")


async def test_a_frame_too_large_to_send_goes_as_a_jpeg(farm: Farm) -> None:
    """THEN a phone whose screencap PNG is over the control plane's 1 MiB message limit
    (a real phone's full-size screen can be) is watched through JPEG frames of its size."""
    noisy = Canvas(700, 700, (0, 0, 0))
    noisy.pixels[:] = random.Random(24).randbytes(len(noisy.pixels))
    png = noisy.png(level=1)
    assert len(png) > 1 << 20
    operator = await farm.operator()
    async with FakeAdbServer([FakePhone("emu-1", png=png)]) as server:
        source = AdbSource(server.host, server.port, call_timeout=5.0)
        async with running_agent(farm, source):
            call = watch(operator, host_id=HOST, serial="emu-1", max_fps=5)
            frame = await next_frame(call)
            call.cancel()
    assert frame.mime == "image/jpeg" and frame.data.startswith(b"\xff\xd8")
    assert (frame.width, frame.height) == (700, 700) and len(frame.data) < 1 << 20


async def test_watch_screen_and_screen_frames_are_served_through_reflection(farm: Farm) -> None:
    """THEN grpcurl describes both new methods from the server's reflection."""
    for method, shape in (
        ("amc.v1.Scheduler.WatchScreen", "( .amc.v1.WatchScreenRequest ) returns ( stream"),
        ("amc.v1.Lease.ScreenFrames", "( stream .amc.v1.ScreenFramesRequest ) returns ( stream"),
    ):
        described = await run(GRPCURL, "-plaintext", farm.address, "describe", method)
        assert shape in described, described


async def test_a_viewer_s_patience_runs_out_only_on_a_wait_that_lasted_its_seconds() -> None:
    """THEN waits shorter than the patience, however many, never run out (the timer is
    not reset by each), and one that lasts it runs out and wakes its viewer."""
    ready = asyncio.Event()
    with Patience(ready, 0.3) as patience:
        for _ in range(8):  # 0.4 s of short waits, beyond the first timer
            patience.begin()
            await asyncio.sleep(0.05)
            assert not patience.end() and not ready.is_set()
        patience.begin()
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(ready.wait(), 2.0)
        waited = asyncio.get_running_loop().time() - started
        assert patience.end() and 0.25 <= waited < 1.0
