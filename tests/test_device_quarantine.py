"""A quarantined phone and its leases: nothing disturbs a leased phone (no `adb reconnect`,
no reboot) except through its lease; a phone its host quarantined is offered no work at
once, whatever the control plane has heard; a health report that failed is sent again
soon; a quarantine outlives a restart of the agent until an operator releases it. Through
the real agent (in-process and as a process) on simulated phones and the real control
plane."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

from amc.v1 import admin_pb2, task_pb2
from control_plane.domain import Role
from host_agent.recovery import RecoverySettings
from host_agent.simulated import SimulatedSource
from scripts.launch import HostAgentCommand
from tests.support import Farm, actions_spec, eventually, tap, wait_action
from tests.support.agent import get, running_agent, status_is, submit
from tests.test_device_health import condition_of, is_in, on
from tests.test_host_agent_process import agent_process
from tests.test_sessions import dispatched, last_task, opening

PROBES = {"probe_interval": 0.3, "probe_timeout": 0.3}


async def leases_live_at(farm: Farm, serial: str, at: float) -> int:
    """How many attempts on `serial` held a live lease at `at` (time.time())."""
    assert farm.db is not None
    moment = datetime.fromtimestamp(at, UTC)
    count: int = await farm.db.fetchval(
        "SELECT count(*) FROM attempts WHERE device_serial = $1 AND created_at <= $2"
        " AND (ended_at IS NULL OR ended_at >= $2)",
        serial,
        moment,
    )
    return count


@asynccontextmanager
async def health_reports_refused(farm: Farm) -> AsyncIterator[None]:
    """Every ReportDeviceHealth fails (UNAVAILABLE: the database refuses its write), while
    Acquire, renewals and reports go on."""
    assert farm.db is not None
    await farm.db.execute(
        """
        CREATE FUNCTION test_refuse_health() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.probed_at IS DISTINCT FROM OLD.probed_at THEN
                RAISE EXCEPTION 'health reports refused' USING ERRCODE = '57P03';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER test_refuse_health BEFORE UPDATE ON devices
            FOR EACH ROW EXECUTE FUNCTION test_refuse_health();
        """
    )
    try:
        yield
    finally:
        await farm.db.execute(
            "DROP TRIGGER test_refuse_health ON devices; DROP FUNCTION test_refuse_health()"
        )


# -- the ladder and a leased phone -----------------------------------------------------------


async def test_the_ladder_gives_a_leased_phones_task_back_before_it_reconnects_or_reboots_it(
    farm: Farm,
) -> None:
    """A phone hangs mid-task and is quarantined; it still does not answer at the ladder's
    first step, so its task is stopped and given back (device_lost) before `adb reconnect`
    and the reboot: no lease was live on it when either ran; the task runs again once the
    phone is back, and is done."""
    source = SimulatedSource(1, delay=0.02)
    source.boot_time = 0.3
    recovery = RecoverySettings(failures=1, backoff=0.2, boot_timeout=5.0)
    client = await farm.client()
    async with running_agent(farm, source, recovery=recovery, **PROBES) as agent:
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first probe")
        task_id = await submit(client, actions_spec(wait_action(5)), selector=on("sim-0"))
        await status_is(farm, task_id, "dispatched")
        source.hang("sim-0")
        await status_is(farm, task_id, "done", within=30)
        assert agent.recovery.outcomes == [("sim-0", True)]
    assert [(serial, step) for serial, step, _ in source.recovery_steps] == [
        ("sim-0", "reconnect"),
        ("sim-0", "reboot"),
    ]
    for _, step, at in source.recovery_steps:
        assert await leases_live_at(farm, "sim-0", at) == 0, f"{step} under a live lease"
    first, second = await farm.attempts(task_id)
    assert (first["state"], second["state"]) == ("released", "done")
    lost = [e for e in await farm.events(task_id) if e["kind"] == "device_lost"]
    assert len(lost) == 1 and "device quarantined" in lost[0]["detail"], lost


async def test_a_phone_that_answers_again_at_the_ladders_first_step_keeps_its_task(
    farm: Farm,
) -> None:
    """A probe times out mid-task and quarantines the phone, which answers again by the
    ladder's first step: back in service with nothing disturbed, its task done on its one
    attempt."""
    source = SimulatedSource(1, delay=0.02)
    recovery = RecoverySettings(failures=1, backoff=1.0, boot_timeout=5.0)
    client = await farm.client()
    async with running_agent(farm, source, recovery=recovery, **PROBES) as agent:
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first probe")
        task_id = await submit(client, actions_spec(wait_action(3)), selector=on("sim-0"))
        await status_is(farm, task_id, "dispatched")
        source.hang("sim-0")
        await eventually(lambda: "sim-0" in agent.recovery.held, what="the quarantine")
        source.hang("sim-0", False)
        await status_is(farm, task_id, "done", within=20)
        await eventually(lambda: agent.recovery.outcomes, what="the ladder's end")
        assert agent.recovery.outcomes == [("sim-0", True)]
    assert source.recovery_steps == []
    assert [a["state"] for a in await farm.attempts(task_id)] == ["done"]


async def test_a_session_on_a_phone_that_stops_answering_ends_failed_before_its_recovery(
    farm: Farm,
) -> None:
    """A session's phone hangs and is quarantined: the session is not given back (its
    client is attached to this phone) but ends failed, "device quarantined", before the
    ladder reconnects the phone; its task is not run again."""
    source = SimulatedSource(1, delay=0.02)
    source.boot_time = 0.3
    recovery = RecoverySettings(failures=1, backoff=0.2, boot_timeout=5.0)
    client = await farm.client()
    async with running_agent(farm, source, recovery=recovery, **PROBES) as agent:
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first probe")
        call = client.scheduler.OpenSession()
        await call.write(opening(idle=30.0))
        task = await dispatched(call)
        source.hang("sim-0")
        final = await last_task(call)
        await eventually(lambda: agent.recovery.outcomes, timeout=15, what="the ladder's end")
    assert final.status == task_pb2.TASK_STATUS_FAILED
    assert final.result.error == "device quarantined: waiting for the next action"
    assert [a["state"] for a in await farm.attempts(task.task_id)] == ["failed"]
    assert source.recovery_steps
    for _, step, at in source.recovery_steps:
        assert await leases_live_at(farm, "sim-0", at) == 0, f"{step} under a live lease"


# -- no work for a quarantined phone ------------------------------------------------------


async def test_a_quarantined_phone_is_never_given_a_task_while_its_health_report_fails(
    farm: Farm,
) -> None:
    """The agent's Acquire parked with the phone offered; the phone is quarantined while
    every health report fails (the control plane still has it ready): the agent stops
    offering it at once, so a task for it is never assigned, through the ladder and after;
    once reports go through the task says why it waits."""
    source = SimulatedSource(1, delay=0.02)
    source.boot_time = 600.0  # the ladder's reboot outlasts its boot timeout: it fails
    recovery = RecoverySettings(failures=1, backoff=0.1, boot_timeout=0.3)
    client = await farm.client()
    async with running_agent(farm, source, recovery=recovery, acquire_wait=30.0, **PROBES) as agent:
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first probe")
        assert farm.plane is not None
        dispatcher = farm.plane.hub.dispatcher
        await eventually(lambda: dispatcher.acquires_of("host-1") == 1, what="parked")
        async with health_reports_refused(farm):
            source.hang("sim-0")
            await eventually(lambda: "sim-0" in agent.recovery.held, what="the quarantine")
            # The parked Acquire that offered it is gone (nothing else is offered).
            await eventually(lambda: dispatcher.acquires_of("host-1") == 0, what="withdrawn")
            task_id = await submit(client, actions_spec(tap()), selector=on("sim-0"))
            await eventually(lambda: agent.recovery.outcomes, timeout=15, what="the ladder")
            assert agent.recovery.outcomes == [("sim-0", False)]
            assert await condition_of(farm, "sim-0") == "ready"  # not heard of
            assert await farm.attempts(task_id) == []
            assert await farm.status(task_id) == "queued"
        await eventually(lambda: is_in(farm, "sim-0", "quarantined"), what="the report")
        assert (await get(client, task_id)).pending_reason == "1 matching phone held: 1 quarantined"
        assert await farm.attempts(task_id) == []


async def test_a_failed_health_report_is_sent_again_before_the_next_probe_round(
    farm: Farm,
) -> None:
    """A run loses its hung phone, which is quarantined while health reports fail; once
    they go through, the quarantine reaches the control plane within seconds, not at the
    next probe round (10 minutes away)."""
    source = SimulatedSource(1, delay=0.02)
    source.boot_time = 600.0
    source.call_timeout = 0.3  # a tap on the hung phone times out: the phone is lost
    recovery = RecoverySettings(failures=1, backoff=0.05, boot_timeout=0.2)
    client = await farm.client()
    async with running_agent(
        farm, source, recovery=recovery, probe_interval=600.0, probe_timeout=0.3
    ) as agent:
        async with health_reports_refused(farm):
            source.hang("sim-0")
            task_id = await submit(client, actions_spec(tap()), selector=on("sim-0"))
            await eventually(lambda: agent.recovery.outcomes, timeout=15, what="the ladder")
            assert agent.recovery.outcomes == [("sim-0", False)]
            assert await condition_of(farm, "sim-0") == "ready"
        await eventually(lambda: is_in(farm, "sim-0", "quarantined"), timeout=5, what="report")
        (attempt,) = await farm.attempts(task_id)  # given back once, never offered again
        assert attempt["state"] == "released"
        assert await farm.status(task_id) == "queued"


# -- across a restart ---------------------------------------------------------------------


async def test_a_quarantine_outlives_a_restart_of_the_agent_process_until_released(
    farm: Farm, tmp_path: Path
) -> None:
    """A phone whose ladder failed waits for an operator; the agent process restarts (as
    systemd's Restart= would) with the phone well again: it stays quarantined and takes no
    work, while its neighbour does; an operator's release puts it back to work."""
    token = tmp_path / "host.token"
    token.write_text(await farm.token(Role.HOST, "host-q") + "\n")
    faults = tmp_path / "faults.json"
    faults.write_text("{}")
    command = HostAgentCommand(
        farm.address,
        "host-q",
        token_file=token,
        simulated_devices=2,
        sim_delay=0.01,
        sim_faults=faults,
        drain_timeout=0.5,
        acquire_wait=2.0,
        probe_interval=0.3,
        probe_timeout=0.3,
        quarantine_failures=1,
        recovery_backoff=0.1,
        boot_timeout=0.3,  # a simulated phone boots in 1 s: the ladder fails
        log_format="json",
    )
    client = await farm.client()
    op = await farm.operator()
    assert farm.db is not None
    async with agent_process(command, tmp_path / "first.log") as first:
        await eventually(lambda: is_in(farm, "sim-0", "ready"), timeout=30, what="probed")
        faults.write_text(json.dumps({"sim-0": {"hung": "reboot"}}))

        async def waits_for_an_operator() -> bool:
            assert farm.db is not None
            row = await farm.db.fetchrow(
                "SELECT condition, condition_reason FROM devices WHERE serial = 'sim-0'"
            )
            assert row is not None
            return tuple(row) == ("quarantined", "recovery failed: waits for an operator")

        await eventually(waits_for_an_operator, timeout=30, what="the ladder to give up")
        faults.write_text("{}")  # the phone is well again; nobody released it
        first.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(first.wait(), 30) == 0
    restarted = await farm.db.fetchval("SELECT clock_timestamp()")
    async with agent_process(command, tmp_path / "second.log"):

        async def probed_again() -> bool:
            assert farm.db is not None
            at = await farm.db.fetchval("SELECT probed_at FROM devices WHERE serial = 'sim-1'")
            return at is not None and at > restarted

        # Both phones' conditions go in the new process's first report.
        await eventually(probed_again, timeout=30, what="the restarted agent's first report")
        assert await condition_of(farm, "sim-0") == "quarantined"
        held = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        other = await submit(client, actions_spec(tap()), selector=on("sim-1"))
        await status_is(farm, other, "done", within=30)
        assert await farm.status(held) == "queued" and await farm.attempts(held) == []
        await op.admin.ReleaseDevice(
            admin_pb2.ReleaseDeviceRequest(host_id="host-q", serial="sim-0", reason="checked")
        )
        await status_is(farm, held, "done", within=30)

        async def ready() -> bool:
            # A finished lease is cleaned before its phone is ready again (the process's
            # phones clean between leases).
            return await condition_of(farm, "sim-0") == "ready"

        await eventually(ready, timeout=30, what="sim-0 ready after its task")


async def test_a_phone_stopped_mid_ladder_by_a_restart_waits_for_an_operator(
    farm: Farm,
) -> None:
    """The agent stops while its phone's ladder runs (recovering); the next agent holds the
    phone quarantined, "quarantined before the host agent restarted: waits for an
    operator", runs no ladder of its own, and gives it no work."""
    recovery = RecoverySettings(failures=1, backoff=30.0, boot_timeout=1.0)
    source = SimulatedSource(1, delay=0.02)
    async with running_agent(farm, source, recovery=recovery, **PROBES) as agent:
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first probe")
        source.hang("sim-0")
        await eventually(lambda: is_in(farm, "sim-0", "quarantined"), what="quarantined")
        assert not agent.recovery.outcomes  # its ladder waits 30 s before the first step
    well = SimulatedSource(1, delay=0.02)
    client = await farm.client()
    async with running_agent(farm, well, recovery=recovery, **PROBES) as again:
        await eventually(lambda: "sim-0" in again.recovery.held, what="held again")
        reason = "quarantined before the host agent restarted: waits for an operator"
        assert again.recovery.held["sim-0"].reason == reason

        async def told() -> bool:
            assert farm.db is not None
            return await farm.db.fetchval(
                "SELECT condition_reason = $1 FROM devices WHERE serial = 'sim-0'", reason
            )

        await eventually(told, what="the reason reported")
        task_id = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        got = await get(client, task_id)
        assert got.pending_reason == "1 matching phone held: 1 quarantined"
        assert await farm.attempts(task_id) == []
    assert well.recovery_steps == [] and not again.recovery.outcomes
