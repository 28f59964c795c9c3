"""Helpers the tests share: waiting with a deadline, spec builders, a control plane on a
real socket with real tokens, and direct reads of the database for assertions."""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

import asyncpg
import grpc
from google.protobuf import duration_pb2

from amc.v1 import (
    admin_pb2_grpc,
    lease_pb2,
    lease_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    task_pb2,
)
from amc_common.channel import aio_channel
from control_plane.admin_service import create_token
from control_plane.config import Settings
from control_plane.domain import Role
from control_plane.server import ControlPlane

T = TypeVar("T")


async def eventually(
    check: Callable[[], Awaitable[T] | T],
    *,
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "condition",
) -> T:
    """Poll `check` until it returns a truthy value (returned) or the deadline passes."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value  # type: ignore[return-value]
        last = value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")
        await asyncio.sleep(interval)


def seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(timedelta(seconds=value))
    return d


def tap(x: int = 10, y: int = 20) -> task_pb2.Action:
    return task_pb2.Action(tap=task_pb2.Tap(x=x, y=y))


def wait_action(s: float) -> task_pb2.Action:
    return task_pb2.Action(wait=task_pb2.Wait(duration=seconds(s)))


def actions_spec(*actions: task_pb2.Action) -> task_pb2.TaskSpec:
    return task_pb2.TaskSpec(actions=task_pb2.ActionList(actions=list(actions) or [tap()]))


def workflow_spec(**steps: list[task_pb2.Action]) -> task_pb2.TaskSpec:
    return task_pb2.TaskSpec(
        workflow=task_pb2.Workflow(
            steps=[task_pb2.WorkflowStep(name=name, actions=acts) for name, acts in steps.items()]
        )
    )


def device(serial: str, **labels: str) -> lease_pb2.DeviceInfo:
    return lease_pb2.DeviceInfo(
        serial=serial,
        state=scheduler_pb2.DEVICE_STATE_DEVICE,
        model="Pixel Test",
        manufacturer="AMC",
        sdk=34,
        abi="arm64-v8a",
        labels=labels,
    )


@dataclass
class Clients:
    channel: grpc.aio.Channel
    scheduler: scheduler_pb2_grpc.SchedulerStub
    lease: lease_pb2_grpc.LeaseStub
    admin: admin_pb2_grpc.AdminStub


@dataclass
class Farm:
    """One control plane on a fresh database, with helpers to act as its users."""

    dsn: str
    settings: Settings
    plane: ControlPlane | None = None
    db: asyncpg.Connection | None = None
    _channels: list[grpc.aio.Channel] = field(default_factory=list)

    @property
    def address(self) -> str:
        assert self.plane is not None
        return f"127.0.0.1:{self.plane.port}"

    async def start(self, port: int = 0) -> None:
        self.plane = ControlPlane(self.dsn, self.settings, listen=f"127.0.0.1:{port}")
        await self.plane.start()
        if self.db is None:
            await self.reconnect_db()

    async def reconnect_db(self) -> None:
        self.db = await asyncpg.connect(self.dsn)
        await self.db.set_type_codec(
            "jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )

    async def restart(self) -> None:
        """Stop this replica entirely and start a new one on the same port and database."""
        assert self.plane is not None
        port = self.plane.port
        await self.plane.stop(0)
        await self.start(port)

    async def stop(self) -> None:
        for ch in self._channels:
            await ch.close()
        if self.plane is not None:
            await self.plane.stop(0)
            assert not self.plane.crashed.is_set(), "a control-plane background loop died"
        if self.db is not None:
            await self.db.close()

    async def token(self, role: Role, host_id: str | None = None) -> str:
        assert self.plane is not None
        _, token = await create_token(self.plane.store, role, host_id, "test")
        return token

    def clients(self, token: str | None) -> Clients:
        ch = aio_channel(self.address, token)
        self._channels.append(ch)
        return Clients(
            ch,
            scheduler_pb2_grpc.SchedulerStub(ch),
            lease_pb2_grpc.LeaseStub(ch),
            admin_pb2_grpc.AdminStub(ch),
        )

    async def client(self) -> Clients:
        return self.clients(await self.token(Role.CLIENT))

    async def operator(self) -> Clients:
        return self.clients(await self.token(Role.OPERATOR))

    async def host(self, host_id: str, *serials: str, **labels: str) -> HostClient:
        c = self.clients(await self.token(Role.HOST, host_id))
        host = HostClient(host_id, c)
        if serials:
            await host.register(*serials, **labels)
        return host

    # -- database reads for assertions ------------------------------------------------------

    async def task_row(self, task_id: str) -> asyncpg.Record:
        assert self.db is not None
        row = await self.db.fetchrow("SELECT * FROM tasks WHERE task_id = $1::uuid", task_id)
        assert row is not None
        return row

    async def status(self, task_id: str) -> str:
        return str((await self.task_row(task_id))["status"])

    async def attempts(self, task_id: str) -> list[asyncpg.Record]:
        assert self.db is not None
        return await self.db.fetch(
            "SELECT * FROM attempts WHERE task_id = $1::uuid ORDER BY attempt", task_id
        )

    async def events(self, task_id: str) -> list[asyncpg.Record]:
        assert self.db is not None
        return await self.db.fetch(
            "SELECT * FROM task_events WHERE task_id = $1::uuid ORDER BY event_id", task_id
        )

    async def device_holder(self, host_id: str, serial: str) -> str | None:
        assert self.db is not None
        value = await self.db.fetchval(
            "SELECT task_id FROM devices WHERE host_id = $1 AND serial = $2", host_id, serial
        )
        return str(value) if value else None

    async def expire_now(self, lease_id: str) -> None:
        """Move a lease's expiry into the past, as if its TTL had run out."""
        assert self.db is not None
        await self.db.execute(
            "UPDATE attempts SET lease_expires_at = now() - interval '1 second'"
            " WHERE lease_id = $1::uuid",
            lease_id,
        )

    async def snapshot(self) -> list[Any]:
        """Every row that requests could change, to prove a refused request changed none."""
        assert self.db is not None
        out: list[Any] = []
        for table in ("tasks", "attempts", "devices", "task_events", "tokens"):
            out.append(await self.db.fetch(f"SELECT * FROM {table} ORDER BY 1, 2"))
        # Not last_seen_at / replica_id: those follow the host's stream (presence), written
        # by the replica whenever a stream opens or closes, not by requests.
        out.append(
            await self.db.fetch("SELECT host_id, labels, registered_at FROM hosts ORDER BY 1")
        )
        return out


@dataclass
class HostClient:
    """Plays a host agent by calling the Lease service directly."""

    host_id: str
    c: Clients
    seq: int = 0

    async def register(self, *serials: str, **labels: str) -> lease_pb2.RegisterHostResponse:
        return await self.c.lease.RegisterHost(
            lease_pb2.RegisterHostRequest(
                host_id=self.host_id, labels=labels, devices=[device(s) for s in serials]
            )
        )

    async def acquire(self, *serials: str, wait: float = 0.0) -> list[lease_pb2.Assignment]:
        response = await self.c.lease.Acquire(
            lease_pb2.AcquireRequest(host_id=self.host_id, idle_serials=serials, wait=seconds(wait))
        )
        return list(response.assignments)

    async def acquire_one(self, serial: str, wait: float = 5.0) -> lease_pb2.Assignment:
        found = await self.acquire(serial, wait=wait)
        assert len(found) == 1, f"expected one assignment, got {found}"
        return found[0]

    async def renew(self, *lease_ids: str) -> list[lease_pb2.LeaseState]:
        """One request on a short-lived stream."""
        return list((await self.renew_answer(*lease_ids)).leases)

    async def renew_answer(self, *lease_ids: str) -> lease_pb2.RenewLeasesResponse:
        self.seq += 1
        request = lease_pb2.RenewLeasesRequest(
            host_id=self.host_id, lease_ids=lease_ids, seq=self.seq
        )
        call = self.c.lease.RenewLeases(iter([request]))
        responses = [r async for r in call]
        answers = [r for r in responses if not r.push]
        assert len(answers) == 1
        return answers[0]

    def stream(self) -> RenewStream:
        return RenewStream(self)

    async def report(self, a: lease_pb2.Assignment, outcome: int, error: str = "") -> task_pb2.Task:
        return await self.c.lease.ReportResult(
            lease_pb2.ReportResultRequest(
                task_id=a.task_id,
                attempt=a.attempt,
                lease_id=a.lease_id,
                outcome=outcome,
                result=task_pb2.TaskResult(error=error),
            )
        )

    async def release(
        self, lease_id: str, reason: str = "shutting down", *, device_lost: bool = False
    ) -> None:
        await self.c.lease.ReleaseLease(
            lease_pb2.ReleaseLeaseRequest(lease_id=lease_id, reason=reason, device_lost=device_lost)
        )


class RenewStream:
    """A long-lived RenewLeases stream: send requests, read answers and pushes."""

    def __init__(self, host: HostClient) -> None:
        self.host = host
        self.requests: asyncio.Queue[lease_pb2.RenewLeasesRequest | None] = asyncio.Queue()
        self.call = host.c.lease.RenewLeases(self._requests())
        self.pushes: list[lease_pb2.RenewLeasesResponse] = []
        self.answers: list[lease_pb2.RenewLeasesResponse] = []
        self._reader = asyncio.create_task(self._read())

    async def _requests(self):  # type: ignore[no-untyped-def]
        while (request := await self.requests.get()) is not None:
            yield request

    async def _read(self) -> None:
        async for response in self.call:
            (self.pushes if response.push else self.answers).append(response)

    async def renew(self, *lease_ids: str) -> list[lease_pb2.LeaseState]:
        self.host.seq += 1
        seq = self.host.seq
        await self.requests.put(
            lease_pb2.RenewLeasesRequest(host_id=self.host.host_id, lease_ids=lease_ids, seq=seq)
        )
        answer = await eventually(
            lambda: next((a for a in self.answers if a.seq == seq), None),
            what=f"renewal answer {seq}",
        )
        return list(answer.leases)

    async def close(self) -> None:
        await self.requests.put(None)
        try:
            await asyncio.wait_for(self._reader, 5)
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
