"""amc_client, the Python client library, against a real control plane and a real agent on
simulated phones: sessions, ordinary tasks, retries."""

from __future__ import annotations

import grpc
import pytest

from amc.v1 import task_pb2
from amc_client import ActionFailed, Farm, SessionEnded
from amc_client.actions import tap, wait
from amc_client.retry import Retry
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm as Harness
from tests.support.agent import get, running_agent, status_is

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


async def test_a_cancelled_session_raises_session_ended(farm: Harness) -> None:
    """THEN the action running when the cancel came is interrupted, and SessionEnded carries
    the cancelled task."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        async with client.session() as phone:
            await client.cancel(phone.task_id)
            with pytest.raises(SessionEnded) as ended:
                await phone.act(wait(30))
                await phone.act(wait(30))
        assert ended.value.task is not None
        assert ended.value.task.status == task_pb2.TASK_STATUS_CANCELLED


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
