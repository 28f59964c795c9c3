"""`amc hosts cordon|uncordon|drain|remove` and `amc devices cordon|uncordon` as real
subprocesses against a live control plane, and the pending reason in `amc get` and
`amc submit --wait`. Hosts are played with `farm.host`, or are a real host agent with
simulated devices; outcomes checked in PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

from amc.v1 import lease_pb2
from control_plane.admin_service import create_token
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, tap, wait_action
from tests.support.agent import running_agent, status_is, submit
from tests.test_cli import TAP, Cli
from tests.test_host_operations import (
    disconnect,
    host_events,
    host_flags,
    named_operator,
    stay_connected,
)


async def operator_cli(farm: Farm) -> tuple[Cli, str]:
    """An `amc` with an operator token named alice; and the token's id."""
    assert farm.plane is not None
    info, token = await create_token(farm.plane.store, Role.OPERATOR, None, "alice")
    return Cli(farm.address, token), str(info.token_id)


async def test_hosts_cordon_and_uncordon(farm: Farm) -> None:
    """cordon: one line, the host cordoned, the event with who and why; `amc hosts` shows
    it; uncordon puts it back."""
    amc, token_id = await operator_cli(farm)
    await farm.host("h1", "s1")
    run = await amc("hosts", "cordon", "h1", "--reason", "flaky hub")
    assert run.code == 0, run.err
    assert run.out == "host h1: cordoned, 0 task(s) running\n"
    assert await host_flags(farm, "h1") == (True, False)
    [event] = await host_events(farm, "h1")
    assert (event["kind"], event["actor"], event["actor_name"], event["reason"]) == (
        "cordon",
        token_id,
        "alice",
        "flaky hub",
    )
    table = await amc("hosts")
    assert "cordoned" in table.out and "1 cordoned" in table.out
    doc = (await amc("hosts", "-o", "json")).json()
    assert doc["hosts"][0]["cordoned"] is True

    run = await amc("hosts", "uncordon", "h1")
    assert run.code == 0, run.err
    assert run.out == "host h1: takes work, 0 task(s) running\n"
    assert await host_flags(farm, "h1") == (False, False)

    shown = await amc("hosts", "show", "h1")
    assert shown.code == 0, shown.err
    assert "flaky hub" in shown.out and f"alice ({token_id})" in shown.out
    doc = (await amc("hosts", "show", "h1", "-o", "json")).json()
    assert [e["kind"] for e in doc["events"]] == ["uncordon", "cordon"]
    assert (await amc("hosts", "show", "nope")).code == 3


async def test_devices_cordon_by_serial_and_by_host(farm: Farm) -> None:
    """A unique serial is enough; a serial on two hosts needs --host (exit 2 naming both);
    an unknown one is exit 3 naming it; errors are one line and change nothing."""
    amc, _ = await operator_cli(farm)
    await farm.host("h1", "s1", "s2")
    await farm.host("h2", "s2")
    run = await amc("devices", "cordon", "s1", "--reason", "battery swollen")
    assert (run.code, run.out) == (0, "device s1 on host h1 cordoned\n"), run.err
    ambiguous = await amc("devices", "cordon", "s2")
    assert ambiguous.code == 2
    assert "h1, h2" in ambiguous.assert_one_error_line()
    missing = await amc("devices", "cordon", "s9")
    assert missing.code == 3
    assert "no device 's9'" in missing.assert_one_error_line()
    run = await amc("devices", "cordon", "s2", "--host", "h2")
    assert run.code == 0, run.err
    assert farm.db is not None
    rows = await farm.db.fetch("SELECT host_id, serial FROM devices WHERE cordoned ORDER BY 1")
    assert [tuple(r) for r in rows] == [("h1", "s1"), ("h2", "s2")]
    run = await amc("devices", "uncordon", "s1")
    assert (run.code, run.out) == (0, "device s1 on host h1 uncordoned\n"), run.err
    events = await host_events(farm, "h1")
    assert [(e["serial"], e["kind"], e["reason"]) for e in events] == [
        ("s1", "cordon", "battery swollen"),
        ("s1", "uncordon", ""),
    ]


async def test_host_commands_need_the_operator_role(farm: Farm) -> None:
    """A client token: exit 6, one line, nothing changes."""
    await farm.host("h1", "s1")
    amc = Cli(farm.address, await farm.token(Role.CLIENT))
    for args in (
        ["hosts", "cordon", "h1"],
        ["hosts", "drain", "h1"],
        ["hosts", "remove", "h1"],
        ["devices", "cordon", "s1"],
    ):
        run = await amc(*args)
        assert run.code == 6, args
        assert "PERMISSION_DENIED" in run.assert_one_error_line()
    assert await host_flags(farm, "h1") == (False, False)
    assert await host_events(farm, "h1") == []


async def test_hosts_remove_refused_then_done(farm: Farm) -> None:
    """Connected: exit 4 saying so; unknown: exit 3; disconnected with no lease: removed."""
    amc, _ = await operator_cli(farm)
    await farm.host("h1", "s1")
    run = await amc("hosts", "remove", "h1")
    assert run.code == 4
    assert "is connected" in run.assert_one_error_line()
    assert (await amc("hosts", "remove", "nope")).code == 3
    await disconnect(farm, "h1")
    run = await amc("hosts", "remove", "h1", "--reason", "gone for good")
    assert (run.code, run.out) == (0, "host h1 removed\n"), run.err
    assert await host_flags(farm, "h1") is None
    assert [e["kind"] for e in await host_events(farm, "h1")] == ["remove"]


async def test_hosts_drain_wait_returns_once_the_agent_finished_its_task(farm: Farm) -> None:
    """`amc hosts drain --wait` against a real agent running a task: it returns after the
    task is done, the queued task stays queued, the agent stays connected and drained."""
    amc, _ = await operator_cli(farm)
    op, _ = await named_operator(farm, "ops")
    async with running_agent(farm, SimulatedSource(1), host_id="lab1") as agent:
        long_task = await submit(op, actions_spec(wait_action(1.5), tap()))
        await status_is(farm, long_task, "dispatched")
        run = await amc("hosts", "drain", "lab1", "--wait", "--reason", "patching")
        assert run.code == 0, run.err
        assert run.out.startswith("host lab1: draining, 1 task(s) running\n")
        assert run.out.endswith("host lab1 drained: no task running\n")
        assert await farm.status(long_task) == "done"
        assert agent.drained_by_centre
        queued = await submit(op, actions_spec(tap()))
        await asyncio.sleep(0)
        assert await farm.status(queued) == "queued"
        assert farm.db is not None
        assert await farm.db.fetchval("SELECT count(*) FROM devices WHERE task_id IS NOT NULL") == 0
        assert await host_flags(farm, "lab1") == (True, True)
        run = await amc("hosts", "uncordon", "lab1")
        assert run.code == 0, run.err
        await status_is(farm, queued, "done")


async def test_get_and_submit_wait_show_why_a_task_waits(farm: Farm, tmp_path: Path) -> None:
    """`amc get` shows the reason; `amc submit --wait` prints it, and again when it
    changes (here: the host is uncordoned, then takes the task)."""
    amc, _ = await operator_cli(farm)
    nothing = await amc.submit("-", "-l", "model=Pixel9", stdin=TAP)
    got = await amc("get", nothing["task_id"])
    assert "no registered device matches model=Pixel9" in got.out, got.out
    doc = (await amc("get", nothing["task_id"], "-o", "json")).json()
    assert doc["pending_reason"] == "no registered device matches model=Pixel9"

    host = await farm.host("h1", "s1", rack="r9")
    stream = await stay_connected(farm, host)
    assert (await amc("hosts", "cordon", "h1")).code == 0
    spec = tmp_path / "tap.yaml"
    spec.write_text(TAP)
    follow = await amc.running("submit", str(spec), "-l", "rack=r9", "--wait")
    await follow.line_with("waiting: every matching host is cordoned")
    assert (await amc("hosts", "uncordon", "h1")).code == 0
    await follow.line_with("waiting: 1 matching device is idle")
    a = await host.acquire_one("s1")
    await follow.line_with("assigned")
    await host.renew(a.lease_id)
    await host.report(a, lease_pb2.OUTCOME_DONE)
    run = await follow.finish()
    await stream.close()
    assert run.code == 0, run.err
    assert sum("every matching host is cordoned" in line for line in follow.lines) == 1
