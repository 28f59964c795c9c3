"""`amc adb` end to end with the real adb binary: the user's adb server → the door (`amc
adb`, a subprocess) → the control plane → the real host agent → the host's adb server →
the fake phone daemon, and back."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from amc_testing.adb_client import AdbClient, AdbClientKey
from control_plane.domain import Role
from host_agent.adb import AdbSource
from tests.support import Farm
from tests.support.agent import cancel, running_agent, status_is
from tests.support.apks import OLD, ApkFile, apk_cache, old_apk
from tests.support.doors import connected, door, offline, user_key
from tests.support.fakes.adbd import FakeAdbd
from tests.support.fakes.phone import FakePhone
from tests.support.fakes.real_adb import RealAdbServer

SERIAL = "FAKE0001"


@dataclass
class Phone:
    """The fake phone, its daemon, and the host's adb server connected to it."""

    phone: FakePhone
    adbd: FakeAdbd
    server: RealAdbServer

    @property
    def serial(self) -> str:
        return self.adbd.address

    def source(self) -> AdbSource:
        return AdbSource(port=self.server.port)


@pytest.fixture
async def phone(tmp_path: Path) -> AsyncIterator[Phone]:
    fake = FakePhone(SERIAL)
    async with FakeAdbd(fake) as adbd, RealAdbServer(tmp_path / "host-adb") as server:
        await server.connect(adbd.address)
        yield Phone(fake, adbd, server)


@pytest.fixture
async def user_adb(tmp_path: Path) -> AsyncIterator[RealAdbServer]:
    async with RealAdbServer(tmp_path / "user-adb") as server:
        yield server


def door_args(user_adb: RealAdbServer, *more: str) -> tuple[str, ...]:
    return ("--adb-key", str(user_key(user_adb)), *more)


async def test_shell_push_pull_install_and_logcat_through_a_door_reach_the_phone(
    farm: Farm, phone: Phone, user_adb: RealAdbServer, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN the real adb client's shell, 10 MB push and pull, install and logcat work as on
    a USB phone, the phone saw each stream through `host:transport:` of its own serial, and
    stopping the door ends the session done."""
    token = await farm.token(Role.CLIENT)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(10 * 1024 * 1024))
    async with running_agent(farm, phone.source()):
        async with door(farm.address, token, *door_args(user_adb)) as d:
            await connected(user_adb, d.address)
            a = d.address
            assert await user_adb.shell(a, "echo hi") == b"hi\n"
            await user_adb.adb("-s", a, "push", str(big), "/sdcard/big.bin", within=90)
            assert phone.phone.files["/sdcard/big.bin"] == big.read_bytes()
            back = tmp_path / "back.bin"
            await user_adb.adb("-s", a, "pull", "/sdcard/big.bin", str(back), within=90)
            assert back.read_bytes() == big.read_bytes()
            installed = await user_adb.adb("-s", a, "install", str(old_apk.path), within=60)
            assert b"Success" in installed.stdout, installed
            assert OLD.package in phone.phone.apps.packages
            # The phone's one log, the run's: a line written through the door is in it.
            await user_adb.shell(a, "log -p w -t DoorUser 'written through the door'")
            log = await user_adb.adb("-s", a, "logcat", "-d")
            assert b" W DoorUser: written through the door\n" in log.stdout, log
            assert " W DoorUser: written through the door" in phone.phone.log.dump()
            assert await d.stop() == 0
        task_id = await _only_task(farm)
        assert await farm.status(task_id) == "done"
    assert "shell:echo hi" in phone.adbd.services
    assert any(s.startswith("exec:cmd package 'install'") for s in phone.adbd.services)


async def test_adb_forward_through_a_door_reaches_the_phones_port(
    farm: Farm, phone: Phone, user_adb: RealAdbServer
) -> None:
    """THEN a connection to the forwarded local port reaches the phone's echo port."""
    token = await farm.token(Role.CLIENT)
    async with running_agent(farm, phone.source()):
        async with door(farm.address, token, *door_args(user_adb)) as d:
            await connected(user_adb, d.address)
            local = _free_port()
            await user_adb.adb("-s", d.address, "forward", f"tcp:{local}", "tcp:7")
            reader, writer = await asyncio.open_connection("127.0.0.1", local)
            writer.write(b"ping through the door")
            await writer.drain()
            echoed = await asyncio.wait_for(reader.readexactly(21), 20)
            writer.close()
            assert echoed == b"ping through the door"
            assert await d.stop() == 0
    assert "tcp:7" in phone.adbd.services


async def test_a_cancel_mid_shell_takes_the_phone_offline_and_ends_the_session_cancelled(
    farm: Farm, phone: Phone, user_adb: RealAdbServer
) -> None:
    """THEN the running `adb shell` ends, the door's device goes offline, the door exits 9
    (cancelled) saying so, and the task is cancelled."""
    token = await farm.token(Role.CLIENT)
    client = farm.clients(token)
    async with running_agent(farm, phone.source()):
        async with door(farm.address, token, *door_args(user_adb)) as d:
            await connected(user_adb, d.address)
            shell = asyncio.ensure_future(
                user_adb.adb("-s", d.address, "shell", "sleep 60", within=60, check=False)
            )
            await _until(lambda: "sleep 60" in phone.phone.shell_commands(), "the shell to run")
            task_id = await _only_task(farm)
            await cancel(client, task_id)
            await asyncio.wait_for(shell, 30)  # plain `shell:` (no shell_v2) says no exit code
            await offline(user_adb, d.address)
            assert await d.wait() == 9
            assert "cancelled" in d.said()
        assert await status_is(farm, task_id, "cancelled") == "cancelled"


async def test_a_cancel_mid_push_fails_the_push_and_the_file_never_reaches_the_phone(
    farm: Farm, phone: Phone, user_adb: RealAdbServer, tmp_path: Path
) -> None:
    """GIVEN a push the phone stops reading mid-way, so that the door and every hop after
    it hold bytes the door answered OKAY for and the phone never took, THEN a cancel fails
    the push (never a success), the device goes offline, the door exits 9, and the phone
    has no such file, even once it reads again what was on its way."""
    token = await farm.token(Role.CLIENT)
    client = farm.clients(token)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(32 * 1024 * 1024))
    async with running_agent(farm, phone.source()):
        async with door(farm.address, token, *door_args(user_adb)) as d:
            await connected(user_adb, d.address)
            pushing = asyncio.ensure_future(
                user_adb.adb(
                    "-s", d.address, "push", str(big), "/sdcard/big.bin", within=60, check=False
                )
            )
            await _until(lambda: phone.adbd.received > 1024 * 1024, "the push to reach the phone")
            phone.adbd.reading.clear()
            task_id = await _only_task(farm)
            await cancel(client, task_id)
            pushed = await asyncio.wait_for(pushing, 30)
            await offline(user_adb, d.address)
            assert await d.wait() == 9, d.said()
            phone.adbd.reading.set()
        assert await status_is(farm, task_id, "cancelled") == "cancelled"
    assert pushed.returncode != 0, pushed
    assert b"1 file pushed" not in pushed.stdout
    assert "/sdcard/big.bin" not in phone.phone.files


async def test_a_client_token_is_refused_what_is_for_operators_and_the_phone_never_sees_it(
    farm: Farm, phone: Phone, user_adb: RealAdbServer
) -> None:
    """THEN root, remount and reboot answer why and never reach the phone; reverse fails
    with why; the session goes on (a shell works after)."""
    token = await farm.token(Role.CLIENT)
    async with running_agent(farm, phone.source()):
        async with door(farm.address, token, *door_args(user_adb)) as d:
            await connected(user_adb, d.address)
            for command in (("root",), ("remount",), ("reboot",)):
                said = await user_adb.adb("-s", d.address, *command, check=False)
                assert b"is for operators" in said.stdout + said.stderr, said
            reverse = await user_adb.adb("-s", d.address, "reverse", "tcp:1", "tcp:2", check=False)
            assert reverse.returncode != 0
            assert b"not carried" in reverse.stderr, reverse
            assert await user_adb.shell(d.address, "echo still") == b"still\n"
            assert await d.stop() == 0
    assert not [s for s in phone.adbd.services if s.startswith(("root", "remount", "reboot"))]


async def test_an_operator_token_may_open_what_is_for_operators(
    farm: Farm, phone: Phone, user_adb: RealAdbServer
) -> None:
    """THEN root: reaches the phone (whose adbd refuses it, as a production build's does)."""
    token = await farm.token(Role.OPERATOR)
    async with running_agent(farm, phone.source()):
        async with door(farm.address, token, *door_args(user_adb)) as d:
            await connected(user_adb, d.address)
            await user_adb.adb("-s", d.address, "root", check=False)
            await _until(lambda: "root:" in phone.adbd.services, "root: to reach the phone")
            assert await d.stop() == 0


async def test_the_door_never_reaches_past_its_phone(
    farm: Farm, phone: Phone, user_adb: RealAdbServer, tmp_path: Path
) -> None:
    """THEN a stream asking for the adb server's own services (another phone's transport)
    is refused by the door's control plane and its host, and nothing reaches the phone."""
    token = await farm.token(Role.OPERATOR)
    key = AdbClientKey()
    async with running_agent(farm, phone.source()):
        async with door(farm.address, token, "--adb-key", str(key.write(tmp_path / "k"))) as d:
            client = AdbClient(key)
            await client.connect("127.0.0.1", d.port)
            for service in ("host:transport:other", "host-serial:other:shell:ls", "host:kill"):
                said = await (await client.open(service)).read_all()
                assert b"is the adb server's, not the phone's" in said, said
            assert await client.shell("echo mine") == b"mine\n"
            await client.close()
            assert await d.stop() == 0
    assert not [s for s in phone.adbd.services if s.startswith("host")]


async def test_a_malformed_packet_drops_its_connection_and_changes_nothing(
    farm: Farm, phone: Phone, tmp_path: Path
) -> None:
    """THEN the door hangs up on that connection (adbd's own answer), the session goes on
    with no step recorded, and a new connection works."""
    token = await farm.token(Role.CLIENT)
    key = AdbClientKey()
    async with running_agent(farm, phone.source()):
        async with door(farm.address, token, "--adb-key", str(key.write(tmp_path / "k"))) as d:
            bad = AdbClient(key)
            await bad.connect("127.0.0.1", d.port)
            bad.send_raw(b"\x00" * 24)  # a header whose magic is wrong
            await bad.wait_closed(10)
            task_id = await _only_task(farm)
            assert await farm.status(task_id) == "dispatched"
            good = AdbClient(key)
            await good.connect("127.0.0.1", d.port)
            assert await good.shell("echo again") == b"again\n"
            await good.close()
            assert "protocol error" in d.said()
            assert await d.stop() == 0
        row = await farm.task_row(task_id)
    assert row["status"] == "done"


async def test_an_adb_server_without_the_users_key_stays_unauthorized(
    farm: Farm, phone: Phone, user_adb: RealAdbServer, tmp_path: Path
) -> None:
    """THEN another user's adb server (its own key) is never let in: `unauthorized`, and
    the phone sees nothing of it."""
    token = await farm.token(Role.CLIENT)
    async with running_agent(farm, phone.source()):
        async with door(farm.address, token, *door_args(user_adb)) as d:
            async with RealAdbServer(tmp_path / "someone-else") as other:
                await other.adb("connect", d.address)
                await other.wait_for_state(d.address, "unauthorized")
                await other.adb("-s", d.address, "shell", "echo them", check=False)
            await connected(user_adb, d.address)
            assert await user_adb.shell(d.address, "echo me") == b"me\n"
            assert await d.stop() == 0
            assert "not trusted" in d.said()
    # The agent's own commands carry its exit-code marker, its read of the run's log ends
    # `exec logcat -v threadtime …` (host_agent.adb_logcat); the door's user's, "echo me".
    ours = ("AMC_EXIT_", "; exec logcat -v threadtime -v usec")
    assert [s for s in phone.adbd.services if not s.endswith(ours[1]) and ours[0] not in s] == [
        "shell:echo me"
    ]


async def _only_task(farm: Farm) -> str:
    assert farm.db is not None
    return str(await farm.db.fetchval("SELECT task_id FROM tasks"))


async def _until(check: object, what: str, within: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    until = loop.time() + within
    while not check():  # type: ignore[operator]
        if loop.time() > until:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


__all__ = ["apk_cache", "old_apk"]
