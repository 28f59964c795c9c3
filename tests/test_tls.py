"""The gRPC listener with TLS: a client that trusts the CA and sends a token gets in."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import grpc
import pytest

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc
from amc_common.channel import aio_channel
from control_plane.admin_service import create_token
from control_plane.config import Settings
from control_plane.domain import Role
from control_plane.server import ControlPlane, Tls
from tests.support import actions_spec
from tests.support.certs import self_signed


async def test_a_tls_listener_serves_clients_that_trust_its_certificate(
    database_url: str, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    plane = ControlPlane(
        database_url,
        Settings(lease_ttl=timedelta(seconds=15)),
        listen="127.0.0.1:0",
        tls=Tls(cert.read_bytes(), key.read_bytes()),
    )
    await plane.start()
    try:
        _, token = await create_token(plane.store, Role.CLIENT, None, "tls")
        address = f"127.0.0.1:{plane.port}"
        async with aio_channel(address, token, ca_file=cert) as ch:
            task = await scheduler_pb2_grpc.SchedulerStub(ch).SubmitTask(
                scheduler_pb2.SubmitTaskRequest(spec=actions_spec())
            )
            assert task.task_id
        async with grpc.aio.insecure_channel(address) as plain:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await scheduler_pb2_grpc.SchedulerStub(plain).SubmitTask(
                    scheduler_pb2.SubmitTaskRequest(spec=actions_spec()), timeout=5
                )
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await plane.stop(0)
