"""Phones cleaned between leases (issue 38, part 2): after every lease, whatever its outcome,
the host agent brings the phone back to its baseline — packages a task installed
uninstalled, files it left removed, the profile's settings restored — before it is offered
again; meanwhile the device's condition is `cleaning` (GetHost, ListHosts, a queued task's
pending reason), each step is a `cleaning` host event, and a clean that fails or hangs
quarantines the phone, which then takes no lease. Through the real agent on simulated
phones and the real control plane."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import asyncpg

from amc.v1 import admin_pb2, scheduler_pb2, task_pb2
from control_plane.domain import Role
from host_agent.adb import AdbSource
from host_agent.agent import Agent
from host_agent.clean_profile import parse
from host_agent.device_life import Stage
from host_agent.recovery import RecoverySettings
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, eventually, seconds, tap, wait_action
from tests.support.agent import running_agent, status_is, submit
from tests.support.apks import ApkFile, apk_cache, old_apk
from tests.support.fakes.adb_server import FakeAdbServer
from tests.support.fakes.phone import DEFAULT_PROPS, FakePhone
from tests.support.library import library, upload_app, upload_file
from tests.test_device_health import SlowProbes, condition_of, is_in, on
from tests.test_host_operations import host_events

DISPATCHED = task_pb2.TASK_STATUS_DISPATCHED
__all__ = ["apk_cache", "old_apk"]  # fixtures

# The profile of these tests: the defaults (uninstall, files) and two settings.
PROFILE = parse({"defaults": {"settings": {"font_scale": 1.0, "airplane_mode": False}}})
LEFTOVERS = [
    "touch /data/local/tmp/com.example.leftover.apk",
    "pm install -r /data/local/tmp/com.example.leftover.apk",
    "touch /sdcard/Download/left.txt",
    "mkdir -p /storage/emulated/0/Pictures/trip",
    "touch /storage/emulated/0/Pictures/trip/one.jpg",
    "settings put system font_scale 1.5",
    "cmd connectivity airplane-mode enable",
]
LOOKS = [
    "pm list packages -3",
    "ls /sdcard/Download",
    "find /sdcard/ /data/local/tmp/ -mindepth 1",
    "settings get system font_scale",
    "cmd connectivity airplane-mode",
]


def shell(command: str) -> task_pb2.Action:
    return task_pb2.Action(shell=task_pb2.Shell(command=command))


async def outputs(farm: Farm, task_id: str) -> list[str]:
    client = await farm.client()
    task = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))
    return [step.output for step in task.result.steps]


def cleaning_settings(**more: Any) -> dict[str, Any]:
    return {"clean_profile": PROFILE, "probe_interval": 0.5, **more}


async def test_the_next_task_sees_the_phone_as_it_was_before_the_last_lease(farm: Farm) -> None:
    """A task installs a package, leaves files and changes settings: the next task on the
    same phone sees none of it (the baseline's packages, files and the profile's settings),
    and the clean's steps are `cleaning` events of the phone with their durations."""
    source = SimulatedSource(1, delay=0.01)
    source.states["sim-0"].preinstall("com.example.kept")  # there before: the baseline
    client = await farm.client()
    async with running_agent(farm, source, **cleaning_settings()):
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first clean")
        before = await submit(client, actions_spec(*map(shell, LOOKS)))
        await status_is(farm, before, "done")
        messy = await submit(client, actions_spec(*map(shell, [*LEFTOVERS, *LOOKS])))
        await status_is(farm, messy, "done")
        after = await submit(client, actions_spec(*map(shell, LOOKS)))
        await status_is(farm, after, "done")
    seen_messy = (await outputs(farm, messy))[len(LEFTOVERS) :]
    assert "package:com.example.leftover" in seen_messy[0]
    assert "left.txt" in seen_messy[1]
    assert seen_messy[3:] == ["1.5\n", "enabled\n"]
    seen_after = await outputs(farm, after)
    assert seen_after[0] == "package:com.example.kept\n"
    assert seen_after[1] == ""
    assert seen_after[2] == (await outputs(farm, before))[2]
    assert seen_after[3:] == ["1\n", "disabled\n"]
    steps = [e["reason"] for e in await host_events(farm, "host-1") if e["kind"] == "cleaning"]
    assert any(s.startswith("uninstall (") and "com.example.leftover" in s for s in steps)
    assert any(s.startswith("files (") and "removed 3" in s for s in steps), steps


async def cleaned_once(farm: Farm, agent: Agent, serial: str = "sim-0", nth: int = 1) -> None:
    """Until `serial`'s first clean by this agent (its `nth` baseline step) passed and was
    told."""

    async def told() -> bool:
        events = await host_events(farm, "host-1")
        baselines = [e for e in events if e["reason"].startswith("baseline (")]
        return len(baselines) >= nth and await is_in(farm, serial, "ready")

    await eventually(lambda: agent.life.stage(serial) is Stage.READY, what="the first clean")
    await eventually(told, what="the first clean told")


async def device_of(farm: Farm, serial: str) -> scheduler_pb2.Device:
    op = await farm.operator()
    host = await op.admin.GetHost(admin_pb2.GetHostRequest(host_id="host-1"))
    listed = await op.scheduler.ListHosts(scheduler_pb2.ListHostsRequest())
    (device,) = [d for d in host.host.devices if d.serial == serial]
    (same,) = [d for h in listed.hosts for d in h.devices if d.serial == serial]
    assert (same.condition, same.condition_reason) == (device.condition, device.condition_reason)
    return device


async def test_a_phone_shows_cleaning_from_its_tasks_end_until_its_clean_passed(
    farm: Farm,
) -> None:
    """The moment its task is done the phone is `cleaning` (in the same transaction: never
    idle and ready in between), GetHost and ListHosts say so, a task waiting for it says
    it waits for a phone cleaning; once the clean passed it is ready and runs that task."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, **cleaning_settings()) as agent:
        await cleaned_once(farm, agent)
        source.clean_delay = 0.4  # each of the clean's commands: the clean takes seconds
        first = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        assert farm.db is not None

        async def done_and_then() -> tuple[str, str] | None:
            assert farm.db is not None
            row = await farm.db.fetchrow(
                "SELECT t.status, d.condition FROM tasks t, devices d"
                " WHERE t.task_id = $1 AND d.serial = 'sim-0'",
                uuid.UUID(first),
            )
            return (row["status"], row["condition"]) if row["status"] == "done" else None

        assert await eventually(done_and_then, what="the task done") == ("done", "cleaning")
        waiting = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        device = await device_of(farm, "sim-0")
        assert device.condition == scheduler_pb2.DEVICE_CONDITION_CLEANING
        assert device.condition_reason == f"after task {first}"
        got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=waiting))
        assert got.pending_reason == "1 matching phone held: 1 cleaning (between leases)"
        await status_is(farm, waiting, "done", within=15)
        assert await farm.attempts(waiting)
        (attempt,) = await farm.attempts(waiting)
        cleans = [r for r in source.cleans if r.serial == "sim-0"]
        # Its clean's last command ended before the next task's lease began.
        begun = attempt["created_at"].timestamp()
        assert max(r.ended_wall for r in cleans if r.started_wall < begun) <= begun
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="cleaned after it too")


async def test_a_phone_whose_clean_passed_is_ready_without_waiting_for_another_probe(
    farm: Farm,
) -> None:
    """The clean's steps had the phone answer, so its report (`ready`, with the steps) goes
    at once on its last probe's reading: though a probe of it now takes 3 s, the phone is
    ready well within that of its clean's last command."""
    source = SlowProbes(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, **cleaning_settings(probe_interval=5.0)) as agent:
        await cleaned_once(farm, agent)
        assert "sim-0" in agent.health.health  # the reading told with its first clean
        source.probe_delay = 3.0
        task = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        await status_is(farm, task, "done")
        assert farm.db is not None
        sql = (
            "SELECT extract(epoch FROM e.at) FROM host_events e, attempts a"
            " WHERE a.task_id = $1 AND e.serial = 'sim-0' AND e.kind = 'cleaning'"
            " AND e.at >= a.ended_at ORDER BY e.event_id DESC LIMIT 1"
        )
        told = await eventually(
            lambda: farm.db.fetchval(sql, uuid.UUID(task)), what="the clean after the task told"
        )
        assert await is_in(farm, "sim-0", "ready")
        last = max(r.ended_wall for r in source.cleans if r.serial == "sim-0")
    assert float(told) - last < 2.0, f"told {float(told) - last:.2f}s after the clean"


async def test_a_clean_that_fails_quarantines_the_phone_and_it_gets_no_lease(farm: Farm) -> None:
    """`pm uninstall` fails on the phone: its clean fails, the phone is quarantined (the
    ladder cleans again after each step, failing again) and a task for it never starts;
    the events say which step failed and why."""
    source = SimulatedSource(2, delay=0.01)
    source.boot_time = 0.1
    recovery = RecoverySettings(failures=3, backoff=0.05, boot_timeout=2.0)
    client = await farm.client()
    async with running_agent(farm, source, recovery=recovery, **cleaning_settings()) as agent:
        await cleaned_once(farm, agent)
        source.states["sim-0"].uninstall_fails = True
        messy = await submit(client, actions_spec(*map(shell, LEFTOVERS[:2])), selector=on("sim-0"))
        await status_is(farm, messy, "done")
        waiting = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        await eventually(lambda: agent.recovery.outcomes, timeout=20, what="the ladder's end")
        assert agent.recovery.outcomes == [("sim-0", False)]
        await eventually(lambda: is_in(farm, "sim-0", "quarantined"), what="quarantined")
        assert await farm.attempts(waiting) == []
        got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=waiting))
        assert got.pending_reason == "1 matching phone held: 1 quarantined"
    events = [e for e in await host_events(farm, "host-1") if e["serial"] == "sim-0"]
    failed = [e["reason"] for e in events if e["kind"] == "cleaning" and " failed (" in e["reason"]]
    # The clean after the task, then one after each of the ladder's three steps.
    assert len(failed) == 4, failed
    assert all(
        f.startswith("uninstall failed (")
        and f.endswith("pm uninstall com.example.leftover: Failure [DELETE_FAILED_INTERNAL_ERROR]")
        for f in failed
    )
    recovery = [e["reason"] for e in events if e["kind"] == "recovery"]
    assert recovery[0] == (
        "quarantined: clean failed: uninstall: "
        "pm uninstall com.example.leftover: Failure [DELETE_FAILED_INTERNAL_ERROR]"
    )
    assert recovery[-1] == "quarantined: recovery failed: waits for an operator"


async def test_a_clean_that_hangs_times_out_and_quarantines_the_phone(farm: Farm) -> None:
    """The phone stops answering the clean's commands: the clean fails at its timeout, the
    phone is quarantined and the task waiting for it never starts."""
    profile = parse({"defaults": {"timeout": "500ms"}})
    source = SimulatedSource(1, delay=0.01)
    source.boot_time = 0.1
    recovery = RecoverySettings(failures=3, backoff=0.05, boot_timeout=2.0)
    settings = cleaning_settings(clean_profile=profile, recovery=recovery)
    client = await farm.client()
    async with running_agent(farm, source, **settings) as agent:
        await cleaned_once(farm, agent)
        source.hang_cleans("sim-0")
        first = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        await status_is(farm, first, "done")
        waiting = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        await eventually(lambda: is_in(farm, "sim-0", "quarantined"), what="quarantined")
        await eventually(lambda: agent.recovery.outcomes, timeout=20, what="the ladder's end")
        assert await farm.attempts(waiting) == []
        assert await farm.status(waiting) == "queued"
    events = [e for e in await host_events(farm, "host-1") if e["serial"] == "sim-0"]
    timed_out = [e["reason"] for e in events if "timed out" in e["reason"]]
    assert timed_out[0].startswith("uninstall failed (5")  # ~500 ms, at its first command
    assert timed_out[0].endswith("timed out: the clean ran past its 0.5s")
    assert next(e["reason"] for e in events if e["kind"] == "recovery") == (
        "quarantined: clean failed: uninstall: timed out: the clean ran past its 0.5s"
    )


async def test_an_operator_releases_a_phone_whose_clean_failed_and_it_is_cleaned_first(
    farm: Farm,
) -> None:
    """A phone quarantined by its failed clean is released once the fault is gone: it is
    cleaned (its condition `cleaning` meanwhile) before the task waiting for it starts,
    and that task sees none of what the last one left."""
    source = SimulatedSource(1, delay=0.01)
    recovery = RecoverySettings(failures=3, backoff=0.05, boot_timeout=0.2)
    source.boot_time = 600.0  # the ladder's reboot never boots in time: it waits for us
    op = await farm.operator()
    client = await farm.client()
    async with running_agent(farm, source, recovery=recovery, **cleaning_settings()) as agent:
        await cleaned_once(farm, agent)
        source.states["sim-0"].uninstall_fails = True
        messy = await submit(client, actions_spec(*map(shell, LEFTOVERS)), selector=on("sim-0"))
        await status_is(farm, messy, "done")
        await eventually(lambda: agent.recovery.outcomes, timeout=20, what="the ladder's end")
        await eventually(lambda: is_in(farm, "sim-0", "quarantined"), what="quarantined")
        waiting = await submit(client, actions_spec(*map(shell, LOOKS)), selector=on("sim-0"))
        source.set_body("sim-0", booting_until=0.0)
        source.states["sim-0"].uninstall_fails = False
        source.clean_delay = 0.3
        await op.admin.ReleaseDevice(
            admin_pb2.ReleaseDeviceRequest(serial="sim-0", reason="fixed the package manager")
        )
        await eventually(lambda: is_in(farm, "sim-0", "cleaning"), what="cleaning first")
        assert await farm.attempts(waiting) == []
        await status_is(farm, waiting, "done", within=15)
    seen = await outputs(farm, waiting)
    assert seen[0] == "" and seen[1] == "" and seen[3:] == ["1\n", "disabled\n"]


async def test_a_phone_lost_mid_task_is_cleaned_once_it_answers_again(farm: Farm) -> None:
    """A phone unplugged mid-task: the task is given back (device_lost), the phone stays
    `cleaning` while it is away (its clean waits for it), and once it is plugged in again
    it is cleaned before it runs the task again."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, **cleaning_settings()) as agent:
        await cleaned_once(farm, agent)
        steps = [*map(shell, LEFTOVERS[:2]), wait_action(0.5), tap()]
        task_id = await submit(client, actions_spec(*steps), selector=on("sim-0"))
        await eventually(
            lambda: "com.example.leftover" in source.states["sim-0"].packages, what="installed"
        )
        source.unplug("sim-0")
        await eventually(lambda: len(agent.finished) == 1, what="the lease given back")
        assert agent.finished[0].result is not None and agent.finished[0].result.device_lost
        await asyncio.sleep(1.5)  # as long as it stays away, however long
        assert await condition_of(farm, "sim-0") == "cleaning"
        assert await farm.status(task_id) == "queued"
        assert [e["kind"] for e in await farm.events(task_id)][-1] == "device_lost"
        source.plug("sim-0")
        await status_is(farm, task_id, "done", within=20)
    attempts = await farm.attempts(task_id)
    assert len(attempts) == 2
    begun = attempts[1]["created_at"].timestamp()
    removed = [r for r in source.cleans if r.args["command"] == "pm uninstall com.example.leftover"]
    assert removed and removed[0].ended_wall <= begun


async def test_a_phone_is_rebooted_after_every_nth_lease(farm: Farm) -> None:
    """reboot_every 2: after the 2nd and the 4th task the clean reboots the phone (and
    waits for it to boot), not after the others."""
    profile = parse({"defaults": {"reboot_every": 2}})
    source = SimulatedSource(1, delay=0.01)
    source.boot_time = 0.2
    client = await farm.client()
    async with running_agent(farm, source, **cleaning_settings(clean_profile=profile)) as agent:
        await cleaned_once(farm, agent)
        for n in range(1, 5):
            task_id = await submit(client, actions_spec(tap()))
            await status_is(farm, task_id, "done")
            reboots = [s for s in source.recovery_steps if s[1] == "reboot"]
            await eventually(lambda: agent.life.stage("sim-0") is Stage.READY, what="clean")
            assert len([s for s in source.recovery_steps if s[1] == "reboot"]) == n // 2
        assert reboots

        async def reboots_recorded() -> list[str]:
            """The clean's steps as the control plane recorded them (the agent's phone is
            ready before its report of them is written)."""
            events = await host_events(farm, "host-1")
            steps = [e["reason"] for e in events if e["kind"] == "cleaning"]
            found = [s for s in steps if s.startswith("reboot (")]
            return found if len(found) >= 2 else []

        found = await eventually(reboots_recorded, what="both reboots recorded")
    assert len(found) == 2 and all(s.endswith(": rebooted") for s in found)


async def test_a_restarted_agent_cleans_against_the_baseline_it_recorded_before(
    farm: Farm, tmp_path: Path
) -> None:
    """With --clean-baselines, the baseline recorded by one agent process is the next one's:
    what a lease left while no agent ran (the agent stopped mid-lease) is removed by the
    new agent's first clean, not taken into a new baseline."""
    baselines = tmp_path / "baselines.json"
    source = SimulatedSource(1, delay=0.01)
    settings = cleaning_settings(clean_baselines=baselines)
    client = await farm.client()
    async with running_agent(farm, source, **settings) as agent:
        await cleaned_once(farm, agent)
    assert "sim-0" in json.loads(baselines.read_text())
    for command in LEFTOVERS:  # what an interrupted lease left
        source.states["sim-0"].answer(command)
    async with running_agent(farm, source, **settings) as agent:
        await cleaned_once(farm, agent, nth=2)
        looks = await submit(client, actions_spec(*map(shell, LOOKS)))
        await status_is(farm, looks, "done")
    seen = await outputs(farm, looks)
    assert seen[:2] == ["", ""] and seen[3:] == ["1\n", "disabled\n"]
    steps = [e["reason"] for e in await host_events(farm, "host-1") if e["kind"] == "cleaning"]
    first, again = [s for s in steps if s.startswith("baseline (")]
    assert "recorded: packages 0, 4 files" in first
    assert again.endswith("kept the one recorded before")


async def test_a_sessions_phone_is_cleaned_when_the_session_ends(farm: Farm) -> None:
    """What an interactive session left (a package, a file, a setting) is gone for the next
    task on its phone."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, **cleaning_settings()) as agent:
        await cleaned_once(farm, agent)
        call = client.scheduler.OpenSession()
        await call.write(
            scheduler_pb2.OpenSessionRequest(
                open=scheduler_pb2.SessionOpen(idle_timeout=seconds(10))
            )
        )
        while (await asyncio.wait_for(call.read(), 20)).task.status != DISPATCHED:
            pass
        for command in LEFTOVERS:
            action = task_pb2.SessionAction(action=shell(command))
            await call.write(scheduler_pb2.OpenSessionRequest(action=action))
            await asyncio.wait_for(call.read(), 20)
        assert "com.example.leftover" in source.states["sim-0"].packages
        await call.done_writing()
        looks = await submit(client, actions_spec(*map(shell, LOOKS)))
        await status_is(farm, looks, "done")
    seen = await outputs(farm, looks)
    assert seen[:2] == ["", ""] and seen[3:] == ["1\n", "disabled\n"]


async def test_an_app_installed_and_a_file_pushed_from_the_library_are_gone_for_the_next_task(
    farm: Farm, old_apk: ApkFile
) -> None:
    """A task installs a real APK from the app library (install_app) and pushes a library
    file (push_file); the clean after it uninstalls the app (not in the baseline) and
    removes the file, so the next task on the phone finds neither."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    token = await farm.token(Role.CLIENT)
    app = await upload_app(library(farm, token), old_apk.data)
    pushed = await upload_file(library(farm, token), b"fixture", "fixture.bin")
    install = task_pb2.Action(install_app=task_pb2.InstallApp(app=app.app_id))
    push = task_pb2.Action(
        push_file=task_pb2.PushFile(file=pushed.file_id, path="/storage/emulated/0/fixture.bin")
    )
    async with running_agent(farm, source, **cleaning_settings()) as agent:
        await cleaned_once(farm, agent)
        leaves = await submit(client, actions_spec(install, push, *map(shell, LOOKS[:1])))
        await status_is(farm, leaves, "done")
        looks = await submit(client, actions_spec(*map(shell, LOOKS[:3])))
        await status_is(farm, looks, "done")
    assert (await outputs(farm, leaves))[2] == f"package:{app.package}\n"
    packages, _, files = await outputs(farm, looks)
    assert packages == ""
    assert "fixture.bin" not in files
    steps = [e["reason"] for e in await host_events(farm, "host-1") if e["kind"] == "cleaning"]
    assert any(f"removed 1: {app.package}" in s for s in steps), steps


async def test_a_phone_behind_the_adb_server_is_cleaned_through_the_adb_wire(
    farm: Farm, old_apk: ApkFile, tmp_path: Path
) -> None:
    """Over the adb host protocol (the fake adb server and its phone, the agent's own adb
    driver): the app a task installed is uninstalled by the clean after it (`pm uninstall`,
    its exit code read by the driver), and the next task lists no package."""
    profile = parse({"defaults": {"remove_files": False}})  # the fake phone has no `find`
    token = await farm.token(Role.CLIENT)
    app = await upload_app(library(farm, token), old_apk.data)
    client = await farm.client()
    install = task_pb2.Action(install_app=task_pb2.InstallApp(app=app.app_id))
    wire_phone = FakePhone("R58M", props={**DEFAULT_PROPS, "ro.build.version.sdk": "34"})
    async with FakeAdbServer([wire_phone]) as server:
        source = AdbSource(server.host, server.port, call_timeout=10.0)
        settings = cleaning_settings(clean_profile=profile, app_cache_dir=tmp_path)
        async with running_agent(farm, source, **settings) as agent:
            await cleaned_once(farm, agent, "R58M")
            leaves = await submit(client, actions_spec(install))
            await status_is(farm, leaves, "done", within=30)
            looks = await submit(client, actions_spec(shell("pm list packages -3")))
            await status_is(farm, looks, "done", within=30)
    assert await outputs(farm, looks) == [""]
    assert f"pm uninstall {app.package}" in " ".join(wire_phone.shell_commands())


async def test_a_phone_is_cleaned_once_its_result_is_recorded_not_while_it_is_reported(
    farm: Farm,
) -> None:
    """THEN a phone the host does not run itself (not an emulator of its pool) is cleaned
    after its result's report, not while the report goes (its few adb commands gain little
    from overlapping the report, and its `cleaning` told apart from the report cost 4-5
    commits a task): with the report held up (its task's row locked in PostgreSQL), the
    phone stays leased on the agent; once the report lands it is cleaned and ready."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    assert farm.db is not None
    async with running_agent(farm, source, **cleaning_settings()) as agent:
        await cleaned_once(farm, agent)
        task_id = await submit(client, actions_spec(wait_action(1.0)))
        await status_is(farm, task_id, "dispatched")
        held = await asyncpg.connect(farm.dsn)
        try:
            async with held.transaction():
                await held.execute(
                    "SELECT 1 FROM tasks WHERE task_id = $1::uuid FOR UPDATE", task_id
                )

                async def reporting() -> bool:
                    """The result's report waits for the row: the run is over."""
                    waiting = await held.fetchval(
                        "SELECT count(*) FROM pg_stat_activity"
                        " WHERE wait_event_type = 'Lock' AND datname = current_database()"
                    )
                    return bool(waiting)

                await eventually(reporting, what="the result's report waiting for the row")
                assert agent.life.stage("sim-0") is Stage.LEASED
        finally:
            await held.close()
        await status_is(farm, task_id, "done")
        await eventually(lambda: agent.life.stage("sim-0") is Stage.READY, what="cleaned")
