"""A binary that cannot start says so in one line, without a traceback (unless --debug),
never with local variables, and never with a secret: no token, no database password.

Each test starts the real console script with a bad configuration carrying a
recognisable secret and reads everything it wrote to stdout and stderr."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

from amc_common.secrets import mask_url, redact
from control_plane.domain import Role
from control_plane.embedded import free_port
from scripts.launch import CONTROL_PLANE, ControlPlaneCommand, HostAgentCommand, LogFormat
from tests.support import Farm

SECRET_PASSWORD = "SECRETpw123"
UNREACHABLE_DSN = f"postgresql://amc:{SECRET_PASSWORD}@127.0.0.1:1/amc"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


async def run(
    command: ControlPlaneCommand | HostAgentCommand, timeout: float = 60, **env: str
) -> tuple[int, str]:
    """Exit code and everything written to stdout and stderr (colour codes removed); `env`
    on top of the launcher's environment."""
    proc = await asyncio.create_subprocess_exec(
        *command.argv(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**command.env(), **env},
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, ANSI.sub("", out.decode(errors="replace"))


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


def replica(**fields: Any) -> ControlPlaneCommand:
    return ControlPlaneCommand(listen=f"127.0.0.1:{free_port()}", **fields)


# -- control plane: a malformed setting ----------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        {"AMC_LEASE_TTL": "nan"},  # was a traceback ("cannot convert float NaN to integer")
        {"AMC_LEASE_TTL": "0"},
        {"AMC_RENEW_INTERVAL": "inf"},
        {"AMC_SWEEP_INTERVAL": "-1"},  # was taken
        {"AMC_RETENTION_INTERVAL": "inf"},  # was a traceback
        {"AMC_GRACE": "nan"},  # was taken
    ],
    ids=lambda env: "=".join(*env.items()),
)
async def test_control_plane_with_a_malformed_time_says_so_in_one_line(
    env: dict[str, str],
) -> None:
    """THEN exit 2 and one line naming the flag, the value and what it takes; the database
    (unreachable here) is never tried."""
    rc, output = await run(replica(database_url=UNREACHABLE_DSN), timeout=30, **env)
    assert rc == 2, output
    (line,) = lines(output)
    ((var, value),) = env.items()
    flag = "--" + var.removeprefix("AMC_").lower().replace("_", "-")
    assert line.startswith(f"control-plane serve: error: argument {flag}: "), line
    takes = ("(e.g. 15s, 1m30s, 1h)", "a duration must be 0 or more")
    assert any(t in line for t in takes) and f"'{value}'" in line, line


async def test_control_plane_renewing_no_faster_than_leases_live_is_refused_in_one_line() -> None:
    """THEN a renewal interval at or over the lease TTL (every lease would lapse between two
    renewals) ends the start with exit 2 and one line naming both flags."""
    command = replica(database_url=UNREACHABLE_DSN, lease_ttl=10, renew_interval=12)
    rc, output = await run(command, timeout=30)
    assert rc == 2, output
    (line,) = lines(output)
    assert line.startswith("control-plane: --renew-interval 12s is not below --lease-ttl 10s")


def test_control_plane_usage_errors_are_one_line() -> None:
    """THEN an unknown flag or command, or a bad choice, is one line, not the usage."""
    for argv in (["--bogus"], ["tokens"], ["tokens", "create", "--role", "nobody"]):
        done = subprocess.run(
            [str(CONTROL_PLANE), *argv], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done
        assert done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("control-plane"), done.stderr


# -- control plane: the database is not there ----------------------------------------------


@pytest.mark.parametrize("fmt", ["console", "json"])
async def test_control_plane_with_an_unreachable_database_says_so_in_one_line(
    fmt: LogFormat,
) -> None:
    """THEN it exits non-zero with one line naming the URL (password masked) and the
    cause, no traceback, and the password nowhere."""
    rc, output = await run(replica(database_url=UNREACHABLE_DSN, log_format=fmt))
    assert rc != 0
    assert SECRET_PASSWORD not in output
    assert "Traceback" not in output
    assert len(lines(output)) == 1, output
    assert "postgresql://amc:***@127.0.0.1:1/amc" in output
    assert "refused" in output.lower()
    if fmt == "json":
        event = json.loads(output)
        assert event["level"] == "error"


async def test_control_plane_database_url_from_the_environment_is_masked_too() -> None:
    """THEN DATABASE_URL is treated like --database-url: masked in the one line."""
    rc, output = await run(replica(log_format="json"), DATABASE_URL=UNREACHABLE_DSN)
    assert rc != 0
    assert SECRET_PASSWORD not in output
    assert len(lines(output)) == 1, output
    assert "postgresql://amc:***@127.0.0.1:1/amc" in output


@pytest.mark.parametrize("flag", [True, False], ids=["--debug", "AMC_DEBUG"])
async def test_control_plane_debug_shows_a_traceback_without_locals_or_secret(
    flag: bool,
) -> None:
    """THEN --debug (or AMC_DEBUG=1) adds the traceback, still without the password (the
    DSN is a local variable of several frames: no locals are shown)."""
    command = replica(database_url=UNREACHABLE_DSN, log_format="console", debug=flag)
    env = {} if flag else {"AMC_DEBUG": "1"}
    rc, output = await run(command, **env)
    assert rc != 0
    assert "Traceback" in output
    assert "ConnectionRefusedError" in output
    assert SECRET_PASSWORD not in output
    assert "postgresql://amc:***@127.0.0.1:1/amc" in output


# -- host agent: a token bound to another host ---------------------------------------------


async def _agent_with_wrong_host(
    farm: Farm, tmp_path: Path, log_format: LogFormat, debug: bool = False
) -> tuple[int, str, str]:
    token = await farm.token(Role.HOST, "lab1")
    token_file = tmp_path / "host.token"
    token_file.write_text(token + "\n")
    command = HostAgentCommand(
        farm.address,
        "lab2",
        token_file=token_file,
        simulated_devices=1,
        log_format=log_format,
        debug=debug,
    )
    rc, output = await run(command)
    return rc, output, token


def _assert_no_token(output: str, token: str) -> None:
    """Not the token, nor any 8 characters of its secret (Rich once showed the first 16)."""
    secret = token.rsplit("_", 1)[1]
    assert token not in output
    for i in range(len(secret) - 7):
        assert secret[i : i + 8] not in output, f"part of the token's secret in: {output}"


async def test_host_agent_with_another_hosts_token_console(farm: Farm, tmp_path: Path) -> None:
    """THEN one error line saying what the control plane refused and what to do; no
    traceback (it was 339 lines, locals and the token included)."""
    rc, output, token = await _agent_with_wrong_host(farm, tmp_path, "console")
    assert rc == 1
    _assert_no_token(output, token)
    assert "Traceback" not in output
    errors = [line for line in lines(output) if "[error" in line]
    assert len(errors) == 1, output
    assert "PERMISSION_DENIED" in errors[0]
    assert "this token is for host 'lab1', not 'lab2'" in errors[0]
    assert "--host-id" in errors[0]
    # Besides the error: at most the "host agent starting" line.
    assert len(lines(output)) <= 2, output


async def test_host_agent_with_another_hosts_token_json(farm: Farm, tmp_path: Path) -> None:
    """THEN every line is JSON, exactly one is the error, and none has a traceback."""
    rc, output, token = await _agent_with_wrong_host(farm, tmp_path, "json")
    assert rc == 1
    _assert_no_token(output, token)
    events = [json.loads(line) for line in lines(output)]
    errors = [e for e in events if e["level"] == "error"]
    assert len(errors) == 1, output
    assert "exception" not in errors[0]
    assert "PERMISSION_DENIED" in errors[0]["error"]
    assert len(events) <= 2, output


async def test_host_agent_debug_traceback_has_no_locals_and_no_token(
    farm: Farm, tmp_path: Path
) -> None:
    """THEN --debug shows where it failed, yet the token (a local of several frames) is
    absent: tracebacks never show local variables."""
    rc, output, token = await _agent_with_wrong_host(farm, tmp_path, "console", debug=True)
    assert rc == 1
    assert "Traceback" in output
    _assert_no_token(output, token)


async def test_host_agent_at_work_never_logs_its_token(farm: Farm) -> None:
    """THEN a token from the environment shows in no line, even at DEBUG level."""
    token = await farm.token(Role.HOST, "lab1")
    command = HostAgentCommand(
        farm.address,
        "lab1",
        token=token,
        simulated_devices=1,
        log_format="json",
        log_level="DEBUG",
    )
    proc = await asyncio.create_subprocess_exec(
        *command.argv(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=command.env(),
    )
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(60):
            while line := (await proc.stdout.readline()).decode():
                seen.append(line)
                if '"registered"' in line:
                    break
        assert any('"registered"' in line for line in seen), "".join(seen)
    finally:
        proc.terminate()
        rest, _ = await proc.communicate()
    output = "".join(seen) + rest.decode(errors="replace")
    _assert_no_token(output, token)


# -- the masking itself ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://amc:pw@db:5432/amc", "postgresql://amc:***@db:5432/amc"),
        (
            "postgres://amc:p%40ss@db/amc?sslmode=require",
            "postgres://amc:***@db/amc?sslmode=require",
        ),
        ("postgresql://amc@db/amc", "postgresql://amc@db/amc"),
        (
            "postgresql://db/amc?password=pw&sslmode=off",
            "postgresql://db/amc?password=***&sslmode=off",
        ),
        ("host=db user=amc password=pw dbname=amc", "host=db user=amc password=*** dbname=amc"),
    ],
)
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_redact_masks_tokens_and_passwords_in_any_text() -> None:
    token = "amc_0123456789abcdef0123456789abcdef_s3cr3t-Value_xyz"
    text = f"failed: Bearer {token} at postgresql://u:hunter2@h/d"
    out = redact(text)
    assert "s3cr3t-Value_xyz" not in out and "hunter2" not in out
    assert "amc_0123456789abcdef0123456789abcdef_***" in out
    assert "postgresql://u:***@h/d" in out


async def test_host_agent_with_its_metrics_port_taken_names_that_port() -> None:
    """THEN one error line naming --metrics-listen and the address in use (the control
    plane it would have served is not what failed)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        metrics = f"127.0.0.1:{taken.getsockname()[1]}"
        command = HostAgentCommand(
            control_plane="127.0.0.1:1",
            host_id="lab1",
            insecure=True,
            simulated_devices=1,
            metrics_listen=metrics,
            log_format="json",
        )
        rc, output = await run(command)
    assert rc == 1
    errors = [e for e in map(json.loads, lines(output)) if e["level"] == "error"]
    assert len(errors) == 1, output
    assert f"--metrics-listen {metrics}: Address already in use" in errors[0]["error"], output
