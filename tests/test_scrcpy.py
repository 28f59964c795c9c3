"""scrcpy's server on a real phone (host_agent.scrcpy, host_agent.scrcpy_link), at its
wire protocol (v3.3.4's): the agent behind the fake adb server, against a phone that runs
a stand-in of the server speaking that protocol (tests.support.fakes.scrcpy_server). The
stream comes from it as H.264, and taps go through its control socket while it runs."""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import struct
import time
from pathlib import Path

import pytest

from amc.v1 import task_pb2
from host_agent import scrcpy
from host_agent.adb import AdbSource
from host_agent.flags import parse
from host_agent.scrcpy_link import load_jar
from tests.support import Farm, actions_spec, eventually, tap
from tests.support.agent import get, running_agent, status_is, submit
from tests.support.fakes.adb_server import FakeAdbServer
from tests.support.fakes.scrcpy_server import STAND_IN, ScrcpyPhone, read_control, stand_in_jar
from tests.test_screen import frame_where, next_frame, watch
from tests.test_screen_video import Decoder, connected, reddish, rgb_at
from tests.test_sessions import act, dispatched, opening

HOST, SERIAL = "host-1", "emu-1"


def test_a_packet_header_says_config_key_frame_pts_and_size() -> None:
    """THEN the top bit marks a configuration packet, the next a key frame (scrcpy's
    device/Streamer.java), the rest is the PTS."""
    key = scrcpy.packet_header(struct.pack(">QI", (1 << 62) | 123_456, 900))
    assert (key.config, key.key, key.pts_us, key.size) == (False, True, 123_456, 900)
    config = scrcpy.packet_header(struct.pack(">QI", 1 << 63, 30))
    assert (config.config, config.key, config.pts_us) == (True, False, 0)
    with pytest.raises(scrcpy.ProtocolError, match="a packet of 0 bytes"):
        scrcpy.packet_header(struct.pack(">QI", 5, 0))


def test_the_video_meta_is_refused_unless_it_is_h264_of_a_size() -> None:
    assert scrcpy.video_meta(struct.pack(">III", scrcpy.CODEC_H264, 1080, 2400)).width == 1080
    for codec, said in ((0, "disabled"), (1, "could not configure"), (0x68323635, "not h264")):
        with pytest.raises(scrcpy.ProtocolError, match=said):
            scrcpy.video_meta(struct.pack(">III", codec, 1080, 2400))


def test_control_messages_are_laid_out_as_scrcpy_reads_them() -> None:
    """THEN a touch is 32 bytes, a key 14, text its length and UTF-8 (ControlMessageReader)."""
    touch = scrcpy.touch(scrcpy.TOUCH_DOWN, 10, 20, 360, 800, 0xFFFF)
    assert len(touch) == 32 and touch[:2] == b"\x02\x00"
    assert touch[2:10] == b"\xff" * 7 + b"\xfe"  # the generic finger, -2
    assert read_control(touch)[0] == (2, (0, (1 << 64) - 2, 10, 20, 360, 800, 0xFFFF))
    assert len(scrcpy.keycode(scrcpy.KEY_UP, 4)) == 14
    assert scrcpy.text("hé") == b"\x01\x00\x00\x00\x03h\xc3\xa9"
    with pytest.raises(ValueError, match="at most 300 bytes"):
        scrcpy.text("x" * 301)


def test_a_server_file_other_than_the_pinned_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "scrcpy-server"
    path.write_bytes(STAND_IN)
    with pytest.raises(ValueError) as caught:
        load_jar(path)
    assert str(caught.value) == (
        f"{path}: its SHA-256 is {hashlib.sha256(STAND_IN).hexdigest()},"
        f" not scrcpy-server v3.3.4's ({scrcpy.SHA256})"
    )
    with pytest.raises(ValueError, match="cannot be read"):
        load_jar(tmp_path / "missing")

    argv = ["--control-plane", "cp:1", "--host-id", "h", "--insecure"]
    with pytest.raises(SystemExit):  # argparse's one line, exit 2
        parse([*argv, "--scrcpy-server", str(path)], env={})
    real = tmp_path / "scrcpy-server-v3.3.4"
    real.write_bytes(b"x")
    assert parse(argv, env={}).scrcpy_server is None


def source_of(server: FakeAdbServer) -> AdbSource:
    return AdbSource(server.host, server.port, call_timeout=5.0, scrcpy_server=stand_in_jar())


async def test_a_watched_phone_streams_from_scrcpy_s_server_and_a_session_taps_through_it(
    farm: Farm,
) -> None:
    """THEN the server is pushed and started, its stream reaches the viewer as H.264 from a
    key frame (its configuration packet merged in), a session's taps go through the
    control socket (the step says so; no `input tap` ran), scaled from the phone's pixels
    to the video's, and show in the pictures."""
    phone = ScrcpyPhone(SERIAL, physical=(1080, 2400))
    operator, client = await farm.operator(), await farm.client()
    async with FakeAdbServer([phone]) as server, running_agent(farm, source_of(server)) as agent:
        await connected(farm)
        call = watch(operator, host_id=HOST, serial=SERIAL, max_fps=30, codec="h264")
        first = await frame_where(call, lambda f: f.mime == "video/h264", what="the stream")
        assert first.key_frame and first.video.codec.startswith("avc1.")
        assert (first.video.coded_width, first.video.coded_height) == (360, 800)
        assert phone.files[scrcpy.REMOTE_PATH] == STAND_IN
        assert phone.servers[0]["tunnel_forward"] == "true"
        decoder = Decoder()
        assert decoder.decode(first) is not None
        session = client.scheduler.OpenSession()
        await session.write(opening())
        await dispatched(session)
        await session.write(act(tap(540, 1200)))  # the phone's 1080 x 2400 → video's pixels
        step = (await asyncio.wait_for(session.read(), 20)).step.step
        assert step.status == task_pb2.STEP_STATUS_OK and step.data["input"] == "control"
        assert phone.touches() == [(0, 180, 400), (1, 180, 400)]
        assert not any("input tap" in c for c in phone.shell_commands())

        def marked(frame: object) -> bool:
            picture = decoder.decode(frame)  # type: ignore[arg-type]
            return picture is not None and reddish(rgb_at(picture, 180, 400))

        await frame_where(call, marked, what="the tap in a decoded picture")
        assert agent.screens is not None and agent.screens.captures(SERIAL) == {"video"}
        await session.done_writing()
        call.cancel()
        await eventually(lambda: not phone._sockets, what="the server to end")


async def test_a_task_s_tap_goes_through_input_where_no_server_runs(farm: Farm) -> None:
    """THEN with nobody watching, the tap is `input tap` and its step says so."""
    phone = ScrcpyPhone(SERIAL)
    async with FakeAdbServer([phone]) as server, running_agent(farm, source_of(server)):
        client = await farm.client()
        task_id = await submit(client, actions_spec(tap(10, 20)))
        await status_is(farm, task_id, "done")
        assert (await get(client, task_id)).result.steps[0].data["input"] == "input"
    assert any("input tap 10 20" in c for c in phone.shell_commands())
    assert phone.servers == [] and phone.touches() == []


async def test_a_server_that_will_not_start_leaves_still_frames_and_input(farm: Farm) -> None:
    """THEN a phone whose server exits (another file than the one pushed, here a version
    it refuses) is watched through screencap, and a session's taps go through `input`."""
    phone = ScrcpyPhone(SERIAL, jar=b"the phone expects another file")
    operator = await farm.operator()
    async with FakeAdbServer([phone]) as server, running_agent(farm, source_of(server)) as agent:
        await connected(farm)
        call = watch(operator, host_id=HOST, serial=SERIAL, max_fps=5, codec="h264")
        assert (await next_frame(call)).mime == "image/png"
        assert agent.screens is not None and agent.screens.captures(SERIAL) == {"images"}
        call.cancel()


async def test_a_tap_through_the_control_socket_is_done_sooner_than_input_tap(
    farm: Farm,
) -> None:
    """THEN on the fake adb server a tap through scrcpy's control socket (one write on an
    open connection) is done sooner than `input tap` (a connection, the transport, a shell
    and its exit status), median of 40 each, both for the call and for the phone to have
    it; the figures are printed (docs/performance.md quotes them). The fake's `input`
    starts no Java process: on a real phone `input tap` alone takes ~300 ms more."""
    phone = ScrcpyPhone(SERIAL)
    calls: dict[str, list[float]] = {"input": [], "control": []}
    arrived: dict[str, list[float]] = {"input": [], "control": []}
    async with FakeAdbServer([phone]) as server:
        device = source_of(server).device(SERIAL)
        for i in range(40):
            started = time.monotonic()
            assert await device.tap(i, i) == "input"
            calls["input"].append((time.monotonic() - started) * 1000)
            ran = next(at for at, argv in reversed(phone.executed) if argv[:2] == ["input", "tap"])
            arrived["input"].append((ran - started) * 1000)
        async with device.hold_control() as held:
            assert held
            for i in range(40):
                started = time.monotonic()
                assert await device.tap(i, i) == "control"
                calls["control"].append((time.monotonic() - started) * 1000)
                await eventually(lambda n=i: len(phone.touches()) >= 2 * (n + 1), timeout=5)
                arrived["control"].append((phone.received[-2].at - started) * 1000)
    p50 = {k: (statistics.median(calls[k]), statistics.median(arrived[k])) for k in calls}
    for path, (call, phone_has) in p50.items():
        print(f"tap by {path}: call p50 {call:.2f} ms, on the phone after p50 {phone_has:.2f} ms")
    assert p50["control"][0] < p50["input"][0]
