"""What a notice would have pushed to a host's renewal stream reaches the host even when the
notice is lost: a replica whose LISTEN connection dropped (a failover, any broken
connection) tells every stream it holds again once it listens again (the drain, devices
released from quarantine, cancels), and a stream that opens on another replica (a host
moving) is told what was recorded while it moved.

Real replica processes on one database, real agents on simulated phones. A replica's
database connections go through a TCP proxy, so a test can kill its LISTEN connection
(pg_terminate_backend, as a failover would) and keep it from listening again until an
operator's change has committed and its notification has gone out."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from amc.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    lease_pb2,
    lease_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
)
from control_plane.domain import Role
from host_agent.agent import Agent
from host_agent.simulated import SimulatedSource
from tests.conftest import FAST
from tests.support import Clients, Farm, HostClient, actions_spec, eventually, tap, wait_action
from tests.support.agent import agent_channel, cancel, running_agent, status_is, submit
from tests.support.fakes.tcp_proxy import TcpProxy
from tests.support.replicas import Replica, farm_with_replicas
from tests.test_device_health import is_in, on
from tests.test_device_release import QUARANTINE

# Well under the replicas' connection age (30 minutes by default): what a lost notice
# costs once the replica listens again.
PROMPTLY = 10.0
QUARANTINED = scheduler_pb2.DEVICE_CONDITION_QUARANTINED


def _via(dsn: str, proxy: TcpProxy) -> str:
    """`dsn` with its server reached through `proxy`."""
    parts = urlsplit(dsn)
    user = parts.netloc.rpartition("@")[0]
    netloc = f"{user}@{proxy.address}" if user else proxy.address
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass
class Deafened:
    """A replica process whose database connections all go through `proxy`."""

    farm: Farm
    replica: Replica
    proxy: TcpProxy

    async def replica_id(self, host_id: str) -> str:
        """The replica holding `host_id`'s renewal stream, once it is this one."""
        assert self.farm.db is not None and self.farm.plane is not None
        mine = self.farm.plane.hub.replica
        db = self.farm.db

        async def held() -> str | None:
            held_by = await db.fetchval("SELECT replica_id FROM hosts WHERE host_id = $1", host_id)
            return held_by if held_by not in (None, mine) else None

        found = await eventually(held, timeout=15, what=f"{host_id}'s stream on the replica")
        return str(found)

    async def kill_listener(self) -> None:
        """Terminate the replica's LISTEN connection and refuse its new connections (its
        other connections stay), until `listen_again`."""
        assert self.farm.db is not None
        self.proxy.refusing = True
        ports = [link.upstream.get_extra_info("sockname")[1] for link in self.proxy.live]
        pid = await self.farm.db.fetchval(
            "SELECT pid FROM pg_stat_activity WHERE client_port = ANY ($1::int[])"
            " AND (query LIKE 'LISTEN %' OR query LIKE '%pg_listening_channels%')",
            ports,
        )
        assert pid is not None, "the replica's LISTEN connection"
        assert await self.farm.db.fetchval("SELECT pg_terminate_backend($1, 5000)", pid)

    def listen_again(self) -> None:
        self.proxy.heal()


@pytest.fixture
async def deafened(database_url: str, tmp_path: Path) -> AsyncIterator[Deafened]:
    """An in-process replica (for operators and tokens, it holds no host's stream) and a
    replica process behind a database proxy (where the hosts are)."""
    farm = Farm(database_url, FAST)
    await farm.start()
    try:
        async with TcpProxy(*_server(database_url)) as proxy:
            replica = Replica(_via(database_url, proxy), log=tmp_path / "replica.log")
            try:
                await replica.start()
                yield Deafened(farm, replica, proxy)
            finally:
                replica.stop()
    finally:
        await farm.stop()


def _server(dsn: str) -> tuple[str, int]:
    parts = urlsplit(dsn)
    assert parts.hostname and parts.port
    return parts.hostname, parts.port


@contextlib.asynccontextmanager
async def sent(farm: Farm, channel: str, payload: str) -> AsyncIterator[None]:
    """Returns once the in-process replica heard `channel`/`payload` from the database:
    the notification has gone out (and a replica that was not listening missed it)."""
    assert farm.plane is not None
    heard: list[str] = []

    def hear(got: str, body: str) -> None:
        if got == channel and body.startswith(payload):
            heard.append(body)

    # A change the replica published is acted on there at once, then heard from the
    # database; a cancel is notified by its transaction only.
    echoed = 1 if channel == "amc_cancel" else 2
    with farm.plane.hub.listening(hear):
        yield
        await eventually(lambda: len(heard) >= echoed, what=f"the {channel} notification")


async def test_an_uncordon_while_the_replica_is_not_listening_reaches_the_drained_agent(
    deafened: Deafened,
) -> None:
    """A drained agent on a replica whose LISTEN connection is killed; an operator
    uncordons the host on another replica while it cannot listen. Once it listens again,
    the agent is told the drain ended (promptly, not at its stream's next move) and takes
    the queued task."""
    farm = deafened.farm
    op = await farm.operator()
    source = SimulatedSource(1, delay=0.02)
    async with running_agent(
        farm, source, address=deafened.replica.address, host_id="lab1"
    ) as agent:
        await deafened.replica_id("lab1")
        await op.admin.DrainHost(admin_pb2.DrainHostRequest(host_id="lab1", reason="kernel"))
        await eventually(lambda: agent.drained_by_centre, what="the agent drained")
        queued = await submit(op, actions_spec(tap()))

        await deafened.kill_listener()
        async with sent(farm, "amc_drain", "lab1 0"):
            await op.admin.UncordonHost(admin_pb2.UncordonHostRequest(host_id="lab1"))
        assert agent.drained_by_centre
        deafened.listen_again()

        await eventually(
            lambda: not agent.drained_by_centre, timeout=PROMPTLY, what="the drain to end"
        )
        await status_is(farm, queued, "done")


async def _quarantined(farm: Farm, agent: Agent, source: SimulatedSource) -> None:
    """sim-0 hangs, goes through its whole ladder and waits quarantined; then it is made
    well, as an operator who replugged it would (test_device_release.quarantined_phone)."""
    await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first probe")
    source.hang("sim-0")
    await eventually(lambda: agent.recovery.outcomes, timeout=15, what="the ladder's end")
    await eventually(lambda: is_in(farm, "sim-0", "quarantined"), what="quarantined")
    source.set_body("sim-0", booting_until=0.0)


async def test_a_release_while_the_replica_is_not_listening_reaches_the_agent(
    deafened: Deafened,
) -> None:
    """An operator releases a quarantined phone while the replica holding its host's stream
    cannot listen: once it listens again, the agent ends the hold and the phone is ready
    and runs the task that waited for it."""
    farm = deafened.farm
    op = await farm.operator()
    source = SimulatedSource(2, delay=0.02)
    source.boot_time = 600.0
    async with running_agent(farm, source, address=deafened.replica.address, **QUARANTINE) as agent:
        await deafened.replica_id("host-1")
        await _quarantined(farm, agent, source)
        waiting = await submit(op, actions_spec(tap()), selector=on("sim-0"))

        await deafened.kill_listener()
        async with sent(farm, "amc_release", "host-1 sim-0"):
            await op.admin.ReleaseDevice(
                admin_pb2.ReleaseDeviceRequest(host_id="host-1", serial="sim-0", reason="swap")
            )
        assert "sim-0" in agent.recovery.held
        deafened.listen_again()

        await eventually(
            lambda: "sim-0" not in agent.recovery.held, timeout=PROMPTLY, what="the release"
        )
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the phone ready")
        await status_is(farm, waiting, "done")


async def test_a_cancel_while_the_replica_is_not_listening_is_pushed_once_it_listens(
    deafened: Deafened,
) -> None:
    """A host holds a dispatched lease on the replica and sends no renewal meanwhile; a
    client cancels the task while the replica cannot listen. Once it listens again, the
    replica pushes the cancel onto the host's stream (not left to the next renewal)."""
    farm = deafened.farm
    client = await farm.client()
    token = await farm.token(Role.HOST, "h1")
    channel = agent_channel(deafened.replica.address, token)
    try:
        host = HostClient(
            "h1",
            Clients(
                channel,
                scheduler_pb2_grpc.SchedulerStub(channel),
                lease_pb2_grpc.LeaseStub(channel),
                admin_pb2_grpc.AdminStub(channel),
            ),
        )
        await host.register("s1")
        task_id = await submit(client, actions_spec(wait_action(60)))
        (a,) = await host.acquire("s1", wait=5)
        stream = host.stream()
        try:
            await stream.renew(a.lease_id)
            await deafened.replica_id("h1")
            await status_is(farm, task_id, "dispatched")

            await deafened.kill_listener()
            async with sent(farm, "amc_cancel", "h1 "):
                await cancel(client, task_id)
            deafened.listen_again()

            def cancel_pushed() -> list[lease_pb2.LeaseState]:
                return [
                    s
                    for p in stream.pushes
                    for s in p.leases
                    if s.lease_id == a.lease_id and s.cancel_pending
                ]

            await eventually(cancel_pushed, timeout=PROMPTLY, what="the cancel pushed")
        finally:
            await stream.close()
    finally:
        await channel.close()


async def test_a_release_while_the_hosts_stream_moves_between_replicas_reaches_the_agent(
    database_url: str, tmp_path: Path
) -> None:
    """A quarantined phone's host loses its stream on one replica (its connection cut, as
    a move or a balancer would) and an operator releases the phone before the host's
    stream opens on the other replica: the stream that opens there tells the agent, which
    ends the hold; the phone runs the task that waited for it."""
    async with farm_with_replicas(database_url, tmp_path, FAST) as (farm, (first, second)):
        op = await farm.operator()
        assert farm.db is not None
        db = farm.db

        async def held_by() -> str | None:
            found = await db.fetchval("SELECT replica_id FROM hosts WHERE host_id = 'host-1'")
            return str(found) if found else None

        source = SimulatedSource(2, delay=0.02)
        source.boot_time = 600.0
        async with TcpProxy("127.0.0.1", first.port) as proxy:
            async with running_agent(farm, source, address=proxy.address, **QUARANTINE) as agent:
                on_first = await eventually(held_by, what="the stream on the first replica")
                await _quarantined(farm, agent, source)
                waiting = await submit(op, actions_spec(tap()), selector=on("sim-0"))

                proxy.cut()  # the stream ends; the host cannot reach a replica for now
                await eventually(
                    lambda: _not(held_by), what="the first replica to close the stream"
                )
                await op.admin.ReleaseDevice(
                    admin_pb2.ReleaseDeviceRequest(host_id="host-1", serial="sim-0", reason="swap")
                )
                proxy.balance(("127.0.0.1", second.port))
                proxy.heal()
                on_second = await eventually(held_by, what="the stream on the second replica")
                assert on_second != on_first

                await eventually(
                    lambda: "sim-0" not in agent.recovery.held,
                    timeout=PROMPTLY,
                    what="the release",
                )
                await status_is(farm, waiting, "done")


async def _not(check: Callable[[], Awaitable[object]]) -> bool:
    return not await check()


async def _tell(host: HostClient, serial: str, condition: int, reason: str = "") -> None:
    await host.c.lease.ReportDeviceHealth(
        lease_pb2.ReportDeviceHealthRequest(
            host_id=host.host_id,
            devices=[lease_pb2.DeviceHealth(serial=serial, condition=condition, reason=reason)],
        )
    )


async def _released_at_open(host: HostClient) -> list[str]:
    """What a stream that opens now is pushed as released (pushed before its first answer)."""
    stream = host.stream()
    try:
        await stream.renew()
        return [s for p in stream.pushes for s in p.release_serials]
    finally:
        await stream.close()


async def test_each_stream_that_opens_is_told_a_release_until_the_host_takes_the_phone_out(
    farm: Farm,
) -> None:
    """A release is the host's to hear until it acts on it: every stream of the host that
    opens is told, also after the host told the phone quarantined again (as it does when
    it registers again, not having heard); once it reports the phone out of quarantine
    (ready, or anything else its probe found), no stream is told any more."""
    op = await farm.operator()
    host = await farm.host("h1", "s1", "s2")
    first = host.stream()
    try:
        await first.renew()
        await _tell(host, "s1", QUARANTINED, "recovery failed")
        # Its notification acted on and heard back (no late echo reaches a later stream).
        async with sent(farm, "amc_release", "h1 s1"):
            await op.admin.ReleaseDevice(
                admin_pb2.ReleaseDeviceRequest(host_id="h1", serial="s1", reason="replugged")
            )
        await eventually(
            lambda: "s1" in [s for p in first.pushes for s in p.release_serials],
            what="the release pushed",
        )
    finally:
        await first.close()
    assert await _released_at_open(host) == ["s1"]
    await _tell(host, "s1", QUARANTINED, "recovery failed")
    assert await _released_at_open(host) == ["s1"]
    await _tell(host, "s1", scheduler_pb2.DEVICE_CONDITION_READY)
    assert await _released_at_open(host) == []
