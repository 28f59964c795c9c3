"""Emulator pools end to end: the real host agent runs emulator doubles (the `emulator`
program's stand-in: tests/support/fakes/emulator.py) that register with the real adb
server, over the real control plane and gRPC. A pool keeps its minimum, labels its
instances, resets each between leases by loading its snapshot over the console, starts a
task from the snapshot it names, starts afresh an instance whose process dies (its task
given back as device_lost) or whose load fails, grows when tasks wait for it and shrinks
when idle; an unknown snapshot is refused at submit.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest

from amc.v1 import scheduler_pb2, task_pb2
from amc_client import Farm as Client
from amc_testing.emulators import install_double, make_avd
from control_plane.domain import Role
from host_agent.clean_profile import Profiles
from host_agent.devices import DeviceLost
from host_agent.flags import parse
from host_agent.recovery import FAILED, RecoverySettings
from tests.support import Farm, actions_spec, eventually, tap, wait_action
from tests.support.agent import cancel, get, running_agent, status_is, submit
from tests.support.emulators import AVD, EmulatorWorld
from tests.test_cli import Cli, amc

__all__ = ["amc"]

FIRST = "emulator-5600"
EMULATOR = {"kind": "emulator"}


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[EmulatorWorld]:
    made = await EmulatorWorld.make(tmp_path, monkeypatch)
    try:
        yield made
    finally:
        await made.close()


def running(farm: Farm, world: EmulatorWorld, **given: Any) -> Any:
    """The agent with the world's pool (one instance, and no more, by default: a task that
    waits while it restarts would grow a larger pool), cleaning on (an emulator's clean is
    its snapshot load)."""
    pool = given.pop("pool", world.pool(1, 1))
    source = world.source(world.settings(pool, **given.pop("emulators", {})))
    return running_agent(farm, source, clean_profile=Profiles(), probe_interval=0.5, **given)


async def device_row(farm: Farm, serial: str) -> Any:
    assert farm.db is not None
    return await farm.db.fetchrow("SELECT * FROM devices WHERE serial = $1", serial)


async def ready(farm: Farm, serial: str) -> bool:
    """Registered, and ready after a clean that passed (not only as first registered)."""
    row = await device_row(farm, serial)
    if row is None or row["state"] != "device" or row["condition"] != "ready":
        return False
    return any(not r.startswith("snapshot failed") for r in await cleaning_events(farm, serial))


async def cleaning_events(farm: Farm, serial: str) -> list[str]:
    assert farm.db is not None
    rows = await farm.db.fetch(
        "SELECT reason FROM host_events WHERE kind = 'cleaning' AND serial = $1 ORDER BY event_id",
        serial,
    )
    return [r["reason"] for r in rows]


async def test_a_pool_keeps_its_minimum_labelled_as_emulators_of_its_avd(
    farm: Farm, world: EmulatorWorld
) -> None:
    """THEN the agent starts the pool's minimum with the emulator's own flags, and the control
    plane records each instance with kind, avd, snapshot, api and a label per snapshot it
    can load, ready once its first clean (a load of its snapshot) passed."""
    async with running(farm, world):
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the first emulator")
        row = await device_row(farm, FIRST)
    labels = row["labels"]
    assert {k: labels[k] for k in ("kind", "avd", "snapshot", "api")} == {
        "kind": "emulator",
        "avd": AVD,
        "snapshot": "default_boot",
        "api": "34",
    }
    assert labels["snapshot/login_screen"] == labels["snapshot/default_boot"] == "yes"
    assert (await cleaning_events(farm, FIRST))[0].startswith("snapshot (")
    started = world.read_events("started")
    assert [e["serial"] for e in started] == [FIRST]


async def test_a_session_from_a_snapshot_starts_there_and_the_emulator_is_reset_after(
    farm: Farm, world: EmulatorWorld, tmp_path: Path
) -> None:
    """THEN a session that starts from the pool's snapshot runs on the instance fresh from
    its last reset (no load at its start), one that starts from another snapshot has it
    loaded before its first action, and after each lease the instance is reset by a load
    of its pool's snapshot (a `snapshot` cleaning event), not rebooted: a file pushed in
    the first session is gone in the second."""
    token = await farm.token(Role.CLIENT)
    note = tmp_path / "note.txt"
    note.write_text("left behind")
    async with running(farm, world), Client(farm.address, token=token) as client:
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the emulator")
        loads_before = len(world.read_events("loaded"))
        async with client.session(labels=EMULATOR, start_snapshot="default_boot") as phone:
            assert phone.serial == FIRST
            await phone.shell("echo hi")
            await world.adb.adb("-s", FIRST, "push", str(note), "/sdcard/note.txt")
        assert len(world.read_events("loaded")) == loads_before  # fresh: nothing loaded
        async with client.session(labels=EMULATOR, start_snapshot="login_screen") as phone:
            assert "No such file" in await phone.shell("cat /sdcard/note.txt; true")
        loaded = [e["snapshot"] for e in world.read_events("loaded")][loads_before:]
        assert loaded == ["default_boot", "login_screen"]
        await eventually(lambda: ready(farm, FIRST), timeout=20, what="the reset after")
        assert [e["snapshot"] for e in world.read_events("loaded")][-1] == "default_boot"
    reasons = await cleaning_events(farm, FIRST)
    assert all(r.startswith("snapshot (") for r in reasons), reasons
    assert not world.read_events("killed")  # reset, never restarted


def consoles_of(world: EmulatorWorld, pid: int) -> int:
    """The console connections the instance of process `pid` accepted."""
    return sum(1 for e in world.read_events("console") if e["pid"] == pid)


async def test_an_emulators_resets_share_one_console_connection_and_a_new_process_gets_its_own(
    farm: Farm, world: EmulatorWorld
) -> None:
    """THEN the console connection an instance's start opened (`avd snapshot list`) carries
    its resets' loads and a task's start-snapshot load, with no new connection, banner and
    `auth` for each; once its process dies, the instance started afresh is reached over a
    connection of its own (the old one is never used for it) and its clean passes."""
    token = await farm.token(Role.CLIENT)
    async with running(farm, world), Client(farm.address, token=token) as client:
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the emulator")
        (first,) = world.read_events("started")
        for snapshot in ("default_boot", "login_screen", "default_boot"):
            async with client.session(labels=EMULATOR, start_snapshot=snapshot) as phone:
                await phone.shell("echo hi")
            await eventually(lambda: ready(farm, FIRST), timeout=20, what="the reset")
        loads = [e for e in world.read_events("loaded") if e["pid"] == first["pid"]]
        assert len(loads) >= 4, loads  # its first clean, three resets and a task's load
        assert consoles_of(world, first["pid"]) == 1
        cleans = len(await cleaning_events(farm, FIRST))
        os.kill(first["pid"], signal.SIGKILL)
        await eventually(lambda: len(world.read_events("started")) == 2, timeout=30)
        second = world.read_events("started")[1]

        async def cleaned_again() -> bool:
            return await ready(farm, FIRST) and len(await cleaning_events(farm, FIRST)) > cleans

        await eventually(cleaned_again, timeout=30, what="the new instance's clean")
        assert [e["pid"] for e in world.read_events("loaded")][-1] == second["pid"]
        assert consoles_of(world, second["pid"]) == 1


async def test_a_snapshot_no_host_has_is_refused_at_submit_and_nothing_is_queued(
    farm: Farm, world: EmulatorWorld
) -> None:
    """THEN a task or a session starting from a snapshot no host's emulators have is
    refused NOT_FOUND with one line naming it, a malformed name INVALID_ARGUMENT, and no
    task is queued; a known one is queued asking for the phones that have it."""
    client = await farm.client()
    async with running(farm, world):
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the emulator")
        for name, code in (("nope", "NOT_FOUND"), ("two words", "INVALID_ARGUMENT")):
            spec = actions_spec(tap())
            spec.start_snapshot = name
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await submit(client, spec)
            assert refused.value.code().name == code
            assert "start_snapshot" in refused.value.details()
            assert "\n" not in refused.value.details()
        call: Any = client.scheduler.OpenSession()
        opening = scheduler_pb2.SessionOpen(start_snapshot="nope")
        opening.idle_timeout.FromSeconds(10)
        await call.write(scheduler_pb2.OpenSessionRequest(open=opening))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await call.read()
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
        assert farm.db is not None
        assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 0
        spec = actions_spec(tap())
        spec.start_snapshot = "login_screen"
        task_id = await submit(client, spec)
        await status_is(farm, task_id, "done", within=30)
    row = await farm.task_row(task_id)
    assert row["selector_labels"] == {"snapshot/login_screen": "yes"}


async def test_a_spec_files_start_snapshot_is_submitted_and_an_unknown_one_refused_in_one_line(
    amc: Cli, farm: Farm, world: EmulatorWorld, tmp_path: Path
) -> None:
    """THEN `amc submit` of a spec file whose `start_snapshot:` no host has is refused with
    one line naming the field (NOT_FOUND, exit 3), one that is no snapshot name by amc
    itself with its line (exit 2), nothing is queued, and a known one is submitted."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("start_snapshot: nope\nactions:\n  - tap: [1, 2]\n")
    missing = await amc("submit", str(spec))
    assert missing.code == 3
    line = missing.assert_one_error_line()
    assert "spec.start_snapshot: no emulator of the farm has a snapshot named nope" in line
    spec.write_text("start_snapshot: two words\nactions:\n  - tap: [1, 2]\n")
    bad = await amc("submit", str(spec))
    assert bad.code == 2 and "spec.yaml:1: start_snapshot: not a snapshot name" in bad.err
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 0
    async with running(farm, world):
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the emulator")
        spec.write_text("start_snapshot: login_screen\nactions:\n  - tap: [1, 2]\n")
        task = await amc.submit(str(spec))
        assert task["spec"]["start_snapshot"] == "login_screen"
        await status_is(farm, task["task_id"], "done", within=30)


async def test_an_emulator_whose_process_dies_gives_its_task_back_and_starts_afresh(
    farm: Farm, world: EmulatorWorld
) -> None:
    """THEN a task on an emulator whose process dies is given back as device_lost
    (requeued, not failed), the instance is started afresh on its port pair, cleaned, and
    the task runs to done on it."""
    client = await farm.client()
    async with running(farm, world):
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the emulator")
        task_id = await submit(client, actions_spec(wait_action(30)))
        await status_is(farm, task_id, "dispatched", within=20)
        (first,) = world.read_events("started")
        os.kill(first["pid"], signal.SIGKILL)
        await status_is(farm, task_id, "queued", "dispatched", within=20)
        await eventually(lambda: len(world.read_events("started")) == 2, timeout=30)
        await cancel_wait(client, task_id)
    events = [(e["kind"], e["detail"]) for e in await farm.events(task_id)]
    lost = [d for k, d in events if k == "device_lost"]
    assert lost and "device lost" in lost[0], events
    attempts = await farm.attempts(task_id)
    assert len(attempts) == 2 and attempts[1]["device_serial"] == FIRST
    assert (await get(client, task_id)).status == task_pb2.TASK_STATUS_CANCELLED


class LeaseOnIt:
    """The phones' life as the pool sees it (host_agent.devices.PoolHost), with one lease
    on the instance: as the agent's, `lost` returns only once that lease's task has ended."""

    def __init__(self) -> None:
        self.task: asyncio.Task[str] | None = None
        self.lost_told = asyncio.Event()

    def ready(self, serial: str) -> bool:
        return self.task is None

    def retire(self, serial: str) -> bool:
        return False

    async def lost(self, serial: str, why: str) -> None:
        self.lost_told.set()
        if self.task is not None:
            await asyncio.wait([self.task])

    def broken(self, serial: str, why: str) -> None:
        pass

    def fresh(self, serial: str) -> None:
        pass

    async def changed(self) -> None:
        pass


async def test_a_lease_whose_emulator_died_as_it_began_ends_device_lost_and_the_restart_goes_on(
    world: EmulatorWorld,
) -> None:
    """THEN a lease that begins as its instance's process dies (the restart already waits
    for that lease's task to end) does not wait for the restart to load its start snapshot:
    its load fails at once as device lost, so the task ends, and the instance is started
    afresh (no task and no restart left waiting on each other)."""
    source = world.source(world.settings(world.pool(1, 1)))
    pool = source.emulators
    host = LeaseOnIt()
    keeping = asyncio.create_task(pool.run(host))
    try:

        async def up() -> bool:
            found = pool.instance(FIRST)
            return found is not None and found.state == "up"

        await eventually(up, timeout=30, what="the emulator")

        async def lease_begins() -> str:
            await host.lost_told.wait()
            return await source.prepare(FIRST, "login_screen")

        host.task = asyncio.create_task(lease_begins())
        (first,) = world.read_events("started")
        os.kill(first["pid"], signal.SIGKILL)
        done, _ = await asyncio.wait([host.task], timeout=20)
        assert done, "the lease's load still waits for the restart that waits for it"
        with pytest.raises(DeviceLost):
            host.task.result()
        host.task = None
        await eventually(up, timeout=30, what="the emulator started afresh")
        assert len(world.read_events("started")) == 2
    finally:
        keeping.cancel()
        await asyncio.gather(keeping, return_exceptions=True)
        if host.task is not None:
            host.task.cancel()
            await asyncio.gather(host.task, return_exceptions=True)


async def test_an_emulator_a_killed_agent_left_running_is_stopped_when_the_agent_starts(
    farm: Farm, world: EmulatorWorld
) -> None:
    """THEN an instance of the pool's AVD on the pool's ports that an earlier agent process
    left running (killed hard, it could not stop its emulators: they run in sessions of
    their own) is stopped when the agent starts, so the host runs only its pool's own
    instances and never offers the leftover as a phone of its own."""
    leftover = "emulator-5602"
    argv = ["-avd", AVD, "-read-only", "-no-window", "-port", "5602", "-no-snapshot-save"]
    orphan = await asyncio.create_subprocess_exec(
        str(world.root / "bin" / "emulator"), *argv, start_new_session=True
    )
    try:
        await world.adb.wait_for_state(leftover, "device", within=30)
        async with running(farm, world):
            await eventually(lambda: ready(farm, FIRST), timeout=30, what="the pool's emulator")
            await asyncio.wait_for(orphan.wait(), 30)
            row = await device_row(farm, leftover)
    finally:
        if orphan.returncode is None:
            orphan.kill()
            await orphan.wait()
    assert [e["serial"] for e in world.read_events("killed")] == [leftover]
    assert row is None or row["state"] != "device" or row["condition"] != "ready"
    assert [e["serial"] for e in world.read_events("started")] == [leftover, FIRST]


async def cancel_wait(client: Any, task_id: str) -> None:
    """The second attempt (on the fresh instance) dispatched, then cancelled."""
    await eventually(
        lambda: _attempts_dispatched(client, task_id), timeout=30, what="a second attempt"
    )
    await client.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=task_id))
    await eventually(lambda: _cancelled(client, task_id), timeout=20, what="the cancel")


async def _attempts_dispatched(client: Any, task_id: str) -> bool:
    task = await get(client, task_id)
    return task.attempt == 2 and task.status == task_pb2.TASK_STATUS_DISPATCHED


async def _cancelled(client: Any, task_id: str) -> bool:
    return (await get(client, task_id)).status == task_pb2.TASK_STATUS_CANCELLED


async def test_an_emulator_that_dies_during_its_reset_load_is_started_afresh_before_any_lease(
    farm: Farm, world: EmulatorWorld
) -> None:
    """THEN an instance whose process dies during the snapshot load of its clean is started
    afresh within that clean (its step says so, and it passes), and the next task starts
    only after it: no lease between the death and the clean that passed."""
    client = await farm.client()
    async with running(farm, world):
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the emulator")
        world.set_fault(FIRST, {"die_in_load": True})
        first = await submit(client, actions_spec(tap()))
        await status_is(farm, first, "done", within=20)
        await eventually(lambda: world.read_events("died"), timeout=20, what="the death")
        world.set_fault(FIRST, None)
        second = await submit(client, actions_spec(tap()))
        await status_is(farm, second, "done", within=40)
    (died,) = world.read_events("died")
    reasons = await cleaning_events(farm, FIRST)
    assert any("started afresh" in r for r in reasons), reasons
    attempt = (await farm.attempts(second))[0]
    assert attempt["created_at"].timestamp() > died["at"]
    assert len(world.read_events("started")) == 2


async def test_an_emulator_whose_reset_load_fails_is_started_afresh_and_its_clean_passes(
    farm: Farm, world: EmulatorWorld
) -> None:
    """THEN an instance whose snapshot load fails (KO) between leases is killed and started
    afresh within its clean, which passes (its step says both), and the next task runs."""
    client = await farm.client()
    async with running(farm, world):
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the emulator")
        world.set_fault(FIRST, {"load_fails": "snapshot file is corrupt"})
        first = await submit(client, actions_spec(tap()))
        await status_is(farm, first, "done", within=20)
        await eventually(lambda: world.read_events("killed"), timeout=20, what="the kill")
        world.set_fault(FIRST, None)
        second = await submit(client, actions_spec(tap()))
        await status_is(farm, second, "done", within=40)
    reasons = await cleaning_events(farm, FIRST)
    failed_load = [r for r in reasons if "snapshot file is corrupt" in r]
    assert failed_load and "started afresh" in failed_load[0], reasons
    assert len(world.read_events("started")) == 2


async def test_an_emulator_that_will_not_start_again_after_a_failed_load_is_quarantined(
    farm: Farm, world: EmulatorWorld
) -> None:
    """THEN when the instance whose load failed will not start again either, its clean
    fails and the recovery ladder takes it (its reboot step one more start, which fails):
    the control plane records it quarantined for an operator, and a task that waits for
    an emulator gets no lease on it."""
    client = await farm.client()
    ladder = RecoverySettings(backoff=0.1, boot_timeout=10.0)
    async with running(farm, world, recovery=ladder):
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the emulator")
        broken = {"load_fails": "snapshot file is corrupt", "boot_fails": "cannot open disk"}
        world.set_fault(FIRST, broken)
        first = await submit(client, actions_spec(tap()))
        await status_is(farm, first, "done", within=20)
        await eventually(lambda: waits_for_operator(farm, FIRST), timeout=60, what="the ladder")
        second = await submit(client, actions_spec(tap()), selector=_selector())
        await eventually(lambda: _pending(client, second), timeout=20, what="its pending reason")
        assert not await farm.attempts(second)
    row = await device_row(farm, FIRST)
    assert row["condition"] == "quarantined" and row["condition_reason"] == FAILED
    reasons = await cleaning_events(farm, FIRST)
    assert any("did not start again" in r and "cannot open disk" in r for r in reasons), reasons
    assert len(world.read_events("started")) == 1


async def waits_for_operator(farm: Farm, serial: str) -> bool:
    row = await device_row(farm, serial)
    return row is not None and row["condition_reason"] == FAILED


async def _pending(client: Any, task_id: str) -> bool:
    task = await get(client, task_id)
    return task.status == task_pb2.TASK_STATUS_QUEUED and bool(task.pending_reason)


async def test_a_pool_grows_when_tasks_wait_for_it_and_shrinks_to_its_minimum_when_idle(
    farm: Farm, world: EmulatorWorld
) -> None:
    """THEN with its one instance busy and a second task waiting for its labels, the
    control plane's hint on the renewal stream grows the pool to its maximum (2) and both
    run at once; idle past --emulator-idle, it stops the extra instance (retired first)."""
    client = await farm.client()
    async with running(farm, world, pool=world.pool(1, 2), emulators={"idle": 1.0}):
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the emulator")
        tasks = [await submit(client, actions_spec(wait_action(60)), selector=_selector())]
        await status_is(farm, tasks[0], "dispatched", within=20)
        tasks.append(await submit(client, actions_spec(wait_action(60)), selector=_selector()))
        await status_is(farm, tasks[1], "dispatched", within=60)  # on the new instance
        holders = {(await farm.attempts(t))[0]["device_serial"] for t in tasks}
        assert len(holders) == 2
        for task_id in tasks:
            await cancel(client, task_id)
        await eventually(lambda: world.read_events("killed"), timeout=30, what="a shrink")
    assert len(world.read_events("started")) == 2


def _selector() -> task_pb2.DeviceSelector:
    return task_pb2.DeviceSelector(labels={"kind": "emulator", "avd": AVD})


def test_the_emulator_flag_reads_its_pool_against_the_avd_and_refuses_one_larger_than_the_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """THEN `host-agent --emulator AVD@SNAPSHOT:MIN:MAX` gives a pool read against the AVD
    on disk (its API level and snapshots), and pools that could outgrow the host at their
    maximum, or name a snapshot the AVD lacks, stop the agent with one line (exit 2)."""
    make_avd(tmp_path / "avd", AVD, snapshots=("default_boot", "login_screen"))
    install_double(tmp_path / "bin")
    env = {
        "AMC_TOKEN": "t",
        "ANDROID_AVD_HOME": str(tmp_path / "avd"),
        "PATH": str(tmp_path / "bin"),
    }
    flags = ["--emulator", f"{AVD}@login_screen:1:3", "--emulator-budget", "0.01,1MB"]
    config = parse(flags, env=env)
    assert config.emulators is not None
    (pool,) = config.emulators.pools
    assert (pool.name, pool.avd, pool.snapshot, pool.low, pool.high, pool.api) == (
        f"{AVD}@login_screen",
        AVD,
        "login_screen",
        1,
        3,
        34,
    )
    assert config.emulators.binary == tmp_path / "bin" / "emulator"
    for argv, says in (
        (["--emulator", f"{AVD}:1:100000"], "this host has"),
        (["--emulator", f"{AVD}@nope:1:2"], f"AVD {AVD} has no snapshot nope"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            parse(argv, env=env)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("host-agent: error: --emulator: "), err
        assert says in err


async def test_an_emulators_reset_load_runs_while_its_result_is_reported_and_it_is_ready_after(
    farm: Farm, world: EmulatorWorld
) -> None:
    """THEN the snapshot load after a task starts as its result's report goes, not after
    it: with the report held up (its task's row locked in PostgreSQL), the load happens
    while the task is still running at the control plane, and the phone is told neither
    clean nor ready until the report lands; then the task is done and the phone ready."""
    client = await farm.client()
    assert farm.db is not None
    async with running(farm, world):
        await eventually(lambda: ready(farm, FIRST), timeout=30, what="the emulator")
        loads, cleans = len(world.read_events("loaded")), len(await cleaning_events(farm, FIRST))
        task_id = await submit(client, actions_spec(wait_action(1.0)))
        await status_is(farm, task_id, "dispatched", within=20)
        held = await asyncpg.connect(farm.dsn)
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(held.close)
            await stack.enter_async_context(held.transaction())
            await held.execute("SELECT 1 FROM tasks WHERE task_id = $1::uuid FOR UPDATE", task_id)
            await eventually(
                lambda: len(world.read_events("loaded")) > loads,
                timeout=10,
                what="the reset's load while the result's report waits",
            )
            await asyncio.sleep(0.5)  # a window in which nothing may say the phone is clean
            assert await farm.status(task_id) == "dispatched"
            assert len(await cleaning_events(farm, FIRST)) == cleans
            assert (await device_row(farm, FIRST))["task_id"] is not None  # still leased
        await status_is(farm, task_id, "done", within=20)
        await eventually(
            lambda: _cleaned_since(farm, cleans), timeout=20, what="the clean told after"
        )
        await eventually(lambda: ready(farm, FIRST), timeout=20, what="ready after the report")


async def _cleaned_since(farm: Farm, before: int) -> bool:
    return len(await cleaning_events(farm, FIRST)) > before
