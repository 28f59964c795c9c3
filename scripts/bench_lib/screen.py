"""The `screen` workload (issue 24): live screens of simulated phones through AMC.

One host agent with --screen-phones simulated phones (actions answer at once) serving its
/metrics, then, in order:

- idle: nobody watches for --screen-idle-seconds: frames the agent captured
  (amc_agent_screen_captures_total; target 0) and sent.
- one viewer: WatchScreen of one phone asking 30 fps (the agent's --screen-max-fps, 12 by
  default, bounds it) for --screen-seconds: frames a second received (target >= 10) and
  bytes per frame.
- click to frame: a session on that phone taps at a new place each time (--screen-clicks
  times) while the viewer reads; from sending the tap to the first frame received whose
  pixel there is the tap's red mark (the simulated phone draws one where the last tap
  landed): p50 (target <= 150 ms) and p99. The tap's own round trip is reported beside it.
- 20 viewers: one viewer of each of the phones for --screen-seconds: the control plane's
  CPU (cores; target <= 0.3) and the agent's, frames a second in all.
- video (bench_lib.screen_video): the phones' H.264 stream beside their PNG frames, 1 and
  10 viewers of one phone, click to decoded pixel.
- a task watched: a task of TASK_TAPS taps (each with a 10-ms wait) on one phone, run
  alternately with nobody watching and with three viewers reading its frames and one that
  never reads (a slow viewer), RUNS times each: its run time (from `dispatched` to `done`,
  as WatchTask sees them), whose medians should not differ (watching must not slow a
  task).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import duration_pb2

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_testing.database import free_port
from bench_lib import promtext, screen_video
from bench_lib.stack import AgentSpec, Stack, cpu_seconds
from bench_lib.stats import summarize

HOST = screen_video.HOST
POOL = screen_video.POOL
TAP_RGB = (230, 20, 20)
SCREEN_SCALE = 3  # the simulated phones' frames are drawn at a third of 1080 x 2400
TASK_TAPS = 100  # each followed by a 10-ms wait: a run of about a second
RUNS = 5


@dataclass(frozen=True)
class Options:
    phones: int = 20
    seconds: float = 10.0
    idle_seconds: float = 10.0
    clicks: int = 50


def _pixel(png: bytes, x: int, y: int) -> tuple[int, ...]:
    """(x, y) of the simulated phones' PNGs: truecolour, unfiltered scanlines."""
    width = struct.unpack(">I", png[16:20])[0]
    at, idat = 8, bytearray()
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        if png[at + 4 : at + 8] == b"IDAT":
            idat += png[at + 8 : at + 8 + length]
        at += 12 + length
    stride = 1 + 3 * width
    row = zlib.decompressobj().decompress(bytes(idat), (y + 1) * stride)[y * stride :]
    return tuple(row[1 + 3 * x : 4 + 3 * x])


def _phone(serial: str) -> task_pb2.DeviceSelector:
    """That phone of this workload's host: other agents' simulated phones have the same
    serials (the other workloads' agents may still run beside it)."""
    return task_pb2.DeviceSelector(serial=serial, labels={"pool": POOL})


def _watch(stub: scheduler_pb2_grpc.SchedulerStub, serial: str) -> Any:
    return stub.WatchScreen(
        scheduler_pb2.WatchScreenRequest(host_id=HOST, serial=serial, max_fps=30)
    )


async def _count(call: Any, since_ms: int, until: float, got: list[int]) -> None:
    """Frames of `call` captured from `since_ms` (wall clock) and read before `until`:
    their sizes into `got` (frames a transport held from before the window are not
    counted in it)."""
    while time.perf_counter() < until:
        frame = await call.read()
        if frame is grpc.aio.EOF:
            raise RuntimeError("a watch ended during the window")
        if frame.captured_at_ms >= since_ms:
            got.append(len(frame.data))


async def _agent_metric(url: str, name: str) -> float:
    return promtext.value(await promtext.scrape(url), name)


async def _idle(url: str, seconds: float) -> dict[str, Any]:
    before = await promtext.scrape(url)
    await asyncio.sleep(seconds)
    after = await promtext.scrape(url)
    names = ("amc_agent_screen_captures_total", "amc_agent_screen_frames_sent_total")
    captured, sent = (promtext.value(after, n) - promtext.value(before, n) for n in names)
    return {"seconds": seconds, "frames_captured": captured, "frames_sent": sent}


async def _one_viewer(stub: scheduler_pb2_grpc.SchedulerStub, seconds: float) -> dict[str, Any]:
    call = _watch(stub, "sim-0")
    try:
        await call.read()  # the first frame: the capture loop is running
        sizes: list[int] = []
        started, since = time.perf_counter(), int(time.time() * 1000)
        await _count(call, since, started + seconds, sizes)
        elapsed = time.perf_counter() - started
    finally:
        call.cancel()
    return {
        "frames_per_s": len(sizes) / elapsed,
        "bytes_per_frame": sum(sizes) / max(1, len(sizes)),
    }


def _seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(value * 1e9))
    return d


async def _session(stub: scheduler_pb2_grpc.SchedulerStub) -> Any:
    call: Any = stub.OpenSession()
    await call.write(
        scheduler_pb2.OpenSessionRequest(
            open=scheduler_pb2.SessionOpen(selector=_phone("sim-0"), idle_timeout=_seconds(120))
        )
    )
    while True:
        response = await call.read()
        if response is grpc.aio.EOF:
            raise RuntimeError("the session ended before its phone was ready")
        if response.task.status == task_pb2.TASK_STATUS_DISPATCHED:
            return call


def _places(n: int) -> list[tuple[int, int]]:
    """n tap places in the phone's coordinates, each away from the one before (the mark of
    the last tap is a 12-pixel square at a third of them)."""
    grid = [(x, y) for y in range(300, 2100, 150) for x in range(90, 1000, 150)]
    return [grid[(i * 7) % len(grid)] for i in range(n)]


async def _clicks(stub: scheduler_pb2_grpc.SchedulerStub, clicks: int) -> dict[str, Any]:
    viewer = _watch(stub, "sim-0")
    session = await _session(stub)
    loop = asyncio.get_running_loop()
    # The tap being timed: where its mark shows, when it was sent, and its frame's arrival.
    wanted: dict[str, Any] = {}

    async def read() -> None:
        while (frame := await viewer.read()) is not grpc.aio.EOF:
            at = time.perf_counter()
            shown = wanted.get("shown")
            if shown is None or shown.done() or at <= wanted["sent"]:
                continue
            wanted["frames"] += 1
            if _pixel(frame.data, *wanted["where"]) == TAP_RGB:
                shown.set_result(at)

    reader = asyncio.create_task(read())
    to_frame: list[float] = []
    tap_rtt: list[float] = []
    try:
        for x, y in _places(clicks + 3):
            # A person's click comes at any moment of the capture cycle: right after a
            # frame arrived, every tap would wait a whole cycle.
            await asyncio.sleep(random.uniform(0, 0.2))
            shown: asyncio.Future[float] = loop.create_future()
            sent = time.perf_counter()
            where = (x // SCREEN_SCALE, y // SCREEN_SCALE)
            wanted.update(where=where, sent=sent, shown=shown, frames=0)
            tap = task_pb2.Action(tap=task_pb2.Tap(x=x, y=y))
            await session.write(
                scheduler_pb2.OpenSessionRequest(action=task_pb2.SessionAction(action=tap))
            )
            answer = await session.read()
            tap_rtt.append((time.perf_counter() - sent) * 1000)
            if answer is grpc.aio.EOF or not answer.HasField("step"):
                raise RuntimeError("the session ended during the clicks")
            to_frame.append((await screen_video.tap_shown(shown, reader, wanted) - sent) * 1000)
    finally:
        reader.cancel()
        viewer.cancel()
        await session.done_writing()
        while await session.read() is not grpc.aio.EOF:
            pass
    # The first three are warm-up (the capture loop starting, the session's first steps).
    return {"click_to_frame_ms": summarize(to_frame[3:]), "tap_rtt_ms": summarize(tap_rtt[3:])}


async def _many(
    stack: Stack, stub: scheduler_pb2_grpc.SchedulerStub, phones: int, seconds: float
) -> dict[str, Any]:
    calls = [_watch(stub, f"sim-{i}") for i in range(phones)]
    assert stack.control_plane is not None
    cp, agent = stack.control_plane.pid, stack.agents[HOST].pid
    try:
        await asyncio.gather(*(c.read() for c in calls))  # every capture loop running
        await asyncio.sleep(1.0)
        cpu0 = (cpu_seconds(cp), cpu_seconds(agent))
        started, since = time.perf_counter(), int(time.time() * 1000)
        sizes: list[int] = []
        await asyncio.gather(*(_count(c, since, started + seconds, sizes) for c in calls))
        elapsed = time.perf_counter() - started
        cpu1 = (cpu_seconds(cp), cpu_seconds(agent))
    finally:
        for c in calls:
            c.cancel()
    return {
        "viewers": phones,
        "frames_per_s": len(sizes) / elapsed,
        "cp_cores": (cpu1[0] - cpu0[0]) / elapsed,
        "agent_cores": (cpu1[1] - cpu0[1]) / elapsed,
    }


async def _task_seconds(stub: scheduler_pb2_grpc.SchedulerStub, serial: str) -> float:
    """A task of TASK_TAPS taps and waits on `serial`: seconds from `dispatched` to `done`."""
    tap = task_pb2.Action(tap=task_pb2.Tap(x=540, y=1200))
    wait = task_pb2.Action(wait=task_pb2.Wait(duration=_seconds(0.01)))
    spec = task_pb2.TaskSpec(actions=task_pb2.ActionList(actions=[tap, wait] * TASK_TAPS))
    task = await stub.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(spec=spec, selector=_phone(serial), max_attempts=1),
        timeout=30,
    )
    started: float | None = None
    watch = stub.WatchTask(scheduler_pb2.WatchTaskRequest(task_id=task.task_id), timeout=120)
    async for seen in watch:
        if seen.status == task_pb2.TASK_STATUS_DISPATCHED and started is None:
            started = time.perf_counter()
        elif seen.status == task_pb2.TASK_STATUS_DONE and started is not None:
            return time.perf_counter() - started
        elif seen.status in (task_pb2.TASK_STATUS_FAILED, task_pb2.TASK_STATUS_CANCELLED):
            raise RuntimeError(f"the timed task ended {seen.status}")
    raise RuntimeError("the timed task's watch ended before it was done")


async def _task_watched(stub: scheduler_pb2_grpc.SchedulerStub) -> dict[str, Any]:
    serial = "sim-1"
    alone: list[float] = []
    watched: list[float] = []
    for _ in range(RUNS):
        alone.append(await _task_seconds(stub, serial))
        viewers = [_watch(stub, serial) for _ in range(4)]
        readers = [
            asyncio.create_task(_count(v, 0, time.perf_counter() + 600, [])) for v in viewers[:3]
        ]
        try:
            await viewers[3].read()  # the slow viewer: one frame, then never reads again
            watched.append(await _task_seconds(stub, serial))
        finally:
            for r in readers:
                r.cancel()
            for v in viewers:
                v.cancel()
    a, w = statistics.median(alone), statistics.median(watched)
    return {
        "taps": TASK_TAPS,
        "runs": RUNS,
        "alone_s": alone,
        "watched_s": watched,
        "alone_median_s": a,
        "watched_median_s": w,
        "ratio": w / a,
    }


async def run(stack: Stack, options: Options, say: Callable[[str], None]) -> dict[str, Any]:
    metrics = f"127.0.0.1:{free_port()}"
    stack.start_agent(AgentSpec(HOST, options.phones, 0.0, POOL, metrics_listen=metrics))
    url = f"http://{metrics}/metrics"
    channel = grpc.aio.insecure_channel(stack.address)
    stub = scheduler_pb2_grpc.SchedulerStub(channel)
    out: dict[str, Any] = {"phones": options.phones}
    try:
        await _ready(stub, url)
        say(f"screen: nobody watching for {options.idle_seconds:g}s")
        out["idle"] = await _idle(url, options.idle_seconds)
        say(f"  {out['idle']['frames_captured']:.0f} frames captured")
        say(f"screen: one viewer of one phone for {options.seconds:g}s")
        out["one_viewer"] = await _one_viewer(stub, options.seconds)
        say(f"  {out['one_viewer']['frames_per_s']:.1f} frames/s")
        say(f"screen: {options.clicks} taps through a session until a frame shows each")
        out["clicks"] = await _clicks(stub, options.clicks)
        c = out["clicks"]["click_to_frame_ms"]
        say(f"  click to frame p50 {c['p50']:.0f} ms, p99 {c['p99']:.0f} ms")
        say(f"screen: {options.phones} viewers of {options.phones} phones, {options.seconds:g}s")
        out["many"] = await _many(stack, stub, options.phones, options.seconds)
        say(f"  control plane {out['many']['cp_cores']:.3f} cores")
        out["video"] = await screen_video.run(stack, stub, options.seconds, options.clicks, say)
        say(f"screen: a task of {TASK_TAPS} taps, alone and watched by 4 (one slow), x{RUNS}")
        out["task_watched"] = t = await _task_watched(stub)
        say(
            f"  run time median {t['alone_median_s']:.3f} s alone,"
            f" {t['watched_median_s']:.3f} s watched ({t['ratio']:.2f}x)"
        )
    finally:
        await channel.close()
        child = stack.agents.pop(HOST, None)
        if child is not None:
            child.stop()
    out["verified"] = out["idle"]["frames_captured"] == 0
    return out


async def _ready(stub: scheduler_pb2_grpc.SchedulerStub, url: str) -> None:
    """The agent registered, connected and serving its metrics (a watch of its first phone
    gives a frame)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        call = _watch(stub, "sim-0")
        try:
            await asyncio.wait_for(call.read(), 5)
            await _agent_metric(url, "amc_agent_screen_captures_total")
            call.cancel()
            # The capture loop has stopped before the idle window starts counting.
            await asyncio.sleep(1.0)
            return
        except (grpc.aio.AioRpcError, TimeoutError, OSError):
            call.cancel()
            await asyncio.sleep(0.5)
    raise RuntimeError(f"{HOST} did not serve a screen within 60 s")
