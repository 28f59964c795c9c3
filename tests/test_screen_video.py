"""Live screens as H.264 (WatchScreenRequest.codec "h264"): a simulated phone's stream
through a real control plane and a real host agent, decoded here with PyAV to read its
pixels; a host's stream as the control plane takes it (checked, rate-bounded, a group of
pictures per phone, viewers that fall behind skipping to the next key frame)."""

from __future__ import annotations

import asyncio
import io
from datetime import timedelta
from typing import Any

import av
import grpc
import pytest
from prometheus_client import REGISTRY

from amc.v1 import lease_pb2, scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from control_plane import video
from control_plane.config import Settings
from control_plane.domain import Role
from control_plane.frames import Screens
from host_agent import recording
from host_agent.recording_mp4 import VideoRecording
from host_agent.simulated import SimulatedSource
from host_agent.simulated_screen import (
    SCREENSHOT_SIZE,
    TAP_MARK,
    LiveScreen,
    live_frame,
    live_pixels,
)
from host_agent.video_encoder import Encoder
from tests.support import Farm, actions_spec, eventually, tap, wait_action
from tests.support.agent import get, running_agent, status_is, submit
from tests.support.replicas import Replica
from tests.test_screen import HOST, SERIAL, frame_where, next_frame, session_tap, watch

RED = (230, 20, 20)


async def connected(farm: Farm, host_id: str = HOST) -> None:
    """Until the host's renewal stream is up (a watch before it is FAILED_PRECONDITION)."""
    await eventually(lambda: farm.plane.hub.connected(host_id), what="the host's stream")


class Decoder:
    """H.264 frames (ScreenFrame.data, Annex B) to RGB pictures, as a viewer decodes them."""

    def __init__(self) -> None:
        self._codec: Any = av.CodecContext.create("h264", "r")
        self.pictures = 0

    def decode(self, frame: scheduler_pb2.ScreenFrame) -> Any:
        """The frame's picture (an RGB av.VideoFrame), or None if the decoder held it."""
        pictures = self._codec.decode(av.Packet(frame.data))
        self.pictures += len(pictures)
        return pictures[-1].reformat(format="rgb24") if pictures else None


def rgb_at(picture: Any, x: int, y: int) -> tuple[int, int, int]:
    plane = picture.planes[0]
    row = bytes(plane)[y * plane.line_size : (y + 1) * plane.line_size]
    r, g, b = row[3 * x : 3 * x + 3]
    return r, g, b


def reddish(rgb: tuple[int, int, int]) -> bool:
    """Near the tap mark's red (H.264 is lossy)."""
    return all(abs(a - b) < 40 for a, b in zip(rgb, RED, strict=True))


async def test_a_watched_phone_streams_h264_from_a_key_frame_and_a_tap_shows_in_its_pictures(
    farm: Farm,
) -> None:
    """THEN the stream's first frame is a key frame with its codec and coded size, every
    frame decodes in order, and a tap done through a session shows in a later picture."""
    operator, client = await farm.operator(), await farm.client()
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source) as agent:
        await connected(farm)
        call = watch(operator, host_id=HOST, serial=SERIAL, max_fps=30, codec="h264")
        first = await next_frame(call)
        assert (first.mime, first.key_frame) == ("video/h264", True)
        assert first.video.codec.startswith("avc1.42")  # constrained baseline
        assert (first.video.coded_width, first.video.coded_height) == (360, 800)
        assert (first.width, first.height) == (1080, 2400)  # taps' coordinates
        decoder = Decoder()
        picture = decoder.decode(first)
        assert picture is not None and (picture.width, picture.height) == (360, 800)
        assert not reddish(rgb_at(picture, 180, 400))
        seqs = [first.seq]
        for _ in range(10):
            frame = await next_frame(call)
            seqs.append(frame.seq)
            assert decoder.decode(frame) is not None
        assert seqs == list(range(seqs[0], seqs[0] + 11))  # every frame, in order
        session = await session_tap(client, 540, 1200)

        def marked(frame: scheduler_pb2.ScreenFrame) -> bool:
            shown = decoder.decode(frame)
            return shown is not None and reddish(rgb_at(shown, 180, 400))

        await frame_where(call, marked, what="the tap's mark in a decoded picture")
        assert agent.screens is not None
        assert agent.screens.captures(SERIAL) == {"video"}  # no still frames taken
        await session.done_writing()
        call.cancel()


async def test_image_and_stream_viewers_of_a_phone_each_get_their_kind(farm: Farm) -> None:
    """THEN a viewer of still images gets PNGs and a viewer of the stream H.264, side by
    side, from one capture of each kind; the stream's viewers share one capture."""
    operator = await farm.operator()
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source) as agent:
        await connected(farm)
        images = watch(operator, host_id=HOST, serial=SERIAL, max_fps=10)
        streams = [
            watch(operator, host_id=HOST, serial=SERIAL, max_fps=30, codec="h264") for _ in range(5)
        ]
        assert (await next_frame(images)).mime == "image/png"
        # Still images may come before the stream's first key frame: each says its kind.
        firsts = [
            await frame_where(s, lambda f: f.mime == "video/h264", what="the stream")
            for s in streams
        ]
        assert all(f.key_frame for f in firsts)
        # One stream for the five: they read the same numbered frames.
        later = [[(await next_frame(s)).seq for _ in range(5)] for s in streams]
        assert len({tuple(seqs) for seqs in later}) <= 2  # at most a frame apart as read
        assert agent.screens is not None
        assert agent.screens.captures(SERIAL) == {"images", "video"}
        for call in (images, *streams):
            call.cancel()
        await eventually(lambda: not agent.screens.capturing, what="the captures to stop")


async def test_a_phone_without_a_stream_sends_still_frames_to_its_stream_viewers(
    farm: Farm,
) -> None:
    """THEN a viewer of the stream of a phone that has none gets still images."""
    operator = await farm.operator()
    source = SimulatedSource(1, delay=0.01)
    source.video = False
    async with running_agent(farm, source) as agent:
        await connected(farm)
        call = watch(operator, host_id=HOST, serial=SERIAL, max_fps=10, codec="h264")
        assert (await next_frame(call)).mime == "image/png"
        assert (await next_frame(call)).mime == "image/png"
        assert agent.screens is not None and agent.screens.captures(SERIAL) == {"images"}
        call.cancel()


async def test_a_viewer_asking_an_unknown_codec_is_refused(farm: Farm) -> None:
    """THEN INVALID_ARGUMENT naming codec and what it takes."""
    operator = await farm.operator()
    await farm.host(HOST, SERIAL)
    call = watch(operator, host_id=HOST, serial=SERIAL, codec="vp9")
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await next_frame(call, 10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "codec: 'vp9' is not one of: image, h264 ('': image)"


def malformed() -> float:
    value = REGISTRY.get_sample_value("amc_screen_frames_total", {"result": "malformed"})
    return value or 0.0


def encoded(count: int, key_every: int = 1000) -> list[scheduler_pb2.ScreenFrame]:
    """`count` frames of a real H.264 stream of a 64 x 64 picture that changes."""
    encoder, frames = Encoder(64, 64, gop=10_000), []
    for i in range(count):
        picture = bytes([i * 7 % 256, 40, 200]) * 64 * 64
        for packet in encoder.encode(picture, i * 33_333, key=i % key_every == 0):
            frame = scheduler_pb2.ScreenFrame(
                serial="p-1",
                seq=i + 1,
                mime="video/h264",
                data=packet.data,
                key_frame=packet.key,
                width=64,
                height=64,
                pts_us=packet.pts_us,
            )
            if packet.key:
                frame.video.codec, frame.video.coded_width = packet.codec, 64
                frame.video.coded_height = 64
            frames.append(frame)
    return frames


async def test_a_host_s_bad_frames_are_dropped_and_its_viewers_go_on_from_the_next_key_frame(
    farm: Farm,
) -> None:
    """THEN a frame cut short (not Annex B) and a key frame without its codec are not
    passed on, the frames after them neither until a key frame, and the viewer, never
    stuck, decodes from there; the replica counts them malformed."""
    host = await farm.host("host-9", "p-1")
    operator = await farm.operator()
    stream = host.stream()
    await stream.renew()
    call = watch(operator, host_id="host-9", serial="p-1", codec="h264")
    feed = host.c.lease.ScreenFrames()
    await feed.write(lease_pb2.ScreenFramesRequest(host_id="host-9"))
    told = await asyncio.wait_for(feed.read(), 10)
    while not told.watched:  # the viewer not yet in when the call opened
        told = await asyncio.wait_for(feed.read(), 10)
    assert [(w.serial, w.images, w.video) for w in told.watched] == [("p-1", False, True)]
    frames = encoded(12, key_every=4)  # key frames: seq 1, 5, 9
    before = malformed()
    truncated = scheduler_pb2.ScreenFrame()
    truncated.CopyFrom(frames[1])
    truncated.data = frames[1].data[7:]  # its start code and more cut off
    no_codec = scheduler_pb2.ScreenFrame()
    no_codec.CopyFrom(frames[4])
    no_codec.ClearField("video")
    sent = [frames[0], truncated, frames[2], frames[3], no_codec, *frames[5:]]
    for frame in sent:
        await feed.write(lease_pb2.ScreenFramesRequest(frame=frame))
    got = [await next_frame(call, 10) for _ in range(5)]
    # seq 1, then nothing of the broken group, nothing of the key frame without its
    # codec's group, then the group from seq 9 on.
    assert [f.seq for f in got] == [1, 9, 10, 11, 12]
    decoder = Decoder()
    assert all(decoder.decode(f) is not None for f in got)
    assert malformed() - before == 2
    call.cancel()
    feed.cancel()
    await stream.close()


def test_a_host_sending_past_its_rate_has_frames_skipped() -> None:
    """THEN past what a phone's host may send a second, frames are skipped (over_rate)
    and the stream waits for its next key frame; the next second takes them again."""
    screens = Screens()
    frames = encoded(video.MOST_FRAMES_PER_SECOND + 5, key_every=1000)
    with screens.watch("h", "p-1", 30, "h264") as (screen, _viewer):
        results = [screens.deliver("h", f) for f in frames]
        assert results.count("received") == video.MOST_FRAMES_PER_SECOND
        assert results[video.MOST_FRAMES_PER_SECOND :] == ["over_rate"] * 5
        assert screen.gop.broken


def test_a_viewer_that_fell_behind_skips_to_the_newest_key_frame() -> None:
    """THEN a viewer of the stream due a frame of a group that a newer key frame replaced
    is sent that key frame next (a gap in seq), never the frames it missed; one that
    joins starts at the latest key frame; the group held per phone is one group."""
    screens = Screens()
    frames = encoded(20, key_every=8)  # key frames: seq 1, 9, 17
    with screens.watch("h", "p-1", 30, "h264") as (screen, _viewer):
        for frame in frames[:3]:
            screens.deliver("h", frame)
        frame, position = screen.gop.at(screen.gop.base)
        assert frame.seq == 1
        for frame in frames[3:19]:
            screens.deliver("h", frame)
        behind, position = screen.gop.at(position)
        assert (behind.seq, behind.key_frame) == (17, True)
        assert [f.seq for f in screen.gop.frames] == [17, 18, 19]
        joined, _ = screen.gop.at(screen.gop.base)
        assert joined.seq == 17


async def test_a_viewer_on_another_replica_gets_the_stream_through_one_relay(
    database_url: str, tmp_path: Any
) -> None:
    """THEN viewers of the stream on the replica without the host's feed get it through
    one relay, from a key frame, decodable, from the one capture of the phone."""
    farm = Farm(database_url, Settings(lease_ttl=timedelta(seconds=15)))
    await farm.start()
    pair = [Replica(database_url, log=tmp_path / f"replica{i}.log") for i in range(2)]
    try:
        await asyncio.gather(*(r.start() for r in pair))
        viewer_side, host_side = pair
        token = await farm.token(Role.OPERATOR)
        here = aio_channel(viewer_side.address, token)
        farm._channels.append(here)
        source = SimulatedSource(1, delay=0.01)
        request = scheduler_pb2.WatchScreenRequest(
            host_id=HOST, serial=SERIAL, max_fps=30, codec="h264"
        )
        async with running_agent(farm, source, address=host_side.address) as agent:

            async def first_frame() -> Any:
                call = scheduler_pb2_grpc.SchedulerStub(here).WatchScreen(request)
                try:
                    return call, await next_frame(call, 10)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc
                    return None

            one, first = await eventually(first_frame, timeout=20, what="a relayed frame")
            assert first.key_frame and first.mime == "video/h264"
            two = scheduler_pb2_grpc.SchedulerStub(here).WatchScreen(request)
            decoders = [Decoder(), Decoder()]
            assert decoders[0].decode(first) is not None
            for _ in range(8):
                assert decoders[0].decode(await next_frame(one)) is not None
            second = await next_frame(two)
            assert second.key_frame  # a joiner starts at a key frame
            assert decoders[1].decode(second) is not None
            assert agent.screens is not None and agent.screens.captures(SERIAL) == {"video"}
            one.cancel()
            two.cancel()
    finally:
        for r in pair:
            r.stop()
        await farm.stop()


def test_the_stream_s_frames_carry_no_decoding_on_the_way() -> None:
    """THEN the control plane passes a host's frame on byte for byte (no re-encoding)."""
    screens = Screens()
    frames = encoded(3)
    with screens.watch("h", "p-1", 30, "h264") as (screen, _viewer):
        for frame in frames:
            assert screens.deliver("h", frame) == "received"
        assert [f.data for f in screen.gop.frames] == [f.data for f in frames]


@pytest.fixture(autouse=True)
def _tap_mark_is_visible() -> None:
    assert TAP_MARK >= 8  # a mark H.264 keeps at a third of the phone's size


async def artifact_bytes(client: Any, task_id: str, artifact_id: str) -> bytes:
    request = scheduler_pb2.GetArtifactRequest(task_id=task_id, artifact_id=artifact_id)
    return b"".join([m.chunk async for m in client.scheduler.GetArtifact(request)])


async def test_a_recording_of_a_phone_with_a_stream_is_an_mp4_of_it(farm: Farm) -> None:
    """THEN the task keeps one screen_video (video/mp4) with its last step: an MP4 of the
    stream's own frames (no re-encoding) from a key frame, whose pictures show the tap,
    at most its duration bound long; nobody watching, nothing is sent up for it."""
    client = await farm.client()
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source) as agent:
        await connected(farm)
        spec = actions_spec(wait_action(0.5), tap(540, 1200), wait_action(1.0))
        spec.record_screen.CopyFrom(task_pb2.ScreenRecording(fps=10, max_frames=30))
        task_id = await submit(client, spec)
        await status_is(farm, task_id, "done")
        assert agent.screens is not None and not agent.screens.capturing
    listed = await client.scheduler.ListArtifacts(
        scheduler_pb2.ListArtifactsRequest(task_id=task_id)
    )
    (video,) = [a for a in listed.artifacts if a.kind == "screen_video"]
    assert video.content_type == "video/mp4" and video.step_index == 2
    data = await artifact_bytes(client, task_id, video.artifact_id)
    assert data[4:8] == b"ftyp" and len(data) == video.size_bytes
    container = av.open(io.BytesIO(data))
    stream = container.streams.video[0]
    assert (stream.codec_context.name, stream.width, stream.height) == ("h264", 360, 800)
    pictures = [p.to_rgb() for p in container.decode(video=0)]
    assert 10 <= len(pictures) <= 31
    assert float(stream.duration * stream.time_base) <= 3.0  # 30 frames at 10 a second
    assert not reddish(rgb_at(pictures[0], 180, 400)) and reddish(rgb_at(pictures[-1], 180, 400))
    steps = (await get(client, task_id)).result.steps
    assert "video frames" in steps[-1].data["screen_video"]
    assert "screen_recording" not in steps[-1].data


def test_a_video_recording_ends_at_its_bounds_and_never_starts_mid_group() -> None:
    """THEN frames before the first key frame are left out, the recording ends at the first
    frame past its duration, and one past its bytes ends it too."""
    frames = encoded(30, key_every=10)
    late = VideoRecording(max_seconds=0.5, max_bytes=1 << 20)
    for frame in frames[3:]:
        late.add(frame)
    # Starts at seq 11 (a key frame); 0.5 s at 30 a second: frames up to pts + 500 ms.
    assert late.frames == 16 and late.skipped == 7 + 4
    small = VideoRecording(max_seconds=60, max_bytes=4096 + 2000)
    for frame in frames:
        small.add(frame)
    assert 0 < small.frames < 30 and small.frames + small.skipped == 30
    assert av.open(io.BytesIO(small.mp4() or b"")).streams.video[0].frames == small.frames


def minute_recorded(fps: int) -> tuple[int, int]:
    """(APNG bytes at the recordings' default 2 frames a second, MP4 bytes of the stream at
    `fps`) of the same 60 s of a simulated phone, a tap every 5 s, a key frame every 10 s
    as the stream makes them."""
    screen, serial = LiveScreen(), "sim-0"
    settings = recording.settings_from(2, 600, 64 << 20)
    apng, mp4 = recording.Recording(settings), VideoRecording(300, 64 << 20)
    encoder = Encoder(*SCREENSHOT_SIZE, gop=10_000)
    for n in range(60 * fps):
        at_us = n * 1_000_000 // fps
        if n % (5 * fps) == 0:
            screen.saw("tap", {"x": 90 + (n * 37) % 900, "y": 300 + (n * 53) % 1800})
        if n % (fps // 2) == 0:
            png = scheduler_pb2.ScreenFrame(
                seq=n + 1, mime="image/png", captured_at_ms=at_us // 1000
            )
            png.data = live_frame(serial, screen)
            apng.add(png)
        for packet in encoder.encode(live_pixels(serial, screen), at_us, key=n % (10 * fps) == 0):
            frame = scheduler_pb2.ScreenFrame(
                seq=n + 1,
                mime="video/h264",
                data=packet.data,
                key_frame=packet.key,
                pts_us=packet.pts_us,
            )
            if packet.key:
                frame.video.codec = packet.codec
                frame.video.coded_width, frame.video.coded_height = SCREENSHOT_SIZE
            mp4.add(frame)
    assert (apng.frames, mp4.frames) == (120, 60 * fps)
    return len(apng.apng() or b""), len(mp4.mp4() or b"")


def test_a_minute_of_screen_as_mp4_is_at_most_a_fifth_of_the_animated_png() -> None:
    """THEN a minute recorded with nobody watching (the stream at the recording's 2 frames
    a second) and one watched at 30 frames a second all along are each at most a fifth of
    the APNG of the same screens (the figures are printed: docs/performance.md)."""
    animated, alone = minute_recorded(2)
    _, watched = minute_recorded(30)
    print(f"60 s: APNG {animated} bytes; MP4 {alone} bytes at 2 fps, {watched} at 30 fps")
    assert alone * 5 <= animated and watched * 5 <= animated


async def test_a_viewer_joining_long_after_a_key_frame_waits_for_one_asked_of_the_host(
    farm: Farm,
) -> None:
    """THEN a viewer of the stream that joins 40 frames into a group is not sent them: the
    host is asked for a key frame (ScreenFramesResponse.key_frames) and the viewer starts
    at the next one; the viewer already there got every frame."""
    host = await farm.host("host-9", "p-1")
    operator = await farm.operator()
    stream = host.stream()
    await stream.renew()
    first = watch(operator, host_id="host-9", serial="p-1", codec="h264")
    feed = host.c.lease.ScreenFrames()
    await feed.write(lease_pb2.ScreenFramesRequest(host_id="host-9"))
    while not (await asyncio.wait_for(feed.read(), 10)).watched:
        pass
    frames = encoded(50, key_every=45)  # key frames: seq 1 and 46
    for frame in frames[:40]:
        await feed.write(lease_pb2.ScreenFramesRequest(frame=frame))
    assert [(await next_frame(first, 10)).seq for _ in range(40)] == list(range(1, 41))
    late = watch(operator, host_id="host-9", serial="p-1", codec="h264")
    told = await asyncio.wait_for(feed.read(), 10)
    assert list(told.key_frames) == ["p-1"] and [w.serial for w in told.watched] == ["p-1"]
    for frame in frames[40:]:
        await feed.write(lease_pb2.ScreenFramesRequest(frame=frame))
    got = await next_frame(late, 10)
    assert (got.seq, got.key_frame) == (46, True)
    assert [(await next_frame(first, 10)).seq for _ in range(10)] == list(range(41, 51))
    for call in (first, late, feed):
        call.cancel()
    await stream.close()
