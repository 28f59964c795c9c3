"""Hosts and devices from the centre: cordon, uncordon, drain and remove through the Admin
service (operator role), the events they record, and why a queued task waits
(`Task.pending_reason`). Through the real gRPC API, hosts played with `farm.host` or a real
host agent with simulated devices; outcomes checked in PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import grpc
import pytest

from amc.v1 import admin_pb2, lease_pb2, scheduler_pb2, task_pb2
from control_plane.admin_service import create_token
from control_plane.domain import Role, StreamState
from host_agent.simulated import SimulatedSource
from tests.support import (
    Clients,
    Farm,
    HostClient,
    RenewStream,
    actions_spec,
    eventually,
    tap,
    wait_action,
)
from tests.support.agent import finished, running_agent, status_is, submit


async def named_operator(farm: Farm, name: str = "alice") -> tuple[Clients, str]:
    """An operator client whose token has `name`; and the token's id."""
    assert farm.plane is not None
    info, token = await create_token(farm.plane.store, Role.OPERATOR, None, name)
    return farm.clients(token), str(info.token_id)


async def host_events(farm: Farm, host_id: str) -> list[dict[str, Any]]:
    assert farm.db is not None
    rows = await farm.db.fetch(
        "SELECT host_id, serial, kind, actor, actor_name, reason FROM host_events"
        " WHERE host_id = $1 ORDER BY event_id",
        host_id,
    )
    return [dict(r) for r in rows]


async def host_flags(farm: Farm, host_id: str) -> tuple[bool, bool] | None:
    assert farm.db is not None
    row = await farm.db.fetchrow("SELECT cordoned, draining FROM hosts WHERE host_id = $1", host_id)
    return (row["cordoned"], row["draining"]) if row else None


async def submit_tap(c: Clients, **labels: str) -> str:
    task = await c.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(
            spec=actions_spec(tap()), selector=task_pb2.DeviceSelector(labels=labels)
        )
    )
    return str(task.task_id)


async def reason_of(c: Clients, task_id: str) -> str:
    task = await c.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))
    return str(task.pending_reason)


async def stay_connected(farm: Farm, host: HostClient) -> RenewStream:
    """A renewal stream held open, recorded: the host counts as connected however slowly
    the test runs (until `disconnect`)."""
    stream = host.stream()
    await stream.renew()
    assert farm.db is not None
    db = farm.db

    async def recorded() -> bool:
        sql = "SELECT replica_id IS NOT NULL FROM hosts WHERE host_id = $1"
        return bool(await db.fetchval(sql, host.host_id))

    await eventually(recorded, what="the stream recorded")
    return stream


def disconnect(farm: Farm, host_id: str) -> Any:
    """The host's last sighting an hour ago, no stream open: as a host long gone."""
    assert farm.db is not None
    return farm.db.execute(
        "UPDATE hosts SET last_seen_at = now() - interval '1 hour', replica_id = NULL"
        " WHERE host_id = $1",
        host_id,
    )


# -- cordon ----------------------------------------------------------------------------------


async def test_a_cordoned_host_gets_no_new_work_while_its_running_task_finishes(
    farm: Farm,
) -> None:
    """Cordon: the running task reports as usual, a new task stays queued though the host
    offers an idle device, and the host, its flag and the event (who, why) are recorded."""
    op, token_id = await named_operator(farm)
    host = await farm.host("h1", "s1", "s2")
    running = await submit_tap(op)
    a = await host.acquire_one("s1")
    await host.renew(a.lease_id)

    answer = await op.admin.CordonHost(
        admin_pb2.CordonHostRequest(host_id="h1", reason="swap the USB hub")
    )
    assert (answer.host.cordoned, answer.host.draining, answer.leases) == (True, False, 1)
    assert await host_flags(farm, "h1") == (True, False)

    waiting = await submit_tap(op)
    assert await host.acquire("s2", wait=0.3) == []
    assert await farm.status(waiting) == "queued"
    done = await host.report(a, lease_pb2.OUTCOME_DONE)
    assert done.status == task_pb2.TASK_STATUS_DONE
    assert await farm.status(running) == "done"
    assert await host.acquire("s1", "s2", wait=0.3) == []
    assert await farm.status(waiting) == "queued"

    listed = await op.scheduler.ListHosts(scheduler_pb2.ListHostsRequest())
    assert [(h.host_id, h.cordoned, h.draining) for h in listed.hosts] == [("h1", True, False)]
    assert await host_events(farm, "h1") == [
        {
            "host_id": "h1",
            "serial": None,
            "kind": "cordon",
            "actor": token_id,
            "actor_name": "alice",
            "reason": "swap the USB hub",
        }
    ]


async def test_uncordon_lets_queued_work_flow_to_a_parked_host_at_once(farm: Farm) -> None:
    """An Acquire parked while the host was cordoned takes the queued task as soon as the
    host is uncordoned, long before its wait ends."""
    op = await farm.operator()
    host = await farm.host("h1", "s1")
    await op.admin.CordonHost(admin_pb2.CordonHostRequest(host_id="h1"))
    task_id = await submit_tap(op)
    parked = asyncio.create_task(host.acquire("s1", wait=30))
    assert farm.plane is not None
    dispatcher = farm.plane.hub.dispatcher
    await eventually(lambda: dispatcher.acquires_of("h1") == 1, what="the Acquire to park")
    assert await farm.status(task_id) == "queued"
    started = time.monotonic()
    answer = await op.admin.UncordonHost(
        admin_pb2.UncordonHostRequest(host_id="h1", reason="hub replaced")
    )
    assert not answer.host.cordoned
    assigned = await asyncio.wait_for(parked, 10)
    assert time.monotonic() - started < 10
    assert [a.task_id for a in assigned] == [task_id]
    assert await farm.status(task_id) == "assigned"
    assert await host_flags(farm, "h1") == (False, False)
    assert [e["kind"] for e in await host_events(farm, "h1")] == ["cordon", "uncordon"]


async def test_a_cordoned_device_gets_no_work_and_the_others_of_its_host_do(farm: Farm) -> None:
    """CordonDevice: that phone is never offered; the host's other phone takes the task;
    uncordoned, it takes work again. The device's flag and events are recorded."""
    op, token_id = await named_operator(farm, "bob")
    host = await farm.host("h1", "s1", "s2")
    answer = await op.admin.CordonDevice(
        admin_pb2.CordonDeviceRequest(serial="s1", reason="cracked screen")
    )
    assert answer.host.host_id == "h1"
    assert {d.serial: d.cordoned for d in answer.host.devices} == {"s1": True, "s2": False}
    first = await submit_tap(op)
    assert await host.acquire("s1", wait=0.3) == []
    a = await host.acquire_one("s2")
    assert a.task_id == first

    second = await submit_tap(op)
    await op.admin.UncordonDevice(admin_pb2.UncordonDeviceRequest(host_id="h1", serial="s1"))
    b = await host.acquire_one("s1")
    assert b.task_id == second
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT cordoned FROM devices WHERE serial = 's1'") is False
    events = await host_events(farm, "h1")
    assert [(e["serial"], e["kind"], e["actor_name"]) for e in events] == [
        ("s1", "cordon", "bob"),
        ("s1", "uncordon", "bob"),
    ]
    assert events[0]["actor"] == token_id and events[0]["reason"] == "cracked screen"


async def test_device_operations_name_the_host_when_the_serial_is_not_unique(
    farm: Farm,
) -> None:
    """A serial on two hosts needs host_id (INVALID_ARGUMENT naming both); an unknown
    device or host is NOT_FOUND naming it; nothing changes."""
    op = await farm.operator()
    await farm.host("h1", "s1")
    await farm.host("h2", "s1")
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await op.admin.CordonDevice(admin_pb2.CordonDeviceRequest(serial="s1"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "h1, h2" in (err.value.details() or "")
    for request in (
        admin_pb2.CordonDeviceRequest(serial="nope"),
        admin_pb2.CordonDeviceRequest(host_id="h3", serial="s1"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await op.admin.CordonDevice(request)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "no device" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await op.admin.CordonHost(admin_pb2.CordonHostRequest(host_id="h9"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "h9" in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await op.admin.CordonHost(admin_pb2.CordonHostRequest(host_id="bad id"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await farm.snapshot() == before
    assert await host_events(farm, "h1") == []
    await op.admin.CordonDevice(admin_pb2.CordonDeviceRequest(host_id="h2", serial="s1"))
    assert farm.db is not None
    rows = await farm.db.fetch("SELECT host_id, cordoned FROM devices ORDER BY host_id")
    assert [tuple(r) for r in rows] == [("h1", False), ("h2", True)]


@pytest.mark.parametrize(
    "method,request_",
    [
        ("CordonHost", admin_pb2.CordonHostRequest(host_id="h1")),
        ("UncordonHost", admin_pb2.UncordonHostRequest(host_id="h1")),
        ("DrainHost", admin_pb2.DrainHostRequest(host_id="h1")),
        ("RemoveHost", admin_pb2.RemoveHostRequest(host_id="h1")),
        ("CordonDevice", admin_pb2.CordonDeviceRequest(serial="s1")),
        ("UncordonDevice", admin_pb2.UncordonDeviceRequest(serial="s1")),
        ("GetHost", admin_pb2.GetHostRequest(host_id="h1")),
    ],
)
async def test_host_operations_are_refused_to_clients_and_hosts(
    farm: Farm, method: str, request_: Any
) -> None:
    """Only an operator may take hosts out of service: PERMISSION_DENIED, nothing changes."""
    host = await farm.host("h1", "s1")
    client = await farm.client()
    before = await farm.snapshot()
    for caller in (client, host.c):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await getattr(caller.admin, method)(request_)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert await farm.snapshot() == before
    assert await host_flags(farm, "h1") == (False, False)
    assert await host_events(farm, "h1") == []


# -- remove ----------------------------------------------------------------------------------


async def test_remove_is_refused_while_the_host_is_connected_or_holds_leases(farm: Farm) -> None:
    """FAILED_PRECONDITION saying why; the host and its devices stay. Once disconnected and
    with no lease, the host and its devices are forgotten and the removal is recorded."""
    op, token_id = await named_operator(farm)
    host = await farm.host("h1", "s1", "s2")
    await submit_tap(op)
    a = await host.acquire_one("s1")

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await op.admin.RemoveHost(admin_pb2.RemoveHostRequest(host_id="h1"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "is connected" in (err.value.details() or "")

    await disconnect(farm, "h1")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await op.admin.RemoveHost(admin_pb2.RemoveHostRequest(host_id="h1"))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "holds 1 lease" in (err.value.details() or "")
    assert await host_flags(farm, "h1") == (False, False)

    await host.report(a, lease_pb2.OUTCOME_DONE)
    await disconnect(farm, "h1")  # the report does not count as a sighting, but be sure
    await op.admin.RemoveHost(admin_pb2.RemoveHostRequest(host_id="h1", reason="decommissioned"))
    assert farm.db is not None
    assert await host_flags(farm, "h1") is None
    assert await farm.db.fetchval("SELECT count(*) FROM devices WHERE host_id = 'h1'") == 0
    events = await host_events(farm, "h1")
    assert [(e["kind"], e["actor"], e["reason"]) for e in events] == [
        ("remove", token_id, "decommissioned")
    ]
    listed = await op.scheduler.ListHosts(scheduler_pb2.ListHostsRequest())
    assert list(listed.hosts) == []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await op.admin.RemoveHost(admin_pb2.RemoveHostRequest(host_id="h1"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


# -- drain, with a real host agent -------------------------------------------------------------


async def test_drain_lets_the_agent_finish_its_task_and_take_no_more(farm: Farm) -> None:
    """DrainHost: the agent is told over its stream, finishes its running task (reported
    done), is given no queued task, stays connected; GetHost shows no lease left. Uncordon:
    it takes the queued task."""
    op, token_id = await named_operator(farm)
    source = SimulatedSource(1)
    async with running_agent(farm, source, host_id="lab1", acquire_wait=1.0) as agent:
        long_task = await submit(op, actions_spec(wait_action(1.0), tap()))
        await status_is(farm, long_task, "dispatched")

        answer = await op.admin.DrainHost(
            admin_pb2.DrainHostRequest(host_id="lab1", reason="kernel update")
        )
        assert (answer.host.cordoned, answer.host.draining, answer.leases) == (True, True, 1)
        await eventually(lambda: agent.drained_by_centre, what="the agent to hear the drain")
        queued = await submit(op, actions_spec(tap()))

        done = await finished(agent, long_task)
        assert done.result is not None and done.result.outcome.name == "DONE"
        assert await farm.status(long_task) == "done"

        async def no_leases() -> bool:
            got = await op.admin.GetHost(admin_pb2.GetHostRequest(host_id="lab1"))
            return got.leases == 0

        await eventually(no_leases, what="the host to hold no lease")
        got = await op.admin.GetHost(admin_pb2.GetHostRequest(host_id="lab1"))
        assert (got.host.connected, got.host.draining) == (True, True)
        assert [(e.kind, e.actor, e.actor_name, e.reason) for e in got.events] == [
            ("drain", token_id, "alice", "kernel update")
        ]
        assert await host_flags(farm, "lab1") == (True, True)
        # It keeps its idle phone offered (for an operator's maintenance session), and is
        # given none of the queued work for longer than an Acquire's wait.
        assert farm.plane is not None
        dispatcher = farm.plane.hub.dispatcher
        await eventually(lambda: dispatcher.acquires_of("lab1") == 1, what="its Acquire")
        quiet_until = time.monotonic() + 1.5
        while time.monotonic() < quiet_until:
            assert await farm.status(queued) == "queued"
            await asyncio.sleep(0.05)

        await op.admin.UncordonHost(admin_pb2.UncordonHostRequest(host_id="lab1"))
        await eventually(lambda: not agent.drained_by_centre, what="the drain to end")
        await status_is(farm, queued, "done")
        assert await host_flags(farm, "lab1") == (False, False)


async def test_an_agent_that_reconnects_while_drained_is_told_again(farm: Farm) -> None:
    """The drain is the host's state, not a message: a stream that opens while it holds
    gets it at once."""
    op = await farm.operator()
    host = await farm.host("h1", "s1")
    await op.admin.DrainHost(admin_pb2.DrainHostRequest(host_id="h1"))
    stream = host.stream()
    try:
        await stream.renew()
        pushed = await eventually(
            lambda: [p for p in stream.pushes if not p.leases], what="a drain push"
        )
        assert pushed[0].drain is True
        await op.admin.UncordonHost(admin_pb2.UncordonHostRequest(host_id="h1"))
        resumed = await eventually(
            lambda: [p for p in stream.pushes if not p.leases and not p.drain],
            what="the push that ends the drain",
        )
        assert resumed
    finally:
        await stream.close()


async def test_an_uncordon_between_a_streams_drain_read_and_its_push_leaves_it_undrained(
    farm: Farm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21, item 3. A drained host's stream opens; the replica reads the drain
    (True), and before it acts on what it read, an uncordon commits and its "drain off"
    reaches the stream. The later state wins: the agent ends up undrained, as the
    database has it, without reconnecting.

    A plain SELECT waits on no row lock, so the interleaving is forced by running the
    uncordon (through the Admin API) between the read's return and its use."""
    assert farm.plane is not None
    op = await farm.operator()
    host = await farm.host("h1", "s1")
    await op.admin.DrainHost(admin_pb2.DrainHostRequest(host_id="h1"))
    store, hub = farm.plane.store, farm.plane.hub
    read = store.hosts.stream_state
    stale: list[bool] = []
    heard: list[str] = []

    async def read_then_uncordon(host_id: str) -> StreamState:
        state = await read(host_id)
        if not stale:  # the stream's first read only
            stale.append(state.draining)
            await op.admin.UncordonHost(admin_pb2.UncordonHostRequest(host_id="h1"))
            # Every notice of it delivered: this replica's own, and the database's echo
            # (what another replica's stream would get).
            with contextlib.suppress(AssertionError):
                await eventually(lambda: len(heard) >= 2, timeout=2, what="the echo")
        return state

    def hear(channel: str, payload: str) -> None:
        if channel == "amc_drain":
            heard.append(payload)

    def agent_drained() -> bool:
        """The agent's view: not drained when its stream opens, then each drain push."""
        told = [p.drain for p in stream.pushes if not p.leases]
        return told[-1] if told else False

    monkeypatch.setattr(store.hosts, "stream_state", read_then_uncordon)
    with hub.listening(hear):
        stream = host.stream()
        try:
            await stream.renew()
            assert stale == [True]  # the interleaving happened
            assert await host_flags(farm, "h1") == (False, False)
            await eventually(lambda: not agent_drained(), timeout=5, what="the agent undrained")
            await asyncio.sleep(0.5)  # and it stays so (no stale push after)
            assert not agent_drained()
            await stream.renew()
            assert not agent_drained()
        finally:
            await stream.close()


# -- why a task waits -------------------------------------------------------------------------


async def test_pending_reason_says_why_a_queued_task_waits(farm: Farm) -> None:
    """No matching device; all matching busy; every matching device offline; every matching
    host cordoned; a device cordoned. GetTask, ListTasks and WatchTask carry it; a task that
    is not queued has none."""
    op = await farm.operator()
    c = await farm.client()
    nothing = await submit_tap(c, model="Pixel9")
    assert await reason_of(c, nothing) == "no registered device matches model=Pixel9"

    h1 = await farm.host("h1", "s1", rack="r1")
    stream = await stay_connected(farm, h1)
    running = await submit_tap(c, rack="r1")
    a = await h1.acquire_one("s1")
    busy = await submit_tap(c, rack="r1")
    assert await reason_of(c, busy) == "1 matching device, busy"
    assert await reason_of(c, running) == ""
    await h1.report(a, lease_pb2.OUTCOME_DONE)
    assert (
        await reason_of(c, busy) == "1 matching device is idle; its host has not taken the task yet"
    )

    await op.admin.CordonHost(admin_pb2.CordonHostRequest(host_id="h1"))
    assert await reason_of(c, busy) == "every matching host is cordoned"
    await op.admin.UncordonHost(admin_pb2.UncordonHostRequest(host_id="h1"))
    await op.admin.CordonDevice(admin_pb2.CordonDeviceRequest(serial="s1"))
    assert await reason_of(c, busy) == "every matching device is cordoned"
    await op.admin.UncordonDevice(admin_pb2.UncordonDeviceRequest(serial="s1"))

    await disconnect(farm, "h1")
    assert await reason_of(c, busy) == "every matching device is offline"

    listed = await c.scheduler.ListTasks(scheduler_pb2.ListTasksRequest())
    reasons = {t.task_id: t.pending_reason for t in listed.tasks}
    assert reasons == {
        nothing: "no registered device matches model=Pixel9",
        busy: "every matching device is offline",
        running: "",
    }
    watch = c.scheduler.WatchTask(scheduler_pb2.WatchTaskRequest(task_id=nothing))
    first = await anext(aiter(watch))
    watch.cancel()
    await stream.close()
    assert first.pending_reason == "no registered device matches model=Pixel9"


async def test_pending_reason_counts_busy_devices_beside_unavailable_ones(farm: Farm) -> None:
    """Busy devices are named with the offline and cordoned ones beside them."""
    op = await farm.operator()
    h1 = await farm.host("h1", "s1", "s2", rack="r1")
    stream = await stay_connected(farm, h1)
    await farm.host("h2", "s3", rack="r1")
    await submit_tap(op, rack="r1")
    await h1.acquire_one("s1")
    await op.admin.CordonDevice(admin_pb2.CordonDeviceRequest(serial="s2"))
    await disconnect(farm, "h2")
    waiting = await submit_tap(op, rack="r1")
    assert await reason_of(op, waiting) == "1 matching device, busy (1 offline, 1 cordoned)"
    await stream.close()


async def test_pending_reason_names_a_serial_selector(farm: Farm) -> None:
    """A serial selector is described as serial=..."""
    c = await farm.client()
    task = await c.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(
            spec=actions_spec(tap()), selector=task_pb2.DeviceSelector(serial="X1")
        )
    )
    assert await reason_of(c, task.task_id) == "no registered device matches serial=X1"
