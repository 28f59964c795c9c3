"""A task's live screen (Scheduler.WatchScreen by task_id) against a real control plane and
a real host agent on simulated phones: the watch is bound to the attempt it was opened
for and ends ABORTED once that attempt is not the task's current one, so a viewer never
sees the phone's next task; who may watch a task's screen."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from amc.v1 import lease_pb2, scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel
from control_plane.admin_service import create_token
from control_plane.domain import Role
from control_plane.screen_tasks import CONTROL_KEY, CONTROL_VALUE, Following
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, eventually, tap, wait_action
from tests.support.agent import running_agent, status_is, submit
from tests.test_sessions import dispatched, opening

HOST = "host-1"


def pinned(serial: str) -> task_pb2.DeviceSelector:
    return task_pb2.DeviceSelector(serial=serial)


async def slow_viewer(farm: Farm, token: str, task_id: str) -> Any:
    """A watch of the task whose transport window stays small (no BDP probing): while its
    reader pauses, the server holds at most a few frames and waits to send the next."""
    channel = aio_channel(farm.address, token, options=[("grpc.http2.bdp_probe", 0)])
    farm._channels.append(channel)
    return scheduler_pb2_grpc.SchedulerStub(channel).WatchScreen(
        scheduler_pb2.WatchScreenRequest(task_id=task_id, max_fps=30)
    )


async def read_to_end(call: Any, within: float) -> tuple[list[Any], grpc.aio.AioRpcError | None]:
    """Every frame until the call ends (or `within` seconds pass), and how it ended."""
    frames: list[Any] = []
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    try:
        while (left := until - loop.time()) > 0:
            try:
                frame = await asyncio.wait_for(call.read(), left)
            except TimeoutError:
                break
            if frame is grpc.aio.EOF:
                break
            frames.append(frame)
    except grpc.aio.AioRpcError as exc:
        return frames, exc
    return frames, None


async def test_a_task_s_watch_ends_when_its_attempt_moves_and_never_shows_the_phone_s_next_task(
    farm: Farm,
) -> None:
    """GIVEN a client watching its running task T on sim-0 WHEN T's lease expires, another
    phone takes T and sim-0 runs another client's task U THEN T's viewer is sent no frame
    of sim-0 captured since U was given the phone, and its watch ends ABORTED ("moved")."""
    owner_token = await farm.token(Role.CLIENT)
    owner, other = farm.clients(owner_token), await farm.client()
    source = SimulatedSource(2, delay=0.01)
    async with running_agent(farm, source):
        # sim-1 busy a moment, so T starts on sim-0.
        busy = await submit(other, actions_spec(wait_action(1.5)), selector=pinned("sim-1"))
        await status_is(farm, busy, "dispatched")
        spec = actions_spec(wait_action(20), tap())
        task_id = await submit(owner, spec, max_attempts=2)
        await status_is(farm, task_id, "dispatched")
        (first,) = await farm.attempts(task_id)
        assert first["device_serial"] == "sim-0"
        call = await slow_viewer(farm, owner_token, task_id)
        seen = await asyncio.wait_for(call.read(), 20)
        assert (seen.host_id, seen.serial) == (HOST, "sim-0")
        # Another client's task waits for sim-0, ahead of T.
        later = await submit(
            other, actions_spec(wait_action(3), tap()), selector=pinned("sim-0"), priority=10
        )
        await status_is(farm, busy, "done")
        # The viewer stops reading (its window fills); T's lease runs out.
        await farm.expire_now(str(first["lease_id"]))
        await eventually(
            lambda: _attempt_on(farm, task_id, 2, "sim-1"), timeout=20, what="T on sim-1"
        )
        await eventually(
            lambda: _attempt_on(farm, later, 1, "sim-0"), timeout=20, what="U on sim-0"
        )
        (u_attempt,) = await farm.attempts(later)
        given_at_ms = u_attempt["created_at"].timestamp() * 1000
        await asyncio.sleep(1.0)  # U's screen on sim-0 for a while
        frames, ended = await read_to_end(call, within=8)
        leaked = [
            (f.serial, f.seq)
            for f in frames
            if (f.host_id, f.serial) == (HOST, "sim-0") and f.captured_at_ms >= given_at_ms
        ]
        assert not leaked, f"T's viewer was sent {len(leaked)} sim-0 frames of task U: {leaked[:3]}"
        assert ended is not None, f"the watch went on ({len(frames)} frames after the move)"
        assert ended.code() == grpc.StatusCode.ABORTED, ended
        assert "moved" in (ended.details() or "")
        call.cancel()


async def _attempt_on(farm: Farm, task_id: str, attempt: int, serial: str) -> bool:
    rows = await farm.attempts(task_id)
    return any(
        r["attempt"] == attempt and r["device_serial"] == serial and r["state"] == "active"
        for r in rows
    ) and await farm.status(task_id) in ("assigned", "dispatched")


async def test_a_task_s_watch_ends_on_the_timer_when_the_notification_of_its_move_is_lost(
    farm: Farm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GIVEN this replica hears no task notification (as when the replica that committed
    the change died before telling the others) WHEN the watched task's lease expires and
    another phone takes it THEN the watch ends ABORTED all the same, within a re-read of
    the task (watch_refresh: 1 s here)."""
    assert farm.plane is not None
    client = await farm.client()
    source = SimulatedSource(2, delay=0.01)
    async with running_agent(farm, source):
        busy = await submit(client, actions_spec(wait_action(1.0)), selector=pinned("sim-1"))
        await status_is(farm, busy, "dispatched")
        task_id = await submit(client, actions_spec(wait_action(20), tap()), max_attempts=2)
        await status_is(farm, task_id, "dispatched")
        (first,) = await farm.attempts(task_id)
        call = client.scheduler.WatchScreen(
            scheduler_pb2.WatchScreenRequest(task_id=task_id, max_fps=5)
        )
        assert (await asyncio.wait_for(call.read(), 20)).serial == first["device_serial"]
        await status_is(farm, busy, "done")
        # Every task notification is lost on this replica from here on.
        monkeypatch.setattr(farm.plane.hub, "_wake_watchers", lambda payload: None)
        await farm.expire_now(str(first["lease_id"]))
        await eventually(
            lambda: _attempt_on(farm, task_id, 2, "sim-1"), timeout=20, what="T on sim-1"
        )
        moved_at = asyncio.get_running_loop().time()
        frames, ended = await read_to_end(call, within=10)
        took = asyncio.get_running_loop().time() - moved_at
        assert ended is not None, f"the watch went on ({len(frames)} frames after the move)"
        assert ended.code() == grpc.StatusCode.ABORTED and "moved" in (ended.details() or "")
        assert took < 3.0, f"the watch ended {took:.1f}s after the move"


async def refused(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call.read(), 20)
    return caught.value.code(), caught.value.details() or ""


async def test_a_task_s_screen_is_for_its_submitter_s_team_and_operators(farm: Farm) -> None:
    """THEN its submitter, a token of its team and operators get frames; a client of
    another team, or of none, is refused PERMISSION_DENIED in one line; a console Control
    session's screen is for operators only, whoever asks by its task."""
    assert farm.plane is not None
    store = farm.plane.store

    async def token(role: Role, team: str = "") -> str:
        _, made = await create_token(store, role, None, "test", team)
        return made

    submitter = farm.clients(await token(Role.CLIENT, "qa"))
    teammate = farm.clients(await token(Role.CLIENT, "qa"))
    stranger = farm.clients(await token(Role.CLIENT, "web"))
    teamless = farm.clients(await token(Role.CLIENT))
    operator = farm.clients(await token(Role.OPERATOR))
    async with running_agent(farm, SimulatedSource(2, delay=0.01)):
        task_id = await submit(submitter, actions_spec(wait_action(30), tap()))
        await status_is(farm, task_id, "dispatched")
        request = scheduler_pb2.WatchScreenRequest(task_id=task_id)
        for who in (submitter, teammate, operator):
            call = who.scheduler.WatchScreen(request)
            assert (await asyncio.wait_for(call.read(), 20)).host_id == HOST
            call.cancel()
        for who in (stranger, teamless):
            code, details = await refused(who.scheduler.WatchScreen(request))
            assert code == grpc.StatusCode.PERMISSION_DENIED, details
            assert "only its team and operators" in details and "\n" not in details
        # An operator's Control session (as the console opens it).
        session = operator.scheduler.OpenSession()
        await session.write(opening(metadata={CONTROL_KEY: CONTROL_VALUE, "operator": "o"}))
        control = (await dispatched(session)).task_id
        watching = scheduler_pb2.WatchScreenRequest(task_id=control)
        call = operator.scheduler.WatchScreen(watching)
        assert (await asyncio.wait_for(call.read(), 20)).host_id == HOST
        call.cancel()
        for who in (submitter, teamless):
            code, details = await refused(who.scheduler.WatchScreen(watching))
            assert code == grpc.StatusCode.PERMISSION_DENIED, details
            assert "Control session: only operators" in details
        await session.done_writing()
        await status_is(farm, control, "done")
        await submitter.scheduler.CancelTask(
            scheduler_pb2.CancelTaskRequest(task_id=task_id, reason="test over")
        )
        await status_is(farm, task_id, "cancelled")


def other_attempt_frames() -> float:
    return REGISTRY.get_sample_value("amc_screen_frames_total", {"result": "other_attempt"}) or 0


async def test_a_task_s_viewer_is_sent_only_the_frames_its_host_says_are_of_its_attempt(
    farm: Farm,
) -> None:
    """GIVEN a host whose phone runs the watched task's attempt 1 as far as the control
    plane knows THEN of the frames the host sends, the viewer gets those it says were
    captured during that attempt (and an older agent's, which say nothing), never one it
    says was captured during another task's attempt, another attempt of the task, or no
    task (the phone idle between attempts)."""
    client = await farm.client()
    host = await farm.host("host-9", "p-1")
    task_id = await submit(client, actions_spec(tap()), selector=pinned("p-1"))
    assignment = await host.acquire_one("p-1")
    stream = host.stream()
    await stream.renew(assignment.lease_id)
    feed = host.c.lease.ScreenFrames()
    await feed.write(lease_pb2.ScreenFramesRequest(host_id="host-9"))
    call = client.scheduler.WatchScreen(scheduler_pb2.WatchScreenRequest(task_id=task_id))
    told = await asyncio.wait_for(feed.read(), 10)
    while [w.serial for w in told.watched] != ["p-1"]:
        told = await asyncio.wait_for(feed.read(), 10)
    seq = 0

    async def send(running: scheduler_pb2.FrameTask | None) -> int:
        nonlocal seq
        seq += 1
        frame = scheduler_pb2.ScreenFrame(serial="p-1", seq=seq, mime="image/png", data=b"png")
        if running is not None:
            frame.running.CopyFrom(running)
        await feed.write(lease_pb2.ScreenFramesRequest(frame=frame))
        return seq

    ours = scheduler_pb2.FrameTask(task_id=task_id, attempt=1)
    others = [
        scheduler_pb2.FrameTask(task_id=str(uuid.uuid4()), attempt=1),
        scheduler_pb2.FrameTask(task_id=task_id, attempt=2),
        scheduler_pb2.FrameTask(),
    ]

    async def received(expected: int) -> None:
        assert (await asyncio.wait_for(call.read(), 10)).seq == expected

    await received(await send(ours))
    for other in others:
        kept = other_attempt_frames()
        await send(other)
        await eventually(lambda k=kept: other_attempt_frames() == k + 1, what="the frame kept")
        await received(await send(ours))
    await received(await send(None))
    call.cancel()
    feed.cancel()
    await stream.close()


async def test_the_agent_says_which_attempt_each_frame_was_captured_during(farm: Farm) -> None:
    """THEN a watched phone's frames say no task while it is idle and the task's attempt
    while it runs one."""
    operator, client = await farm.operator(), await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        assert farm.plane is not None
        hub = farm.plane.hub
        await eventually(lambda: hub.connected(HOST), what="the host's renewal stream")
        call = operator.scheduler.WatchScreen(
            scheduler_pb2.WatchScreenRequest(host_id=HOST, serial="sim-0")
        )
        idle = await asyncio.wait_for(call.read(), 20)
        assert idle.HasField("running") and idle.running.task_id == ""
        task_id = await submit(client, actions_spec(wait_action(30), tap()))
        await status_is(farm, task_id, "dispatched")

        async def during() -> bool:
            frame = await asyncio.wait_for(call.read(), 10)
            return (frame.running.task_id, frame.running.attempt) == (task_id, 1)

        await eventually(during, what="a frame captured during the task")
        await client.scheduler.CancelTask(
            scheduler_pb2.CancelTaskRequest(task_id=task_id, reason="test over")
        )
        await status_is(farm, task_id, "cancelled")

        async def idle_again() -> bool:
            return (await asyncio.wait_for(call.read(), 10)).running.task_id == ""

        await eventually(idle_again, what="a frame of the idle phone")
        call.cancel()


async def test_a_tasks_viewer_is_woken_by_each_read_of_the_task_through_its_own_event() -> None:
    """THEN a viewer's own event (the one a frame sets) is set after each read of the task it
    watches, so the viewer waits on that one event for either (not on two: two tasks and an
    `asyncio.wait` a frame); once the viewer left, a read no longer sets it."""
    heard = asyncio.Event()

    @contextlib.contextmanager
    def hub_watch(_task_id: uuid.UUID) -> Iterator[asyncio.Event]:
        yield heard

    reads: list[uuid.UUID] = []

    async def read(task_id: uuid.UUID) -> dict[str, Any]:
        reads.append(task_id)
        return {"attempt": 1, "host_id": "host-1", "serial": "sim-0", "task_status": "running"}

    task_id, ready = uuid.uuid4(), asyncio.Event()
    following = Following(hub_watch)
    with following.follow(task_id, read, every=60.0) as followed:
        with followed.waking(ready):
            await asyncio.wait_for(ready.wait(), 10)  # the first read
            assert reads == [task_id] and followed.sure
            ready.clear()
            heard.set()  # the hub heard the task change
            await asyncio.wait_for(ready.wait(), 10)
            assert len(reads) == 2
        ready.clear()
        heard.set()
        await eventually(lambda: len(reads) == 3, what="the third read")
        await asyncio.sleep(0)
        assert not ready.is_set()
