"""The adb driver (`host_agent.adb`) against a fake adb server speaking the real protocol.

AdbSource / AdbDevice → TCP (adb host protocol) → FakeAdbServer → FakePhone
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from host_agent.adb import AdbDevice, AdbSource, UnsupportedText, escape_input_text
from host_agent.devices import CommandFailed, DeviceError, DeviceLost, DeviceTimeout
from tests.support.fakes.adb_server import ConnectionRecord, FakeAdbServer
from tests.support.fakes.phone import PNG_SIGNATURE, FakePhone, make_png

SERIAL = "emu-5554"
CALL_TIMEOUT = 2.0
EXIT_MARKER = re.compile(r"; echo AMC_EXIT_[0-9a-f]{32}_\$\?$")


async def assert_eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + CALL_TIMEOUT
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


@pytest.fixture
def phone() -> FakePhone:
    return FakePhone(SERIAL)


@pytest.fixture
async def server(phone: FakePhone) -> AsyncIterator[FakeAdbServer]:
    async with FakeAdbServer([phone]) as server:
        yield server


@pytest.fixture
def source(server: FakeAdbServer) -> AdbSource:
    return AdbSource(port=server.port, call_timeout=CALL_TIMEOUT)


@pytest.fixture
def device(source: AdbSource) -> AdbDevice:
    return source.device(SERIAL)


def executed(phone: FakePhone) -> list[list[str]]:
    """The simple commands the phone ran, without the driver's exit-code echo."""
    return [argv for _, argv in phone.executed if not argv[0] == "echo"]


def shell_connections(server: FakeAdbServer) -> list[ConnectionRecord]:
    return [c for c in server.connections if any(r.startswith("shell:") for r in c.requests)]


# -- inventory ---------------------------------------------------------------------------


async def test_inventory_reports_every_state_and_reads_props_of_online_phones(
    server: FakeAdbServer, source: AdbSource, phone: FakePhone
) -> None:
    """THEN online phones carry model/manufacturer/sdk/abi, the others only their state."""
    server.add_phone(FakePhone("emu-offline"), state="offline")
    server.add_phone(FakePhone("emu-locked"), state="unauthorized")
    server.add_phone(FakePhone("emu-recovery"), state="recovery")

    inventory = {info.serial: info for info in await source.inventory()}

    online = inventory[SERIAL]
    assert (online.state, online.model, online.manufacturer) == ("device", "Pixel Fake", "AMC")
    assert (online.sdk, online.abi) == (34, "arm64-v8a")
    assert online.labels["model"] == "Pixel_Fake"
    assert {s: i.state for s, i in inventory.items() if s != SERIAL} == {
        "emu-offline": "offline",
        "emu-locked": "unauthorized",
        "emu-recovery": "recovery",
    }
    assert inventory["emu-offline"].model == ""
    assert executed(phone) == [["getprop"]]
    assert "host:devices-l" in server.payloads()


async def test_inventory_of_an_empty_server_is_empty(
    server: FakeAdbServer, source: AdbSource
) -> None:
    """THEN no phones attached means an empty list, not an error."""
    server.remove_phone(SERIAL)

    assert await source.inventory() == []


async def test_inventory_keeps_a_phone_whose_getprop_hangs_and_says_why(
    server: FakeAdbServer, phone: FakePhone
) -> None:
    """THEN the phone is listed with its state and an error label, within the deadline."""
    server.faults.hang_on = "getprop"
    source = AdbSource(port=server.port, call_timeout=0.3)

    [info] = await source.inventory()

    assert (info.serial, info.state, info.model) == (SERIAL, "device", "")
    assert "timed out" in info.labels["error"]


# -- actions send real adb commands -------------------------------------------------------

ACTIONS: list[tuple[str, Callable[[AdbDevice], Awaitable[None]], str]] = [
    ("tap", lambda d: d.tap(120, 340), "input tap 120 340"),
    ("swipe", lambda d: d.swipe(10, 20, 30, 40, 500), "input swipe 10 20 30 40 500"),
    ("key", lambda d: d.key(66), "input keyevent 66"),
    (
        "launch_with_activity",
        lambda d: d.launch_app("com.example", ".MainActivity"),
        "am start -n com.example/.MainActivity",
    ),
    (
        "launch_without_activity",
        lambda d: d.launch_app("com.example", ""),
        "monkey -p com.example -c android.intent.category.LAUNCHER 1",
    ),
    ("stop_app", lambda d: d.stop_app("com.example"), "am force-stop com.example"),
]


@pytest.mark.parametrize(("name", "act", "expected"), ACTIONS, ids=[a[0] for a in ACTIONS])
async def test_each_action_sends_its_adb_command_with_an_exit_marker(
    device: AdbDevice,
    phone: FakePhone,
    name: str,
    act: Callable[[AdbDevice], Awaitable[None]],
    expected: str,
) -> None:
    """THEN the phone is asked exactly `<command>; echo <marker>$?` and runs only it."""
    await act(device)

    [command] = phone.shell_commands()
    assert command.startswith(expected + ";")
    assert EXIT_MARKER.search(command)
    assert executed(phone) == [shlex.split(expected)]


async def test_launch_app_quotes_inner_class_activity_names(
    device: AdbDevice, phone: FakePhone
) -> None:
    """THEN `$` in an activity reaches `am` literally instead of being expanded by sh."""
    await device.launch_app("com.example", "com.example.Outer$Inner")

    assert executed(phone) == [["am", "start", "-n", "com.example/com.example.Outer$Inner"]]


async def test_input_text_escapes_spaces_and_shell_metacharacters(
    device: AdbDevice, phone: FakePhone
) -> None:
    """THEN `input` receives the text verbatim (spaces as %s) and nothing else runs."""
    text = """it's a "test"; rm -rf / & echo $HOME `id` | (x) <y> *?~#\\ 100%"""

    await device.input_text(text)

    [[program, verb, typed]] = executed(phone)
    assert (program, verb) == ("input", "text")
    assert typed.replace("%s", " ") == text


@given(st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E)))
def test_escaped_input_text_survives_sh_word_splitting(text: str) -> None:
    """THEN sh turns the escaped text into one word that `input` maps back to the text."""
    if "%s" in text:
        with pytest.raises(UnsupportedText):
            escape_input_text(text)
        return

    escaped = escape_input_text(text)

    words = shlex.split(f"input text {escaped}")
    assert words[:2] == ["input", "text"]
    assert " ".join(words[2:]).replace("%s", " ") == text


@pytest.mark.parametrize("text", ["héllo", "line\nbreak", "tab\there", "50%sale"])
async def test_input_text_refuses_what_input_cannot_type(
    device: AdbDevice, phone: FakePhone, text: str
) -> None:
    """THEN UnsupportedText (a DeviceError) is raised and nothing is sent to the phone."""
    with pytest.raises(UnsupportedText):
        await device.input_text(text)

    assert phone.commands == []


async def test_action_with_nonzero_exit_raises_command_failed_with_its_output(
    device: AdbDevice, phone: FakePhone
) -> None:
    """THEN CommandFailed names the exit code and carries what the phone printed."""
    phone.failures["input tap"] = (1, b"Error: Injecting to another application\n")

    with pytest.raises(CommandFailed, match=r"exited 1: Error: Injecting to another"):
        await device.tap(1, 2)


async def test_launch_app_error_printed_with_exit_zero_raises_command_failed(
    device: AdbDevice, phone: FakePhone
) -> None:
    """THEN `am start` complaining on stdout counts as a failure despite exit 0."""
    phone.failures["am start"] = (0, b"Error: Activity class {com.x/.Y} does not exist.\n")

    with pytest.raises(CommandFailed, match="does not exist"):
        await device.launch_app("com.x", ".Y")


# -- shell -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "exit_code", "output"),
    [
        ("echo hi", 0, "hi\n"),
        ("false", 1, ""),
        ("echo partial && false", 1, "partial\n"),
        ("nosuchtool --flag", 127, "/system/bin/sh: nosuchtool: inaccessible or not found\n"),
        ("getprop ro.product.model;", 0, "Pixel Fake\n"),
    ],
)
async def test_shell_returns_exit_code_and_output_without_the_marker(
    device: AdbDevice, command: str, exit_code: int, output: str
) -> None:
    """THEN ShellResult has the command's own exit code and output, marker stripped."""
    result = await device.shell(command, timeout=CALL_TIMEOUT)

    assert (result.exit_code, result.output) == (exit_code, output)


async def test_shell_output_with_invalid_utf8_is_decoded_with_replacement(
    device: AdbDevice, phone: FakePhone
) -> None:
    """THEN valid UTF-8 survives and each invalid byte becomes U+FFFD."""
    phone.files["/data/local/tmp/mixed"] = "café ".encode() + b"\xff\xfe end\n"

    result = await device.shell("cat /data/local/tmp/mixed", timeout=CALL_TIMEOUT)

    assert result == type(result)(0, "café \ufffd\ufffd end\n")


# -- screenshots and UI dumps --------------------------------------------------------------


async def test_screenshot_is_trimmed_to_the_png_signature_and_byte_exact(
    device: AdbDevice, phone: FakePhone, server: FakeAdbServer
) -> None:
    """THEN a warning printed before the image is cut off and every byte after it kept."""
    phone.png = make_png(64, 48, (13, 10, 26))  # CR/LF bytes in the pixels must survive
    phone.screencap_prefix = b"WARNING: linker: screencap: unused DT entry\r\n"

    png = await device.screenshot()

    assert png.startswith(PNG_SIGNATURE)
    assert hashlib.sha256(png).hexdigest() == hashlib.sha256(phone.png).hexdigest()
    assert any(p.startswith("exec-out:screencap -p;") for p in server.payloads())


async def test_large_binary_screenshot_arrives_intact(device: AdbDevice, phone: FakePhone) -> None:
    """THEN a multi-hundred-kilobyte image with arbitrary bytes is returned unchanged."""
    phone.png = PNG_SIGNATURE + os.urandom(300_000)

    assert await device.screenshot() == phone.png


async def test_screenshot_without_png_raises_command_failed(
    device: AdbDevice, phone: FakePhone
) -> None:
    """THEN output with no PNG signature is a failed command, not garbage bytes."""
    phone.png = b"screencap: no display\n"

    with pytest.raises(CommandFailed, match="no PNG"):
        await device.screenshot()


async def test_ui_dump_returns_only_the_hierarchy_xml(device: AdbDevice, phone: FakePhone) -> None:
    """THEN the "UI hierchary dumped to" line is dropped and the XML returned whole."""
    xml = await device.ui_dump()

    assert xml == phone.ui_xml
    assert 'bounds="[100,200][300,260]"' in xml
    assert executed(phone) == [
        ["uiautomator", "dump", "/sdcard/amc_window_dump.xml"],
        ["cat", "/sdcard/amc_window_dump.xml"],
    ]


async def test_ui_dump_that_fails_raises_command_failed(
    device: AdbDevice, phone: FakePhone
) -> None:
    """THEN a dump that wrote no file fails with the phone's message."""
    phone.failures["uiautomator dump"] = (1, b"ERROR: could not get idle state.\n")

    with pytest.raises(CommandFailed, match="could not get idle state"):
        await device.ui_dump()


# -- a misbehaving transport ---------------------------------------------------------------


async def test_replies_split_into_tiny_tcp_segments_are_reassembled(
    server: FakeAdbServer, source: AdbSource, device: AdbDevice, phone: FakePhone
) -> None:
    """THEN inventory, shell and screenshot all work when every reply arrives 3 bytes at a time."""
    server.faults.chunk_size = 3

    [info] = await source.inventory()
    result = await device.shell("echo split", timeout=CALL_TIMEOUT)
    png = await device.screenshot()

    assert info.model == "Pixel Fake"
    assert (result.exit_code, result.output) == (0, "split\n")
    assert png == phone.png


@pytest.mark.parametrize("drop_on", ["screencap", "getprop"])
async def test_connection_dropped_mid_command_raises_device_error(
    server: FakeAdbServer, device: AdbDevice, drop_on: str
) -> None:
    """THEN a reset half-way through the output is a DeviceError, not DeviceLost or a success."""
    server.faults.drop_on = drop_on

    with pytest.raises(DeviceError, match="connection dropped") as caught:
        if drop_on == "screencap":
            await device.screenshot()
        else:
            await device.shell("getprop", timeout=CALL_TIMEOUT)

    assert not isinstance(caught.value, DeviceLost)


async def test_hanging_server_raises_device_timeout_within_the_call_timeout(
    server: FakeAdbServer,
) -> None:
    """THEN DeviceTimeout comes after about call_timeout, and the connection is closed."""
    server.faults.hang_on = "shell:"
    device = AdbSource(port=server.port, call_timeout=0.3).device(SERIAL)
    started = time.monotonic()

    with pytest.raises(DeviceTimeout, match=r"timed out after 0\.3s"):
        await device.tap(1, 1)

    assert 0.3 <= time.monotonic() - started < 1.5
    await assert_eventually(
        lambda: all(c.closed_by == "client" for c in shell_connections(server)),
        "the fake to see the client close the hung connection",
    )


async def test_shell_timeout_argument_bounds_a_slow_command(
    server: FakeAdbServer, device: AdbDevice
) -> None:
    """THEN `shell(cmd, timeout)` gives up after `timeout`, not after the call timeout."""
    started = time.monotonic()

    with pytest.raises(DeviceTimeout):
        await device.shell("sleep 10", timeout=0.2)

    assert time.monotonic() - started < 1.5


async def test_unreachable_adb_server_raises_device_error() -> None:
    """THEN a refused connection to the adb server itself is a DeviceError, not DeviceLost."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again before use: nothing listens there

    with pytest.raises(DeviceError, match="unreachable") as caught:
        await AdbSource(port=port, call_timeout=CALL_TIMEOUT).inventory()

    assert not isinstance(caught.value, DeviceLost)


# -- lost phones -----------------------------------------------------------------------


async def test_unknown_serial_raises_device_lost(source: AdbSource) -> None:
    """THEN adb's "device 'X' not found" becomes DeviceLost saying "device lost"."""
    with pytest.raises(DeviceLost, match=r"device lost.*not found"):
        await source.device("no-such-phone").tap(1, 1)


@pytest.mark.parametrize("state", ["offline", "unauthorized"])
async def test_phone_that_is_not_online_raises_device_lost(
    server: FakeAdbServer, device: AdbDevice, state: str
) -> None:
    """THEN an offline or unauthorized phone cannot be driven and reports device lost."""
    server.set_state(SERIAL, state)

    with pytest.raises(DeviceLost, match="device lost"):
        await device.key(3)


async def test_phone_removed_between_calls_raises_device_lost(
    server: FakeAdbServer, device: AdbDevice
) -> None:
    """THEN the first call works and the call after unplugging raises DeviceLost."""
    await device.tap(1, 1)
    server.remove_phone(SERIAL)

    with pytest.raises(DeviceLost, match="device lost"):
        await device.tap(2, 2)


async def test_phone_removed_mid_command_raises_device_lost(
    server: FakeAdbServer, device: AdbDevice, phone: FakePhone
) -> None:
    """THEN a command cut off because the phone left is DeviceLost, not a dropped connection."""
    call = asyncio.create_task(device.shell("echo started; sleep 10", timeout=CALL_TIMEOUT))
    await assert_eventually(lambda: bool(phone.executed), "the phone to start the command")

    server.remove_phone(SERIAL)

    with pytest.raises(DeviceLost, match="device lost"):
        await call


# -- connections are always closed ---------------------------------------------------------


async def test_cancelling_an_in_flight_shell_closes_its_connection(
    server: FakeAdbServer, device: AdbDevice, phone: FakePhone
) -> None:
    """THEN the task ends cancelled and the fake adb server sees the client close."""
    call = asyncio.create_task(device.shell("sleep 30", timeout=60.0))
    await assert_eventually(lambda: bool(phone.executed), "the phone to start sleeping")

    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call

    [connection] = shell_connections(server)
    await assert_eventually(lambda: connection.closed, "the fake to see the connection close")
    assert connection.closed_by == "client"


async def test_every_call_leaves_no_connection_open(
    server: FakeAdbServer, source: AdbSource, device: AdbDevice
) -> None:
    """THEN after successes and failures alike, every connection the driver made is closed."""
    await source.inventory()
    await device.tap(1, 1)
    await device.screenshot()
    with pytest.raises(DeviceLost):
        await source.device("gone").tap(1, 1)

    await assert_eventually(
        lambda: all(c.closed for c in server.connections), "all connections to close"
    )
    assert len(server.connections) >= 5


def test_importing_the_driver_silences_only_ppadb_escape_warnings(tmp_path: Path) -> None:
    """THEN a fresh compile of ppadb under -W error imports cleanly and no filter is left."""
    check = (
        "import warnings, host_agent.adb\n"
        "modules = [str(getattr(f[3], 'pattern', f[3])) for f in warnings.filters]\n"
        "assert not [m for m in modules if 'ppadb' in m], modules\n"
    )
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}

    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", check],
        cwd=Path(__file__).resolve().parents[1],
        env=env,
        capture_output=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr.decode()
