"""Tier 2 device tests: the real adb server between our driver and a fake phone.

    pure-python-adb / adb CLI → real `adb server` (private port) → FakeAdbd → FakePhone

No adb binary is a failure, not a skip: without a system adb on PATH, the one in the
`adbutils` wheel (a dev dependency, so `make setup` installs it) is used.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ppadb.client_async import ClientAsync

from host_agent.adb import AdbSource
from host_agent.devices import DeviceLost, DeviceTimeout
from tests.support.fakes.adbd import FakeAdbd
from tests.support.fakes.phone import PNG_SIGNATURE, FakePhone, make_png
from tests.support.fakes.real_adb import RealAdbServer, find_adb, poll_until

# adb names a `connect`ed phone after its address; this is only the phone's own label.
SERIAL = "FAKE0001"


@pytest.fixture
def phone() -> FakePhone:
    return FakePhone(SERIAL)


@pytest.fixture
async def adbd(phone: FakePhone) -> AsyncIterator[FakeAdbd]:
    async with FakeAdbd(phone) as adbd:
        yield adbd


@pytest.fixture
async def adb_server(tmp_path: Path, adbd: FakeAdbd) -> AsyncIterator[RealAdbServer]:
    """A private adb server with the fake phone connected and online."""
    async with RealAdbServer(tmp_path / "adb-home") as server:
        await server.connect(adbd.address)
        yield server


def test_adb_binary_is_installed() -> None:
    """THEN an adb binary is found and runs."""
    adb = find_adb()
    done = subprocess.run([adb, "version"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "Android Debug Bridge" in done.stdout, done.stderr


def test_without_a_system_adb_the_adbutils_binary_is_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """THEN with no adb on PATH and no $AMC_ADB, the adbutils wheel's executable adb is found."""
    monkeypatch.delenv("AMC_ADB", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    adbutils = importlib.util.find_spec("adbutils")
    assert adbutils is not None and adbutils.origin is not None, "make setup installs adbutils"
    adb = find_adb()
    assert adb == Path(adbutils.origin).parent / "binaries" / "adb"
    assert os.access(adb, os.X_OK)


async def test_real_adb_shell_echo_reaches_fake_adbd(
    adb_server: RealAdbServer, adbd: FakeAdbd, phone: FakePhone
) -> None:
    """THEN `adb shell echo hi` prints "hi" produced by the fake phone."""
    result = await adb_server.adb("-s", adbd.address, "shell", "echo hi")

    assert result.stdout == b"hi\n"
    assert phone.shell_commands() == ["echo hi"]
    assert "shell:echo hi" in adbd.services


async def test_adb_devices_lists_fake_phone_with_its_model(
    adb_server: RealAdbServer, adbd: FakeAdbd
) -> None:
    """THEN `adb devices -l` lists the phone as "device" with the model from its banner."""
    result = await adb_server.adb("devices", "-l")

    line = next(ln for ln in result.text.splitlines() if ln.startswith(adbd.address))
    assert line.split()[1] == "device"
    assert "model:Pixel_Fake" in line  # adb turns the space into "_"
    assert len(adbd.connections) == 1
    assert adbd.connections[0].system_identity.startswith("host::")


async def test_binary_output_larger_than_max_payload_arrives_intact(
    adb_server: RealAdbServer, adbd: FakeAdbd, phone: FakePhone
) -> None:
    """THEN `adb exec-out screencap -p` returns every byte, across many flow-controlled WRTEs."""
    phone.png = PNG_SIGNATURE + os.urandom(3 * adbd.max_payload + 1234)

    result = await adb_server.adb("-s", adbd.address, "exec-out", "screencap -p")

    assert result.stdout == phone.png


async def test_concurrent_streams_each_get_their_own_output(
    adb_server: RealAdbServer, adbd: FakeAdbd
) -> None:
    """THEN commands run at once over one transport each print only their own output."""
    results = await asyncio.gather(
        *(adb_server.shell(adbd.address, f"sleep 0.3; echo stream{n}") for n in range(5))
    )

    assert results == [f"stream{n}\n".encode() for n in range(5)]
    assert len(adbd.connections) == 1


async def test_unsupported_service_is_refused_and_device_stays_online(
    adb_server: RealAdbServer, adbd: FakeAdbd
) -> None:
    """THEN `adb remount` (remount:, which the fake phone does not serve) fails and the
    phone is still "device" afterwards."""
    result = await adb_server.adb("-s", adbd.address, "remount", check=False)

    assert result.returncode != 0
    assert "remount:" in adbd.services
    assert (await adb_server.devices())[adbd.address] == "device"


async def test_adb_push_and_pull_reach_the_fake_phones_files(
    adb_server: RealAdbServer, adbd: FakeAdbd, phone: FakePhone
) -> None:
    """THEN Debian's own `adb push` and `adb pull` speak the fake adbd's sync protocol: the
    file lands in the phone's files and comes back whole; a push outside the shared
    storage is refused with the phone's words."""
    local = adb_server.home / "data.bin"
    local.write_bytes(bytes(range(256)) * 1000)
    await adb_server.adb("-s", adbd.address, "push", str(local), "/sdcard/data.bin")
    assert phone.files["/sdcard/data.bin"] == local.read_bytes()
    back = adb_server.home / "back.bin"
    await adb_server.adb("-s", adbd.address, "pull", "/sdcard/data.bin", str(back))
    assert back.read_bytes() == local.read_bytes()
    refused = await adb_server.adb("-s", adbd.address, "push", str(local), "/system/x", check=False)
    assert refused.returncode != 0 and b"Read-only file system" in refused.stderr


async def test_stopped_fake_adbd_drops_out_of_adb_devices(
    adb_server: RealAdbServer, adbd: FakeAdbd
) -> None:
    """THEN once the phone's adbd goes away, adb no longer reports it as "device"."""
    await adbd.stop()

    async def gone() -> bool:
        return (await adb_server.devices()).get(adbd.address) != "device"

    await poll_until(gone, 15.0, "the stopped phone to leave the 'device' state")


async def test_pure_python_adb_drives_fake_phone_through_real_server(
    adb_server: RealAdbServer, adbd: FakeAdbd, phone: FakePhone
) -> None:
    """THEN pure-python-adb sees the phone and gets shell output and the PNG through adb."""
    client = ClientAsync(adb_server.host, adb_server.port)

    device = await client.device(adbd.address)
    assert device is not None
    assert await device.shell("getprop ro.product.model") == "Pixel Fake\n"
    assert await device.screencap() == bytes(phone.png)
    assert phone.shell_commands()[-1] == "/system/bin/screencap -p"


async def test_host_agent_adb_source_drives_fake_phone_through_real_server(
    adb_server: RealAdbServer, adbd: FakeAdbd, phone: FakePhone
) -> None:
    """THEN AdbSource lists the phone online with its model, taps reach it, screenshots are PNG."""
    phone.png = make_png(8, 6, (200, 10, 10))
    source = AdbSource(adb_server.host, adb_server.port, call_timeout=10.0)

    inventory = {info.serial: info for info in await source.inventory()}
    info = inventory[adbd.address]
    assert info.state == "device"
    assert info.model == phone.props["ro.product.model"]

    device = source.device(adbd.address)
    result = await device.shell("echo hi", timeout=10.0)
    assert result.output.strip() == "hi"

    await device.tap(120, 340)
    assert any("input tap 120 340" in command for command in phone.shell_commands())

    assert await device.screenshot() == phone.png
    assert "com.example:id/title" in await device.ui_dump()


@pytest.mark.parametrize("pty", [False, True], ids=["raw", "pty"])
async def test_a_held_phones_taps_go_through_one_kept_sh_stream_of_the_real_adb_server(
    adb_server: RealAdbServer, adbd: FakeAdbd, phone: FakePhone, pty: bool
) -> None:
    """THEN through the real adb server, a held phone's taps, key and text are lines of
    one `shell:sh` stream (none is a `shell:input …` stream of its own), each run once on
    the phone, raw or over a pty (as before Android 7: echoed, CRLF); as the hold ends,
    the server closes that stream on the phone; a tap after it has its own stream again."""
    phone.sh_pty = pty
    device = AdbSource(adb_server.host, adb_server.port, call_timeout=10.0).device(adbd.address)
    async with device.hold_control():
        for i in range(5):
            await device.tap(i, i)
        await device.key(4)
        await device.input_text("ok")
        assert [s for s in adbd.services if s.startswith("shell:")] == ["shell:sh"]

    async def hung_up() -> bool:
        return "shell:sh" in adbd.hung_up

    await poll_until(hung_up, 10.0, "the server to close the kept sh on the phone")
    await device.tap(9, 9)
    inputs = [c.split(";")[0] for c in phone.shell_commands() if c.startswith("input")]
    taps = [f"input tap {i} {i}" for i in range(5)]
    assert inputs == [*taps, "input keyevent 4", "input text ok", "input tap 9 9"]
    assert [s.split(";")[0] for s in adbd.services if s.startswith("shell:")] == [
        "shell:sh",
        "shell:input tap 9 9",
    ]


async def _line_read(stream: AsyncIterator[bytes], line: bytes) -> float:
    """When (time.monotonic) the stream has read `line`."""
    seen = b""
    async with asyncio.timeout(10.0):
        while line not in seen:
            seen += await anext(stream)
    return time.monotonic()


async def test_a_followed_logs_lines_are_read_at_once_not_after_a_delayed_ack(
    adb_server: RealAdbServer, adbd: FakeAdbd
) -> None:
    """THEN a new `logcat` stream reads the phone's log at once, and a line written while it
    is open comes as soon as it is written: the agent acknowledges what it reads at once,
    so the adb server's socket (Nagle) does not hold a small write back for the kernel's
    delayed ACK of the one before (40 ms on Linux), which each run's log capture waited
    for as it started and as it ended."""
    device = AdbSource(adb_server.host, adb_server.port, call_timeout=10.0).device(adbd.address)
    await device.mark_log("amc", "written before", 5.0)
    first, then = [], []
    for i in range(5):
        stream = device.follow_log()
        try:
            began = time.monotonic()
            first.append(await _line_read(stream, b"written before") - began)
            began = time.monotonic()
            await device.mark_log("amc", f"written while followed {i}", 5.0)
            then.append(await _line_read(stream, f"followed {i}".encode()) - began)
        finally:
            await stream.aclose()
    # The least of five: a slow moment of a loaded machine is not the wait looked for.
    assert min(first) < 0.02, f"a new stream's first lines came after {min(first):.3f}s"
    assert min(then) < 0.02, f"a line written came {min(then):.3f}s later"


async def test_dropped_transport_comes_back_online(
    adb_server: RealAdbServer, adbd: FakeAdbd
) -> None:
    """THEN adb reconnects by itself after the phone hangs up the transport."""
    await adbd.drop_connections()

    async def reconnected() -> bool:
        return len(adbd.connections) == 2

    await poll_until(reconnected, 30.0, "adb to open a second transport")
    await adb_server.wait_for_state(adbd.address, "device", within=30.0)


async def test_host_agent_reports_device_lost_when_phone_goes_away(
    adb_server: RealAdbServer, adbd: FakeAdbd
) -> None:
    """THEN a shell on a phone whose adbd is gone raises DeviceLost through the real server."""
    device = AdbSource(adb_server.host, adb_server.port, call_timeout=10.0).device(adbd.address)
    await adbd.stop()
    await adb_server.wait_for_state(adbd.address, "offline", within=15.0)

    with pytest.raises(DeviceLost):
        await device.shell("echo hi", timeout=10.0)


async def test_adb_reconnect_clears_a_wedged_transport(
    adb_server: RealAdbServer, adbd: FakeAdbd
) -> None:
    """THEN a phone whose transport hangs times out, the recovery ladder's `adb reconnect`
    (AdbSource.reconnect_device) has the real server connect to it again, and it answers."""
    source = AdbSource(adb_server.host, adb_server.port, call_timeout=2.0)
    device = source.device(adbd.address)
    adbd.wedged = True
    with pytest.raises(DeviceTimeout):
        await device.shell("echo hi", timeout=1.0)
    await source.reconnect_device(adbd.address)

    async def reconnected() -> bool:
        return len(adbd.connections) == 2

    await poll_until(reconnected, 30.0, "adb to open a second transport")
    await adb_server.wait_for_state(adbd.address, "device", within=30.0)
    result = await device.shell("echo hi", timeout=10.0)
    assert result.output.strip() == "hi"
    with pytest.raises(DeviceLost):
        await source.reconnect_device("127.0.0.1:1")
