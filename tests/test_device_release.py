"""An operator releases a quarantined phone from the centre (issue 22): Admin.ReleaseDevice
(`amc devices release`), recorded as a `release` host event with who and why, told to the
host's agent over its renewal stream; the agent ends the hold, probes the phone and reports
it, and a ready phone takes work again. Bad input is refused and changes nothing. Through
the real agent with simulated phones and the real control plane."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest

from amc.v1 import admin_pb2, scheduler_pb2
from control_plane.admin_service import create_token
from control_plane.domain import Role
from host_agent.agent import Agent
from host_agent.recovery import RecoverySettings
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, eventually, tap
from tests.support.agent import running_agent, status_is, submit
from tests.test_cli import Cli
from tests.test_device_health import condition_of, is_in, on
from tests.test_host_operations import host_events, named_operator

# The ladder fails fast: one failure quarantines, a reboot outlasts the boot timeout.
QUARANTINE = {
    "probe_interval": 0.3,
    "probe_timeout": 0.3,
    "recovery": RecoverySettings(failures=1, backoff=0.05, boot_timeout=0.3),
}


@asynccontextmanager
async def quarantined_phone(farm: Farm, source: SimulatedSource) -> AsyncIterator[Agent]:
    """An agent whose sim-0 hung, went through its whole ladder (the reboot takes longer
    than the boot timeout) and waits quarantined for an operator; then the phone is made
    well (booted), as an operator who replugged it would."""
    source.boot_time = 600.0
    async with running_agent(farm, source, **QUARANTINE) as agent:
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first probe")
        source.hang("sim-0")
        await eventually(lambda: agent.recovery.outcomes, timeout=15, what="the ladder's end")
        assert agent.recovery.outcomes == [("sim-0", False)]
        await eventually(lambda: is_in(farm, "sim-0", "quarantined"), what="quarantined")
        source.set_body("sim-0", booting_until=0.0)
        yield agent


async def test_an_operator_releases_a_quarantined_phone_and_it_takes_work_again(
    farm: Farm,
) -> None:
    """ReleaseDevice on a quarantined phone: a `release` event with the operator and the
    reason; the agent probes it, reports it ready (a `recovery` event of the host) and the
    task that waited for it runs."""
    op, token_id = await named_operator(farm, "carol")
    client = await farm.client()
    source = SimulatedSource(2, delay=0.02)
    async with quarantined_phone(farm, source) as agent:
        waiting = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=waiting))
        assert got.pending_reason == "1 matching phone held: 1 quarantined"
        answer = await op.admin.ReleaseDevice(
            admin_pb2.ReleaseDeviceRequest(host_id="host-1", serial="sim-0", reason="replugged")
        )
        assert answer.host.host_id == "host-1"
        await status_is(farm, waiting, "done", within=15)
        assert await condition_of(farm, "sim-0") == "ready"
        assert "sim-0" not in agent.recovery.held
    events = [e for e in await host_events(farm, "host-1") if e["serial"] == "sim-0"]
    release = [e for e in events if e["kind"] == "release"]
    assert release == [
        {
            "host_id": "host-1",
            "serial": "sim-0",
            "kind": "release",
            "actor": token_id,
            "actor_name": "carol",
            "reason": "replugged",
        }
    ]
    after = events[events.index(release[0]) + 1 :]
    assert [(e["kind"], e["reason"]) for e in after][:1] == [("recovery", "ready")]


async def refused(call: object, request: object) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(request)  # type: ignore[operator]
    return err.value


async def test_releasing_what_is_not_quarantined_is_refused_and_changes_nothing(
    farm: Farm,
) -> None:
    """No serial: INVALID_ARGUMENT; an unknown device or host: NOT_FOUND; a ready phone, or
    a quarantined one whose host is not connected: FAILED_PRECONDITION saying why; no
    event is recorded and no condition changes."""
    op = await farm.operator()
    assert farm.db is not None
    await farm.db.execute(
        "INSERT INTO hosts (host_id, last_seen_at) VALUES ('gone-host', now() - interval '1 day');"
        "INSERT INTO devices (host_id, serial, state, condition, condition_reason)"
        " VALUES ('gone-host', 'old-1', 'device', 'quarantined', 'recovery failed')"
    )
    release = op.admin.ReleaseDevice
    source = SimulatedSource(1, delay=0.02)
    async with running_agent(farm, source, **QUARANTINE):
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first probe")
        before = await farm.db.fetchval("SELECT count(*) FROM host_events")
        conditions = await farm.db.fetch("SELECT serial, condition FROM devices ORDER BY serial")
        err = await refused(release, admin_pb2.ReleaseDeviceRequest(host_id="host-1"))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "serial" in (err.details() or "")
        err = await refused(release, admin_pb2.ReleaseDeviceRequest(serial="nope"))
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert err.details() == "no device 'nope'"
        err = await refused(
            release, admin_pb2.ReleaseDeviceRequest(host_id="other", serial="sim-0")
        )
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert err.details() == "no device 'sim-0' on host 'other'"
        err = await refused(release, admin_pb2.ReleaseDeviceRequest(serial="sim-0"))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert err.details() == "device 'sim-0' on host 'host-1' is not quarantined (ready)"
        err = await refused(release, admin_pb2.ReleaseDeviceRequest(serial="old-1"))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert (err.details() or "").startswith("host 'gone-host' is not connected")
        assert await farm.db.fetchval("SELECT count(*) FROM host_events") == before
        assert (
            await farm.db.fetch("SELECT serial, condition FROM devices ORDER BY serial")
            == conditions
        )
    client = await farm.client()
    err = await refused(client.admin.ReleaseDevice, admin_pb2.ReleaseDeviceRequest(serial="x"))
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_amc_devices_release_takes_a_phone_out_of_quarantine(farm: Farm) -> None:
    """`amc devices release SERIAL --reason`: one line saying what happens; the phone is
    ready again; a phone that is not quarantined is refused in one line, exit 4."""
    assert farm.plane is not None
    _, token = await create_token(farm.plane.store, Role.OPERATOR, None, "dave")
    amc = Cli(farm.address, token)
    source = SimulatedSource(2, delay=0.02)
    async with quarantined_phone(farm, source):
        run = await amc("devices", "release", "sim-0", "--reason", "cable swapped")
        assert run.code == 0, run.err
        assert run.out.strip() == (
            "device sim-0 on host host-1 released from quarantine: its host probes it and "
            "reports its condition"
        )
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="ready again")
        again = await amc("devices", "release", "sim-0", "--host", "host-1")
        assert again.code == 4, again.out
        assert again.out == ""
        assert again.err == (
            "amc: error: release device: device 'sim-0' on host 'host-1' is not quarantined"
            " (ready) (FAILED_PRECONDITION)\n"
        )
        shown = await amc("hosts", "show", "host-1")
        assert shown.code == 0, shown.err
        line = next(x for x in shown.out.splitlines() if "release" in x)
        assert "sim-0" in line and "dave" in line and "cable swapped" in line, shown.out
