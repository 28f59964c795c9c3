"""The host agent driving phones over adb, end to end from a submitted task:

* Agent → AdbSource → fake adb server (host protocol) → FakePhone
* Agent → AdbSource → Debian's real `adb` server → fake adbd (transport protocol) → FakePhone
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from amc.v1 import task_pb2
from host_agent.adb import AdbSource
from tests.support import Farm, actions_spec, eventually, tap, workflow_spec
from tests.support.agent import running_agent, status_is, submit
from tests.support.fakes.adb_server import FakeAdbServer
from tests.support.fakes.adbd import FakeAdbd
from tests.support.fakes.phone import FakePhone, make_png
from tests.support.fakes.real_adb import RealAdbServer
from tests.test_sessions import act, dispatched, last_task, opening


def screenshot() -> task_pb2.Action:
    return task_pb2.Action(screenshot=task_pb2.Screenshot())


def tap_on_text(text: str) -> task_pb2.Action:
    return task_pb2.Action(tap_on=task_pb2.TapOn(selector=task_pb2.UiSelector(text=text)))


async def test_agent_runs_a_tap_through_the_fake_adb_server(farm: Farm) -> None:
    """THEN the phone receives `input tap` and the task is done."""
    phone = FakePhone("emu-5554")
    async with FakeAdbServer([phone]) as server:
        source = AdbSource(server.host, server.port, call_timeout=5.0)
        async with running_agent(farm, source):
            task_id = await submit(await farm.client(), actions_spec(tap(120, 340)))
            await status_is(farm, task_id, "done")
    assert any("input tap 120 340" in command for command in phone.shell_commands())
    assert (await farm.task_row(task_id))["device_serial"] == "emu-5554"


async def test_a_sessions_taps_on_a_phone_over_adb_share_one_kept_sh_closed_as_it_ends(
    farm: Farm,
) -> None:
    """THEN a session's taps (no scrcpy server: through `input`) reach the phone as lines
    of one `shell:sh` connection, none as a `shell:input …` request of its own, and the
    agent closes that connection as the session ends."""
    phone = FakePhone("emu-5554")
    client = await farm.client()
    async with FakeAdbServer([phone]) as server:
        source = AdbSource(server.host, server.port, call_timeout=5.0)
        async with running_agent(farm, source):
            call = client.scheduler.OpenSession()
            await call.write(opening())
            await dispatched(call)
            for i in range(5):
                await call.write(act(tap(10 + i, 20 + i)))
                step = (await asyncio.wait_for(call.read(), 20)).step.step
                assert step.status == task_pb2.STEP_STATUS_OK and step.data["input"] == "input"
            await call.done_writing()
            final = await last_task(call)
            [kept] = [c for c in server.connections if "shell:sh" in c.requests]
            await eventually(lambda: kept.closed, what="the kept sh to close")
    assert final.status == task_pb2.TASK_STATUS_DONE
    assert kept.closed_by == "client"
    assert not [p for p in server.payloads() if p.startswith("shell:input")]
    taps = [c.split(";")[0] for c in phone.shell_commands() if c.startswith("input")]
    assert taps == [f"input tap {10 + i} {20 + i}" for i in range(5)]


async def test_agent_registers_adb_inventory_with_model_and_takes_work_only_for_online_phones(
    farm: Farm,
) -> None:
    """THEN both phones are registered with their getprop facts; only the online one works."""
    online, offline = FakePhone("emu-1"), FakePhone("emu-2")
    async with FakeAdbServer([online]) as server:
        server.add_phone(offline, state="offline")
        source = AdbSource(server.host, server.port, call_timeout=5.0)
        async with running_agent(farm, source):
            task_id = await submit(await farm.client(), actions_spec(tap(1, 1)))
            await status_is(farm, task_id, "done")
    assert farm.db is not None
    rows = {
        r["serial"]: r
        for r in await farm.db.fetch(
            "SELECT serial, state, model, sdk FROM devices WHERE host_id = 'host-1'"
        )
    }
    assert rows["emu-1"]["state"] == "device" and rows["emu-1"]["model"] == "Pixel Fake"
    assert rows["emu-1"]["sdk"] == 34
    assert rows["emu-2"]["state"] == "offline"
    assert (await farm.task_row(task_id))["device_serial"] == "emu-1"
    assert offline.shell_commands() == []


async def test_agent_runs_a_task_through_the_real_adb_server_to_a_fake_phone(
    farm: Farm, tmp_path: Path
) -> None:
    """THEN pure-python-adb → real adb server → fake adbd carries the whole task: the phone
    got the tap, the UI dump for tap_on and the screencap, and the task is done."""
    phone = FakePhone("FAKE0001", png=make_png(8, 6, (10, 200, 10)))
    async with FakeAdbd(phone) as adbd, RealAdbServer(tmp_path / "adb-home") as adb:
        await adb.connect(adbd.address)
        source = AdbSource(adb.host, adb.port, call_timeout=10.0)
        async with running_agent(farm, source):
            spec = workflow_spec(
                touch=[tap(5, 6)], find=[tap_on_text("OK")], capture=[screenshot()]
            )
            task_id = await submit(await farm.client(), spec)
            await status_is(farm, task_id, "done", within=30)
    commands = phone.shell_commands()
    assert any("input tap 5 6" in c for c in commands)
    assert any("uiautomator dump" in c for c in commands)
    assert any("input tap 200 230" in c for c in commands)  # the centre of "OK"
    assert any("screencap -p" in c for c in commands)
    row = await farm.task_row(task_id)
    assert row["device_serial"] == adbd.address
    result = task_pb2.TaskResult.FromString(row["result"])
    assert result.steps[2].data["png_bytes"] == str(len(phone.png))
