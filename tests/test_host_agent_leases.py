"""The LeaseKeeper (host_agent.leases) against a real control plane: acknowledgement,
renewal answers matched by seq, pushes, reconnects and self-fencing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest

from amc.v1 import lease_pb2, lease_pb2_grpc
from amc_common.action_table import Key, Tap
from amc_common.channel import aio_channel
from control_plane.domain import Role
from host_agent.fencing import FENCE_LEAD, HeldLease, RenewalResult, Timing, fencing_margin
from host_agent.leases import LeaseKeeper
from host_agent.results import StepStatus
from host_agent.runner import run
from host_agent.spec import ActionList
from host_agent.stop_token import StopReason
from tests.support import Farm, HostClient, actions_spec, eventually
from tests.support.agent import cancel, short_ttl_farm, status_is, submit
from tests.support.fakes.tcp_proxy import TcpProxy
from tests.support.runner_fakes import Call, FakeDevice

HOST = "h1"


@asynccontextmanager
async def keeper_for(farm: Farm, address: str | None = None) -> AsyncIterator[LeaseKeeper]:
    """A running keeper for HOST, with the timing RegisterHost gives."""
    channel = aio_channel(address or farm.address, await farm.token(Role.HOST, HOST))
    stub = lease_pb2_grpc.LeaseStub(channel)
    registered = await stub.RegisterHost(lease_pb2.RegisterHostRequest(host_id=HOST))
    timing = Timing(
        registered.lease_ttl.ToTimedelta().total_seconds(),
        registered.renew_interval.ToTimedelta().total_seconds(),
    )
    keeper = LeaseKeeper(stub, HOST, timing)
    task = asyncio.create_task(keeper.run())
    try:
        yield keeper
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await channel.close()


async def assignment(farm: Farm) -> tuple[HostClient, lease_pb2.Assignment, float]:
    client = await farm.client()
    host = await farm.host(HOST, "s1")
    await submit(client, actions_spec())
    a = await host.acquire_one("s1")
    return host, a, time.monotonic()


def lease_from(keeper: LeaseKeeper, a: lease_pb2.Assignment, received_at: float) -> HeldLease:
    return keeper.new_lease(
        a.lease_id, a.task_id, a.attempt, a.valid_for.ToTimedelta().total_seconds(), received_at
    )


@pytest.mark.parametrize(("ttl", "margin"), [(15, 3.0), (2, 1.0), (1, 0.5), (100, 20.0)])
def test_fencing_margin_is_a_fifth_of_the_ttl_at_least_a_second_at_most_half(
    ttl: float, margin: float
) -> None:
    """THEN the margin is max(1 s, 20 % of the TTL), capped at half the TTL."""
    assert fencing_margin(ttl) == pytest.approx(margin)


async def test_first_renewal_acknowledges_and_the_deadline_counts_from_its_send_time(
    farm: Farm,
) -> None:
    """THEN the answer is RENEWED, the task is dispatched, and the deadline is send time +
    valid_for - margin (never later than the answer's arrival + valid_for - margin)."""
    _, a, received_at = await assignment(farm)
    async with keeper_for(farm) as keeper:
        lease = lease_from(keeper, a, received_at)
        before = time.monotonic()
        answer = await keeper.acknowledge(lease)
        after = time.monotonic()
    assert answer is not None and answer.result is RenewalResult.RENEWED
    assert not answer.cancel_pending and not lease.token.tripped
    assert await farm.status(a.task_id) == "dispatched"
    ttl, margin = answer.valid_for, keeper.timing.margin
    assert before + ttl - margin <= lease.deadline <= after + ttl - margin


async def test_renewal_response_signals_a_pending_cancellation_at_acknowledgement(
    farm: Farm,
) -> None:
    """THEN an acknowledgement that says cancel_pending trips the token CANCELLED."""
    _, a, received_at = await assignment(farm)
    await cancel(await farm.client(), a.task_id)
    async with keeper_for(farm) as keeper:
        lease = lease_from(keeper, a, received_at)
        answer = await keeper.acknowledge(lease)
    assert answer is not None and answer.cancel_pending
    assert lease.token.reason is StopReason.CANCELLED
    assert lease.cancel_seen_via == "renewal"


async def test_acknowledging_a_lost_lease_answers_conflict_and_trips_lease_lost(farm: Farm) -> None:
    """THEN a lease that expired before its acknowledgement is a CONFLICT: LEASE_LOST."""
    _, a, received_at = await assignment(farm)
    await farm.expire_now(a.lease_id)
    await status_is(farm, a.task_id, "queued")
    async with keeper_for(farm) as keeper:
        lease = lease_from(keeper, a, received_at)
        answer = await keeper.acknowledge(lease)
        assert answer is not None and answer.result is RenewalResult.CONFLICT
        assert lease.token.reason is StopReason.LEASE_LOST
        assert lease.conflicted
    assert await farm.status(a.task_id) == "queued"  # nothing revived


async def test_pushed_cancellation_trips_the_token_before_the_next_renewal(farm: Farm) -> None:
    """THEN a cancellation recorded mid-run arrives by push, well within a renew interval."""
    _, a, received_at = await assignment(farm)
    async with keeper_for(farm) as keeper:
        lease = lease_from(keeper, a, received_at)
        await keeper.acknowledge(lease)
        await cancel(await farm.client(), a.task_id)
        await asyncio.wait_for(lease.token.wait(), keeper.timing.interval / 2)
    assert lease.token.reason is StopReason.CANCELLED
    assert lease.cancel_seen_via == "push"


async def test_stream_reconnects_after_a_reset_and_keeps_renewing_its_leases(farm: Farm) -> None:
    """THEN after the connection drops the keeper reopens the stream and the lease it held is
    renewed again: its deadline moves past the reset."""
    _, a, received_at = await assignment(farm)
    async with (
        TcpProxy("127.0.0.1", int(farm.address.rsplit(":", 1)[1])) as proxy,
        keeper_for(farm, proxy.address) as keeper,
    ):
        lease = lease_from(keeper, a, received_at)
        await keeper.acknowledge(lease)
        proxy.cut(refuse=False)
        reset_at = time.monotonic()
        ttl, margin = keeper.timing.ttl, keeper.timing.margin
        await eventually(
            lambda: lease.deadline > reset_at + ttl - margin,
            timeout=keeper.timing.interval * 3,
            what="a renewal after the reset",
        )
        assert not lease.token.tripped
        assert len(proxy.connections) >= 2


async def test_lease_deadline_trips_lease_lost_while_the_stream_is_down(database_url: str) -> None:
    """THEN with the control plane unreachable the token trips LEASE_LOST at the deadline,
    not before, and before the control plane's own expiry (send time + TTL)."""
    async with short_ttl_farm(database_url) as farm:
        _, a, received_at = await assignment(farm)
        async with (
            TcpProxy("127.0.0.1", int(farm.address.rsplit(":", 1)[1])) as proxy,
            keeper_for(farm, proxy.address) as keeper,
        ):
            lease = lease_from(keeper, a, received_at)
            await keeper.acknowledge(lease)
            proxy.cut()
            last_deadline = lease.deadline
            await asyncio.wait_for(lease.token.wait(), keeper.timing.ttl)
            tripped_at = time.monotonic()
        assert lease.token.reason is StopReason.LEASE_LOST
        assert lease.deadline == last_deadline  # nothing renewed it after the cut
        assert tripped_at >= lease.deadline - FENCE_LEAD
        # The control plane still counts the lease live for at least the margin.
        assert (await farm.status(a.task_id)) == "dispatched"


async def test_answers_are_matched_to_requests_by_seq(farm: Farm) -> None:
    """THEN an answer for a request this keeper never sent changes no deadline."""
    _, a, received_at = await assignment(farm)
    async with keeper_for(farm) as keeper:
        lease = lease_from(keeper, a, received_at)
        await keeper.acknowledge(lease)
        deadline = lease.deadline
        state = lease_pb2.LeaseState(
            lease_id=a.lease_id, result=lease_pb2.RENEWAL_RESULT_RENEWED, cancel_pending=True
        )
        answer = lease_pb2.RenewLeasesResponse(leases=[state], seq=10**9)
        answer.valid_for.FromSeconds(3600)
        keeper.on_response(answer)
        assert lease.deadline == deadline
        assert not lease.token.tripped


async def test_forgotten_lease_is_no_longer_renewed_or_fenced(farm: Farm) -> None:
    """THEN once forgotten, a lease's deadline passing trips nothing."""
    _, a, received_at = await assignment(farm)
    async with keeper_for(farm) as keeper:
        lease = keeper.new_lease(a.lease_id, a.task_id, a.attempt, 0.0, received_at)
        keeper.forget(lease.lease_id)
        keeper.hold(lease)
        keeper.forget(lease.lease_id)
        for _ in range(3):  # a timer already due would fire on the next loop iteration
            await asyncio.sleep(0)
        assert not lease.token.tripped
        assert keeper.held() == []


def test_a_push_asking_for_the_screen_call_reaches_on_screen_and_keeps_the_drain() -> None:
    """THEN a push with screen_wanted calls `on_screen`, and its drain goes to `on_drain`
    as any push without leases; a push without it asks for nothing."""
    screens: list[bool] = []
    drains: list[bool] = []
    keeper = LeaseKeeper(
        cast(Any, None),
        HOST,
        Timing(10.0, 2.0),
        on_drain=drains.append,
        on_screen=lambda: screens.append(True),
    )
    keeper.on_response(lease_pb2.RenewLeasesResponse(push=True, drain=True, screen_wanted=True))
    keeper.on_response(lease_pb2.RenewLeasesResponse(push=True, drain=False))
    assert screens == [True] and drains == [True, False]


async def test_writing_to_a_renewal_stream_that_already_ended_is_a_break_not_a_crash() -> None:
    """Found by `make chaos`: an agent frozen while its replica died wrote to the finished
    call on SIGCONT, and asyncio.InvalidStateError took the whole agent down."""
    import asyncio

    from host_agent.leases import StreamBroken, _stream_error

    failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    failed.set_exception(asyncio.InvalidStateError("RPC already finished."))
    assert isinstance(_stream_error(failed), StreamBroken)


async def test_a_run_frozen_across_its_lease_deadline_starts_no_action_after_it(
    database_url: str,
) -> None:
    """Found by `make chaos`: a host frozen (SIGSTOP) across its lease's deadline started its
    next action on SIGCONT, before the overdue fencing timer ran. THEN after the event loop
    was frozen past the deadline, no action starts after it: the next boundary finds the
    token tripped LEASE_LOST and the steps left are not run."""
    async with short_ttl_farm(database_url) as farm:
        _, a, received_at = await assignment(farm)
        async with keeper_for(farm) as keeper:
            lease = lease_from(keeper, a, received_at)
            assert await keeper.acknowledge(lease) is not None

            def freeze(call: Call) -> None:
                if call.method == "tap" and len(device.calls) == 1:
                    # Blocks the whole event loop, as SIGSTOP does: no timer, no renewal.
                    time.sleep(max(0.0, lease.deadline - time.monotonic()) + 0.2)

            device = FakeDevice(on_call=freeze)
            result = await run(ActionList((Tap(1, 1), Tap(2, 2), Key(4))), device, lease.token)
    after = [c.method for c in device.calls if c.started >= lease.deadline - FENCE_LEAD]
    assert after == [], device.calls
    assert device.methods() == ["tap"]
    assert lease.token.reason is StopReason.LEASE_LOST
    assert result.stop_reason is StopReason.LEASE_LOST
    assert [s.status for s in result.steps] == [
        StepStatus.OK,
        StepStatus.SKIPPED,
        StepStatus.SKIPPED,
    ]
