"""One step numbering everywhere: one task walked through `amc` (watch, get, artifacts,
artifact) and the console's Task page, on a real agent's simulated phone, and the same step
is the same number and name in each, from 1 (the wire's index counts from 0)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from amc.v1 import scheduler_pb2, task_pb2
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, tap, wait_action, workflow_spec
from tests.support.agent import running_agent, status_is
from tests.test_cli import Cli
from tests.test_console import browser, farm, open_page, pytestmark

__all__ = ["browser", "farm", "pytestmark"]

SCREENSHOT = task_pb2.Action(screenshot=task_pb2.Screenshot())


async def test_the_same_step_has_the_same_number_and_name_in_the_cli_and_the_console(
    farm: Farm, browser: Any, tmp_path: Path
) -> None:
    """A workflow open → evidence (a screenshot) → hold (a long wait), cancelled while it
    holds: step 3 (hold) is running and then interrupted, and step 2 (evidence) kept the
    screenshot, wherever it is shown."""
    client = await farm.client()
    amc = Cli(farm.address, await farm.token(Role.OPERATOR))
    spec = workflow_spec(open=[tap()], evidence=[SCREENSHOT], hold=[wait_action(120)])
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id="rack1"):
        task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec))
        task_id = task.task_id
        watch = await amc.running("watch", task_id)
        # While it holds: `amc watch`, `amc get` and the console's Task page.
        assert "running for" in await watch.line_with("step 3/3 hold", timeout=30)
        assert "ok in" in await watch.line_with("step 2/3 evidence  ok")
        got = await amc("get", task_id)
        assert re.search(r"2 of 3 steps done; running step 3 hold for", got.out), got.out
        page = await open_page(browser, farm, f"/tasks/{task_id}", await farm.token(Role.OPERATOR))
        progress = page.locator("dd[data-field='progress']")
        await progress.filter(has_text="2 of 3 steps done; running step 3 hold for").wait_for()
        running = page.locator("table.steps tr.running-step td")
        assert (await running.all_inner_texts())[:2] == ["3", "hold"]

        await page.get_by_role("button", name="Cancel task").click()
        await page.get_by_label("cancel reason").fill("numbering")
        await page.get_by_role("button", name="Yes, cancel it").click()
        await status_is(farm, task_id, "cancelled")
        ended = await watch.finish()
    error = "cancelled: interrupted during step 3 (hold)"
    assert error in ended.out

    # The record: `amc get`'s table and error, `amc artifacts`, `amc artifact`.
    got = await amc("get", task_id)
    steps_table = got.out[re.search(r"^\s*steps\s*$", got.out, re.M).end() :].split("\n\n")[0]  # type: ignore[union-attr]
    rows = [line.split("│") for line in steps_table.splitlines() if line.count("│") >= 4]
    assert [(r[0].strip(), r[1].strip(), r[2].strip()) for r in rows if r[0].strip()] == [
        ("1", "open", "ok"),
        ("2", "evidence", "ok"),
        ("3", "hold", "cancelled"),
    ]
    assert error in got.out
    listed = await amc("artifacts", task_id)
    (row,) = [line.split("│") for line in listed.out.splitlines() if "evidence" in line]
    assert [cell.strip() for cell in row[1:4]] == ["2", "evidence", "1"]
    wrote = await amc("artifact", task_id, "2", "-o", str(tmp_path / "evidence.png"))
    assert wrote.code == 0 and "wrote screenshot of step 2 (evidence)," in wrote.err

    # The console's record of it: the steps table, the error, the events, the screenshot.
    await page.locator("#task-status", has_text="cancelled").wait_for()
    cells = page.locator("table.steps tbody tr td:nth-child(-n+3)")
    shown = await cells.all_inner_texts()
    assert [tuple(shown[i : i + 3]) for i in range(0, len(shown), 3)] == [
        ("1", "open", "ok"),
        ("2", "evidence", "ok"),
        ("3", "hold", "cancelled"),
    ]
    assert error in await page.locator("dd[data-field='error']").inner_text()
    assert error in await page.locator("table.events").inner_text()
    shot = page.locator("[data-kind='screenshot'] img")
    assert await shot.get_attribute("alt") == "screenshot of step 2 (evidence)"
    assert page.errors == []
