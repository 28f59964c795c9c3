"""The launcher's command lines mean what their fields say: each is read back by the
binary's own parser (no process started), and a launched process inherits no setting."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

from control_plane.flags import parser as control_plane_parser
from host_agent.flags import parse as host_agent_parse
from scripts.launch import (
    CONTROL_PLANE,
    HOST_AGENT,
    ControlPlaneCommand,
    CreateTokenCommand,
    HostAgentCommand,
    inherited,
)


@pytest.fixture(autouse=True)
def no_settings_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parsers take their defaults from the environment: none for these tests."""
    kept = inherited()
    for name in [k for k in os.environ if k not in kept]:
        monkeypatch.delenv(name)


def test_every_control_plane_field_reaches_the_replicas_parser(tmp_path: Path) -> None:
    """THEN `control-plane serve` parses the rendered flags back into the same values."""
    command = ControlPlaneCommand(
        listen="127.0.0.1:7001",
        database_url="postgresql://amc@127.0.0.1:5/amc",
        data_dir=tmp_path / "pg",
        insecure=True,
        tls_cert=tmp_path / "cert.pem",
        tls_key=tmp_path / "key.pem",
        lease_ttl=1.5,
        renew_interval=0.5,
        sweep_interval=0.05,
        grace=0,
        metrics_listen="127.0.0.1:9464",
        http_listen="127.0.0.1:8080",
        log_format="json",
        debug=True,
        task_retention=86400 * 30,
        forget_hosts_after=0,
        retention_interval=0.25,
        max_artifact_size=4096,
        max_app_size=300 * 1024 * 1024 + 1,
        max_connection_age=90,
    )
    argv = command.argv()
    assert argv[:2] == [str(CONTROL_PLANE), "serve"]
    args = control_plane_parser().parse_args(argv[1:])
    assert args.command == "serve"
    assert (args.listen, args.database_url, args.data_dir) == (
        "127.0.0.1:7001",
        "postgresql://amc@127.0.0.1:5/amc",
        str(tmp_path / "pg"),
    )
    assert args.insecure and args.debug
    assert (args.tls_cert, args.tls_key) == (str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))
    assert (args.lease_ttl, args.renew_interval, args.sweep_interval, args.grace) == (
        1.5,
        0.5,
        0.05,
        0.0,
    )
    assert (args.metrics_listen, args.log_format) == ("127.0.0.1:9464", "json")
    assert args.http_listen == "127.0.0.1:8080"
    assert (args.task_retention, args.forget_hosts_after) == (timedelta(days=30), None)
    assert args.retention_interval == 0.25
    assert (args.max_artifact_size, args.max_app_size) == (4096, 300 * 1024 * 1024 + 1)
    assert args.max_connection_age == timedelta(seconds=90)


def test_unset_control_plane_fields_leave_the_replicas_defaults() -> None:
    """THEN only --listen is written, and the replica keeps its own defaults."""
    argv = ControlPlaneCommand(listen="127.0.0.1:7001").argv()
    assert argv == [str(CONTROL_PLANE), "serve", "--listen", "127.0.0.1:7001"]
    defaults = control_plane_parser().parse_args(["serve"])
    args = control_plane_parser().parse_args(argv[1:])
    assert vars(args) | {"listen": defaults.listen} == vars(defaults)


def test_a_token_command_reaches_the_token_parser(tmp_path: Path) -> None:
    """THEN `control-plane tokens create` parses role, database, host and name back."""
    argv = CreateTokenCommand(
        "host", database_url="postgresql://amc@127.0.0.1:5/amc", host_id="h1", name="lab h1"
    ).argv()
    args = control_plane_parser().parse_args(argv[1:])
    assert (args.command, args.tokens_command) == ("tokens", "create")
    assert (args.role, args.database_url, args.host_id, args.name) == (
        "host",
        "postgresql://amc@127.0.0.1:5/amc",
        "h1",
        "lab h1",
    )


def test_every_host_agent_field_reaches_the_agents_config(tmp_path: Path) -> None:
    """THEN `host-agent` parses the rendered flags into a Config with the same values."""
    token_file = tmp_path / "token"
    token_file.write_text("from-the-file\n")
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    profile = tmp_path / "clean.yaml"
    profile.write_text("defaults: {reboot_every: 7}\n")
    command = HostAgentCommand(
        control_plane="127.0.0.1:7001",
        host_id="h1",
        token_file=token_file,
        ca=ca,
        tls=True,
        labels={"pool": "p", "rack": "r 2"},
        adb="10.0.0.2:5038",
        adb_timeout=3,
        simulated_devices=4,
        sim_delay=0.01,
        action_log=tmp_path / "actions.jsonl",
        drain_timeout=0,
        inventory_interval=2.5,
        acquire_wait=5,
        report_timeout=30,
        shell_timeout=7,
        metrics_listen="127.0.0.1:9465",
        log_format="json",
        log_level="DEBUG",
        debug=True,
        probe_interval=2,
        probe_timeout=0.5,
        quarantine_failures=4,
        quarantine_window=90,
        recovery_backoff=0.25,
        boot_timeout=30,
        sim_faults=tmp_path / "faults.json",
        clean_profile=profile,
        clean_baselines=tmp_path / "baselines.json",
        app_cache_dir=tmp_path / "apps",
        app_cache_size=(3 << 30) + 12345,
        appium=tmp_path / "appium",
        appium_caps='{"appium:adbExecTimeout": 60000}',
    )
    argv = command.argv()
    assert argv[0] == str(HOST_AGENT)
    config = host_agent_parse(argv[1:], env=command.env({}))
    assert (config.control_plane, config.token, config.ca, config.tls) == (
        "127.0.0.1:7001",
        "from-the-file",
        ca,
        True,
    )
    assert config.agent.host_id == "h1"
    assert dict(config.agent.labels) == {"pool": "p", "rack": "r 2"}
    assert (config.adb_host, config.adb_port, config.adb_timeout) == ("10.0.0.2", 5038, 3.0)
    assert (config.simulated_devices, config.sim_delay) == (4, 0.01)
    assert config.action_log == tmp_path / "actions.jsonl"
    assert config.sim_faults == tmp_path / "faults.json"
    agent = config.agent
    assert (agent.probe_interval, agent.probe_timeout) == (2.0, 0.5)
    assert (agent.recovery.failures, agent.recovery.window) == (4, 90.0)
    assert (agent.recovery.backoff, agent.recovery.boot_timeout) == (0.25, 30.0)
    assert (agent.drain_timeout, agent.inventory_interval, agent.acquire_wait) == (0.0, 2.5, 5.0)
    assert (agent.report_timeout, agent.shell_timeout) == (30.0, 7.0)
    assert agent.clean_profile.defaults.reboot_every == 7
    assert agent.clean_profile.path == profile
    assert agent.clean_baselines == tmp_path / "baselines.json"
    assert (agent.app_cache_dir, agent.app_cache_size) == (tmp_path / "apps", (3 << 30) + 12345)
    assert agent.appium == str(tmp_path / "appium")
    assert agent.appium_caps == {"appium:adbExecTimeout": 60000}
    assert (config.metrics_listen, config.log_format, config.log_level) == (
        "127.0.0.1:9465",
        "json",
        "DEBUG",
    )
    assert config.debug


def test_a_host_token_as_text_goes_in_the_environment_never_on_the_command_line() -> None:
    """THEN the agent reads the token, and no argument carries it."""
    command = HostAgentCommand("127.0.0.1:7001", "h1", token="secret-token", simulated_devices=1)
    assert not any("secret-token" in arg for arg in command.argv())
    assert "secret-token" not in repr(command)
    config = host_agent_parse(command.argv()[1:], env=command.env({}))
    assert config.token == "secret-token"


def test_an_insecure_agent_has_no_token() -> None:
    command = HostAgentCommand("127.0.0.1:7001", "h1", insecure=True)
    assert host_agent_parse(command.argv()[1:], env=command.env({})).token is None


def test_a_launched_process_inherits_no_setting_from_the_environment() -> None:
    """THEN AMC_*, DATABASE_URL and systemd's variables are left out; the rest is kept."""
    base = {
        "PATH": "/usr/bin",
        "PYTHONPATH": "/src",
        "AMC_ADDR": "far.example:443",
        "AMC_TLS": "1",
        "AMC_TOKEN": "someone-elses",
        "DATABASE_URL": "postgresql://elsewhere/amc",
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "WATCHDOG_USEC": "1000",
    }
    assert ControlPlaneCommand("127.0.0.1:1").env(base) == {
        "PATH": "/usr/bin",
        "PYTHONPATH": "/src",
    }
    agent = HostAgentCommand("127.0.0.1:1", "h1", token="mine")
    assert agent.env(base) == {"PATH": "/usr/bin", "PYTHONPATH": "/src", "AMC_TOKEN": "mine"}
