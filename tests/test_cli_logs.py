"""`amc logs` and the warnings `amc get` shows, as a person runs them: the real `amc`
process against a real control plane, and a real host agent on simulated phones."""

from __future__ import annotations

import pytest

from amc_common import logcat
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, tap, wait_action
from tests.support.agent import finished, running_agent, status_is, submit
from tests.test_cli import Cli
from tests.test_phone_logs import APP, crashing_spec, launch


@pytest.fixture
async def amc(farm: Farm) -> Cli:
    return Cli(farm.address, await farm.token(Role.OPERATOR))


async def test_amc_logs_prints_a_finished_tasks_log_and_amc_get_its_warnings(
    amc: Cli, farm: Farm
) -> None:
    """THEN `amc logs` prints the kept log as logcat does, with the step marks; `--level E
    --tag AndroidRuntime` only that tag's E and F lines (and the marks); `amc get` shows
    the crash as a warning on step 3 and the ANR on step 5."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1)) as agent:
        task_id = await submit(client, crashing_spec())
        await finished(agent, task_id)
        await status_is(farm, task_id, "done")
    run = await amc("logs", task_id)
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert any(x.endswith("I amc     : step 1 'launch_app' began") for x in lines)
    assert any("FATAL EXCEPTION: main" in x for x in lines)
    assert all(logcat.parse(x) or x.startswith("---------") for x in lines)
    run = await amc("logs", task_id, "--level", "E", "--tag", "AndroidRuntime")
    assert run.code == 0, run.err
    entries = [e for x in run.out.splitlines() if (e := logcat.parse(x)) and e.tag != "amc"]
    assert entries and {(e.tag, e.level) for e in entries} == {("AndroidRuntime", "E")}
    shown = await amc("get", task_id)
    assert shown.code == 0, shown.err
    assert shown.out.count("warning: ") == 2
    assert "AndroidRuntime: FATAL EXCEPTION: main" in shown.out
    assert f"ActivityManager: ANR in {APP}" in shown.out


async def test_amc_logs_follow_prints_lines_as_they_come_and_exits_when_the_attempt_ends(
    amc: Cli, farm: Farm
) -> None:
    """THEN a tap done while `amc logs --follow` runs is printed as it is logged, and the
    command exits 0 once the task ended."""
    client = await farm.client()
    source = SimulatedSource(1)
    async with running_agent(farm, source):
        spec = actions_spec(launch(), wait_action(3), tap(321, 654), wait_action(1))
        task_id = await submit(client, spec)
        await status_is(farm, task_id, "dispatched")
        running = await amc.running("logs", task_id, "--follow")
        await running.line_with("step 1 'launch_app' began", timeout=20)
        await running.line_with("(x=321.0, y=654.0)", timeout=20)
        await status_is(farm, task_id, "done")
        run = await running.finish()
    assert run.code == 0, run.err
    assert "step 4 'wait' ended" in run.out


async def test_amc_logs_refuses_bad_input_in_one_line(amc: Cli, farm: Farm) -> None:
    """THEN a priority that is none and a tag with a ':' are refused before any call
    (exit 2), a task that does not exist is NOT_FOUND, one line each."""
    run = await amc("logs", "0" * 8 + "-0000-0000-0000-" + "0" * 12, "--level", "loud")
    assert run.code == 2 and "'loud' is not a log priority" in run.assert_one_error_line()
    run = await amc("logs", "0" * 8 + "-0000-0000-0000-" + "0" * 12, "--tag", "a:b")
    assert run.code == 2 and "'a:b' is not a log tag" in run.assert_one_error_line()
    run = await amc("logs", "0" * 8 + "-0000-0000-0000-" + "0" * 12)
    line = run.assert_one_error_line()
    assert run.code != 0 and "read log" in line and "not found" in line
