"""`amc adb` on `make run`'s simulated phones: the real adb client, through the door, the
control plane and the real host agent, to a simulated phone that answers itself; and how
a door's session waits, idles and ends."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from amc.v1 import task_pb2
from amc_cli.adb_session import _ended
from amc_testing.adb_client import AdbClient, AdbClientKey
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, eventually
from tests.support.agent import cancel, running_agent, short_ttl_farm, status_is
from tests.support.apks import OLD, ApkFile, apk_cache, old_apk
from tests.support.doors import connected, door, offline, user_key
from tests.support.fakes.real_adb import RealAdbServer
from tests.support.fakes.tcp_proxy import TcpProxy
from tests.test_cleaning import cleaned_once, cleaning_settings
from tests.test_device_health import is_in

__all__ = ["apk_cache", "old_apk"]


@pytest.fixture
async def user_adb(tmp_path: Path) -> AsyncIterator[RealAdbServer]:
    async with RealAdbServer(tmp_path / "user-adb") as server:
        yield server


async def test_adb_works_on_a_simulated_phone_through_its_door(
    farm: Farm, user_adb: RealAdbServer, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN shell, push and pull of 10 MB, install, logcat and forward answer as the fake
    phone does, each stream is an `adb` action of the phone, and the session ends done."""
    token = await farm.token(Role.CLIENT)
    source = SimulatedSource(1)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(10 * 1024 * 1024))
    async with running_agent(farm, source):
        async with door(farm.address, token, "--adb-key", str(user_key(user_adb))) as d:
            await connected(user_adb, d.address)
            a = d.address
            devices = await user_adb.adb("devices", "-l")
            assert b"model:Simulated" in devices.stdout, devices
            assert await user_adb.shell(a, "echo hello") == b"hello\n"
            await user_adb.adb("-s", a, "push", str(big), "/sdcard/big.bin", within=90)
            assert source.apps["sim-0"].files["/sdcard/big.bin"] == big.read_bytes()
            back = tmp_path / "back.bin"
            await user_adb.adb("-s", a, "pull", "/sdcard/big.bin", str(back), within=90)
            assert back.read_bytes() == big.read_bytes()
            installed = await user_adb.adb("-s", a, "install", str(old_apk.path), within=60)
            assert b"Success" in installed.stdout, installed
            assert OLD.package in source.apps["sim-0"].packages
            # The phone's one log, the run's: a line written through the door is in it.
            await user_adb.shell(a, "log -p w -t DoorUser 'written through the door'")
            log = await user_adb.adb("-s", a, "logcat", "-d")
            assert b" W DoorUser: written through the door\n" in log.stdout, log
            assert " W DoorUser: written through the door" in source.logs["sim-0"].dump()
            local = _free_port()
            await user_adb.adb("-s", a, "forward", f"tcp:{local}", "tcp:7")
            reader, writer = await asyncio.open_connection("127.0.0.1", local)
            writer.write(b"echo me")
            assert await asyncio.wait_for(reader.readexactly(7), 20) == b"echo me"
            writer.close()
            assert await d.stop() == 0
        task_id = await _only_task(farm)
        assert await status_is(farm, task_id, "done") == "done"
    services = [r.args["service"] for r in source.actions_for("sim-0") if r.action == "adb"]
    assert "shell:echo hello" in services and "sync:" in services and "tcp:7" in services


async def test_an_open_stream_keeps_a_door_from_its_idle_timeout_and_then_it_idles_out(
    farm: Farm, tmp_path: Path
) -> None:
    """THEN while a logcat follows the log the session outlives its 2-second idle timeout;
    once it is closed, the session ends failed "idle timeout", the door hangs up and exits
    8 (failed)."""
    token = await farm.token(Role.CLIENT)
    key = AdbClientKey()
    source = SimulatedSource(1)
    async with running_agent(farm, source):
        args = ("--adb-key", str(key.write(tmp_path / "k")), "--idle-timeout", "2s")
        async with door(farm.address, token, *args) as d:
            client = AdbClient(key)
            await client.connect("127.0.0.1", d.port)
            following = await client.open("shell:logcat")
            task_id = await _only_task(farm)
            await asyncio.sleep(3.5)  # longer than the idle timeout, a stream open throughout
            assert await farm.status(task_id) == "dispatched"
            source.logs["sim-0"].write("I", "Followed", "a line the phone wrote")
            said = b" I Followed: a line the phone wrote\n"
            assert said in await following.read_until(said, within=20)
            following.close()
            await client.wait_closed(within=20)
            assert await d.wait() == 8
            assert "idle timeout" in d.said()
        row = await farm.task_row(task_id)
    assert (row["status"], row["error"]) == ("failed", "idle timeout")


async def test_a_cancel_takes_a_simulated_phone_offline_mid_shell(
    farm: Farm, user_adb: RealAdbServer
) -> None:
    """THEN the running shell ends, the device goes offline, the phone's stream ended no
    later than the task did, and the door exits 9."""
    token = await farm.token(Role.CLIENT)
    client = farm.clients(token)
    source = SimulatedSource(1)
    async with running_agent(farm, source):
        async with door(farm.address, token, "--adb-key", str(user_key(user_adb))) as d:
            await connected(user_adb, d.address)
            shell = asyncio.ensure_future(
                user_adb.adb("-s", d.address, "shell", "sleep 60", within=60, check=False)
            )
            task_id = await _only_task(farm)
            await asyncio.sleep(0.5)
            await cancel(client, task_id)
            await asyncio.wait_for(shell, 30)
            await offline(user_adb, d.address)
            assert await d.wait() == 9
        await status_is(farm, task_id, "cancelled")
        row = await farm.task_row(task_id)
    adb = [r for r in source.actions_for("sim-0") if r.action == "adb"]
    (sleeping,) = [r for r in adb if r.args["service"] == "shell:sleep 60"]
    assert sleeping.outcome == "cancelled"
    assert sleeping.ended_wall <= row["finished_at"].timestamp()


async def test_a_door_stopped_before_its_phone_came_withdraws_its_session(farm: Farm) -> None:
    """THEN the queued session is cancelled (nothing ran) and the door exits 130."""
    token = await farm.token(Role.CLIENT)
    async with door(farm.address, token, "--label", "model=none", ready=False) as d:
        await eventually(lambda: _count(farm), timeout=20, what="the door's session")
        assert await d.stop() == 130
    row = await farm.task_row(await _only_task(farm))
    assert row["status"] == "cancelled"


async def test_a_port_in_use_is_refused_before_anything_is_queued(farm: Farm) -> None:
    """THEN one line naming the flag, exit 2, and no task."""
    token = await farm.token(Role.CLIENT)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        async with door(farm.address, token, "--port", str(port), ready=False) as d:
            assert await d.wait() == 2
    assert f"amc: error: --port {port}: cannot listen on 127.0.0.1: address already in use\n" in (
        d.said()
    )
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 0


async def test_a_lost_lease_takes_the_phone_offline_and_ends_the_door_failed(
    database_url: str, tmp_path: Path
) -> None:
    """GIVEN a door with a shell running and its host cut off from the control plane (its
    connection frozen: no renewal arrives) THEN the host fences itself and the lease
    expires: the shell on the phone is stopped no later than the task ended, the door hangs
    up on its adb client (the device goes offline), exits 8, and the session is failed
    "lease lost"."""
    key = AdbClientKey()
    source = SimulatedSource(1)
    async with short_ttl_farm(database_url) as farm:
        assert farm.plane is not None
        proxy = await TcpProxy("127.0.0.1", farm.plane.port).start()
        token = await farm.token(Role.CLIENT)
        async with running_agent(farm, source, address=proxy.address):
            async with door(farm.address, token, "--adb-key", str(key.write(tmp_path / "k"))) as d:
                client = AdbClient(key)
                await client.connect("127.0.0.1", d.port)
                assert await client.shell("echo before", within=20) == b"before\n"
                await client.open("shell:sleep 60")  # once the phone's end opened it
                task_id = await _only_task(farm)
                frozen = proxy.freeze_after("up", b"")
                await eventually(frozen.is_set, what="the host's connection frozen")
                await client.wait_closed(within=30)
                assert await d.wait() == 8
                assert "lease lost" in d.said()
            row = await farm.task_row(task_id)
            proxy.cut()
        await proxy.stop()
    assert row["status"] == "failed" and row["error"].startswith("lease lost"), dict(row)
    adb = [r for r in source.actions_for("sim-0") if r.action == "adb"]
    (sleeping,) = [r for r in adb if r.args["service"] == "shell:sleep 60"]
    assert sleeping.ended_wall <= row["finished_at"].timestamp()
    assert client.closed_at is not None
    assert client.closed_at - row["finished_at"].timestamp() < 5


async def test_a_phone_used_through_a_door_is_cleaned_after_its_session(
    farm: Farm, user_adb: RealAdbServer, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN what the door left on the phone (a pushed file, an installed app) is gone once
    its session ended: the phone is cleaned as after any lease, and ready again."""
    source = SimulatedSource(1)
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"left behind")
    token = await farm.token(Role.CLIENT)
    async with running_agent(farm, source, **cleaning_settings()) as agent:
        await cleaned_once(farm, agent)
        async with door(farm.address, token, "--adb-key", str(user_key(user_adb))) as d:
            await connected(user_adb, d.address)
            await user_adb.adb("-s", d.address, "push", str(notes), "/sdcard/notes.txt")
            await user_adb.adb("-s", d.address, "install", str(old_apk.path), within=60)
            assert "/sdcard/notes.txt" in source.apps["sim-0"].files
            assert OLD.package in source.apps["sim-0"].packages
            assert await d.stop() == 0
        task_id = await _only_task(farm)
        assert await status_is(farm, task_id, "done") == "done"
        await eventually(
            lambda: (
                "/sdcard/notes.txt" not in source.apps["sim-0"].files
                and OLD.package not in source.apps["sim-0"].packages
            ),
            what="the door's leftovers cleaned",
        )
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the phone ready again")


async def _only_task(farm: Farm) -> str:
    assert farm.db is not None
    return str(await farm.db.fetchval("SELECT task_id FROM tasks"))


async def _count(farm: Farm) -> int:
    assert farm.db is not None
    return int(await farm.db.fetchval("SELECT count(*) FROM tasks"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _EndedPhone:
    """A session whose lease ran out as its user stopped the door: closing it returns the
    end the farm had recorded."""

    def __init__(self, task: task_pb2.Task) -> None:
        self.task, self.task_id = task, task.task_id

    async def close(self) -> task_pb2.Task:
        return self.task

    def abandon(self) -> None:
        raise AssertionError("a session the farm ended is not abandoned")


class _Recorded:
    """The farm's word on the session: its task, finished as recorded."""

    def __init__(self, task: task_pb2.Task) -> None:
        self.task = task

    async def wait(self, task_id: str, timeout: float | None = None) -> task_pb2.Task:
        return self.task


@pytest.mark.parametrize(
    ("status", "error", "code", "said"),
    [
        (task_pb2.TASK_STATUS_DONE, "", 0, "done"),
        (task_pb2.TASK_STATUS_FAILED, "lease lost: it expired", 8, "lease lost"),
        (task_pb2.TASK_STATUS_CANCELLED, "", 9, "cancelled"),
    ],
)
async def test_a_door_its_user_stopped_exits_with_the_end_the_farm_recorded(
    status: int, error: str, code: int, said: str
) -> None:
    """THEN a Ctrl-C that came as the lease ran out (or a cancel landed) exits 8 (or 9) and
    says so; only a session that ended done exits 0."""
    task = task_pb2.Task(task_id="t", status=status, result=task_pb2.TaskResult(error=error))
    told: list[str] = []
    phone: Any = _EndedPhone(task)
    assert await _ended(_Recorded(task), phone, "the door closed", True, told.append) == code  # type: ignore[arg-type]
    assert said in told[0], told


async def test_a_door_whose_sessions_end_the_farm_did_not_say_exits_unavailable() -> None:
    """THEN a door stopped by its user whose session's end never came (its call broke and
    the farm did not answer in time) exits 5, saying the end is unknown: not 8, failed."""
    unknown = task_pb2.Task(task_id="t")
    told: list[str] = []
    phone: Any = _EndedPhone(unknown)
    assert await _ended(_Recorded(unknown), phone, "the door closed", True, told.append) == 5  # type: ignore[arg-type]
    assert "did not say how session t ended" in told[0], told


async def test_a_door_whose_call_broke_as_the_farm_ended_the_session_exits_with_that_end() -> None:
    """THEN a door's call that broke as a cancel landed (its host's end came first) exits 9
    and says the session was cancelled, not that it was abandoned."""
    task = task_pb2.Task(task_id="t", status=task_pb2.TASK_STATUS_CANCELLED)
    told: list[str] = []
    phone: Any = _EndedPhone(task)
    broke = "the door's call ended: CANCELLED: Received RST_STREAM"
    assert await _ended(_Recorded(task), phone, broke, False, told.append) == 9  # type: ignore[arg-type]
    assert "cancelled" in told[0], told
