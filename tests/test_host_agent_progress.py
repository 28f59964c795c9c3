"""The host agent's step progress (issue 27.8), end to end: a real agent on simulated phones
sends each step's result with its next lease renewal, so GetTask shows a running workflow's
steps done and the step it runs while it runs; the terminal report stays the record."""

from __future__ import annotations

from amc.v1 import task_pb2
from host_agent.simulated import SimulatedSource
from tests.support import Farm, eventually, tap, wait_action, workflow_spec
from tests.support.agent import cancel, finished, get, running_agent, submit
from tests.support.fakes.tcp_proxy import TcpProxy
from tests.test_host_agent_leases import assignment, keeper_for, lease_from


async def kept(farm: Farm, task_id: str) -> list[int]:
    assert farm.db is not None
    rows = await farm.db.fetch(
        "SELECT step_index FROM attempt_steps WHERE task_id = $1::uuid ORDER BY 1", task_id
    )
    return [r["step_index"] for r in rows]


def ok(index: int) -> task_pb2.StepResult:
    return task_pb2.StepResult(index=index, name="tap", status=task_pb2.STEP_STATUS_OK)


async def test_a_step_goes_with_the_leases_next_renewal(farm: Farm) -> None:
    _, a, received_at = await assignment(farm)
    async with keeper_for(farm) as keeper:
        lease = lease_from(keeper, a, received_at)
        await keeper.acknowledge(lease)
        keeper.progress(a.lease_id, ok(0))
        keeper.progress(a.lease_id, ok(1))
        await eventually(
            lambda: _equal(kept(farm, a.task_id), [0, 1]),
            timeout=keeper.timing.interval * 3,
            what="the steps kept",
        )


async def test_steps_sent_on_a_stream_that_broke_are_sent_again(farm: Farm) -> None:
    _, a, received_at = await assignment(farm)
    async with (
        TcpProxy("127.0.0.1", int(farm.address.rsplit(":", 1)[1])) as proxy,
        keeper_for(farm, proxy.address) as keeper,
    ):
        lease = lease_from(keeper, a, received_at)
        await keeper.acknowledge(lease)
        keeper.progress(a.lease_id, ok(0))
        proxy.cut(refuse=False)
        await eventually(
            lambda: _equal(kept(farm, a.task_id), [0]),
            timeout=keeper.timing.interval * 4,
            what="the step kept after the stream came back",
        )
        assert len(proxy.connections) >= 2


async def test_a_forgotten_leases_steps_are_not_sent(farm: Farm) -> None:
    _, a, received_at = await assignment(farm)
    async with keeper_for(farm) as keeper:
        lease = lease_from(keeper, a, received_at)
        await keeper.acknowledge(lease)
        keeper.progress(a.lease_id, ok(0))
        keeper.forget(a.lease_id)
        keeper.progress(a.lease_id, ok(1))  # after the report: dropped at once
        assert keeper._steps == {}


async def _equal(found, wanted: list[int]) -> bool:  # type: ignore[no-untyped-def]
    return await found == wanted


async def test_a_running_workflow_shows_its_steps_done_and_the_step_running(farm: Farm) -> None:
    client = await farm.client()
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source) as agent:
        spec = workflow_spec(login=[tap(1, 2)], browse=[wait_action(60)], pay=[tap(3, 4)])
        task_id = await submit(client, spec)

        async def on_browse() -> task_pb2.Task | None:
            task = await get(client, task_id)
            return task if task.progress.running_name == "browse" else None

        # Within a renewal interval (5 s here) of the first step's end, while the second
        # (a minute's wait) runs.
        running = await eventually(on_browse, timeout=20, what="step 'login' reported")
        assert running.status == task_pb2.TASK_STATUS_DISPATCHED
        p = running.progress
        assert [(s.index, s.name, s.status) for s in p.steps] == [
            (0, "login", task_pb2.STEP_STATUS_OK)
        ]
        assert (p.step_count, p.running_index) == (3, 1)
        login = p.steps[0]
        assert p.running_since.ToDatetime() == (
            login.started_at.ToDatetime() + login.duration.ToTimedelta()
        )
        assert farm.db is not None
        kept = await farm.db.fetchval(
            "SELECT count(*) FROM attempt_steps WHERE task_id = $1::uuid", task_id
        )
        assert kept == 1

        await cancel(client, task_id)
        await finished(agent, task_id)
        final = await eventually(
            lambda: _ended(client, task_id), timeout=20, what="the cancel reported"
        )
    # The report is the record: the steps as it says, and no progress beside them.
    assert final.status == task_pb2.TASK_STATUS_CANCELLED
    assert not final.HasField("progress")
    assert [(s.name, s.status) for s in final.result.steps] == [
        ("login", task_pb2.STEP_STATUS_OK),
        ("browse", task_pb2.STEP_STATUS_CANCELLED),
        ("pay", task_pb2.STEP_STATUS_SKIPPED),
    ]


async def _ended(client, task_id: str) -> task_pb2.Task | None:  # type: ignore[no-untyped-def]
    task = await get(client, task_id)
    return task if task.status == task_pb2.TASK_STATUS_CANCELLED else None
