"""A held phone's input commands over one kept `sh` (host_agent.adb_kept_shell), against
the fake adb server speaking the real host protocol over real sockets:

AdbDevice.hold_control → one ``shell:sh`` connection → FakeAdbServer → FakePhone.sh
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from host_agent.adb import AdbDevice, AdbSource
from host_agent.devices import CommandFailed, DeviceError, DeviceLost, DeviceTimeout
from tests.support import eventually
from tests.support.fakes.adb_server import ConnectionRecord, FakeAdbServer
from tests.support.fakes.phone import FakePhone

SERIAL = "emu-5554"
CALL_TIMEOUT = 2.0


@pytest.fixture
def phone() -> FakePhone:
    return FakePhone(SERIAL)


@pytest.fixture
async def server(phone: FakePhone) -> AsyncIterator[FakeAdbServer]:
    async with FakeAdbServer([phone]) as server:
        yield server


@pytest.fixture
def device(server: FakeAdbServer) -> AdbDevice:
    return AdbSource(port=server.port, call_timeout=CALL_TIMEOUT).device(SERIAL)


def kept_shells(server: FakeAdbServer) -> list[ConnectionRecord]:
    return [c for c in server.connections if "shell:sh" in c.requests]


def shell_requests(server: FakeAdbServer) -> list[str]:
    return [p for p in server.payloads() if p.startswith(("shell:", "exec-out:"))]


def ran(phone: FakePhone, name: str = "input") -> list[list[str]]:
    """The simple commands of `name` the phone ran, in order."""
    return [argv for _, argv in phone.executed if argv[0] == name]


def held_or_not(device: AdbDevice, held: bool) -> contextlib.AbstractAsyncContextManager[Any]:
    return device.hold_control() if held else contextlib.nullcontext()


async def test_a_held_phones_input_commands_share_one_kept_sh_closed_when_the_hold_ends(
    server: FakeAdbServer, device: AdbDevice, phone: FakePhone
) -> None:
    """THEN in a hold, taps, a swipe, a key and text go over one connection running `sh`
    (no `shell:input …` request), each reaches the phone once, in order, and the
    connection stays open until the hold ends, when the agent closes it."""
    async with device.hold_control() as scrcpy_held:
        assert not scrcpy_held  # no scrcpy server configured: `input` it is
        for i in range(5):
            assert await device.tap(i, 10 * i) == "input"
        assert await device.swipe(1, 2, 3, 4, 100) == "input"
        assert await device.key(66) == "input"
        assert await device.input_text("hi there") == "input"
        [kept] = kept_shells(server)
        assert not kept.closed

    assert kept.requests == [f"host:transport:{SERIAL}", "shell:sh"]
    assert shell_requests(server) == ["shell:sh"]
    assert ran(phone) == [
        *(["input", "tap", str(i), str(10 * i)] for i in range(5)),
        ["input", "swipe", "1", "2", "3", "4", "100"],
        ["input", "keyevent", "66"],
        ["input", "text", "hi%sthere"],
    ]
    await eventually(lambda: kept.closed, what="the kept sh to close")
    assert kept.closed_by == "client"


async def test_outside_a_hold_each_input_command_has_a_connection_of_its_own(
    server: FakeAdbServer, device: AdbDevice, phone: FakePhone
) -> None:
    """THEN without a hold, as before: every tap is its own `shell:input tap …` request on a
    connection of its own, and no `sh` is kept; after a hold ended, the same again."""
    for i in range(3):
        await device.tap(i, i)
    async with device.hold_control():
        await device.tap(7, 7)
    await device.tap(8, 8)

    requests = shell_requests(server)
    assert [r.split(";")[0] for r in requests] == [
        "shell:input tap 0 0",
        "shell:input tap 1 1",
        "shell:input tap 2 2",
        "shell:sh",
        "shell:input tap 8 8",
    ]
    assert len({c.id for c in server.connections if c.requests[-1] in requests}) == 5
    assert len(ran(phone)) == 5


async def test_a_held_phones_other_commands_keep_connections_of_their_own(
    server: FakeAdbServer, device: AdbDevice, phone: FakePhone
) -> None:
    """THEN in a hold, an app's launch, a screenshot, a UI dump and a shell command each
    have their own connection, as before; only the tap goes through the kept `sh`."""
    async with device.hold_control():
        await device.tap(1, 1)
        await device.launch_app("com.example", ".Main")
        await device.screenshot()
        await device.ui_dump()
        await device.shell("getprop ro.product.model", CALL_TIMEOUT)
        await device.stop_app("com.example")

    requests = [r.split(";")[0] for r in shell_requests(server)]
    assert requests == [
        "shell:sh",
        "shell:am start -n com.example/.Main",
        "exec-out:screencap -p",
        "shell:uiautomator dump /sdcard/amc_window_dump.xml && cat /sdcard/amc_window_dump.xml",
        "shell:getprop ro.product.model",
        "shell:am force-stop com.example",
    ]
    assert ran(phone) == [["input", "tap", "1", "1"]]


@pytest.mark.parametrize("held", [False, True], ids=["own connection", "kept sh"])
async def test_a_tap_whose_connection_is_reset_mid_way_raises_as_before_and_is_not_sent_again(
    server: FakeAdbServer, device: AdbDevice, phone: FakePhone, held: bool
) -> None:
    """THEN a tap whose output is cut off by a reset raises the same DeviceError (a dropped
    connection, not DeviceLost: the phone is still listed) held or not, the phone ran it
    once, and the next tap works; held, over a second kept `sh` (the first one closed)."""
    server.faults.drop_on = "input tap 2 2"
    async with held_or_not(device, held):
        await device.tap(1, 1)
        with pytest.raises(DeviceError, match="connection dropped during `input tap 2 2`") as e:
            await device.tap(2, 2)
        assert not isinstance(e.value, DeviceLost)
        await device.tap(3, 3)

    assert [argv[2] for argv in ran(phone)] == ["1", "2", "3"]
    if held:
        first, second = kept_shells(server)
        assert first.closed_by == "fault"
        assert len(second.requests) == 2  # the transport and shell:sh: a fresh one


async def test_a_held_phone_unplugged_during_a_tap_raises_device_lost(
    server: FakeAdbServer, device: AdbDevice
) -> None:
    """THEN a tap cut off on the kept `sh` because the phone left is DeviceLost, as on a
    connection of its own."""
    server.faults.hang_on = "input tap 2 2"
    async with device.hold_control():
        await device.tap(1, 1)
        call = asyncio.create_task(device.tap(2, 2))
        await eventually(lambda: server.hung, what="the tap in flight")
        server.remove_phone(SERIAL)
        with pytest.raises(DeviceLost, match="device lost"):
            await call


async def test_a_held_tap_that_hangs_times_out_and_the_next_opens_another_kept_sh(
    server: FakeAdbServer, phone: FakePhone
) -> None:
    """THEN a tap never answered on the kept `sh` is DeviceTimeout at the call's deadline,
    that `sh` is closed (its state is unknown), and the next tap opens another."""
    device = AdbSource(port=server.port, call_timeout=0.3).device(SERIAL)
    server.faults.hang_on = "input tap 2 2"
    async with device.hold_control():
        await device.tap(1, 1)
        started = time.monotonic()
        with pytest.raises(DeviceTimeout, match=r"`input tap 2 2` timed out after 0\.3s"):
            await device.tap(2, 2)
        assert time.monotonic() - started >= 0.3
        first = kept_shells(server)[0]
        await eventually(lambda: first.closed, what="the hung kept sh to close")
        assert first.closed_by == "client"
        server.faults.hang_on = None
        await device.tap(3, 3)
        assert len(kept_shells(server)) == 2

    assert [argv[2] for argv in ran(phone)] == ["1", "3"]


async def test_a_held_tap_cancelled_in_flight_closes_its_kept_sh(
    server: FakeAdbServer, device: AdbDevice, phone: FakePhone
) -> None:
    """THEN a tap cancelled while the kept `sh` runs it ends cancelled, that `sh` is
    closed, and the next tap goes over another one."""
    server.faults.hang_on = "input tap 2 2"
    async with device.hold_control():
        await device.tap(1, 1)
        call = asyncio.create_task(device.tap(2, 2))
        await eventually(lambda: server.hung, what="the tap in flight")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        first = kept_shells(server)[0]
        await eventually(lambda: first.closed, what="the kept sh to close")
        server.faults.hang_on = None
        await device.tap(3, 3)

    assert len(kept_shells(server)) == 2
    assert [argv[2] for argv in ran(phone)] == ["1", "3"]


async def test_a_held_input_commands_non_zero_exit_is_command_failed_and_the_sh_is_kept(
    server: FakeAdbServer, device: AdbDevice, phone: FakePhone
) -> None:
    """THEN an `input tap` that exits 1 raises CommandFailed with its exit code and output,
    and the same kept `sh` runs the next one."""
    phone.failures["input tap"] = (1, b"Error: Injecting to another application\n")
    async with device.hold_control():
        with pytest.raises(CommandFailed, match="exited 1: Error: Injecting to another"):
            await device.tap(1, 1)
        phone.failures.clear()
        await device.tap(2, 2)
        await device.key(4)

    assert len(kept_shells(server)) == 1
    assert shell_requests(server) == ["shell:sh"]
    assert phone.shell_commands()[-1].startswith("input keyevent 4; echo AMC_EXIT_")


async def test_a_kept_sh_over_a_pty_reads_through_its_echo_and_crlf(
    server: FakeAdbServer, device: AdbDevice, phone: FakePhone
) -> None:
    """THEN on a phone whose `shell:` is a pty (before Android 7: each line echoed, "\\n"
    as "\\r\\n"), held taps work over one kept `sh`, and a failed one says the phone's
    output without the echoed line."""
    phone.sh_pty = True
    phone.failures["input keyevent"] = (1, b"Error: no key\n")
    async with device.hold_control():
        await device.tap(1, 1)
        await device.tap(2, 2)
        with pytest.raises(CommandFailed) as failed:
            await device.key(3)
        await device.tap(4, 4)

    assert str(failed.value) == "`input keyevent 3` exited 1: Error: no key"
    assert len(kept_shells(server)) == 1
    assert [argv[1:] for argv in ran(phone)] == [
        ["tap", "1", "1"],
        ["tap", "2", "2"],
        ["keyevent", "3"],
        ["tap", "4", "4"],
    ]


async def test_a_kept_sh_the_server_ended_between_taps_is_opened_again_for_the_next(
    server: FakeAdbServer, device: AdbDevice, phone: FakePhone
) -> None:
    """THEN when the adb server ends the kept `sh` while nothing runs on it (the phone's
    transport went and came back), the next tap opens another before it is written and
    is done, once, with no error."""
    async with device.hold_control():
        await device.tap(1, 1)
        server.remove_phone(SERIAL)
        server.add_phone(phone)
        kept = device._kept._phone  # the agent's connection, seen to end before the tap
        await eventually(lambda: kept is not None and kept.ended(), what="the end seen")
        await device.tap(2, 2)

    first, second = kept_shells(server)
    assert first.closed_by == "device removed"
    assert second.requests == [f"host:transport:{SERIAL}", "shell:sh"]
    assert [argv[2] for argv in ran(phone)] == ["1", "2"]


async def test_a_refused_kept_sh_raises_as_a_connection_of_its_own_would(
    server: FakeAdbServer, device: AdbDevice
) -> None:
    """THEN a held tap on a phone the adb server says is offline is DeviceLost, as it is
    unheld, and once the phone is back the next tap opens the kept `sh`."""
    server.set_state(SERIAL, "offline")
    async with device.hold_control():
        with pytest.raises(DeviceLost, match=r"device lost.*offline"):
            await device.tap(1, 1)
        server.set_state(SERIAL, "device")
        await device.tap(2, 2)

    assert len(kept_shells(server)) == 1


async def test_a_kept_sh_stays_open_until_the_last_of_two_holds_ends(
    server: FakeAdbServer, device: AdbDevice
) -> None:
    """THEN with two holds on the phone, its taps share one kept `sh` that outlives the
    first hold and closes with the second."""
    outer = device.hold_control()
    await outer.__aenter__()
    async with device.hold_control():
        await device.tap(1, 1)
    await device.tap(2, 2)
    [kept] = kept_shells(server)
    assert not kept.closed
    await outer.__aexit__(None, None, None)

    await eventually(lambda: kept.closed, what="the kept sh to close")
    assert shell_requests(server) == ["shell:sh"]
