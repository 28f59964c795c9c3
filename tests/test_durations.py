"""One duration grammar for every program: `control-plane`, `host-agent`, `amc` and the MCP
server read a time the same way (`15s`, `1m30s`, `1h`, `250ms`, a bare number of seconds)
and refuse a value that is not one in the same one line, naming the flag."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from amc_cli import options
from amc_cli.app import app as amc_app
from amc_client import mcp_server
from amc_common import durations
from control_plane.flags import parser as control_plane_parser
from host_agent.flags import parse as host_agent_parse

BIN = Path(sys.executable).parent

# input -> seconds, or the refusal its flag's one line carries after the flag's name. A
# refusal is the same words in every program (the grammar's), whatever the flag.
TABLE: list[tuple[str, float | str]] = [
    ("15s", 15.0),
    ("1m30s", 90.0),
    ("1h", 3600.0),
    ("250ms", 0.25),
    ("2", 2.0),
    ("1.5", 1.5),
    ("nan", "'nan' is not a duration (e.g. 15s, 1m30s, 1h)"),
    ("inf", "'inf' is not a duration (e.g. 15s, 1m30s, 1h)"),
    ("-1s", "'-1s' is negative; a duration must be 0 or more"),
    ("15x", "'15x' is not a duration (e.g. 15s, 1m30s, 1h)"),
]


def _control_plane(value: str, capsys: pytest.CaptureFixture[str]) -> float | str:
    try:
        args = control_plane_parser({}).parse_args(["serve", f"--lease-ttl={value}"])
    except SystemExit:
        return capsys.readouterr().err
    return float(args.lease_ttl)


def _control_plane_env(value: str, capsys: pytest.CaptureFixture[str]) -> float | str:
    """The same flag from its environment variable."""
    try:
        args = control_plane_parser({"AMC_GRACE": value}).parse_args(["serve"])
    except SystemExit:
        return capsys.readouterr().err
    return float(args.grace)


def _host_agent(value: str, capsys: pytest.CaptureFixture[str]) -> float | str:
    try:
        config = host_agent_parse(["--insecure", f"--acquire-wait={value}"], env={})
    except SystemExit:
        return capsys.readouterr().err
    return config.agent.acquire_wait


def _host_agent_env(value: str, capsys: pytest.CaptureFixture[str]) -> float | str:
    try:
        config = host_agent_parse(["--insecure"], env={"AMC_DRAIN_TIMEOUT": value})
    except SystemExit:
        return capsys.readouterr().err
    return config.agent.drain_timeout


def _served(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """What `mcp_server.run` is called with, instead of serving; and the connection `amc`
    read from its root flags (recorded as it is handed to the command)."""
    calls: list[dict[str, Any]] = []
    connections: list[options.Connection] = []
    real = options.connection

    def connection(ctx: Any) -> options.Connection:
        connections.append(real(ctx))
        return connections[-1]

    def run(address: str, **kwargs: Any) -> None:
        timeout = connections[-1].timeout if connections else None
        calls.append({"address": address, "timeout": timeout, **kwargs})

    monkeypatch.setattr(mcp_server, "run", run)
    monkeypatch.setattr(options, "connection", connection)
    return calls


def _mcp_server(value: str, capsys: pytest.CaptureFixture[str]) -> float | str:
    with pytest.MonkeyPatch.context() as monkeypatch:
        calls = _served(monkeypatch)
        try:
            mcp_server.main(["--address", "x:1", "--token", "t", f"--idle-timeout={value}"])
        except SystemExit:
            return capsys.readouterr().err
    return float(calls[0]["idle_timeout"])


def _amc(flag: str) -> Callable[[str, pytest.CaptureFixture[str]], float | str]:
    def parse(value: str, capsys: pytest.CaptureFixture[str]) -> float | str:
        with pytest.MonkeyPatch.context() as monkeypatch:
            calls = _served(monkeypatch)
            argv = ["--addr", "x:1", "--token", "t"]
            argv += [f"--timeout={value}", "mcp"] if flag == "--timeout" else ["mcp"]
            argv += [f"--idle-timeout={value}"] if flag == "--idle-timeout" else []
            result = CliRunner().invoke(amc_app, argv)
        if calls:
            key = "timeout" if flag == "--timeout" else "idle_timeout"
            return float(calls[0][key])
        assert result.exit_code != 0, result.output
        # What __main__ prints for the CLI's error: `amc: error: <message>`.
        return f"amc: error: {result.exception}"

    return parse


# The flags whose use bounds them further (a session's idle timeout: the control plane takes
# 1s to 1h) refuse a duration past their range in one line of their own, after the grammar.
RANGES = {
    "amc mcp --idle-timeout": mcp_server.IDLE,
    "python -m amc_client.mcp_server --idle-timeout": mcp_server.IDLE,
}

PROGRAMS: dict[str, tuple[str, Callable[[str, pytest.CaptureFixture[str]], float | str]]] = {
    "control-plane --lease-ttl": ("--lease-ttl", _control_plane),
    "control-plane $AMC_GRACE": ("--grace", _control_plane_env),
    "host-agent --acquire-wait": ("--acquire-wait", _host_agent),
    "host-agent $AMC_DRAIN_TIMEOUT": ("--drain-timeout", _host_agent_env),
    "amc --timeout": ("--timeout", _amc("--timeout")),
    "amc mcp --idle-timeout": ("--idle-timeout", _amc("--idle-timeout")),
    "python -m amc_client.mcp_server --idle-timeout": ("--idle-timeout", _mcp_server),
}


@pytest.mark.parametrize(("text", "expected"), TABLE, ids=[t for t, _ in TABLE])
@pytest.mark.parametrize("program", list(PROGRAMS))
def test_every_program_reads_a_duration_the_same_way(
    program: str, text: str, expected: float | str, capsys: pytest.CaptureFixture[str]
) -> None:
    """THEN each program's flag parser gives the same seconds for the same text, and refuses
    the same texts in one line naming the flag, with the same words; a flag with a range
    (RANGES) refuses a duration past it in one line too."""
    flag, parse = PROGRAMS[program]
    got = parse(text, capsys)
    low, high = RANGES.get(program, (0.0, float("inf")))
    if isinstance(expected, float) and not low <= expected <= high:
        expected = f"{text!r} is out of range"
    if isinstance(expected, float):
        assert got == pytest.approx(expected), got
        return
    assert isinstance(got, str), f"{text!r} was taken as {got}"
    lines = got.strip().splitlines()
    assert f"{flag}: {expected}" in lines[-1], got
    # The MCP server's parser is argparse's own: its usage comes before the line.
    assert len(lines) == 1 or program.startswith("python -m"), got


@pytest.mark.parametrize("program", ["control-plane --lease-ttl", "amc --timeout"])
def test_a_flag_that_needs_a_time_refuses_zero(
    program: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flag, parse = PROGRAMS[program]
    got = parse("0s", capsys)
    assert isinstance(got, str) and f"{flag}: '0s' must be above 0" in got, got


def test_the_host_agent_keeps_its_positive_rule_and_lets_a_drain_be_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    got = _host_agent("0", capsys)
    assert isinstance(got, str) and "--acquire-wait must be positive" in got, got
    assert _host_agent_env("0", capsys) == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30d", 30 * 86400.0),
        ("1d12h", 36 * 3600.0),
        ("90s", 90.0),
        ("1m30s", 90.0),
        ("off", None),
        ("0", None),
        ("30", "'30' has no unit, and a bare number is not read as seconds here"),
        ("nan", "'nan' is not a duration (e.g. 30d, 12h, 1m30s, or off)"),
        ("-1d", "'-1d' is negative; a duration must be 0 or more"),
        ("7 days", "'7 days' is not a duration (e.g. 30d, 12h, 1m30s, or off)"),
    ],
)
def test_the_retention_flags_take_the_grammar_with_a_unit_or_off(
    text: str, expected: float | str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    """THEN --task-retention reads the same grammar; `off` and zero turn it off, and a bare
    number is refused (seconds or days? a guess could delete history)."""
    try:
        kept = control_plane_parser({}).parse_args(["serve", f"--task-retention={text}"])
    except SystemExit:
        err = capsys.readouterr().err
        assert isinstance(expected, str) and f"--task-retention: {expected}" in err, err
        return
    value = kept.task_retention
    assert (None if value is None else value.total_seconds()) == expected


def test_a_spec_file_duration_is_the_same_grammar() -> None:
    """THEN `amc`'s spec files read durations with the same function."""
    assert durations.parse_duration("1m30s").ToNanoseconds() == 90 * 10**9
    assert durations.parse_duration(1.5).ToNanoseconds() == 15 * 10**8
    with pytest.raises(durations.DurationError, match="'15x' is not a duration"):
        durations.parse_duration("15x")


@pytest.mark.parametrize(
    "argv",
    [
        [str(BIN / "control-plane"), "serve", "--help"],
        [str(BIN / "host-agent"), "--help"],
        [str(BIN / "amc"), "--help"],
        [sys.executable, "-m", "amc_client.mcp_server", "--help"],
    ],
    ids=["control-plane", "host-agent", "amc", "mcp_server"],
)
def test_each_program_s_help_says_the_grammar(argv: list[str]) -> None:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", ""), "COLUMNS": "300"},
    )
    assert done.returncode == 0, done.stderr
    assert durations.GRAMMAR in " ".join(done.stdout.split()), done.stdout
