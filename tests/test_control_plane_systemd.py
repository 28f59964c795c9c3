"""The control plane under systemd: its unit (scripts/systemd/amc-control-plane.service)
passes `systemd-analyze verify`, its settings file explains every setting, and the replica,
a real process, tells systemd READY=1 once it serves, pings the watchdog and says
STOPPING=1 when SIGTERM stops it."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from control_plane.embedded import free_port
from control_plane.flags import DATABASE_FLAGS, DATABASE_SWITCHES, SERVE_FLAGS, SERVE_SWITCHES
from scripts.launch import ControlPlaneCommand
from tests.support import eventually

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "scripts" / "systemd"
UNIT = UNITS / "amc-control-plane.service"
ENV_EXAMPLE = UNITS / "control-plane.env.example"

pytestmark = pytest.mark.timeout(120)


def settings(path: Path) -> dict[str, list[str]]:
    """The `Key=value` lines of a unit or settings file (comments left out), by key."""
    found: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            found.setdefault(key.strip(), []).append(value)
    return found


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = str(tmp_path / "notify")
    sock.bind(path)
    sock.setblocking(False)
    try:
        yield sock, path
    finally:
        sock.close()


def received(sock: socket.socket) -> list[list[str]]:
    messages = []
    while True:
        try:
            messages.append(sock.recv(4096).decode().split("\n"))
        except BlockingIOError:
            return messages


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            answer = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
        except grpc.RpcError:
            return False
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


async def test_the_replica_tells_systemd_ready_once_it_serves_pings_and_says_stopping(
    database_url: str, notify_socket: tuple[socket.socket, str]
) -> None:
    """THEN no READY=1 before its gRPC health answers SERVING, READY=1 (with a STATUS line)
    once it does, WATCHDOG=1 pings at half of WATCHDOG_USEC, and on SIGTERM STOPPING=1,
    then exit 0."""
    sock, path = notify_socket
    address = f"127.0.0.1:{free_port()}"
    command = ControlPlaneCommand(listen=address, database_url=database_url, insecure=True)
    env = command.env() | {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "200000"}
    proc = await asyncio.create_subprocess_exec(
        *command.argv(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    seen: list[list[str]] = []
    try:

        def ready() -> bool:
            if not seen or "READY=1" not in seen[-1]:
                # READY=1 is never sent ahead of serving: looked at before reading it
                up = serving(address)
                seen.extend(received(sock))
                assert up or not any("READY=1" in m for m in seen), seen
            return any("READY=1" in m for m in seen)

        await eventually(ready, timeout=60, what="READY=1")
        assert serving(address)
        (message,) = [m for m in seen if "READY=1" in m]
        assert f"STATUS=serving on {address}" in message, message

        def pings() -> int:
            seen.extend(received(sock))
            return sum("WATCHDOG=1" in m for m in seen)

        await eventually(lambda: pings() >= 2, timeout=5, what="two watchdog pings")
        assert not any("STOPPING=1" in m for m in seen)
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            _, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()[-2000:]
        seen.extend(received(sock))
        assert any("STOPPING=1" in m for m in seen), seen
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# -- the unit and its settings file ---------------------------------------------------------


def test_the_control_plane_unit_is_type_notify_restarted_and_waits_out_the_grace() -> None:
    """THEN systemd waits for READY=1 and the watchdog (above --stuck-exit, which acts first
    with every thread's stack), restarts the replica whatever ended it (operations.md: a
    supervisor that restarts it), and gives SIGTERM's stop longer than its grace."""
    unit = settings(UNIT)
    assert unit["Type"] == ["notify"] and unit["NotifyAccess"] == ["main"]
    assert unit["ExecStart"] == ["/opt/amc/bin/control-plane serve"]
    assert unit["Restart"] == ["always"]
    assert unit["KillSignal"] == ["SIGTERM"]
    env = {k: v[-1] for k, v in settings(ENV_EXAMPLE).items()}
    grace = float(env.get("AMC_GRACE", "5"))
    stuck = float(env.get("AMC_STUCK_EXIT", "30"))
    assert _seconds(unit["TimeoutStopSec"][0]) > grace + 5
    assert _seconds(unit["WatchdogSec"][0]) > stuck
    # Each host agent holds one connection: far more than the 1024 files of the default.
    assert int(unit["LimitNOFILE"][0]) >= 65536


def _seconds(text: str) -> float:
    units = {"s": 1, "min": 60}
    for suffix, factor in units.items():
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return float(text[: -len(suffix)]) * factor
    return float(text)


def test_the_settings_file_explains_every_setting_of_serve() -> None:
    """THEN each variable `control-plane serve --help` names is in control-plane.env.example
    (set, or commented out with what it does), and nothing else is."""
    known = {var for _, var, *_ in DATABASE_FLAGS + SERVE_FLAGS}
    known |= {var for _, var, _ in DATABASE_SWITCHES + SERVE_SWITCHES}
    text = ENV_EXAMPLE.read_text()
    named = {
        line.lstrip("#").partition("=")[0]
        for line in text.splitlines()
        if "=" in line and line.lstrip("#")[:1].isupper() and " " not in line.partition("=")[0]
    }
    assert known - named == set(), "not in the example"
    assert named - known == set(), "not a setting"


@pytest.fixture
def analyze() -> Iterator[str]:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze not found (Debian package systemd)")
    yield found


def test_the_control_plane_unit_passes_systemd_analyze_verify(analyze: str, tmp_path: Path) -> None:
    """THEN `systemd-analyze verify` accepts the unit without a warning, its paths pointed at
    an installed control-plane (this checkout's) and the files /etc/amc would hold."""
    etc = tmp_path / "etc"
    (etc / "tls").mkdir(parents=True)
    shutil.copy(ENV_EXAMPLE, etc / "control-plane.env")
    for name in ("control-plane.pgpass", "tls/control-plane.key"):
        (etc / name).write_text("x\n")
        (etc / name).chmod(0o600)
    rewrites = {"/opt/amc/": f"{Path(sys.executable).parent.parent}/", "/etc/amc/": f"{etc}/"}
    text = UNIT.read_text()
    for documented, here in rewrites.items():
        text = text.replace(documented, here)
    unit = tmp_path / UNIT.name
    unit.write_text(text)
    done = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr
