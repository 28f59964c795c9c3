"""The control plane while its database is away: health says so, calls say UNAVAILABLE,
and everything works again when the database is back."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from amc.v1 import scheduler_pb2
from control_plane.config import Settings
from control_plane.embedded import EmbeddedPostgres
from tests.support import Farm, actions_spec, eventually


@pytest.fixture
async def own_database() -> AsyncIterator[EmbeddedPostgres]:
    root = Path(tempfile.mkdtemp(prefix="amc-outage-"))
    # Durable: an immediate shutdown must not lose acknowledged commits here.
    server = EmbeddedPostgres(root / "data", durable=True)
    server.start()
    try:
        yield server
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


async def health(farm: Farm) -> int:
    async with grpc.aio.insecure_channel(farm.address) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="amc.v1.Scheduler"), timeout=2
        )
    return reply.status


async def test_health_is_not_serving_while_the_database_is_unreachable(
    own_database: EmbeddedPostgres,
) -> None:
    farm = Farm(own_database.url, Settings(sweep_interval=timedelta(seconds=0.1)))
    await farm.start()
    try:
        client = await farm.client()
        assert await health(farm) == health_pb2.HealthCheckResponse.SERVING
        own_database.stop("immediate")
        await eventually(
            lambda: _is(farm, health_pb2.HealthCheckResponse.NOT_SERVING), what="NOT_SERVING"
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.scheduler.SubmitTask(
                scheduler_pb2.SubmitTaskRequest(spec=actions_spec()), timeout=20
            )
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "internal" not in (err.value.details() or "").lower()
        own_database.start()
        await eventually(
            lambda: _is(farm, health_pb2.HealthCheckResponse.SERVING),
            timeout=30,
            what="SERVING again",
        )
        task = await eventually(lambda: _submit(client), timeout=30, what="a submit to work")
        await farm.reconnect_db()
        assert await farm.status(task.task_id) == "queued"
    finally:
        await farm.stop()


async def _is(farm: Farm, status: int) -> bool:
    return await health(farm) == status


async def _submit(client):  # type: ignore[no-untyped-def]
    try:
        return await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(spec=actions_spec())
        )
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            return None
        raise


async def test_backends_terminated_mid_call_answer_unavailable_and_the_replica_carries_on(
    farm: Farm,
) -> None:
    """Its connections' backends terminated while calls run (an operator's
    pg_terminate_backend): those calls are UNAVAILABLE, never INTERNAL, and the replica
    serves on with new connections."""
    client = await farm.client()
    codes: Counter[str] = Counter()

    async def submits() -> None:
        for _ in range(40):
            try:
                await client.scheduler.SubmitTask(
                    scheduler_pb2.SubmitTaskRequest(spec=actions_spec()), timeout=10
                )
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1

    async def terminate() -> None:
        assert farm.db is not None
        for _ in range(15):
            await farm.db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                " AND backend_type = 'client backend'"
            )
            await asyncio.sleep(0.02)

    await asyncio.gather(submits(), submits(), terminate())
    assert set(codes) <= {"OK", "UNAVAILABLE"}, codes
    assert await eventually(lambda: _submit(client), what="a submit to work")


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_a_renewal_with_the_database_away_renews_nothing_and_keeps_the_stream(
    own_database: EmbeddedPostgres,
) -> None:
    """THEN a renewal made while the database is away is answered with no leases and no
    valid_for: the lease's deadline stands, the stream stays open (it does not end
    UNAVAILABLE, so a database fault does not have every renewing host reconnect at once),
    the step the renewal carried goes again with the next one, and once the database is
    back the same stream renews the lease and the step is kept."""
    from tests.test_host_agent_leases import assignment, keeper_for, lease_from
    from tests.test_host_agent_progress import ok

    settings = Settings(lease_ttl=timedelta(seconds=30), renew_interval=timedelta(seconds=0.5))
    farm = Farm(own_database.url, settings)
    await farm.start()
    try:
        _, a, received_at = await assignment(farm)
        async with keeper_for(farm) as keeper:
            lease = lease_from(keeper, a, received_at)
            await keeper.acknowledge(lease)
            broken = _sample(
                "amc_rpc_requests_total", method="Lease/RenewLeases", code="UNAVAILABLE"
            )
            unanswered = _sample("amc_renewals_total", result="unanswered")
            own_database.stop("immediate")
            keeper.progress(a.lease_id, ok(0))
            await eventually(
                lambda: _sample("amc_renewals_total", result="unanswered") >= unanswered + 2,
                what="renewals answered 'unanswered'",
            )
            stood = lease.deadline
            await asyncio.sleep(0)  # no renewal extends it while the database is away
            assert lease.deadline == stood and not lease.token.tripped
            own_database.start()
            await eventually(lambda: lease.deadline > stood, timeout=20, what="a renewal again")
            await farm.reconnect_db()
            await eventually(lambda: _kept(farm, a.task_id), what="the step kept")
            assert not lease.token.tripped
            assert _sample(
                "amc_rpc_requests_total", method="Lease/RenewLeases", code="UNAVAILABLE"
            ) == (broken)
    finally:
        await farm.stop()


async def _kept(farm: Farm, task_id: str) -> bool:
    from tests.test_host_agent_progress import kept

    return await kept(farm, task_id) == [0]
