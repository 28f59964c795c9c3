"""amc_client, the Python client library, against a real control plane and a real agent on
simulated phones: sessions, ordinary tasks, retries."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import task_pb2
from amc_client import (
    ActionFailed,
    ActionRefused,
    Farm,
    FarmUnreachable,
    NoPhone,
    SessionCancelled,
    SessionDeadline,
    SessionEnded,
    SessionIdle,
    SessionLeaseLost,
    SessionRefused,
    actions,
    opening,
)
from amc_client import phone as phone_module
from amc_client.actions import tap, wait
from amc_client.retry import Retry
from control_plane import pending
from control_plane.domain import DeviceMatch, Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm as Harness
from tests.support import eventually
from tests.support.agent import SHORT_TTL, get, running_agent, short_ttl_farm, status_is
from tests.support.fakes.tcp_proxy import TcpProxy
from tests.support.replicas import Replica

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


async def test_a_session_through_the_library_taps_and_observes_and_ends_done(
    farm: Harness,
) -> None:
    """THEN tap, screenshot and ui_dump work on the phone and leaving the block ends the
    task done, every action a step of it."""
    token = await farm.token(Role.CLIENT)
    waited: list[int] = []
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        async with client.session(
            labels={"model": "Simulated"}, on_wait=lambda t: waited.append(t.status)
        ) as phone:
            await phone.tap(100, 200)
            png = await phone.screenshot()
            xml = await phone.ui_dump()
            assert phone.serial == "sim-0"
        task = await client.get(phone.task_id)
        assert await asyncio.wait_for(phone._call.code(), 5) == grpc.StatusCode.OK
    assert png.startswith(PNG_MAGIC) and "<hierarchy" in xml
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["tap", "screenshot", "ui_dump"]


async def test_a_failed_action_raises_and_the_session_goes_on(farm: Harness) -> None:
    """THEN ActionFailed carries the step; the next action still runs."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        async with client.session() as phone:
            with pytest.raises(ActionFailed) as failed:
                await phone.tap_on(text="No such button")
            assert failed.value.step.status == task_pb2.STEP_STATUS_FAILED
            await phone.tap(1, 2)


async def test_an_exception_in_the_block_abandons_the_session(farm: Harness) -> None:
    """THEN the task ends failed, "session abandoned", and the exception propagates."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        with pytest.raises(RuntimeError):
            async with client.session() as phone:
                await phone.tap(1, 2)
                raise RuntimeError("the agent gave up")
        await status_is(farm, phone.task_id, "failed")
        assert (await client.get(phone.task_id)).result.error == "session abandoned"


async def test_a_cancelled_session_raises_session_cancelled_with_its_reason(
    farm: Harness,
) -> None:
    """THEN the action running when the cancel came is interrupted, SessionCancelled says
    the cancel's reason in one line, and every later call raises the same."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        async with client.session() as phone:
            await client.cancel(phone.task_id, reason="the phone is needed")
            with pytest.raises(SessionCancelled) as ended:
                await phone.act(wait(30))
                await phone.act(wait(30))
            assert str(ended.value) == "session ended: cancelled: the phone is needed"
            assert ended.value.task is not None
            assert ended.value.task.status == task_pb2.TASK_STATUS_CANCELLED
            with pytest.raises(SessionCancelled):
                await phone.tap(1, 2)


@pytest.mark.parametrize("patience", [phone_module.ENDING_PATIENCE, 0.0])
async def test_a_session_whose_replica_dies_raises_the_end_its_host_recorded(
    farm: Harness,
    database_url: str,
    tmp_path: Path,
    patience: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """THEN a session whose client's replica dies (its call broken: UNAVAILABLE, no
    finished task) raises SessionEnded carrying the task as its host recorded it ("session
    relay lost: …"), read through another replica within ENDING_PATIENCE; with no patience
    (patience 0) all it could say was the broken call's status: why the wait is kept."""
    monkeypatch.setattr(phone_module, "ENDING_PATIENCE", patience)
    assert farm.plane is not None
    token = await farm.token(Role.CLIENT)
    dying = await Replica(database_url, log=tmp_path / "replica.log").start()
    try:
        async with (
            running_agent(farm, SimulatedSource(1, delay=0.01)),
            TcpProxy("127.0.0.1", dying.port) as proxy,
            Farm(proxy.address, token=token, retry=Retry(total=20, first=0.05)) as client,
        ):
            proxy.balance(("127.0.0.1", dying.port), ("127.0.0.1", farm.plane.port))
            phone = await client.open_session()  # its call on the replica, its host here
            await phone.tap(1, 2)
            dying.kill()
            with pytest.raises(SessionEnded) as ended:
                await phone.tap(1, 2)
            said = ended.value.reason
            assert "\n" not in said
            if patience:
                assert type(ended.value) is SessionEnded
                assert ended.value.task is not None
                assert ended.value.task.status == task_pb2.TASK_STATUS_FAILED
                assert said.startswith("failed: session relay lost: "), said
                assert "(its call ended UNAVAILABLE: " in said, said
                assert (await phone.close()).result.error.startswith("session relay lost: ")
            else:
                assert ended.value.task is None
                assert said.startswith("the session's call ended: UNAVAILABLE: "), said
            await status_is(farm, phone.task_id, "failed", within=30)
    finally:
        dying.stop()


@pytest.mark.parametrize(
    ("ends", "raised", "reason"),
    [
        ("cancel", SessionCancelled, "cancelled: operator"),
        ("idle", SessionIdle, "idle timeout: no action for 1 s"),
        ("deadline", SessionDeadline, "failed: deadline exceeded"),
    ],
)
async def test_a_session_that_ended_while_idle_raises_its_end_at_the_next_action_and_hangs_up(
    farm: Harness, ends: str, raised: type[SessionEnded], reason: str
) -> None:
    """THEN a session ended while no action runs (an operator's cancel, its idle timeout,
    its longest duration) raises its own exception at the next action, read from the
    finished task the control plane answered (no second look at the task), with a one-line
    reason, and its call then ends OK: never the INTERNAL of a write after the end."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        limits = {"idle": {"idle_timeout": 1}, "deadline": {"max_duration": 1}}
        async with client.session(**limits.get(ends, {})) as phone:
            phone._finished = None  # the end is the call's to tell
            await phone.tap(1, 2)
            if ends == "cancel":
                await client.cancel(phone.task_id, reason="operator")
            await status_is(farm, phone.task_id, "cancelled" if ends == "cancel" else "failed")
            with pytest.raises(raised) as ended:
                await phone.tap(1, 2)
            assert type(ended.value) is raised
            assert ended.value.reason.startswith(reason), ended.value.reason
            assert "\n" not in str(ended.value)
            assert await asyncio.wait_for(phone._call.code(), 5) == grpc.StatusCode.OK
            with pytest.raises(raised):
                await phone.tap(1, 2)


async def test_a_lost_lease_raises_session_lease_lost_and_hangs_up(farm: Harness) -> None:
    """THEN a session whose lease expires under it (the host's renewal refused) raises
    SessionLeaseLost once its running action was interrupted (the finished task answers
    the action), and the call ends OK at once, not held open by the control plane until
    the client writes again or the idle timeout passes."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        async with client.session() as phone:
            phone._finished = None  # the end is the call's to tell
            await phone.tap(1, 2)
            (attempt,) = await farm.attempts(phone.task_id)
            await farm.expire_now(str(attempt["lease_id"]))
            with pytest.raises(SessionLeaseLost) as ended:
                await phone.act(wait(30))  # interrupted when the host hears of it
                await phone.act(wait(30))
            assert ended.value.reason.startswith("failed: lease lost: "), ended.value.reason
            assert await asyncio.wait_for(phone._call.code(), 5) == grpc.StatusCode.OK


async def test_a_bad_action_is_refused_before_it_is_sent_and_the_session_goes_on(
    farm: Harness,
) -> None:
    """THEN an empty action, a coordinate past the action table's limit and an unknown key
    raise ActionRefused (INVALID_ARGUMENT, the field named) without reaching the phone, and
    the same session acts on and ends done with only the actions that ran."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        async with client.session() as phone:
            with pytest.raises(ActionRefused) as refused:
                await phone.act(task_pb2.Action())
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert str(refused.value).startswith("empty action: set one of tap, tap_on")
            with pytest.raises(ActionRefused, match=r"^tap\.x: must be between 0 and 100000$"):
                await phone.tap(-1, 5)
            with pytest.raises(ActionRefused, match=r"^tap\.y: must be between 0 and 100000$"):
                await phone.act(task_pb2.Action(tap=task_pb2.Tap(x=1, y=10**6)))
            with pytest.raises(ActionRefused, match="unknown key 'HOEM'; did you mean 'home'"):
                await phone.key("HOEM")
            await phone.tap(1, 2)
            await phone.key("home")
        task = await client.get(phone.task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["tap", "key"]


async def test_an_action_the_control_plane_refuses_raises_action_refused_and_the_session_goes_on(
    farm: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """THEN with the client's own check out of the way (a control plane whose rules are
    stricter than the client's), the control plane's refusal of tap(-1, 5) raises
    ActionRefused with its code and line, and the session taps on and ends done."""
    monkeypatch.setattr(actions, "check", lambda action: None)
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        async with client.session() as phone:
            with pytest.raises(ActionRefused) as refused:
                await phone.act(task_pb2.Action(tap=task_pb2.Tap(x=-1, y=5)))
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert "tap.x: must be between 0 and 100000" in refused.value.message
            await phone.tap(1, 2)
        task = await client.get(phone.task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["tap"]


async def test_actions_sent_at_once_take_turns_and_each_gets_its_own_answer(
    farm: Harness,
) -> None:
    """THEN eight shell actions sent at once each return their own output; an action whose
    caller stopped waiting leaves its answer behind it, not to the next caller, and the
    session goes on."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        async with client.session() as phone, asyncio.timeout(30):
            said = await asyncio.gather(*(phone.shell(f"echo {i}") for i in range(8)))
            assert said == [f"{i}\n" for i in range(8)]
            waiting = asyncio.create_task(phone.wait(0.5))
            await eventually(lambda: phone._exchange is not None, what="the wait to be sent")
            waiting.cancel()
            assert await phone.shell("echo after") == "after\n"
        task = await client.get(phone.task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["shell"] * 8 + ["wait", "shell"]


async def test_a_session_no_phone_fits_says_so_at_once_and_waits_only_its_queue_timeout(
    farm: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """THEN the first answer's reason is told to on_wait and logged as a warning at once,
    and after the queue timeout NoPhone says the reason; the task ended "queue timeout"."""
    token = await farm.token(Role.CLIENT)
    told: list[str] = []
    async with Farm(farm.address, token=token) as client:
        with pytest.raises(NoPhone) as none:
            async with client.session(labels={"model": "Nope"}, queue_timeout=1):
                pass
        assert none.value.pending_reason == "no registered device matches model=Nope"
        assert str(none.value) == (
            "no phone took the session within 1 s: no registered device matches model=Nope"
        )
        assert none.value.task is not None
        assert (await client.get(none.value.task.task_id)).result.error == "queue timeout"
        with pytest.raises(NoPhone):
            async with client.session(
                labels={"model": "Nope"},
                queue_timeout=1,
                on_wait=lambda t: told.append(t.pending_reason),
            ):
                pass
    assert told[0] == "no registered device matches model=Nope"
    (warned,) = [r for r in caplog.records if r.name == "amc_client"]
    assert warned.levelname == "WARNING"
    assert warned.getMessage() == (
        "no registered device matches model=Nope; the session waits up to 1 s for one that fits"
    )


def test_the_unmatched_reason_is_the_control_planes() -> None:
    """THEN what the client takes for "no phone fits" begins each reason the control plane
    gives for a selector no registered device matches, and no reason it gives when some
    device matches (busy, idle, held, offline, cordoned, on a drained host)."""
    for serial, labels in (("R58M", {}), (None, {"model": "X"}), (None, {})):
        assert pending.explain(serial, labels, DeviceMatch()).startswith(opening.UNMATCHED)
    some = [
        DeviceMatch(busy=1),
        DeviceMatch(idle=2),
        DeviceMatch(held_by=(("charging_hold", 1),)),
        DeviceMatch(offline=1),
        DeviceMatch(cordoned=1),
        DeviceMatch(host_cordoned=1),
        DeviceMatch(host_draining=1),
        DeviceMatch(offline=1, cordoned=1, busy=1, held_by=(("too_hot", 1),)),
    ]
    for m in some:
        said = pending.explain(None, {"model": "X"}, m)
        assert not said.startswith(opening.UNMATCHED), said


async def test_an_opening_sent_again_after_its_call_broke_never_makes_a_second_session(
    farm: Harness,
) -> None:
    """THEN an opening whose connection was cut after the control plane took it, before its
    first answer came back (UNAVAILABLE), is sent again with the same request id and told
    the session it opened: SessionRefused naming that session, which ends withdrawn, and
    no second task (before request ids, the retry opened a second session)."""
    assert farm.db is not None and farm.plane is not None
    token = await farm.token(Role.CLIENT)
    marker = uuid.uuid4().hex
    count = "SELECT count(*) FROM tasks"
    async with (
        TcpProxy("127.0.0.1", farm.plane.port) as proxy,
        Farm(proxy.address, token=token, retry=Retry(total=20, first=0.05)) as client,
    ):
        frozen = proxy.freeze_after("up", marker.encode())
        opening_ = asyncio.create_task(
            client.open_session(labels={"model": "Nope"}, metadata={"try": marker})
        )
        await asyncio.wait_for(frozen.wait(), 10)  # the opening went; its answer is held
        db = farm.db
        await eventually(lambda: _fetch(db, count, 1), what="the session's task")
        proxy.cut(refuse=False)
        with pytest.raises(SessionRefused) as refused:
            await asyncio.wait_for(opening_, 30)
    (task_id,) = [str(r["task_id"]) for r in await farm.db.fetch("SELECT task_id FROM tasks")]
    said = str(refused.value)
    assert f"had opened session {task_id} from the first" in said and "\n" not in said, said
    await status_is(farm, task_id, "cancelled")
    assert await farm.db.fetchval(count) == 1


async def test_an_opening_whose_replica_died_before_answering_withdraws_the_orphan(
    farm: Harness, database_url: str, tmp_path: Path
) -> None:
    """THEN an opening taken by a replica that died before it answered, sent again to
    another replica with the same request id, is refused FAILED_PRECONDITION naming the
    session the dead replica opened (still queued: nobody withdrew it); the client
    withdraws that session (cancelled) and raises SessionRefused naming it: one task."""
    assert farm.db is not None and farm.plane is not None
    db = farm.db
    token = await farm.token(Role.CLIENT)
    marker = uuid.uuid4().hex
    dying = await Replica(database_url, log=tmp_path / "replica.log").start()
    try:
        async with (
            TcpProxy("127.0.0.1", dying.port) as proxy,
            Farm(proxy.address, token=token, retry=Retry(total=20, first=0.05)) as client,
        ):
            proxy.balance(("127.0.0.1", dying.port), ("127.0.0.1", farm.plane.port))
            frozen = proxy.freeze_after("up", marker.encode())
            opening_ = asyncio.create_task(
                client.open_session(labels={"model": "Nope"}, metadata={"try": marker})
            )
            await asyncio.wait_for(frozen.wait(), 10)
            await eventually(lambda: _fetch(db, "SELECT count(*) FROM tasks", 1), what="task")
            dying.kill()
            with pytest.raises(SessionRefused) as refused:
                await asyncio.wait_for(opening_, 30)
    finally:
        dying.stop()
    (row,) = await db.fetch("SELECT task_id, cancel_reason FROM tasks")
    assert str(refused.value).startswith(
        "the session's opening was cut before its answer and sent again: the control plane"
        f" had opened session {row['task_id']} from the first, lost with its call (withdrawn)"
    ), refused.value
    await status_is(farm, str(row["task_id"]), "cancelled")
    assert row["cancel_reason"] == "session lost with its call before it was answered"


async def test_a_token_past_its_session_limit_is_refused_at_once(database_url: str) -> None:
    """THEN with --max-sessions-per-token 1, a second session of the token raises
    SessionRefused with the control plane's line at once (RESOURCE_EXHAUSTED is not a
    transient error here: the limit stays until a session ends)."""
    settings = replace(SHORT_TTL, max_sessions_per_token=1)
    async with short_ttl_farm(database_url, settings) as farm:
        token = await farm.token(Role.CLIENT)
        async with Farm(farm.address, token=token) as client:
            first = asyncio.create_task(client.open_session(labels={"model": "Nope"}))
            await status_is_queued(farm)
            started = time.monotonic()
            with pytest.raises(SessionRefused, match="--max-sessions-per-token"):
                await client.open_session(labels={"model": "Nope"})
            assert time.monotonic() - started < 5
            first.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await first


async def status_is_queued(farm: Harness) -> None:
    assert farm.db is not None
    db = farm.db
    query = "SELECT count(*) FROM tasks WHERE status = 'queued'"
    await eventually(lambda: _fetch(db, query, 1), what="a queued session")


async def _fetch(db: Any, query: str, expected: int) -> bool:
    return bool(await db.fetchval(query) == expected)


async def test_a_session_with_a_bad_token_is_refused_unauthenticated(farm: Harness) -> None:
    """THEN the library raises the control plane's UNAUTHENTICATED, whether the refusal
    came before or after the opening request went."""
    async with Farm(farm.address, token="amc_not-a-token") as client:
        for _ in range(20):
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                async with client.session():
                    pass
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_submit_wait_watch_and_cancel_ordinary_tasks(farm: Harness) -> None:
    """THEN a submitted task is waited to done, its watch ends at the terminal state, and
    a cancelled one ends cancelled."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        task = await client.submit([tap(1, 2)], labels={"model": "Simulated"})
        done = await client.wait(task.task_id, timeout=20)
        assert done.status == task_pb2.TASK_STATUS_DONE
        seen = [t.status async for t in client.watch(task.task_id)]
        assert seen[-1] == task_pb2.TASK_STATUS_DONE
        long = await client.submit([wait(30)])
        await status_is(farm, long.task_id, "dispatched")
        await client.cancel(long.task_id, reason="test")
        ended = await client.wait(long.task_id, timeout=20)
        assert ended.status == task_pb2.TASK_STATUS_CANCELLED
        assert (await get(await farm.client(), long.task_id)).cancel_reason == "test"


def _unavailable() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "restarting"
    )


async def test_transient_errors_are_tried_again_within_the_budget() -> None:
    """THEN UNAVAILABLE twice then an answer returns the answer; past the budget, or for a
    code that is not transient, the error propagates."""
    tries: list[int] = []

    async def flaky() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise _unavailable()
        return "ok"

    assert await Retry(total=5, first=0.01).call(flaky) == "ok" and len(tries) == 3

    async def down() -> str:
        raise _unavailable()

    with pytest.raises(grpc.aio.AioRpcError):
        await Retry(total=0.05, first=0.02).call(down)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_farm_at_an_address_nothing_listens_on_fails_at_once_in_one_line() -> None:
    """THEN each call of a Farm whose address refuses connections and never answered (a
    wrong port, a control plane not started) raises FarmUnreachable within 2 s, in one
    line naming the address; it is not tried again for the retry budget's 30 s."""
    address = f"127.0.0.1:{_closed_port()}"
    async with Farm(address) as client:
        for call in (
            lambda: client.get(str(uuid.uuid4())),
            lambda: client.submit([tap(1, 2)]),
            lambda: client.wait(str(uuid.uuid4())),
            lambda: client.open_session(),
            lambda: _read_all(client.logs(str(uuid.uuid4()))),
        ):
            started = time.monotonic()
            with pytest.raises(FarmUnreachable) as refused:
                await call()
            assert time.monotonic() - started < 2.0
            said = str(refused.value)
            assert "\n" not in said
            assert said == (
                f"cannot reach the control plane at {address}: connection refused:"
                " is it running, and is the address right?"
            )


async def _read_all(lines: AsyncIterator[str]) -> list[str]:
    return [line async for line in lines]


async def test_a_farm_that_answered_before_is_tried_again_while_its_address_refuses(
    farm: Harness,
) -> None:
    """THEN once the control plane answered (even NOT_FOUND), a call made while its
    address refuses connections (a replica restarting) is tried again within the retry
    budget and returns its answer when connections are taken again."""
    assert farm.plane is not None
    token = await farm.token(Role.CLIENT)
    async with (
        TcpProxy("127.0.0.1", farm.plane.port) as proxy,
        Farm(proxy.address, token=token, retry=Retry(total=20, first=0.05)) as client,
    ):
        task = await client.submit([wait(0.01)], labels={"rack": "nowhere"})
        proxy.cut(refuse=True)
        getting = asyncio.create_task(client.get(task.task_id))
        await eventually(lambda: proxy.refused >= 2, timeout=10)
        assert not getting.done()
        proxy.heal()
        got = await asyncio.wait_for(getting, 20)
        assert got.task_id == task.task_id
        assert got.status == task_pb2.TASK_STATUS_QUEUED
