"""Retention settings that would break the spec are refused at start (issue 21, item 6).

- `--task-retention` below the host agent's report-retry window would delete a finished
  task while its agent may still repeat the report whose answer it lost; the repeat then
  gets "lease does not belong to this host…" (ABORTED) instead of the recorded outcome.
- `--forget-hosts-after` below twice the window in which a connected host counts as
  connected (its replica's heartbeat, `--lease-ttl`) would forget hosts that are connected.

Each test starts the real console script, as tests/test_startup_errors.py does: a value
below its floor ends it with exit 2 and one line naming the flag, the floor and why, before
any database is touched (the URL given is unreachable); a value at the floor starts."""

from __future__ import annotations

from datetime import timedelta

import pytest

from control_plane.config import AGENT_REPORT_TIMEOUT, TASK_RETENTION_FLOOR, Settings
from host_agent.config import AgentSettings
from host_agent.flags import parse
from host_agent.retry import RetryPolicy
from tests.support.replicas import Replica
from tests.test_startup_errors import UNREACHABLE_DSN, lines, replica, run


@pytest.mark.parametrize(
    ("fields", "env", "named"),
    [
        (
            {"task_retention": 90},
            {},
            ["--task-retention 1.5m", "floor of 2m", "up to 60s", "--report-timeout"],
        ),
        ({"task_retention": 1}, {}, ["--task-retention 1s", "floor of 2m", "lease conflict"]),
        ({}, {"AMC_TASK_RETENTION": "1m"}, ["--task-retention 1m", "floor of 2m"]),
        (
            {"forget_hosts_after": 20},
            {},
            ["--forget-hosts-after 20s", "floor of 30s", "--lease-ttl 15s", "heartbeat"],
        ),
        (
            {"forget_hosts_after": 5, "lease_ttl": 3},
            {},
            ["--forget-hosts-after 5s", "floor of 6s", "--lease-ttl 3s", "every 1s"],
        ),
        ({}, {"AMC_FORGET_HOSTS_AFTER": "10s"}, ["--forget-hosts-after 10s", "floor of 30s"]),
    ],
    ids=[
        "task-retention-90s",
        "task-retention-1s",
        "AMC_TASK_RETENTION-1m",
        "forget-hosts-after-20s",
        "forget-hosts-after-5s-ttl-3s",
        "AMC_FORGET_HOSTS_AFTER-10s",
    ],
)
@pytest.mark.parametrize("fmt", ["console", "json"])
async def test_a_retention_below_its_floor_is_refused_in_one_line(
    fields: dict[str, float], env: dict[str, str], named: list[str], fmt: str
) -> None:
    """THEN exit 2 and exactly one line naming the flag, its value, the floor and why; the
    database (unreachable here) is never tried."""
    rc, output = await run(
        replica(database_url=UNREACHABLE_DSN, log_format=fmt, **fields), timeout=30, **env
    )
    assert rc == 2, output
    assert len(lines(output)) == 1, output
    (line,) = lines(output)
    assert line.startswith("control-plane: "), line
    for text in named:
        assert text in line, line
    assert "unreachable" not in line and "refused the connection" not in line, line


async def test_off_is_not_below_any_floor() -> None:
    """THEN `off` for both is no refusal: the start goes on (to the unreachable database)."""
    rc, output = await run(
        replica(database_url=UNREACHABLE_DSN, task_retention=0, forget_hosts_after=0),
        timeout=30,
    )
    assert rc == 1, output
    assert "floor" not in output and "unreachable" in output, output


async def test_a_replica_starts_with_both_retentions_at_their_floors(database_url: str) -> None:
    """THEN `--task-retention 2m --forget-hosts-after 30s` (the floors at the default 15 s
    lease TTL) serve, and stop cleanly."""
    r = Replica(database_url, task_retention=120, forget_hosts_after=30)
    try:
        await r.start()
        assert r.terminate() == 0
    finally:
        r.stop()


def test_the_task_retention_floor_covers_the_agents_default_report_window() -> None:
    """The floor is a constant of the control plane (it may not import the host agent):
    it stays above the agent's default report window, which is --report-timeout and the last
    try's own deadline of at least a second (host_agent/retry.py)."""
    default = parse(["--insecure", "--host-id", "h"], env={}).agent.report_timeout
    assert default == AgentSettings(host_id="h").report_timeout == RetryPolicy().total
    assert AGENT_REPORT_TIMEOUT == timedelta(seconds=default)
    assert TASK_RETENTION_FLOOR > timedelta(seconds=default + 1)


@pytest.mark.parametrize(
    ("settings", "floor"),
    [
        (Settings(), timedelta(seconds=30)),
        (Settings(lease_ttl=timedelta(seconds=3)), timedelta(seconds=6)),
        # Heartbeats rarer than the TTL: the floor follows the heartbeat.
        (
            Settings(lease_ttl=timedelta(seconds=3), renew_interval=timedelta(seconds=10)),
            timedelta(seconds=20),
        ),
    ],
)
def test_the_forget_hosts_floor_is_twice_the_connected_window(
    settings: Settings, floor: timedelta
) -> None:
    assert settings.forget_hosts_floor == floor
