"""The wheel as an operator gets it: built (with the sdist, as `make dist` does) from the
files of a clean clone, installed into a fresh virtualenv as the README's host install does,
its three commands run, its host agent connected to its control plane, and the systemd
units verified against that install.

The wheel is built and installed once per test session (about a minute together).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import shutil
import subprocess
import tarfile
import tomllib
import zipfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

from scripts.launch import ControlPlaneCommand, HostAgentCommand, inherited
from tests.support import eventually
from tests.support.fakes.real_adb import find_adb
from tests.support.wheel import Dist

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
UNITS = ROOT / "scripts" / "systemd"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
COMMANDS = ("control-plane", "host-agent", "amc")

pytestmark = pytest.mark.timeout(600)

# The wheel and its install (`dist`, `prefix`): session fixtures of tests/support/wheel.py,
# shared through conftest.py with the walk of docs/deploy.md.


def _run(
    argv: list[str],
    *,
    timeout: float = 120,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    input: str | None = None,
) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, input=input
    )
    assert done.returncode == 0, f"{argv[:4]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout


def _clean_env() -> dict[str, str]:
    """No setting of this environment, and nothing pointing back into the checkout."""
    return {k: v for k, v in inherited().items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


# -- what the wheel and the sdist hold ------------------------------------------------------


def test_the_wheel_carries_the_generated_package_for_every_proto(dist: Dist) -> None:
    """THEN the wheel has amc.v1's messages, stubs and .pyi for each .proto; the sdist has
    the .proto files and the generator, never generated code."""
    names = set(zipfile.ZipFile(dist.wheel).namelist())
    assert {"amc/__init__.py", "amc/v1/__init__.py"} <= names
    client = {f"amc_client/{p.name}" for p in (ROOT / "amc_client").glob("*.py")}
    assert {"amc_client/__init__.py", "amc_client/farm.py"} <= client <= names, "amc_client"
    for proto in PROTOS.glob("amc/v1/*.proto"):
        module = f"amc/v1/{proto.stem}"
        assert {f"{module}_pb2.py", f"{module}_pb2.pyi", f"{module}_pb2_grpc.py"} <= names
    sql = {str(path.relative_to(ROOT)) for path in (ROOT / "control_plane").rglob("*.sql")}
    assert sql and sql <= names, "the control plane's SQL (schema, queries, migrations)"
    with tarfile.open(dist.sdist) as sdist:
        members = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    assert {"setup.py", "scripts/gen_protos.py", "protos/amc/v1/task.proto"} <= members
    assert not any(name.startswith("amc/") for name in members)


def test_the_protobuf_floor_runs_the_generated_code_of_the_wheel(dist: Dist) -> None:
    """THEN the protobuf runtime the package requires is not older than the protoc that
    generated the wheel's code, and of its major version (the code refuses any other)."""
    generated = zipfile.ZipFile(dist.wheel).read("amc/v1/task_pb2.py").decode()
    gencode = re.search(r"Protobuf Python Version: (\d+)\.(\d+)\.(\d+)", generated)
    assert gencode, "the generated code names its protobuf version"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    spec = next(d for d in project["dependencies"] if d.startswith("protobuf"))
    floor = re.search(r">=(\d+)\.(\d+)(?:\.(\d+))?,<(\d+)", spec)
    assert floor, f"protobuf is pinned as >=X.Y.Z,<X+1: {spec}"
    low = tuple(int(part or 0) for part in floor.groups()[:3])
    made = tuple(int(part) for part in gencode.groups())
    assert low >= made, f"{spec} admits runtimes older than the generated code ({made})"
    assert int(floor.group(4)) == made[0] + 1, f"{spec} admits another major version"


def test_the_installed_generated_code_matches_protos(prefix: Path, tmp_path: Path) -> None:
    """THEN every installed _pb2 module describes exactly what its .proto says now."""
    protos = sorted(str(p.relative_to(PROTOS)) for p in PROTOS.rglob("*.proto"))
    script = (
        "import base64, importlib, json, sys\n"
        "print(json.dumps({name: base64.b64encode(importlib.import_module("
        "name[:-6].replace('/', '.') + '_pb2').DESCRIPTOR.serialized_pb).decode()"
        " for name in sys.argv[1:]}))"
    )
    out = _run([str(prefix / "bin" / "python"), "-c", script, *protos], cwd=tmp_path)
    installed = {
        name: descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(data))
        for name, data in json.loads(out).items()
    }
    assert installed == _compiled(protos, tmp_path)


def _compiled(protos: list[str], tmp: Path) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """protos/ as protoc describes it (less json_name, which generated code leaves out)."""
    include = Path(protoc.__file__).parent / "_proto"
    out = tmp / "protos.pb"
    argv = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--descriptor_set_out={out}", *protos]
    assert protoc.main(argv) == 0
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file
    for file in files:
        messages = list(file.message_type)
        while messages:
            message = messages.pop()
            messages.extend(message.nested_type)
            for field in message.field:
                field.ClearField("json_name")
    return {file.name: file for file in files}


# -- the installed commands ----------------------------------------------------------------


def test_the_installed_commands_print_their_version(prefix: Path, tmp_path: Path) -> None:
    """THEN control-plane, host-agent and amc --version each print their name and version."""
    for command in COMMANDS:
        out = _run([str(prefix / "bin" / command), "--version"], cwd=tmp_path, env=_clean_env())
        assert out.strip() == f"{command} {VERSION}"


@contextlib.asynccontextmanager
async def _installed(
    command: ControlPlaneCommand | HostAgentCommand, prefix: Path, log: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """`command` run by the installed console script (not this virtualenv's), in the log's
    directory; stopped with SIGTERM (then killed) if a test leaves it running."""
    program, *args = command.argv()
    argv = [str(prefix / "bin" / Path(program).name), *args]
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            cwd=log.parent,
            env=_clean_env(),
        )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _serving_port(log: Path) -> int | None:
    """The port of the control plane's "serving" line, once that line is written whole."""
    *lines, _partial = log.read_text(errors="replace").split("\n")
    for line in lines:
        if line.startswith("{") and json.loads(line).get("event") == "control plane serving":
            return int(json.loads(line)["port"])
    return None


async def test_the_installed_host_agent_connects_with_simulated_devices(
    prefix: Path, tmp_path: Path
) -> None:
    """THEN the installed control plane (on its embedded PostgreSQL) lists the installed
    agent's host as connected, with its two simulated phones online, as the installed
    `amc hosts` shows them."""
    bin_dir = prefix / "bin"
    plane_log, agent_log = tmp_path / "control-plane.log", tmp_path / "host-agent.log"
    plane = ControlPlaneCommand(
        "127.0.0.1:0", data_dir=tmp_path / "pgdata", insecure=True, log_format="json"
    )
    async with _installed(plane, prefix, plane_log) as plane_proc:

        def port() -> int | None:
            assert plane_proc.returncode is None, plane_log.read_text()
            return _serving_port(plane_log)

        address = f"127.0.0.1:{await eventually(port, timeout=120, what='the control plane')}"
        agent = HostAgentCommand(
            address, "wheel-host", insecure=True, simulated_devices=2, log_format="json"
        )
        async with _installed(agent, prefix, agent_log) as agent_proc:

            async def connected() -> dict[str, object] | None:
                assert agent_proc.returncode is None, agent_log.read_text()
                out = await _amc(bin_dir, address, tmp_path, "hosts", "-o", "json")
                hosts = {host["host_id"]: host for host in json.loads(out)["hosts"]}
                host = hosts.get("wheel-host")
                if host is None or not host["connected"]:
                    return None
                states = [device["state"] for device in host["devices"]]
                return host if states == ["DEVICE_STATE_DEVICE"] * 2 else None

            await eventually(connected, timeout=60, interval=0.5, what="the host, connected")
            agent_proc.terminate()
            assert await asyncio.wait_for(agent_proc.wait(), 60) == 0, agent_log.read_text()
        plane_proc.terminate()
        assert await asyncio.wait_for(plane_proc.wait(), 60) == 0, plane_log.read_text()


async def _amc(bin_dir: Path, address: str, cwd: Path, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(bin_dir / "amc"),
        "--addr",
        address,
        *args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=_clean_env(),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


# -- the host install with systemd ---------------------------------------------------------


@pytest.fixture
def analyze() -> Iterator[str]:
    found = shutil.which("systemd-analyze")
    if found is None:
        pytest.skip("systemd-analyze not found (Debian package systemd)")
    yield found


def test_the_units_of_the_host_install_pass_systemd_analyze_verify(
    prefix: Path, analyze: str, tmp_path: Path
) -> None:
    """THEN `systemd-analyze verify` accepts adb.service and amc-host-agent.service without
    a warning, their paths pointed at the installed prefix, the token and an adb binary."""
    etc = tmp_path / "etc"
    etc.mkdir()
    shutil.copy(UNITS / "host-agent.env.example", etc / "host-agent.env")
    _run(["install", "-m", "0600", "/dev/stdin", str(etc / "host-agent.token")], input="t\n")
    rewrites = {"/opt/amc/": f"{prefix}/", "/etc/amc/": f"{etc}/", "/usr/bin/adb": str(find_adb())}
    units = tmp_path / "units"
    units.mkdir()
    for name in ("adb.service", "amc-host-agent.service"):
        text = (UNITS / name).read_text()
        for documented, here in rewrites.items():
            text = text.replace(documented, here)
        (units / name).write_text(text)
    done = subprocess.run(
        [analyze, "verify", str(units / "adb.service"), str(units / "amc-host-agent.service")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "", done.stderr


def test_the_units_point_at_the_documented_install() -> None:
    """THEN the agent's unit runs /opt/amc/bin/host-agent after adb.service, and the adb unit
    runs the adb server in the foreground."""
    agent = (UNITS / "amc-host-agent.service").read_text()
    assert "\nExecStart=/opt/amc/bin/host-agent\n" in agent
    assert re.search(r"^After=.*\badb\.service\b", agent, re.MULTILINE)
    adb = (UNITS / "adb.service").read_text()
    assert "\nExecStart=/usr/bin/adb server nodaemon\n" in adb
    readme = (ROOT / "README.md").read_text()
    assert "python3 -m venv /opt/amc" in readme
    assert "/opt/amc/bin/pip install agentic_mobile_control-*.whl" in readme
    assert "scripts/systemd/adb.service" in readme


def test_the_host_token_is_written_one_way_everywhere() -> None:
    """THEN each document that writes a token file (or the control plane's key or password
    file) does it with `install -m 0600` (`-D` making its folder), and none with `tee` or
    a shell redirection (which leave the file readable to all)."""
    documents = [
        ROOT / "README.md",
        ROOT / "docs" / "cli.md",
        ROOT / "docs" / "deploy.md",
        ROOT / "scripts" / "token.sh",
        UNITS / "amc-host-agent.service",
        UNITS / "amc-control-plane.service",
    ]
    for document in documents:
        text = document.read_text()
        assert re.search(r"install (-D )?-m 0600 /dev/stdin ", text), document.name
        wrong = re.search(r"\btee\b[^\n]*token|>\s*\S*token\b", text)
        assert wrong is None, f"{document.name}: {wrong and wrong.group()}"
