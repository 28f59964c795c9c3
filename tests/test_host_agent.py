"""The host agent end to end: a real control plane (real PostgreSQL, real gRPC), the Agent
on a real channel, simulated phones that record every action they are asked for (with
monotonic start and end times, the same clock the agent's lease deadlines use)."""

from __future__ import annotations

import time
import uuid

import grpc

from amc.v1 import task_pb2
from amc_common.statuses import Outcome
from host_agent.agent import Agent
from host_agent.fencing import HeldLease
from host_agent.results import StepStatus
from host_agent.simulated import SimulatedSource
from host_agent.stop_token import StopReason
from host_agent.worker import Ending
from tests.support import Farm, actions_spec, eventually, tap, wait_action, workflow_spec
from tests.support.agent import (
    cancel,
    finished,
    running_agent,
    short_ttl_farm,
    status_is,
    submit,
)
from tests.support.fakes.tcp_proxy import TcpProxy


def input_text(text: str) -> task_pb2.Action:
    return task_pb2.Action(input_text=task_pb2.InputText(text=text))


async def held_lease(agent: Agent, task_id: str) -> HeldLease:
    assert agent.keeper is not None
    keeper = agent.keeper

    def lease() -> HeldLease | None:
        return next((held for held in keeper.held() if held.task_id == task_id), None)

    found = await eventually(lease, what=f"the agent to hold a lease for {task_id}")
    assert found is not None
    return found


async def first_action_done(source: SimulatedSource, serial: str = "sim-0") -> None:
    await eventually(lambda: source.actions_for(serial), what="the first action on the phone")


def taps_after(source: SimulatedSource, moment: float) -> list[str]:
    return [f"{r.action}{r.args}" for r in source.actions if r.started_monotonic > moment]


async def report_events(farm: Farm, task_id: str) -> list[str]:
    return [str(e["to_status"]) for e in await farm.events(task_id) if e["kind"] == "report"]


# -- running work ---------------------------------------------------------------------------


async def test_agent_runs_a_workflow_to_done_with_simulated_devices(farm: Farm) -> None:
    """THEN every step runs on the phone and the task is done with its step results."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source) as agent:
        spec = workflow_spec(open=[tap(1, 2), wait_action(0.05)], confirm=[tap(3, 4)])
        task_id = await submit(client, spec)
        await status_is(farm, task_id, "done")
        record = await finished(agent, task_id)
    assert record.ending is Ending.REPORTED and record.result is not None
    assert record.result.outcome is Outcome.DONE
    assert [a.args for a in source.actions] == [{"x": 1, "y": 2}, {"x": 3, "y": 4}]
    row = await farm.task_row(task_id)
    result = task_pb2.TaskResult.FromString(row["result"])
    assert [s.name for s in result.steps] == ["open", "confirm"]
    assert all(s.status == task_pb2.STEP_STATUS_OK for s in result.steps)
    assert await farm.device_holder("host-1", "sim-0") is None


async def test_agent_runs_tasks_on_two_devices_at_once_over_one_renewal_stream(farm: Farm) -> None:
    """THEN both phones work at the same time and one stream renews both leases."""
    assert farm.plane is not None
    source = SimulatedSource(2, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source) as agent:
        ids = [await submit(client, actions_spec(tap(), wait_action(0.5), tap())) for _ in range(2)]
        assert agent.keeper is not None
        keeper = agent.keeper
        await eventually(lambda: len(keeper.held()) == 2, what="two leases held at once")
        assert farm.plane.hub.streams() == 1
        for task_id in ids:
            await status_is(farm, task_id, "done")
    assert {r.serial for r in source.actions} == {"sim-0", "sim-1"}


async def test_agent_reports_a_spec_it_cannot_run_as_failed_without_touching_the_device(
    farm: Farm,
) -> None:
    """THEN a spec this agent cannot run (say, from a newer control plane) fails with the
    reason, and no action reaches the phone."""
    assert farm.db is not None
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    task_id = await submit(client, actions_spec(tap()))
    # The control plane validates specs as the agent does; only version skew gets one by.
    unknown = task_pb2.TaskSpec(actions=task_pb2.ActionList(actions=[task_pb2.Action()]))
    await farm.db.execute(
        "UPDATE tasks SET spec = $1 WHERE task_id = $2::uuid", unknown.SerializeToString(), task_id
    )
    async with running_agent(farm, source):
        await status_is(farm, task_id, "failed")
    assert "invalid task spec" in str((await farm.task_row(task_id))["error"])
    assert source.actions == []


# -- cancellation ---------------------------------------------------------------------------


async def test_execution_stops_due_to_a_cancellation_request(farm: Farm) -> None:
    """THEN the Host Agent reports terminal status cancelled, and the control plane
    transitions the task to status cancelled and releases its device reservation."""
    source = SimulatedSource(1, delay=0.02)
    client = await farm.client()
    async with running_agent(farm, source) as agent:
        spec = actions_spec(tap(1, 1), wait_action(30), tap(2, 2), tap(3, 3))
        task_id = await submit(client, spec)
        await first_action_done(source)
        await cancel(client, task_id)
        await status_is(farm, task_id, "cancelled", within=5)
        record = await finished(agent, task_id)
    assert [r.args for r in source.actions] == [{"x": 1, "y": 1}]  # later steps never ran
    assert record.result is not None and record.result.outcome is Outcome.CANCELLED
    assert [s.status for s in record.result.steps] == [
        StepStatus.OK,
        StepStatus.CANCELLED,
        StepStatus.SKIPPED,
        StepStatus.SKIPPED,
    ]
    assert await report_events(farm, task_id) == ["cancelled"]
    assert await farm.device_holder("host-1", "sim-0") is None


async def test_agent_stop_triggered_by_cancellation_reports_cancelled(farm: Farm) -> None:
    """THEN the terminal result it reports for that attempt is `cancelled`."""
    source = SimulatedSource(1, delay=0.02)
    client = await farm.client()
    async with running_agent(farm, source) as agent:
        spec = workflow_spec(first=[tap()], long=[wait_action(30)], last=[tap()])
        task_id = await submit(client, spec)
        lease = await held_lease(agent, task_id)
        await first_action_done(source)
        await cancel(client, task_id)
        record = await finished(agent, task_id)
    assert lease.token.reason is StopReason.CANCELLED
    assert record.delivery is not None and record.delivery.response is not None
    assert record.delivery.response.status == task_pb2.TASK_STATUS_CANCELLED
    (attempt,) = await farm.attempts(task_id)
    assert attempt["outcome"] == "cancelled"


async def test_cancel_before_the_first_step_reports_cancelled_without_touching_the_device(
    farm: Farm,
) -> None:
    """THEN the acknowledgement finds the cancellation: cancelled, and no device action."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with (
        TcpProxy("127.0.0.1", int(farm.address.rsplit(":", 1)[1])) as proxy,
        running_agent(farm, source, address=proxy.address) as agent,
    ):
        # Hold the connection still right after the assignment (its spec carries the
        # marker) reached the agent, so the cancellation is recorded before the
        # acknowledging renewal arrives.
        marker = uuid.uuid4().hex
        frozen = proxy.freeze_after("down", marker.encode())
        task_id = await submit(client, actions_spec(input_text(marker), tap()))
        await eventually(frozen.is_set, what="the assignment to reach the agent")
        assert await farm.status(task_id) == "assigned"
        await cancel(client, task_id)
        proxy.thaw()
        await status_is(farm, task_id, "cancelled")
        record = await finished(agent, task_id)
    assert source.actions == []
    assert record.result is not None and record.result.outcome is Outcome.CANCELLED
    assert all(s.status is StepStatus.SKIPPED for s in record.result.steps)
    assert await report_events(farm, task_id) == ["cancelled"]


async def test_owning_host_observes_the_pending_cancellation_at_lease_renewal(farm: Farm) -> None:
    """THEN the renewal response signals the pending cancellation and the Host Agent stops
    further planned actions at the next available step boundary."""
    source = SimulatedSource(1, delay=0.02)
    client = await farm.client()
    async with (
        TcpProxy("127.0.0.1", int(farm.address.rsplit(":", 1)[1])) as proxy,
        running_agent(farm, source, address=proxy.address) as agent,
    ):
        task_id = await submit(client, actions_spec(tap(), wait_action(30), tap()))
        lease = await held_lease(agent, task_id)
        await first_action_done(source)
        # With the stream down no push can reach the host: only a renewal can tell it.
        proxy.cut()
        await cancel(client, task_id)
        proxy.heal()
        await status_is(farm, task_id, "cancelled")
    assert lease.cancel_seen_via == "renewal"
    assert lease.token.reason is StopReason.CANCELLED
    assert len(source.actions) == 1


async def test_renewal_response_signals_a_pending_cancellation_and_the_agent_stops_at_the_next_step_boundary(  # noqa: E501
    farm: Farm,
) -> None:
    """THEN the Host Agent stops further planned actions at the next available step
    boundary: the action in flight finishes, no later one starts."""
    source = SimulatedSource(1, delay=0.3)
    client = await farm.client()
    async with (
        TcpProxy("127.0.0.1", int(farm.address.rsplit(":", 1)[1])) as proxy,
        running_agent(farm, source, address=proxy.address) as agent,
    ):
        task_id = await submit(client, actions_spec(*[tap(i, i) for i in range(40)]))
        lease = await held_lease(agent, task_id)
        await first_action_done(source)
        proxy.cut()
        await cancel(client, task_id)
        proxy.heal()
        record = await finished(agent, task_id)
    assert lease.cancel_seen_via == "renewal" and lease.cancel_seen_at is not None
    assert taps_after(source, lease.cancel_seen_at) == []
    assert all(r.outcome == "ok" for r in source.actions)  # the one in flight completed
    assert record.result is not None and record.result.outcome is Outcome.CANCELLED
    ran = [s for s in record.result.steps if s.status is StepStatus.OK]
    assert len(ran) == len(source.actions) < 40
    assert await farm.status(task_id) == "cancelled"


# -- lease loss -----------------------------------------------------------------------------


async def test_execution_stops_due_to_lease_loss_unrelated_to_cancellation(
    database_url: str,
) -> None:
    """THEN the Host Agent reports terminal status failed, not cancelled."""
    source = SimulatedSource(1, delay=0.02)
    async with short_ttl_farm(database_url) as farm:
        client = await farm.client()
        async with running_agent(farm, source) as agent:
            task_id = await submit(
                client, actions_spec(tap(), wait_action(30), tap()), max_attempts=1
            )
            lease = await held_lease(agent, task_id)
            await first_action_done(source)
            await farm.expire_now(lease.lease_id)
            record = await finished(agent, task_id)
        assert lease.token.reason is StopReason.LEASE_LOST
        assert record.result is not None and record.result.outcome is Outcome.FAILED
        assert record.result.stop_reason is StopReason.LEASE_LOST
        # The control plane had ended the attempt already, so it refuses the late report.
        assert record.delivery is not None
        assert record.delivery.code == grpc.StatusCode.ABORTED
        assert len(source.actions) == 1
        assert await farm.status(task_id) == "failed"
        assert await report_events(farm, task_id) == []


async def test_agent_stop_triggered_by_lease_loss_reports_failed_not_cancelled(
    database_url: str,
) -> None:
    """THEN the terminal result it reports for that attempt is `failed`, not `cancelled`."""
    source = SimulatedSource(1, delay=0.02)
    async with short_ttl_farm(database_url) as farm:
        client = await farm.client()
        async with (
            TcpProxy("127.0.0.1", int(farm.address.rsplit(":", 1)[1])) as proxy,
            running_agent(farm, source, address=proxy.address) as agent,
        ):
            task_id = await submit(client, actions_spec(tap(), wait_action(30)))
            lease = await held_lease(agent, task_id)
            await first_action_done(source)
            proxy.cut()
            # The host fences itself before the control plane's lease runs out, and the
            # control plane is back in that window: the host gives the lease back first, so
            # the task is requeued (it has attempts left) and the FAILED report is refused.
            await eventually(lambda: lease.token.tripped, what="self-fencing")
            proxy.heal()
            record = await finished(agent, task_id)
            first = (await farm.attempts(task_id))[0]
        assert lease.token.reason is StopReason.LEASE_LOST
        assert record.result is not None and record.result.outcome is Outcome.FAILED
        sent = record.delivery
        assert sent is not None and sent.code == grpc.StatusCode.ABORTED, sent
        assert await report_events(farm, task_id) == []
        assert (first["state"], first["outcome"]) == ("released", None)


async def test_self_fencing_when_the_control_plane_is_unreachable(database_url: str) -> None:
    """THEN no action is sent to the phone after the lease deadline, and the stop reason is
    lease lost, although the host never heard from the control plane."""
    source = SimulatedSource(1, delay=0.05)
    async with short_ttl_farm(database_url) as farm:
        client = await farm.client()
        async with (
            TcpProxy("127.0.0.1", int(farm.address.rsplit(":", 1)[1])) as proxy,
            running_agent(farm, source, address=proxy.address, report_timeout=1.0) as agent,
        ):
            task_id = await submit(client, actions_spec(*[tap(i, i) for i in range(400)]))
            lease = await held_lease(agent, task_id)
            await first_action_done(source)
            proxy.cut()
            cut_at = time.monotonic()
            record = await finished(agent, task_id)
            deadline = lease.deadline
        assert lease.token.reason is StopReason.LEASE_LOST
        assert cut_at < deadline <= cut_at + 3.0  # the TTL is 3 s
        assert taps_after(source, deadline) == []
        assert sum(1 for r in source.actions if r.ended_monotonic > deadline) <= 1
        assert record.result is not None and record.result.outcome is Outcome.FAILED
        assert record.delivery is not None and not record.delivery.accepted
        # The control plane's own lease runs out later, and the task goes back to the queue.
        await status_is(farm, task_id, "queued")
        (attempt, *_) = await farm.attempts(task_id)
        assert attempt["state"] == "expired"


async def test_assignment_never_acknowledged_in_time_is_released_not_failed(
    database_url: str,
) -> None:
    """THEN with no answer to the acknowledging renewal before the deadline, the agent
    touches nothing and gives the lease back, so the task is requeued, not failed."""
    source = SimulatedSource(1, delay=0.01)
    async with short_ttl_farm(database_url) as farm:
        client = await farm.client()
        async with (
            TcpProxy("127.0.0.1", int(farm.address.rsplit(":", 1)[1])) as proxy,
            running_agent(farm, source, address=proxy.address) as agent,
        ):
            marker = uuid.uuid4().hex
            proxy.freeze_after("down", marker.encode())  # after the assignment arrived
            task_id = await submit(client, actions_spec(input_text(marker)), max_attempts=1)
            lease = await held_lease(agent, task_id)
            await eventually(lambda: lease.token.tripped, what="the deadline to pass")
            proxy.thaw()
            record = await finished(agent, task_id)
        assert lease.token.reason is StopReason.LEASE_LOST
        assert record.ending is Ending.RELEASED and record.result is None
        assert source.actions == []
        (attempt,) = await farm.attempts(task_id)
        assert attempt["state"] in ("released", "expired")
        assert await report_events(farm, task_id) == []


# -- devices --------------------------------------------------------------------------------


async def test_device_unplugged_mid_task_gives_the_task_back_as_device_lost(farm: Farm) -> None:
    """THEN the step fails with "device lost", the task is not failed but given back (a
    device_lost event: requeued for another phone) and the phone is gone."""
    source = SimulatedSource(1, delay=0.2)
    client = await farm.client()
    async with running_agent(farm, source) as agent:
        task_id = await submit(client, actions_spec(*[tap(i, i) for i in range(20)]))
        await first_action_done(source)
        source.unplug("sim-0")
        record = await finished(agent, task_id)
        await status_is(farm, task_id, "queued")
        assert agent.registered.is_set()
    assert record.ending is Ending.RELEASED
    assert record.result is not None and record.result.device_lost
    assert any("device lost" in s.error for s in record.result.steps)
    assert farm.db is not None
    detail = await farm.db.fetchval(
        "SELECT detail FROM task_events WHERE task_id = $1 AND kind = 'device_lost'", task_id
    )
    assert "device lost: sim-0" in detail
    state = await farm.db.fetchval(
        "SELECT state FROM devices WHERE host_id = 'host-1' AND serial = 'sim-0'"
    )
    assert state == "gone"


# -- drain ----------------------------------------------------------------------------------


async def test_drain_lets_a_task_finish_within_the_drain_timeout_and_takes_no_new_work(
    farm: Farm,
) -> None:
    """THEN a task that ends within the grace period is reported done; nothing new starts."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, drain_timeout=10.0) as agent:
        task_id = await submit(client, actions_spec(wait_action(0.5), tap()))
        await held_lease(agent, task_id)
        agent.stop()
        later = await submit(client, actions_spec(tap()))
        record = await finished(agent, task_id)
    assert record.result is not None and record.result.outcome is Outcome.DONE
    assert await farm.status(task_id) == "done"
    assert await farm.status(later) == "queued"
    assert len(source.actions) == 1


async def test_drain_timeout_stops_the_task_and_releases_its_lease_so_it_requeues(
    farm: Farm,
) -> None:
    """THEN the lease is given back, nothing is reported, the task is queued again."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, drain_timeout=0.2) as agent:
        task_id = await submit(client, actions_spec(tap(), wait_action(30), tap()))
        lease = await held_lease(agent, task_id)
        await first_action_done(source)
        agent.stop()
        record = await finished(agent, task_id)
    assert lease.token.reason is StopReason.SHUTDOWN
    assert record.ending is Ending.RELEASED
    assert record.delivery is not None and record.delivery.accepted
    assert await farm.status(task_id) == "queued"
    (attempt,) = await farm.attempts(task_id)
    assert attempt["state"] == "released"
    assert await report_events(farm, task_id) == []


async def test_second_stop_ends_the_grace_period_at_once(farm: Farm) -> None:
    """THEN a second stop request trips the running task without waiting out the drain."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, drain_timeout=60.0) as agent:
        task_id = await submit(client, actions_spec(wait_action(30)))
        lease = await held_lease(agent, task_id)
        started = time.monotonic()
        agent.stop()
        agent.stop()
        await finished(agent, task_id)
    assert time.monotonic() - started < 10
    assert lease.token.reason is StopReason.SHUTDOWN
    assert await farm.status(task_id) == "queued"


async def test_agent_keeps_working_across_a_control_plane_restart(farm: Farm) -> None:
    """THEN the renewal stream reconnects with the lease kept and the task still ends done."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source) as agent:
        task_id = await submit(client, actions_spec(tap(), wait_action(2.0), tap()))
        lease = await held_lease(agent, task_id)
        await first_action_done(source)
        await farm.restart()
        await status_is(farm, task_id, "done")
        assert not lease.token.tripped
    del agent
    assert len(source.actions) == 2


async def test_every_renewal_request_carries_every_held_lease(database_url: str) -> None:
    """THEN each periodic renewal extends the deadlines of all the host's leases."""
    source = SimulatedSource(3, delay=0.01)
    async with short_ttl_farm(database_url) as farm:
        client = await farm.client()
        async with running_agent(farm, source) as agent:
            ids = [await submit(client, actions_spec(wait_action(2.5))) for _ in range(3)]
            for task_id in ids:
                await status_is(farm, task_id, "dispatched")
            leases = [await held_lease(agent, t) for t in ids]
            assert agent.keeper is not None
            interval = agent.keeper.timing.interval
            before = {lease.lease_id: lease.deadline for lease in leases}

            def all_extended() -> bool:
                return all(lease.deadline > before[lease.lease_id] for lease in leases)

            await eventually(all_extended, timeout=interval * 2.5, what="every lease renewed")
            assert not any(lease.token.tripped for lease in leases)
            for task_id in ids:
                await status_is(farm, task_id, "done")


async def test_a_phone_freed_while_another_acquire_waits_is_offered_at_once(farm: Farm) -> None:
    """THEN a task for the freed phone starts at once, not when the other phone's parked
    Acquire returns (a whole wait later)."""
    source = SimulatedSource(2, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, acquire_wait=30.0):
        first = await submit(
            client, actions_spec(tap()), selector=task_pb2.DeviceSelector(serial="sim-0")
        )
        await status_is(farm, first, "done")
        # sim-1 has been parked in an Acquire all along; sim-0 is idle again.
        second = await submit(
            client, actions_spec(tap()), selector=task_pb2.DeviceSelector(serial="sim-0")
        )
        await status_is(farm, second, "done", within=5.0)
