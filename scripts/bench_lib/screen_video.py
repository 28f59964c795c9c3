"""The `screen` workload's video rows: a simulated phone's H.264 stream through AMC (the
agent encodes its drawn frames with PyAV; the control plane relays them as they came),
beside its still frames (PNG), on the same agent and phones as bench_lib.screen.

- per viewer: one viewer of the stream (WatchScreen codec "h264", 30 frames a second
  asked) and one of still frames for --screen-seconds each: frames a second, bytes a
  frame and bytes a second (still frames are bounded by the agent's --screen-max-fps, 12
  by default: their bytes a second at the stream's rate are bytes a frame times it).
- 1 and 10 viewers of one phone's stream: frames a second each viewer gets, the control
  plane's CPU (cores) and per frame relayed, and the ratio of 10's cores to 1's (one
  capture, one relay: target <= 1.2); beside them a window with nobody watching (the
  control plane's own work: its agent's renewals and the rest), so that what one viewer
  and each further viewer add can be told apart (the cost of one message written to one
  viewer's call: per viewer-frame, 10 viewers' cores less 1's over the frames the 9 more
  were sent); and, for that cost, its floor: a bare grpc.aio server streaming the same
  bytes to 1 and 10 calls, and receiving them on one stream as a host sends a phone's
  frames (bench_lib.grpc_floor).
- 1 and 10 viewers of the same stream through the console's socket (`/api/screen`,
  codec h264, 30 frames a second: what a browser's page reads), the same figures: a
  console viewer is sent a WebSocket message on the event loop's own socket, no gRPC
  message.
- click to changed pixel: a session taps at a new place each time while a viewer of the
  stream decodes it (PyAV, as a browser's VideoDecoder would): from sending the tap to
  the first decoded picture whose pixel there is the tap's red, p50 and p99.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import av
import grpc

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from bench_lib import grpc_floor
from bench_lib.stack import Stack, cpu_seconds
from bench_lib.stats import summarize

HOST = "screen-host"
POOL = "screens"  # the pool label of the workload's host (bench_lib.screen)
SCREEN_SCALE = 3


def _watch(stub: scheduler_pb2_grpc.SchedulerStub, serial: str, codec: str) -> Any:
    request = scheduler_pb2.WatchScreenRequest(host_id=HOST, serial=serial, max_fps=30, codec=codec)
    return stub.WatchScreen(request)


async def _stream_frame(call: Any) -> Any:
    """The next frame of the stream (still images before the stream's first are skipped)."""
    while True:
        frame = await call.read()
        if frame is grpc.aio.EOF:
            raise RuntimeError("a watch ended during the window")
        if frame.mime == "video/h264":
            return frame


async def _read_for(call: Any, until: float, sizes: list[int], video: bool) -> None:
    while time.perf_counter() < until:
        frame = await (_stream_frame(call) if video else call.read())
        if frame is grpc.aio.EOF:
            raise RuntimeError("a watch ended during the window")
        sizes.append(len(frame.data))


async def _per_viewer(stub: scheduler_pb2_grpc.SchedulerStub, seconds: float) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, codec in (("h264", "h264"), ("png", "image")):
        call = _watch(stub, "sim-2", codec)
        try:
            await (_stream_frame(call) if codec == "h264" else call.read())
            sizes: list[int] = []
            started = time.perf_counter()
            await _read_for(call, started + seconds, sizes, codec == "h264")
            elapsed = time.perf_counter() - started
        finally:
            call.cancel()
        out[name] = {
            "frames_per_s": len(sizes) / elapsed,
            "bytes_per_frame": sum(sizes) / max(1, len(sizes)),
            "bytes_per_s": sum(sizes) / elapsed,
        }
    h264, png = out["h264"], out["png"]
    # PNG at the stream's frame rate and the same picture size.
    out["png_bytes_per_s_at_h264_rate"] = png["bytes_per_frame"] * h264["frames_per_s"]
    out["h264_to_png_bytes"] = h264["bytes_per_s"] / max(1.0, out["png_bytes_per_s_at_h264_rate"])
    return out


async def _viewers(
    stack: Stack, stub: scheduler_pb2_grpc.SchedulerStub, count: int, seconds: float
) -> dict[str, Any]:
    calls = [_watch(stub, "sim-3", "h264") for _ in range(count)]
    assert stack.control_plane is not None
    cp = stack.control_plane.pid
    try:
        await asyncio.gather(*(_stream_frame(c) for c in calls))
        await asyncio.sleep(1.0)
        cpu0 = cpu_seconds(cp)
        started = time.perf_counter()
        counts: list[list[int]] = [[] for _ in calls]
        await asyncio.gather(
            *(_read_for(c, started + seconds, n, True) for c, n in zip(calls, counts, strict=True))
        )
        if not calls:  # nobody watching: the window alone
            await asyncio.sleep(seconds)
        elapsed = time.perf_counter() - started
        cores = (cpu_seconds(cp) - cpu0) / elapsed
    finally:
        for c in calls:
            c.cancel()
    frames = sum(len(n) for n in counts)
    return {
        "viewers": count,
        "frames_per_s_each": [len(n) / elapsed for n in counts],
        "cp_cores": cores,
        "cp_cpu_us_per_frame_relayed": cores * elapsed / max(1, frames) * 1e6,
    }


async def _socket_frame(socket: Any) -> int:
    """The size of the next frame of the stream on a console socket (still images before
    the stream's first are skipped)."""
    while True:
        message = await socket.receive()
        if message.type != aiohttp.WSMsgType.BINARY:
            raise RuntimeError(f"a console socket ended during the window: {message.extra}")
        data: bytes = message.data
        length = int.from_bytes(data[:4], "big")
        if json.loads(data[4 : 4 + length])["mime"] == "video/h264":
            return len(data) - 4 - length


async def _console_viewers(stack: Stack, count: int, seconds: float) -> dict[str, Any]:
    """`count` console sockets on one phone's stream: the control plane's cores."""
    url = f"{stack.console_url}/api/screen?host_id={HOST}&serial=sim-3&codec=h264&max_fps=30"
    assert stack.control_plane is not None
    cp = stack.control_plane.pid
    async with aiohttp.ClientSession() as http:
        # Offering per-message deflate, as a browser does (the console declines it).
        offer = {"protocols": ("amc.v1",), "compress": 15}
        sockets = [await http.ws_connect(url, **offer) for _ in range(count)]
        try:
            await asyncio.gather(*(_socket_frame(s) for s in sockets))
            await asyncio.sleep(1.0)
            cpu0, started = cpu_seconds(cp), time.perf_counter()
            counts: list[list[int]] = [[] for _ in sockets]

            async def read(socket: Any, sizes: list[int]) -> None:
                while time.perf_counter() < started + seconds:
                    sizes.append(await _socket_frame(socket))

            await asyncio.gather(*(read(s, n) for s, n in zip(sockets, counts, strict=True)))
            elapsed = time.perf_counter() - started
            cores = (cpu_seconds(cp) - cpu0) / elapsed
        finally:
            for socket in sockets:
                await socket.close()
    return {
        "viewers": count,
        "frames_per_s_each": [len(n) / elapsed for n in counts],
        "cp_cores": cores,
    }


async def _session(stub: scheduler_pb2_grpc.SchedulerStub, serial: str) -> Any:
    call: Any = stub.OpenSession()
    # That phone of this workload's host: other workloads' agents may still run beside it,
    # with simulated phones of the same serials.
    selector = task_pb2.DeviceSelector(serial=serial, labels={"pool": POOL})
    idle = scheduler_pb2.SessionOpen(selector=selector)
    idle.idle_timeout.FromSeconds(120)
    await call.write(scheduler_pb2.OpenSessionRequest(open=idle))
    while True:
        response = await call.read()
        if response is grpc.aio.EOF:
            raise RuntimeError("the session ended before its phone was ready")
        if response.task.status == task_pb2.TASK_STATUS_DISPATCHED:
            return call


# How long a tap's mark may take to show on a viewer's frames before the run says so.
SHOWN_WITHIN = 10.0


async def tap_shown(
    shown: asyncio.Future[float], reader: asyncio.Task[None], wanted: dict[str, Any]
) -> float:
    """When the tap's mark was first seen; a reader that failed raises its error, and a
    mark not seen in SHOWN_WITHIN says where it was due and how many frames came since."""
    done, _ = await asyncio.wait(
        {shown, reader}, timeout=SHOWN_WITHIN, return_when=asyncio.FIRST_COMPLETED
    )
    if shown in done:
        return shown.result()
    if reader in done:
        reader.result()
        raise RuntimeError("the watch ended during the clicks")
    raise TimeoutError(
        f"no frame showed the tap's mark at {wanted['where']} within {SHOWN_WITHIN:g} s"
        f" ({wanted['frames']} frames came after the tap, {wanted.get('undecodable', 0)}"
        " of them undecodable)"
    )


def _red(picture: Any, x: int, y: int) -> bool:
    plane = picture.planes[0]
    at = y * plane.line_size + 3 * x
    r, g, b = bytes(plane)[at : at + 3]
    return r > 190 and g < 70 and b < 70


async def _clicks(stub: scheduler_pb2_grpc.SchedulerStub, clicks: int) -> dict[str, Any]:
    serial = "sim-2"
    viewer = _watch(stub, serial, "h264")
    session = await _session(stub, serial)
    decoder: Any = av.CodecContext.create("h264", "r")
    loop = asyncio.get_running_loop()
    wanted: dict[str, Any] = {}

    async def read() -> None:
        while True:
            frame = await _stream_frame(viewer)
            try:
                pictures = decoder.decode(av.Packet(frame.data))
            except av.error.FFmpegError:  # a frame the decoder cannot take: the next key frame
                wanted["undecodable"] = wanted.get("undecodable", 0) + 1
                continue
            at = time.perf_counter()
            shown = wanted.get("shown")
            if shown is None or shown.done() or at <= wanted["sent"]:
                continue
            wanted["frames"] += 1
            if not pictures:
                continue
            if _red(pictures[-1].reformat(format="rgb24"), *wanted["where"]):
                shown.set_result(at)

    reader = asyncio.create_task(read())
    grid = [(x, y) for y in range(300, 2100, 150) for x in range(90, 1000, 150)]
    to_pixel: list[float] = []
    try:
        for i in range(clicks + 3):
            x, y = grid[(i * 7) % len(grid)]
            await asyncio.sleep(random.uniform(0, 0.2))
            shown: asyncio.Future[float] = loop.create_future()
            sent = time.perf_counter()
            where = (x // SCREEN_SCALE, y // SCREEN_SCALE)
            wanted.update(where=where, sent=sent, shown=shown, frames=0)
            tap = task_pb2.Action(tap=task_pb2.Tap(x=x, y=y))
            await session.write(
                scheduler_pb2.OpenSessionRequest(action=task_pb2.SessionAction(action=tap))
            )
            if (answer := await session.read()) is grpc.aio.EOF or not answer.HasField("step"):
                raise RuntimeError("the session ended during the clicks")
            to_pixel.append((await tap_shown(shown, reader, wanted) - sent) * 1000)
    finally:
        reader.cancel()
        viewer.cancel()
        await session.done_writing()
        while await session.read() is not grpc.aio.EOF:
            pass
    return {"click_to_decoded_pixel_ms": summarize(to_pixel[3:])}


async def run(
    stack: Stack,
    stub: scheduler_pb2_grpc.SchedulerStub,
    seconds: float,
    clicks: int,
    say: Callable[[str], None],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    say(f"screen video: one viewer of the H.264 stream, one of PNG frames, {seconds:g}s each")
    out["per_viewer"] = p = await _per_viewer(stub, seconds)
    say(
        f"  h264 {p['h264']['frames_per_s']:.1f} frames/s, {p['h264']['bytes_per_s'] / 1e3:.0f}"
        f" kB/s; png {p['png']['frames_per_s']:.1f} frames/s,"
        f" {p['png']['bytes_per_frame'] / 1e3:.1f} kB a frame ({p['h264_to_png_bytes']:.3f}x)"
    )
    idle = await _viewers(stack, stub, 0, seconds)
    one = await _viewers(stack, stub, 1, seconds)
    ten = await _viewers(stack, stub, 10, seconds)
    # What each of the 9 further viewers costs per frame it is sent.
    further = sum(ten["frames_per_s_each"][1:])
    out["viewers"] = {
        "idle": idle,
        "one": one,
        "ten": ten,
        "cores_ratio": ten["cp_cores"] / one["cp_cores"],
        "cp_us_per_further_viewer_frame": (ten["cp_cores"] - one["cp_cores"]) / further * 1e6,
    }
    v = out["viewers"]
    say(
        f"  nobody watching: cp {idle['cp_cores']:.3f} cores; 1 viewer: {one['cp_cores']:.3f};"
        f" 10 viewers: {ten['cp_cores']:.3f} ({v['cores_ratio']:.2f}x),"
        f" {min(ten['frames_per_s_each']):.1f} frames/s the slowest;"
        f" {v['cp_us_per_further_viewer_frame']:.0f} us a frame to each further viewer"
    )
    out["grpc_floor"] = floor = await grpc_floor.measure(seconds)
    say(
        f"  bare grpc.aio server, same bytes at {grpc_floor.FPS}/s: 1 call {floor['one_cores']:.3f}"
        f" cores, 10 calls {floor['ten_cores']:.3f}: {floor['us_per_message']:.0f} us a further"
        f" call's message; receiving one stream {floor['receiving_cores']:.3f} cores,"
        f" {floor['us_per_message_received']:.0f} us a message"
    )
    if stack.console_url:
        one_page = await _console_viewers(stack, 1, seconds)
        ten_pages = await _console_viewers(stack, 10, seconds)
        further = sum(ten_pages["frames_per_s_each"][1:])
        out["console_viewers"] = c = {
            "one": one_page,
            "ten": ten_pages,
            "cores_ratio": ten_pages["cp_cores"] / one_page["cp_cores"],
            "cp_us_per_further_viewer_frame": (ten_pages["cp_cores"] - one_page["cp_cores"])
            / further
            * 1e6,
        }
        say(
            f"  console sockets: 1 viewer cp {one_page['cp_cores']:.3f} cores; 10 viewers"
            f" {ten_pages['cp_cores']:.3f} ({c['cores_ratio']:.2f}x),"
            f" {min(ten_pages['frames_per_s_each']):.1f} frames/s the slowest;"
            f" {c['cp_us_per_further_viewer_frame']:.0f} us a frame to each further viewer"
        )
    out["clicks"] = await _clicks(stub, clicks)
    c = out["clicks"]["click_to_decoded_pixel_ms"]
    say(f"  click to decoded pixel p50 {c['p50']:.0f} ms, p99 {c['p99']:.0f} ms")
    return out
