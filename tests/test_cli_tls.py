"""TLS mistakes, as a person makes them: each ends in one line that says which of `--tls`
and `--ca` to give or drop, and no process prints gRPC's own (C-core) log lines."""

from __future__ import annotations

import re
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from amc_common.channel import aio_channel
from control_plane.admin_service import create_token
from control_plane.config import Settings
from control_plane.domain import Role
from control_plane.embedded import free_port
from control_plane.server import ControlPlane, Tls
from scripts.launch import ControlPlaneCommand, HostAgentCommand
from tests.support import Farm, eventually
from tests.test_cli import Cli
from tests.test_tls import self_signed

ROOT = Path(__file__).resolve().parent.parent
# A line of gRPC's C core: `E0000 00:00:00.000000  123 file.cc:45] …`
CORE_LINE = re.compile(r"^[EWID]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\]", re.MULTILINE)


@dataclass
class TlsPlane:
    address: str
    cert: Path
    token: str


@pytest.fixture
async def tls_plane(database_url: str, tmp_path: Path) -> AsyncIterator[TlsPlane]:
    cert, key = self_signed(tmp_path)
    plane = ControlPlane(
        database_url, Settings(), listen="127.0.0.1:0", tls=Tls(cert.read_bytes(), key.read_bytes())
    )
    await plane.start()
    try:
        _, token = await create_token(plane.store, Role.CLIENT, None, "tls")
        yield TlsPlane(f"127.0.0.1:{plane.port}", cert, token)
    finally:
        await plane.stop(0)


def assert_no_core_lines(text: str) -> None:
    assert not CORE_LINE.search(text), text
    assert "Handshake failed with" not in text, text


async def test_a_plaintext_client_of_a_tls_server_is_told_to_add_tls_or_ca(
    tls_plane: TlsPlane,
) -> None:
    """Not `Socket closed`: one line saying the server speaks TLS, naming --tls and --ca."""
    run = await Cli(tls_plane.address, tls_plane.token)("list")
    assert run.code == 5, run.err
    line = run.assert_one_error_line()
    assert "serves TLS" in line and "--tls" in line and "--ca" in line, line
    assert_no_core_lines(run.err)


async def test_a_self_signed_server_without_ca_is_told_to_give_its_ca(
    tls_plane: TlsPlane,
) -> None:
    """--tls trusts the system's CAs only: the line says the certificate is not trusted and
    to give --ca; no `Handshake failed` line from gRPC's core."""
    run = await Cli(tls_plane.address, tls_plane.token)("--tls", "list")
    assert run.code == 5, run.err
    line = run.assert_one_error_line()
    assert "not trusted" in line and "--ca" in line, line
    assert_no_core_lines(run.err)
    trusted = await Cli(tls_plane.address, tls_plane.token)("--ca", str(tls_plane.cert), "list")
    assert trusted.code == 0, trusted.err


async def test_a_ca_that_did_not_sign_the_certificate_is_named(
    tls_plane: TlsPlane, tmp_path: Path
) -> None:
    """A --ca of some other CA: the line names that file as the wrong one."""
    (tmp_path / "other").mkdir()
    other, _ = self_signed(tmp_path / "other")
    run = await Cli(tls_plane.address, tls_plane.token)("--ca", str(other), "list")
    assert run.code == 5, run.err
    line = run.assert_one_error_line()
    assert f"--ca {other}" in line and "not the CA that signed it" in line, line
    assert_no_core_lines(run.err)


async def test_a_tls_client_of_a_plaintext_server_is_told_to_drop_tls(farm: Farm) -> None:
    """--tls against a server without TLS: the line says so and to drop --tls and --ca."""
    cli = Cli(farm.address, await farm.token(Role.CLIENT))
    run = await cli("--tls", "list")
    assert run.code == 5, run.err
    line = run.assert_one_error_line()
    assert "does not serve TLS" in line and "drop --tls" in line, line
    assert_no_core_lines(run.err)


async def test_no_process_prints_grpc_core_lines_on_tls_mistakes(
    database_url: str, tmp_path: Path
) -> None:
    """A TLS control plane refusing plaintext and untrusting clients, and a host agent that
    does not trust it, write only their own log lines."""
    cert, key = self_signed(tmp_path)
    address = f"127.0.0.1:{free_port()}"
    plane_command = ControlPlaneCommand(
        listen=address,
        database_url=database_url,
        insecure=True,
        tls_cert=cert,
        tls_key=key,
        log_format="json",
    )
    agent_command = HostAgentCommand(
        control_plane=address,
        host_id="h1",
        insecure=True,
        tls=True,  # the system's CAs: they do not trust the self-signed certificate
        simulated_devices=1,
        log_format="json",
    )
    plane_log, agent_log = tmp_path / "plane.log", tmp_path / "agent.log"
    plane = spawn(plane_command.argv(), quiet_unless_told(plane_command.env()), plane_log)
    agent = None
    try:
        await eventually(lambda: serving(address, cert), timeout=30, what="the control plane")
        cli = Cli(address, None)
        for args in (["list"], ["--tls", "list"]):
            assert (await cli(*args)).code == 5
        agent = spawn(agent_command.argv(), quiet_unless_told(agent_command.env()), agent_log)
        await eventually(
            lambda: "registration failed; retrying" in agent_log.read_text(),
            timeout=20,
            what="the agent's retry line",
        )
    finally:
        for proc in (agent, plane):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
    assert_no_core_lines(plane_log.read_text())
    assert_no_core_lines(agent_log.read_text())


def quiet_unless_told(env: dict[str, str]) -> dict[str, str]:
    """`env` without gRPC's logging settings: the binaries' own defaults apply."""
    return {k: v for k, v in env.items() if k not in ("GRPC_VERBOSITY", "GRPC_TRACE")}


def spawn(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


async def serving(address: str, cert: Path) -> bool:
    async with aio_channel(address, ca_file=cert) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=1
            )
        except Exception:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING
