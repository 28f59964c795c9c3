"""The emulator double (tests/support/fakes/emulator.py) at the real interfaces, and the
agent's console client (host_agent.emulator_console) against it: the real adb server (the
adbutils wheel's) lists the device the double registers, as it lists an emulator; its
console asks for the token, loads a snapshot in its load time and answers KO for what it
refuses; its command line is the emulator's.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from host_agent.devices import DeviceLost
from host_agent.emulator_console import Console, ConsoleError, KeptConsole, snapshot_tags
from tests.support import eventually
from tests.support.emulators import AVD, EmulatorWorld

PORT = 5602
SERIAL = f"emulator-{PORT}"
DOUBLE = [sys.executable, "-m", "tests.support.fakes.emulator"]


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[EmulatorWorld]:
    made = await EmulatorWorld.make(tmp_path, monkeypatch, load_seconds=0.3)
    try:
        yield made
    finally:
        await made.close()


async def run_double(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *DOUBLE, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


@pytest.fixture
async def emulator(world: EmulatorWorld) -> AsyncIterator[asyncio.subprocess.Process]:
    args = ["-avd", AVD, "-read-only", "-no-window", "-port", str(PORT)]
    process = await run_double(*args, "-snapshot", "default_boot", "-no-snapshot-save")
    try:
        try:
            await world.adb.wait_for_state(SERIAL, "device", within=20)
        except AssertionError:
            if process.returncode is None:
                process.kill()
            _, err = await process.communicate()
            raise AssertionError(f"{err.decode()}\n{world.read_events()}") from None
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        await process.wait()


def console(world: EmulatorWorld) -> Console:
    return Console(PORT, world.root / "home" / ".emulator_console_auth_token")


async def test_the_real_adb_server_lists_the_double_as_an_emulator_by_its_console_port(
    world: EmulatorWorld, emulator: asyncio.subprocess.Process
) -> None:
    """THEN the double registers with `host:emulator:<adb port>`: adb names it after its
    console port and runs a shell on it over the adb port."""
    assert (await world.adb.devices())[SERIAL] == "device"
    sdk = await world.adb.shell(SERIAL, "getprop ro.build.version.sdk")
    assert sdk.strip() == b"34"
    assert [e["adb_server"] for e in world.read_events("registered")] == [world.adb.port]


async def test_the_console_loads_a_snapshot_in_its_load_time_and_puts_its_files_back(
    world: EmulatorWorld, emulator: asyncio.subprocess.Process, tmp_path: Path
) -> None:
    """THEN `avd snapshot load` answers OK after the load time, and what was pushed since is
    gone (the snapshot's files are back)."""
    pushed = tmp_path / "note.txt"
    pushed.write_text("left by a lease")
    await world.adb.adb("-s", SERIAL, "push", str(pushed), "/sdcard/note.txt")
    assert await world.adb.shell(SERIAL, "cat /sdcard/note.txt") == b"left by a lease"
    began = time.monotonic()
    await console(world).load("login_screen", timeout=10)
    assert time.monotonic() - began >= 0.3
    assert b"No such file" in await world.adb.shell(SERIAL, "cat /sdcard/note.txt")
    assert [e["snapshot"] for e in world.read_events("loaded")] == ["login_screen"]


async def test_the_console_lists_snapshots_and_refuses_what_it_cannot_do(
    world: EmulatorWorld, emulator: asyncio.subprocess.Process
) -> None:
    """THEN `avd snapshot list` names the AVD's snapshots; an unknown snapshot and a save
    under -read-only are answered KO, and the console goes on answering."""
    assert await console(world).snapshots(timeout=10) == ["default_boot", "login_screen"]
    with pytest.raises(ConsoleError, match="KO: snapshot 'nope' does not exist"):
        await console(world).load("nope", timeout=10)
    with pytest.raises(ConsoleError, match="read-only"):
        await console(world).command("avd snapshot save mine", timeout=10)
    assert await console(world).command("avd name", timeout=10) == [AVD]


async def test_the_console_refuses_a_wrong_token(
    world: EmulatorWorld, emulator: asyncio.subprocess.Process, tmp_path: Path
) -> None:
    """THEN a console client with the wrong token is refused with the console's KO."""
    wrong = tmp_path / "wrong-token"
    wrong.write_text("not-it")
    with pytest.raises(ConsoleError, match="authentication"):
        await Console(PORT, wrong).command("avd name", timeout=10)


async def test_kill_over_the_console_ends_the_emulator_and_adb_drops_it(
    world: EmulatorWorld, emulator: asyncio.subprocess.Process
) -> None:
    """THEN `kill` ends the process, the adb server forgets the device, and the console is
    gone (DeviceLost)."""
    await console(world).kill(timeout=10)
    assert await asyncio.wait_for(emulator.wait(), 10) == 0
    await eventually(lambda: _gone(world), what="adb to drop the emulator")
    with pytest.raises(DeviceLost):
        await console(world).ping(timeout=5)


async def test_a_kept_console_sends_its_commands_on_one_connection_until_its_emulator_dies(
    world: EmulatorWorld, emulator: asyncio.subprocess.Process
) -> None:
    """THEN a kept console's commands, a KO among them, go on the one connection it opened
    (banner and `auth` once); once the emulator's process is gone its next command is
    DeviceLost, as a new connection's would be."""
    kept = KeptConsole(PORT, world.root / "home" / ".emulator_console_auth_token")
    try:
        await kept.load("default_boot", timeout=10)
        with pytest.raises(ConsoleError, match="does not exist"):
            await kept.load("nope", timeout=10)
        assert await kept.command("avd name", timeout=10) == [AVD]
        assert [e["event"] for e in world.read_events("console")] == ["console"]
        emulator.send_signal(signal.SIGKILL)
        await emulator.wait()
        with pytest.raises(DeviceLost):
            await kept.ping(timeout=5)
    finally:
        kept.close()


async def test_a_kept_console_connection_the_emulator_closed_while_idle_is_opened_again() -> None:
    """THEN a command after the emulator closed the kept connection (it answered, then hung
    up) goes on a new connection and is answered, not taken for the emulator's death."""
    accepted = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.write(b"Android Console: type 'help' for a list of commands\r\nOK\r\n")
        await reader.readline()
        writer.write(b"I am alive!\r\nOK\r\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    kept = KeptConsole(server.sockets[0].getsockname()[1])
    try:
        assert await kept.command("ping", timeout=5) == ["I am alive!"]
        await eventually(lambda: not kept.open, what="the emulator to close it")
        assert await kept.command("ping", timeout=5) == ["I am alive!"]
        assert accepted == 2
    finally:
        kept.close()
        server.close()


async def _gone(world: EmulatorWorld) -> bool:
    return SERIAL not in await world.adb.devices()


def test_snapshot_tags_are_the_tag_column_of_a_real_emulators_listing() -> None:
    """THEN the TAG column of `avd snapshot list` (as captured from a real emulator) is read."""
    listing = [
        "List of snapshots present on all disks:",
        "ID        TAG                 VM SIZE                DATE       VM CLOCK",
        "--        default_boot            75M 2026-09-09 11:41:45   00:10:07.753",
        "--        fixture_test            75M 2026-09-09 16:55:38   00:10:45.114",
    ]
    assert snapshot_tags(listing) == ["default_boot", "fixture_test"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["-avd", AVD, "-no-such-flag"], "unknown option: -no-such-flag"),
        (["-avd", "Nope", "-port", "5604"], "Unknown AVD name [Nope]"),
        (["-avd", AVD, "-port", "5605"], "must be an even number from 5554 to 5682"),
        (["-avd", AVD, "-read-only", "-port", "5604", "-snapshot", "gone"], "snapshot 'gone'"),
    ],
)
async def test_the_double_refuses_a_command_line_the_emulator_would_refuse(
    world: EmulatorWorld, args: list[str], said: str
) -> None:
    """THEN the double exits 1 with the emulator's error for a bad command line."""
    process = await run_double(*args)
    _, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 1
    assert said in err.decode()


async def test_a_second_writable_instance_of_one_avd_is_refused(
    world: EmulatorWorld, emulator: asyncio.subprocess.Process
) -> None:
    """THEN without -read-only a second instance of an AVD already running writable is
    refused, as the emulator refuses it (the first here runs -read-only, so it is the
    writable one's own lock that matters: two writable ones)."""
    first = await run_double("-avd", AVD, "-port", "5606", "-no-snapshot-load")
    try:
        await world.adb.wait_for_state("emulator-5606", "device", within=20)
        second = await run_double("-avd", AVD, "-port", "5608", "-no-snapshot-load")
        _, err = await asyncio.wait_for(second.communicate(), 20)
        assert second.returncode == 1
        assert "Please use -read-only flag" in err.decode()
    finally:
        first.kill()
        await first.wait()
