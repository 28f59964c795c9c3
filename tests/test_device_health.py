"""Phones that heal themselves (issue 22): the host agent probes every phone on a schedule,
judges its condition (ready, charging hold, too hot, unresponsive, booting, offline) and tells
the control plane when it changes; only ready phones take work, and a queued task says
which phones are held and why. Through the real agent with simulated phones and the real
control plane; the parsing and the hysteresis as plain functions."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from prometheus_client import REGISTRY

from amc.v1 import admin_pb2, lease_pb2, scheduler_pb2, task_pb2
from control_plane.admin_service import create_token
from control_plane.domain import Role
from host_agent.adb import AdbSource
from host_agent.devices import DeviceLost, DeviceTimeout, ShellResult
from host_agent.health import Condition, Health, Thresholds, judge
from host_agent.probe import Reading, parse_battery, parse_df, probe
from host_agent.recovery import Recovery, RecoverySettings
from host_agent.simulated import SimulatedSource
from host_agent.simulated_body import Physics, battery_text
from tests.support import Farm, actions_spec, eventually, tap
from tests.support.agent import running_agent, status_is, submit
from tests.support.fakes.adb_server import FakeAdbServer
from tests.support.fakes.phone import FakePhone
from tests.test_cli import Cli

PROBE = 0.3  # the agent's probe interval in these tests


def reading(level: int = 80, temperature: float = 30.0) -> Reading:
    return Reading(True, level, temperature, True, 10**10, 0.01)


def test_dumpsys_battery_and_df_are_read_as_android_prints_them() -> None:
    """The level, temperature (tenths of a degree), charging and free bytes are read."""
    text = (
        "Current Battery Service state:\n  AC powered: false\n  USB powered: true\n"
        "  status: 2\n  level: 87\n  scale: 100\n  temperature: 412\n"
    )
    assert parse_battery(text) == (87, 41.2, True)
    assert parse_battery("  AC powered: false\n  status: 3\n  level: 5\n") == (5, None, False)
    assert parse_battery("") == (None, None, None)
    df = (
        "Filesystem 1K-blocks Used Available Use% Mounted on\n/dev/block/dm-5 100 40 60 40% /data\n"
    )
    assert parse_df(df) == 60 * 1024


def test_a_low_battery_is_held_until_it_charged_to_the_resume_mark() -> None:
    """Held below 20 %, and still held at 30 %: let go only at 40 %."""
    t = Thresholds(battery_low=20, battery_resume=40)
    low = judge(None, reading(level=15), t)
    assert low.condition is Condition.CHARGING_HOLD
    assert low.reason == "battery below 20 %; held until 40 %"
    assert judge(low, reading(level=30), t).condition is Condition.CHARGING_HOLD
    assert judge(low, reading(level=40), t).condition is Condition.READY
    assert judge(None, reading(level=30), t).condition is Condition.READY


def test_a_hot_phone_is_held_until_it_cooled_below_the_resume_mark() -> None:
    """Held above 45 °C, still at 42 °C, let go below 40 °C; heat wins over a low battery."""
    t = Thresholds(too_hot=45, cool_again=40)
    hot = judge(None, reading(temperature=46), t)
    assert hot.condition is Condition.TOO_HOT
    assert (hot.battery_percent, hot.temperature_celsius) == (80, 46)
    assert judge(hot, reading(temperature=42), t).condition is Condition.TOO_HOT
    assert judge(hot, reading(temperature=39.5), t).condition is Condition.READY
    assert judge(None, reading(level=5, temperature=50), t).condition is Condition.TOO_HOT
    assert judge(hot, reading(level=5, temperature=30), t).condition is Condition.CHARGING_HOLD


def test_a_probe_that_fails_says_how() -> None:
    """No answer in time: unresponsive; not attached: offline; not booted: booting."""
    t = Thresholds()
    assert judge(None, DeviceTimeout("x"), t).condition is Condition.UNRESPONSIVE
    assert judge(None, DeviceLost("gone"), t).condition is Condition.OFFLINE
    assert judge(None, Reading(False), t).condition is Condition.BOOTING


def test_facts_that_moved_enough_are_worth_sending_again() -> None:
    """Same condition: sent again only when the battery moved 5 points or the heat 2 °C."""
    told = Health(Condition.READY, "", 80, 30.0, True)
    assert not Health(Condition.READY, "", 77, 31.0, True).worth_sending(told)
    assert Health(Condition.READY, "", 75, 31.0, True).worth_sending(told)
    assert Health(Condition.READY, "", 80, 32.0, True).worth_sending(told)
    assert Health(Condition.TOO_HOT, "x", 80, 30.0, True).worth_sending(told)


class SlowProbes(SimulatedSource):
    """Simulated phones whose every probe read takes `probe_delay` seconds (the reads are
    recorded, with when they began: time.monotonic())."""

    probe_delay = 0.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.probe_reads: list[tuple[str, str, float]] = []

    async def probe_read(self, serial: str, command: str) -> ShellResult:
        self.probe_reads.append((serial, command, time.monotonic()))
        await asyncio.sleep(self.probe_delay)
        return await super().probe_read(serial, command)


async def test_a_probes_three_reads_are_sent_at_once() -> None:
    """`getprop`, `dumpsys battery` and `df` go together: a probe of a phone whose every
    read takes 1 s takes about 1 s, not 3; a phone not booted is still `booting` (not
    failed by the other reads)."""
    source = SlowProbes(1, delay=0.01)
    source.probe_delay = 1.0
    began = time.monotonic()
    seen = await probe(source.device("sim-0"), 5.0)
    took = time.monotonic() - began
    assert seen.boot_completed and seen.battery_percent == 100 and seen.free_bytes
    assert sorted(c for _, c, _ in source.probe_reads) == [
        "df /data",
        "dumpsys battery",
        "getprop sys.boot_completed",
    ]
    assert took < 1.8, f"the reads went one after another: {took:.2f}s"
    source.probe_delay = 0.0
    source.reboot("sim-0", boot_time=0.5)
    assert not (await probe(source.device("sim-0"), 1.0)).boot_completed


async def test_simulated_phones_answer_probes_drain_heat_hang_and_boot() -> None:
    """A simulated phone's body changes under load; it can hang and reboot."""
    source = SimulatedSource(1, delay=0.2, physics=Physics(drain_under_load=50, heat_under_load=50))
    phone = source.device("sim-0")
    seen = await probe(phone, 1.0)
    assert (seen.boot_completed, seen.battery_percent, seen.temperature_celsius) == (True, 100, 30)
    assert seen.charging is True and seen.free_bytes
    source.set_body("sim-0", charging=False)
    await phone.tap(1, 1)  # 0.2 s under load
    body = source.body("sim-0")
    assert body.battery < 95 and body.temperature > 35
    assert "level: " in battery_text(body)
    assert not [a for a in source.actions if a.action == "shell"]  # probes are not actions
    source.hang("sim-0")
    with pytest.raises(DeviceTimeout):
        await probe(phone, 0.2)
    source.reboot("sim-0", boot_time=0.3)
    assert not (await probe(phone, 1.0)).boot_completed
    with pytest.raises(DeviceLost):
        await phone.tap(1, 1)
    await eventually(lambda: source.booted("sim-0"))
    assert (await probe(phone, 1.0)).boot_completed


async def test_simulated_phones_take_their_faults_from_a_file_when_it_changes(
    tmp_path: Path,
) -> None:
    """--sim-faults: each phone whose entry changed gets it (unplugged, hung, booting, hot);
    an entry removed undoes it; a file rewritten mid-way is read again."""
    source = SimulatedSource(4, delay=0.01)
    source.call_timeout = 0.2
    path = tmp_path / "faults.json"
    follower = asyncio.create_task(source.faults.follow(path, every=0.02))
    try:
        path.write_text(
            json.dumps(
                {
                    "sim-0": {"unplugged": True},
                    "sim-1": {"hung": "reconnect"},
                    "sim-2": {"booting": 60},
                    "sim-3": {"temperature": 50},
                }
            )
        )
        await eventually(lambda: not source.is_plugged("sim-0"), what="sim-0 unplugged")
        assert source.body("sim-1").hung and source.body("sim-1").hang_cured_by == "reconnect"
        assert not source.booted("sim-2")
        assert source.body("sim-3").temperature == 50
        await source.reconnect_device("sim-1")  # the ladder's step 2 cures its transport
        assert not source.body("sim-1").hung
        path.write_text(json.dumps({"sim-1": {"hung": "reconnect"}}))
        await eventually(lambda: source.is_plugged("sim-0"), what="sim-0 plugged back")
        assert source.booted("sim-2") and source.body("sim-3").temperature == 30
        assert not source.body("sim-1").hung  # its entry did not change: not hung again
        await source.device("sim-0").tap(1, 1)
    finally:
        follower.cancel()


async def condition_of(farm: Farm, serial: str) -> str:
    assert farm.db is not None
    return str(await farm.db.fetchval("SELECT condition FROM devices WHERE serial = $1", serial))


async def is_in(farm: Farm, serial: str, condition: str) -> bool:
    return await condition_of(farm, serial) == condition


async def db_now(farm: Farm) -> datetime:
    assert farm.db is not None
    now: datetime = await farm.db.fetchval("SELECT clock_timestamp()")
    return now


def on(serial: str) -> task_pb2.DeviceSelector:
    return task_pb2.DeviceSelector(serial=serial)


async def test_a_phone_that_turns_hot_gets_no_new_work_after_one_probe_interval(
    farm: Farm,
) -> None:
    """A phone that runs task after task turns hot: no assignment to it later than one probe
    interval after it turned; it is held (the queued task says why) until it cools."""
    source = SimulatedSource(2, delay=0.02)
    client = await farm.client()
    async with running_agent(farm, source, probe_interval=PROBE, probe_timeout=0.5):
        # Keep sim-0 busy with short tasks, so there is always one to assign to it.
        ids = [await submit(client, actions_spec(tap()), selector=on("sim-0")) for _ in range(5)]
        await status_is(farm, ids[0], "done")
        turned = await db_now(farm)
        source.set_body("sim-0", temperature=47.0)
        ids += [await submit(client, actions_spec(tap()), selector=on("sim-0")) for _ in range(30)]
        await eventually(lambda: is_in(farm, "sim-0", "too_hot"), timeout=5, what="too hot")
        assert farm.db is not None
        last: datetime = await farm.db.fetchval(
            "SELECT max(at) FROM task_events WHERE kind = 'assign' AND detail LIKE '%/sim-0'"
        )
        assert (last - turned).total_seconds() <= PROBE * 1.1 + 0.5
        queued = ids[-1]
        task = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=queued))
        assert task.status == task_pb2.TASK_STATUS_QUEUED
        assert task.pending_reason == "1 matching phone held: 1 too hot"
        # Other phones go on taking work.
        other = await submit(client, actions_spec(tap()), selector=on("sim-1"))
        await status_is(farm, other, "done")
        # Cooled below the resume mark: ready again, and the queue drains.
        source.set_body("sim-0", temperature=38.0)
        await status_is(farm, queued, "done", within=20)


async def test_a_low_battery_holds_a_phone_until_it_charged_and_operators_see_why(
    farm: Farm,
) -> None:
    """Below 20 % the phone is held, at 30 % still, at 40 % it takes work again; ListHosts
    shows the condition, its reason and the battery facts."""
    source = SimulatedSource(1, delay=0.02)
    client = await farm.client()
    op = await farm.operator()
    source.set_body("sim-0", battery=15.0, charging=True)
    async with running_agent(farm, source, probe_interval=PROBE, probe_timeout=0.5):
        await eventually(lambda: is_in(farm, "sim-0", "charging_hold"), what="the phone held")
        task_id = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        hosts = await op.scheduler.ListHosts(scheduler_pb2.ListHostsRequest())
        device = hosts.hosts[0].devices[0]
        assert device.condition == scheduler_pb2.DEVICE_CONDITION_CHARGING_HOLD
        assert device.condition_reason == "battery below 20 %; held until 40 %"
        assert device.battery_percent == 15 and device.charging
        assert device.temperature_celsius == pytest.approx(30.0)
        assert device.HasField("probed_at")
        task = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))
        assert task.pending_reason == "1 matching phone held: 1 charging (battery low)"
        assert farm.plane is not None
        _, token = await create_token(farm.plane.store, Role.OPERATOR, None, "alice")
        table = await Cli(farm.address, token)("hosts")
        row = next(line for line in table.out.splitlines() if "sim-0" in line)
        assert "charging_hold" in row and "15%+" in row and "30°C" in row, table.out
        # Metrics: per phone on the host, aggregated (no label per phone) on the centre.
        sample = REGISTRY.get_sample_value
        assert sample("amc_agent_device_battery_percent", {"device": "sim-0"}) == 15
        assert sample("amc_agent_devices_by_condition", {"condition": "charging_hold"}) == 1
        gauges = await farm.plane.store.queue.farm_gauges(timedelta(seconds=30), 20)
        assert gauges.conditions == {"charging_hold": 1}
        assert gauges.battery == (15, 15, 15) and gauges.temperature == (30, 30, 30)
        source.set_body("sim-0", battery=30.0)
        await asyncio.sleep(3 * PROBE)
        assert await condition_of(farm, "sim-0") == "charging_hold"
        source.set_body("sim-0", battery=41.0)
        await status_is(farm, task_id, "done", within=10)
        assert await condition_of(farm, "sim-0") == "ready"


async def test_a_hung_phone_is_quarantined_rebooted_and_back_in_service(farm: Farm) -> None:
    """A phone that stops answering (K = 1) is quarantined; the ladder's reconnect and `adb
    reconnect` find it still hung, its reboot brings it back; every step is a recovery
    event of the host, and the phone takes work again."""
    source = SimulatedSource(2, delay=0.02)
    source.boot_time = 0.5
    client = await farm.client()
    op = await farm.operator()
    settings = {
        "probe_interval": PROBE,
        "probe_timeout": 0.3,
        "recovery": RecoverySettings(failures=1, backoff=0.1, boot_timeout=5.0),
    }
    async with running_agent(farm, source, **settings) as agent:
        await eventually(lambda: agent.health.health.get("sim-0") is not None)
        source.hang("sim-0")
        await eventually(lambda: agent.recovery.outcomes, timeout=10, what="the ladder's end")
        assert agent.recovery.outcomes == [("sim-0", True)]
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="back in service")
        task_id = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        await status_is(farm, task_id, "done")
    answer = await op.admin.GetHost(admin_pb2.GetHostRequest(host_id="host-1"))
    steps = [e.reason for e in reversed(answer.events) if e.kind == "recovery"]
    assert steps[0].startswith("quarantined: 1 infrastructure failures")
    assert steps[1:] == [
        "recovering: step 1: reconnect",
        "recovering: step 2: adb reconnect",
        "recovering: step 3: reboot",
        "ready",
    ]
    assert {e.actor for e in answer.events if e.kind == "recovery"} == {"host-1"}


async def test_a_wedged_transport_is_brought_back_by_adb_reconnect_without_a_reboot(
    farm: Farm,
) -> None:
    """A phone whose transport hangs (what `adb reconnect` cures) is quarantined; step 2
    brings it back, no reboot is asked for, and it takes work again."""
    source = SimulatedSource(1, delay=0.02)
    source.boot_time = 600.0  # a reboot would leave it booting past the test
    client = await farm.client()
    op = await farm.operator()
    settings = {
        "probe_interval": PROBE,
        "probe_timeout": 0.3,
        "recovery": RecoverySettings(failures=1, backoff=0.1, boot_timeout=1.0),
    }
    async with running_agent(farm, source, **settings) as agent:
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first probe")
        source.hang("sim-0", cured_by="reconnect")
        await eventually(lambda: agent.recovery.outcomes, timeout=10, what="the ladder's end")
        assert agent.recovery.outcomes == [("sim-0", True)]
        assert source.booted("sim-0")
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="back in service")
        task_id = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        await status_is(farm, task_id, "done")
    answer = await op.admin.GetHost(admin_pb2.GetHostRequest(host_id="host-1"))
    steps = [e.reason for e in reversed(answer.events) if e.kind == "recovery"]
    assert steps[1:] == [
        "recovering: step 1: reconnect",
        "recovering: step 2: adb reconnect",
        "ready",
    ]


def test_low_free_storage_is_held_until_above_the_resume_mark() -> None:
    """Held below 1 GB free, still at 1.5 GB, let go above 2 GB; heat and a low battery
    are said first."""
    t = Thresholds(storage_low=1 << 30, storage_resume=2 << 30)

    def free(size: int, level: int = 80) -> Reading:
        return Reading(True, level, 30.0, True, size, 0.01)

    low = judge(None, free(500 << 20), t)
    assert low.condition is Condition.LOW_STORAGE
    assert low.reason == "free storage 500 MB below 1 GB; held until above 2 GB"
    assert judge(low, free(3 << 29), t).condition is Condition.LOW_STORAGE
    assert judge(low, free(2 << 30), t).condition is Condition.LOW_STORAGE
    assert judge(low, free((2 << 30) + 1), t).condition is Condition.READY
    assert judge(None, free(3 << 29), t).condition is Condition.READY
    assert judge(None, free(1 << 20, level=5), t).condition is Condition.CHARGING_HOLD


async def test_a_phone_low_on_storage_is_held_and_the_task_says_why(farm: Farm) -> None:
    """Less free storage than --storage-low: held as low_storage (the queued task says so);
    storage freed above --storage-resume: it takes the task."""
    source = SimulatedSource(1, delay=0.02)
    source.set_body("sim-0", free_kb=300_000)
    client = await farm.client()
    async with running_agent(farm, source, probe_interval=PROBE, probe_timeout=0.5):
        await eventually(lambda: is_in(farm, "sim-0", "low_storage"), what="the phone held")
        task_id = await submit(client, actions_spec(tap()), selector=on("sim-0"))
        task = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))
        assert task.pending_reason == "1 matching phone held: 1 low on storage"
        source.set_body("sim-0", free_kb=3_000_000)
        await status_is(farm, task_id, "done", within=10)


async def test_a_phone_the_ladder_cannot_bring_back_stays_quarantined() -> None:
    """Every step fails: quarantined, waiting for an operator; one ladder at a time."""
    told: list[str] = []

    async def dead(serial: str) -> Reading:
        raise DeviceTimeout(f"{serial}: no answer")

    recovery = Recovery(
        dead,
        told.append,
        settings=RecoverySettings(failures=2, window=60, backoff=0.01, boot_timeout=0.1),
    )
    recovery.failure("p1", "no answer")
    assert "p1" not in recovery.held
    recovery.failure("p1", "no answer")
    assert recovery.held["p1"].condition is Condition.QUARANTINED
    recovery.failure("p1", "again")  # held already: no second ladder
    failed_before = REGISTRY.get_sample_value("amc_agent_recoveries_total", {"result": "failed"})
    await eventually(lambda: recovery.outcomes)
    failed = REGISTRY.get_sample_value("amc_agent_recoveries_total", {"result": "failed"})
    assert failed == (failed_before or 0) + 1
    assert recovery.outcomes == [("p1", False)]
    assert recovery.held["p1"] == Health(
        Condition.QUARANTINED, "recovery failed: waits for an operator"
    )
    await recovery.close()


async def test_the_real_driver_probes_and_reboots_a_phone_over_the_adb_protocol() -> None:
    """The probe's reads and the ladder's reboot through host_agent.adb against the fake adb
    server: battery facts read, a reboot leaves the phone booting, then booted."""
    phone = FakePhone("emu-1", battery_level=17, battery_temperature=41.5, charging=False)
    phone.boot_time = 0.4
    async with FakeAdbServer([phone]) as server:
        source = AdbSource(port=server.port, call_timeout=2.0)
        seen = await probe(source.device("emu-1"), 2.0)
        assert (seen.boot_completed, seen.battery_percent) == (True, 17)
        assert (seen.temperature_celsius, seen.charging) == (41.5, False)
        assert seen.free_bytes == 8_000_000 * 1024
        assert judge(None, seen, Thresholds()).condition is Condition.CHARGING_HOLD
        await source.reboot_device("emu-1")
        assert phone.reboots == 1
        assert not (await probe(source.device("emu-1"), 2.0)).boot_completed
        await asyncio.sleep(0.5)
        assert (await probe(source.device("emu-1"), 2.0)).boot_completed
        assert "reboot:" in server.payloads()
        await source.reconnect_device("emu-1")
        assert server.reconnects == {"emu-1": 1}
        assert "host-serial:emu-1:reconnect" in server.payloads()
        with pytest.raises(DeviceLost, match="not found"):
            await source.reconnect_device("emu-9")


def condition_report(
    host_id: str, serial: str, condition: int, battery: int
) -> lease_pb2.ReportDeviceHealthRequest:
    return lease_pb2.ReportDeviceHealthRequest(
        host_id=host_id,
        devices=[
            lease_pb2.DeviceHealth(
                serial=serial, condition=condition, battery_percent=battery, charging=True
            )
        ],
    )


READY = scheduler_pb2.DEVICE_CONDITION_READY
CHARGING = scheduler_pb2.DEVICE_CONDITION_CHARGING_HOLD


async def test_a_battery_change_of_a_ready_phone_publishes_no_freed_notification(
    farm: Farm,
) -> None:
    """A report that only moves a ready phone's battery wakes no Acquire anywhere: the
    database carries no `amc_freed` for it; a phone that turns ready publishes one."""
    assert farm.db is not None
    heard: list[tuple[str, str]] = []
    listener = await asyncpg.connect(farm.dsn)
    for channel in ("amc_freed", "amc_queued"):
        await listener.add_listener(channel, lambda *args: heard.append((args[2], args[3])))
    try:
        host = await farm.host("h1", "p1", "p2")
        await eventually(lambda: heard, what="the registration's notification")
        heard.clear()
        await host.c.lease.ReportDeviceHealth(condition_report("h1", "p2", CHARGING, 10))
        await host.c.lease.ReportDeviceHealth(condition_report("h1", "p1", READY, 80))
        await host.c.lease.ReportDeviceHealth(condition_report("h1", "p1", READY, 60))
        # A marker: a replica sends its notifications in the order it made them, so once
        # the queued task's is heard, any the reports above made were heard before it.
        await submit(await farm.client(), actions_spec(tap()), selector=on("elsewhere"))
        await eventually(
            lambda: "amc_queued" in [c for c, _ in heard], what="the queued task's notice"
        )
        assert [channel for channel, _ in heard] == ["amc_queued"]
        battery = await farm.db.fetchval("SELECT battery_percent FROM devices WHERE serial = 'p1'")
        assert battery == 60
        heard.clear()
        await host.c.lease.ReportDeviceHealth(condition_report("h1", "p2", READY, 45))
        await eventually(lambda: heard, what="the notification of the freed phone")
    finally:
        await listener.close()
    assert heard == [("amc_freed", "h1")]


async def test_a_phone_reported_ready_again_wakes_its_hosts_parked_acquire(farm: Farm) -> None:
    """A task waits for a phone held charging; the report that frees it wakes the host's
    parked Acquire at once (not when its 30 s wait ends), which takes the task."""
    host = await farm.host("h1", "p1")
    client = await farm.client()
    await host.c.lease.ReportDeviceHealth(condition_report("h1", "p1", CHARGING, 10))
    parked = asyncio.create_task(host.acquire("p1", wait=30.0))
    try:
        task_id = await submit(client, actions_spec(tap()), selector=on("p1"))
        await asyncio.sleep(0)
        assert not parked.done()
        await host.c.lease.ReportDeviceHealth(condition_report("h1", "p1", READY, 45))
        (assignment,) = await asyncio.wait_for(parked, 10)
    finally:
        parked.cancel()
    assert assignment.task_id == task_id and assignment.device_serial == "p1"
