"""Control planes as separate processes on one database: restarts and several replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import grpc
import pytest

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane.config import Settings
from tests.support import Farm, HostClient, actions_spec, eventually
from tests.support.replicas import Replica, farm_with_replicas


@pytest.fixture
async def cluster(database_url: str, tmp_path) -> AsyncIterator[tuple[Farm, list[Replica]]]:  # type: ignore[no-untyped-def]
    """An in-process replica for tokens and database reads, plus two replica processes."""
    settings = Settings(lease_ttl=timedelta(seconds=15))
    async with farm_with_replicas(database_url, tmp_path, settings, sweep_interval=0.05) as both:
        yield both


async def host_on(farm: Farm, replica: Replica, host_id: str, *serials: str) -> HostClient:
    """A host client whose calls go to `replica`."""
    from control_plane.domain import Role

    token = await farm.token(Role.HOST, host_id)
    host = HostClient(host_id, _clients_at(farm, replica.address, token))
    if serials:
        await host.register(*serials)
    return host


def _clients_at(farm: Farm, address: str, token: str):  # type: ignore[no-untyped-def]
    from amc.v1 import admin_pb2_grpc, lease_pb2_grpc, scheduler_pb2_grpc
    from amc_common.channel import aio_channel
    from tests.support import Clients

    ch = aio_channel(address, token)
    farm._channels.append(ch)
    return Clients(
        ch,
        scheduler_pb2_grpc.SchedulerStub(ch),
        lease_pb2_grpc.LeaseStub(ch),
        admin_pb2_grpc.AdminStub(ch),
    )


async def client_on(farm: Farm, replica: Replica):  # type: ignore[no-untyped-def]
    from control_plane.domain import Role

    return _clients_at(farm, replica.address, await farm.token(Role.CLIENT))


async def submit(client) -> task_pb2.Task:  # type: ignore[no-untyped-def]
    return await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))


async def test_in_flight_cancel_survives_a_control_plane_process_crash(cluster) -> None:  # type: ignore[no-untyped-def]
    farm, (one, _) = cluster
    client = await client_on(farm, one)
    host = await host_on(farm, one, "h1", "s1")
    task = await submit(client)
    a = await host.acquire_one("s1")
    await host.renew(a.lease_id)
    await client.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=task.task_id))
    one.kill()
    await one.start()
    host = await host_on(farm, one, "h1")  # a new connection: the old one saw the crash
    (state,) = await host.renew(a.lease_id)
    assert state.result == lease_pb2.RENEWAL_RESULT_RENEWED and state.cancel_pending
    assert await farm.status(task.task_id) == "dispatched"


async def test_a_lease_acquired_through_one_replica_is_renewed_through_the_other(cluster) -> None:  # type: ignore[no-untyped-def]
    farm, (one, two) = cluster
    client = await client_on(farm, one)
    via_one = await host_on(farm, one, "h1", "s1")
    via_two = await host_on(farm, two, "h1")
    task = await submit(client)
    a = await via_one.acquire_one("s1")
    (state,) = await via_two.renew(a.lease_id)
    assert state.result == lease_pb2.RENEWAL_RESULT_RENEWED
    assert await farm.status(task.task_id) == "dispatched"
    done = await via_two.report(a, lease_pb2.OUTCOME_DONE)
    assert done.status == task_pb2.TASK_STATUS_DONE


async def test_a_cancel_sent_to_one_replica_reaches_a_host_streaming_to_the_other(cluster) -> None:  # type: ignore[no-untyped-def]
    farm, (one, two) = cluster
    client = await client_on(farm, one)
    host = await host_on(farm, two, "h1", "s1")
    task = await submit(client)
    a = await host.acquire_one("s1")
    stream = host.stream()
    await stream.renew(a.lease_id)
    await client.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=task.task_id))
    # Pushed by replica two on its own: no renewal is sent after the cancel.
    pushes = await eventually(
        lambda: stream.pushes, timeout=1.0, interval=0.005, what="the cancel pushed within 1 s"
    )
    assert pushes[0].leases[0].lease_id == a.lease_id and pushes[0].leases[0].cancel_pending
    await stream.close()


async def test_expiry_sweeps_in_two_replicas_end_each_lease_once(cluster) -> None:  # type: ignore[no-untyped-def]
    farm, (one, _) = cluster
    client = await client_on(farm, one)
    serials = [f"s{i}" for i in range(40)]
    host = await host_on(farm, one, "h1", *serials)
    tasks = [await submit(client) for _ in serials]
    found = await host.acquire(*serials, wait=2)
    assert len(found) == 40
    assert farm.db is not None
    await farm.db.execute("UPDATE attempts SET lease_expires_at = now() - interval '1 second'")

    async def all_requeued() -> bool:
        return (
            await farm.db.fetchval(  # type: ignore[union-attr]
                "SELECT count(*) FROM tasks WHERE status = 'queued'"
            )
            == 40
        )

    await eventually(all_requeued, what="every task requeued")
    counts = await farm.db.fetch(
        "SELECT task_id, count(*) AS n FROM task_events WHERE kind = 'expired' GROUP BY 1"
    )
    assert len(counts) == 40 and all(r["n"] == 1 for r in counts)
    assert {str(r["task_id"]) for r in counts} == {t.task_id for t in tasks}
    assert await farm.db.fetchval("SELECT count(*) FROM devices WHERE task_id IS NOT NULL") == 0


async def test_sigterm_stops_a_replica_cleanly_ending_its_streams(cluster) -> None:  # type: ignore[no-untyped-def]
    farm, (one, _) = cluster
    client = await client_on(farm, one)
    task = await submit(client)
    seen: list[task_pb2.Task] = []

    async def watch() -> None:
        async for update in client.scheduler.WatchTask(
            scheduler_pb2.WatchTaskRequest(task_id=task.task_id)
        ):
            seen.append(update)

    watcher = asyncio.create_task(watch())
    await eventually(lambda: seen, what="the watch to be streaming")
    assert one.terminate() == 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await asyncio.wait_for(watcher, 10)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert one.log is not None and b"control plane stopped" in one.log.read_bytes()


async def test_a_task_queued_through_one_replica_wakes_a_host_parked_on_another(cluster) -> None:  # type: ignore[no-untyped-def]
    """Targeted dispatch across replicas: the offer travels in the NOTIFY payload."""
    farm, (r1, _r2) = cluster
    host = await farm.host("far", "f1", rack="far")  # parked on the in-process replica
    waiting = asyncio.create_task(host.acquire("f1", wait=30))
    dispatcher = farm.plane.hub.dispatcher
    await eventually(lambda: len(dispatcher) == 1, what="the Acquire to park")
    client = await client_on(farm, r1)
    task = await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(
            spec=actions_spec(), selector=task_pb2.DeviceSelector(labels={"rack": "far"})
        )
    )
    (a,) = await asyncio.wait_for(waiting, 10)
    assert a.task_id == task.task_id
