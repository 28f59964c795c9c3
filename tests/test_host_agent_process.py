"""The host agent as a process: the `host-agent` console script, its flags and environment,
SIGTERM drain, sd_notify to systemd, and the systemd unit itself."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from amc_common.systemd import Notifier, watchdog_interval
from control_plane.domain import Role
from host_agent.config import AgentSettings, Config
from host_agent.flag_table import GROUPS as _GROUPS
from host_agent.flag_values import duration, size
from host_agent.flags import parse
from host_agent.health import Thresholds
from host_agent.recovery import RecoverySettings
from host_agent.simulated import SimulatedSource
from scripts.launch import HOST_AGENT, HostAgentCommand
from tests.support import Farm, actions_spec, eventually, tap, wait_action
from tests.support.agent import running_agent, status_is, submit

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "scripts" / "systemd" / "amc-host-agent.service"
ENV_EXAMPLE = ROOT / "scripts" / "systemd" / "host-agent.env.example"


@asynccontextmanager
async def agent_process(
    command: HostAgentCommand, log: Path
) -> AsyncIterator[asyncio.subprocess.Process]:
    """The real console script; killed if a test leaves it running."""
    with log.open("ab") as out:
        proc = await asyncio.create_subprocess_exec(
            *command.argv(), stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=command.env()
        )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def log_events(log: Path) -> list[dict[str, object]]:
    events = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


# -- SIGTERM --------------------------------------------------------------------------------


async def test_sigterm_drain_releases_the_running_task_so_it_requeues_and_exits_0(
    farm: Farm, tmp_path: Path
) -> None:
    """THEN the process exits 0, the task is queued again with attempt 1 released, and
    nothing was reported for it."""
    token = tmp_path / "host.token"
    token.write_text(await farm.token(Role.HOST, "host-sig") + "\n")
    log = tmp_path / "agent.log"
    client = await farm.client()
    command = HostAgentCommand(
        farm.address,
        "host-sig",
        token_file=token,
        simulated_devices=1,
        sim_delay=0.01,
        drain_timeout=0.5,
        log_format="json",
    )
    async with agent_process(command, log) as proc:
        task_id = await submit(client, actions_spec(tap(), wait_action(60), tap()))
        await status_is(farm, task_id, "dispatched", within=30)
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 30)
    assert rc == 0, log.read_text()
    assert await farm.status(task_id) == "queued"
    (attempt,) = await farm.attempts(task_id)
    assert attempt["state"] == "released"
    assert [e["kind"] for e in await farm.events(task_id)].count("report") == 0
    messages = [e.get("event") for e in log_events(log)]
    assert "drain timeout: stopping running tasks" in messages
    assert "lease released" in messages


async def test_sigterm_with_nothing_running_exits_0_promptly(farm: Farm, tmp_path: Path) -> None:
    """THEN an idle agent stops at once (its Acquire long poll is abandoned) and exits 0."""
    log = tmp_path / "agent.log"
    token = await farm.token(Role.HOST, "host-idle")
    env_token = tmp_path / "t"
    env_token.write_text(token)
    command = HostAgentCommand(
        farm.address,
        "host-idle",
        token_file=env_token,
        simulated_devices=2,
        acquire_wait=30,
        log_format="json",
    )
    async with agent_process(command, log) as proc:
        await eventually(
            lambda: "registered" in [e.get("event") for e in log_events(log)],
            timeout=30,
            what="the agent to register",
        )
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.wait_for(proc.wait(), 10)
    assert rc == 0, log.read_text()


# -- flags and environment ------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--drain-timeout", "soon"],
        ["--control-plane", "no-port"],
        ["--label", "novalue"],
        ["--simulated-devices", "-1"],
        ["--log-format", "xml"],
        ["--no-such-flag"],
        ["--token-file", "/nonexistent/token"],
        ["--ca", "/nonexistent/ca.pem"],
        ["--too-hot", "nan"],
        ["--cool-again", "warm"],
        ["--battery-low", "101"],
        ["--storage-low", "1TB"],
        ["--emulator", "Pixel_8"],
        ["--emulator", "No_Such_AVD:1:2"],
        ["--emulator-budget", "lots"],
        ["--emulator-ports", "5555-5554"],
    ],
)
def test_bad_flags_exit_2_with_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """THEN the process exits 2 and says what is wrong in one line."""
    monkeypatch.setenv("AMC_TOKEN", "t")
    with pytest.raises(SystemExit) as exit_info:
        parse(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("host-agent: error: ")


def test_missing_token_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """THEN without a token the agent does not start."""
    with pytest.raises(SystemExit) as exit_info:
        parse([], env={})
    assert exit_info.value.code == 2
    assert "no host token" in capsys.readouterr().err


def test_console_script_exits_2_on_a_bad_flag() -> None:
    """THEN the installed `host-agent` script exits 2 with a one-line error."""
    done = subprocess.run(
        [str(HOST_AGENT), "--drain-timeout", "x"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "")},
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--drain-timeout" in done.stderr


def test_help_lists_every_flag_with_its_variable_in_sections() -> None:
    """THEN `host-agent --help` exits 0 and shows each flag, with the kind of value it takes
    and the variable it may come from, under the section it belongs to (a help text with %
    once ended it in a traceback)."""
    sections = _help_entries(_help())
    for title, options in _GROUPS:
        assert title in sections, f"no section {title!r}"
        for flag, var, *_ in options:
            entry = sections[title].get(flag, "")
            assert entry.endswith(f"[${var}]"), f"{flag} [${var}] not under {title!r}: {entry!r}"
    battery = sections["a phone's health: when it is held from tasks"]["--battery-low"]
    assert "below this battery % [$AMC_BATTERY_LOW]" in battery
    # A value is shown by its kind, where the flag's parser has one.
    assert battery.startswith("--battery-low PERCENT ")
    assert sections["tasks"]["--drain-timeout"].startswith("--drain-timeout DURATION ")


def _help() -> str:
    """What the installed `host-agent --help` prints, on a wide terminal; it must exit 0
    and print nothing on stderr."""
    done = subprocess.run(
        [str(HOST_AGENT), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", ""), "COLUMNS": "200"},
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return done.stdout


def _help_entries(text: str) -> dict[str, dict[str, str]]:
    """argparse's help: section title -> flag -> its entry (the flag's lines, joined). A
    title starts a line and ends with ':'; an entry starts with its flag, indented by 2."""
    sections: dict[str, dict[str, str]] = {}
    entries: dict[str, str] = {}
    flag = ""
    for line in text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            entries = sections[line[:-1]] = {}
        elif match := re.match(r"^  (--[a-z-]+)", line):
            flag = match[1]
            entries[flag] = line.strip()
        elif line.startswith("   ") and flag in entries:
            entries[flag] += " " + line.strip()
    return sections


def test_the_environment_file_example_names_every_variable_and_each_value_parses() -> None:
    """THEN scripts/systemd/host-agent.env.example explains every variable `--help` names,
    and the agent accepts each value it shows (its commented-out lines taken in)."""
    named = set(re.findall(r"\$(AMC_[A-Z_]+)", _help()))
    assert {"AMC_ADDR", "AMC_TLS", "AMC_LABELS", "AMC_DEBUG"} <= named
    example = ENV_EXAMPLE.read_text()
    settings = dict(
        line.lstrip("#").split("=", 1)
        for line in example.splitlines()
        if re.match(r"^#?AMC_[A-Z_]+=", line)
    )
    # AMC_TOKEN is the secret itself: the unit passes a file (AMC_TOKEN_FILE) instead.
    missing = named - {"AMC_TOKEN"} - set(settings)
    assert not missing, f"not in the example: {missing}"
    settings.pop("AMC_INSECURE")  # with a token below: both are shown, one is meant
    settings.pop("AMC_TOKEN_FILE")  # the unit's credential, the CA, scrcpy: host files
    settings.pop("AMC_CA")
    settings.pop("AMC_SCRCPY_SERVER")
    settings.pop("AMC_CLEAN_PROFILE")  # the example's is scripts/examples/clean-profile.yaml
    for emulators in ("AMC_EMULATORS", "AMC_EMULATOR_POOLS", "AMC_EMULATOR_BINARY"):
        settings.pop(emulators)  # an AVD, a pool file, the SDK: host files (tests below)
    config = parse([], env={**settings, "AMC_TOKEN": "t"})
    assert config.metrics_listen == settings["AMC_METRICS_LISTEN"]
    # The example's health settings are the defaults, as its comments say.
    assert config.agent.thresholds == Thresholds()


def test_environment_supplies_defaults_and_flags_win(tmp_path: Path) -> None:
    """THEN AMC_* variables configure the agent; a flag overrides its variable."""
    token = tmp_path / "token"
    token.write_text("secret\n")
    env = {
        "AMC_ADDR": "cp.example:7000",
        "AMC_TOKEN_FILE": str(token),
        "AMC_HOST_ID": "h9",
        "AMC_LABELS": "site=lab, rack=r1",
        "AMC_ADB_ADDR": "10.0.0.2:5038",
        "AMC_DRAIN_TIMEOUT": "2m",
        "AMC_SIMULATED_DEVICES": "3",
        "AMC_LOG_FORMAT": "json",
    }
    config = parse(["--label", "rack=r2", "--drain-timeout", "500ms"], env=env)
    assert config.control_plane == "cp.example:7000"
    assert config.token == "secret"
    assert config.agent.host_id == "h9"
    assert dict(config.agent.labels) == {"site": "lab", "rack": "r2"}
    assert (config.adb_host, config.adb_port) == ("10.0.0.2", 5038)
    assert config.agent.drain_timeout == 0.5
    assert config.simulated_devices == 3 and config.log_format == "json"


def test_defaults() -> None:
    """THEN with only a token: local control plane and adb, hostname as id, 30 s drain."""
    config = parse([], env={"AMC_TOKEN": "t"})
    assert config.control_plane == "127.0.0.1:50051"
    assert (config.adb_host, config.adb_port) == ("127.0.0.1", 5037)
    assert config.agent.host_id == socket.gethostname()
    assert config.agent.drain_timeout == AgentSettings(host_id="x").drain_timeout == 30.0
    assert config.simulated_devices == 0


def test_the_flags_defaults_are_the_settings_defaults() -> None:
    """THEN an agent started with no flag runs with the settings' own defaults (what tests,
    harnesses and amc_testing make with AgentSettings()): the flag table's defaults, written
    as text, do not drift from the dataclasses'."""
    config = parse([], env={"AMC_TOKEN": "t"})
    agent = config.agent
    assert agent == AgentSettings(host_id=agent.host_id)
    assert agent.thresholds == Thresholds() and agent.recovery == RecoverySettings()
    for f in dataclasses.fields(Config):
        if f.default is not dataclasses.MISSING:
            assert getattr(config, f.name) == f.default, f.name


@pytest.mark.parametrize(
    ("text", "seconds"), [("30", 30.0), ("30s", 30.0), ("500ms", 0.5), ("2m", 120.0), (".5", 0.5)]
)
def test_duration_values(text: str, seconds: float) -> None:
    assert duration(text) == pytest.approx(seconds)


def test_a_size_of_0_needs_no_unit_and_others_do() -> None:
    """`--logcat-max-bytes 0` (keep no phone log, as its help says) is taken; a size
    other than 0 without MB or GB is refused."""
    config = parse(["--logcat-max-bytes", "0"], env={"AMC_TOKEN": "t"})
    assert config.agent.logcat_max_bytes == 0
    assert size("1.5GB") == 3 << 29 and size("500MB") == 500 << 20
    with pytest.raises(ValueError):
        size("500")


# -- systemd --------------------------------------------------------------------------------


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


def received(sock: socket.socket) -> list[str]:
    messages = []
    while True:
        try:
            messages.append(sock.recv(4096).decode())
        except BlockingIOError:
            return messages


async def test_agent_notifies_systemd_ready_after_registering_and_stopping_on_drain(
    farm: Farm, notify_socket: tuple[socket.socket, str]
) -> None:
    """THEN READY=1 follows the first registration, WATCHDOG=1 pings come at half of
    WATCHDOG_USEC, and STOPPING=1 is sent when the drain begins."""
    sock, path = notify_socket
    notifier = Notifier(path, environ={"WATCHDOG_USEC": "200000"})
    seen: list[str] = []

    def count(line: str) -> int:
        seen.extend(received(sock))
        return sum(line in message.split("\n") for message in seen)

    async with running_agent(farm, SimulatedSource(1), notifier=notifier):
        await eventually(lambda: count("READY=1"), what="READY=1")
        await eventually(lambda: count("WATCHDOG=1") >= 2, timeout=5, what="two watchdog pings")
        assert count("STOPPING=1") == 0
    await eventually(lambda: count("STOPPING=1"), what="STOPPING=1")
    ready = next(m for m in seen if "READY=1" in m.split("\n"))
    assert "STATUS=1 device(s) online, 0 task(s) running" in ready.split("\n")
    notifier.close()


def test_notifier_reaches_an_abstract_socket() -> None:
    """THEN an '@' address is the Linux abstract namespace, as systemd writes it."""
    name = f"amc-test-{os.getpid()}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    try:
        notifier = Notifier(f"@{name}")
        assert notifier.ready("up")
        assert sock.recv(4096) == b"READY=1\nSTATUS=up"
        notifier.close()
    finally:
        sock.close()


def test_notifier_without_notify_socket_is_a_no_op() -> None:
    notifier = Notifier(environ={})
    assert not notifier.enabled and not notifier.ready("x") and not notifier.watchdog()


def test_watchdog_interval_is_half_the_timeout_for_this_process_only() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert (
        watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) == 15.0
    )
    assert watchdog_interval({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_interval({}) is None


def test_systemd_unit_stop_timeout_exceeds_the_drain_timeout() -> None:
    """THEN systemd waits out the drain (and the uploads and reports) before SIGKILL."""
    settings = dict(
        line.split("=", 1)
        for line in UNIT.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    env = dict(
        line.split("=", 1)
        for line in ENV_EXAMPLE.read_text().splitlines()
        if "=" in line and not line.startswith("#")
    )
    drain = duration(env["AMC_DRAIN_TIMEOUT"])
    defaults = AgentSettings(host_id="x")
    report, upload = defaults.report_timeout, defaults.upload_timeout
    assert duration(settings["TimeoutStopSec"]) > drain + upload + report
    assert settings["Type"] == "notify" and settings["KillSignal"] == "SIGTERM"
    assert settings["Restart"] == "on-failure"
