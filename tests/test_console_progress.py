"""The console's Task page of a running task (issue 27.8), in a real browser (Playwright on
the system's Chromium): the steps its host reported as they ended, the step running with its
time ticking, updated live as steps are kept; once the task ends, its result alone."""

from __future__ import annotations

from typing import Any

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, tap, wait_action, workflow_spec
from tests.support.agent import running_agent, status_is
from tests.test_console import DOCS, browser, farm, open_page, pytestmark
from tests.test_step_progress import progress, renew_with, step

__all__ = ["browser", "farm", "pytestmark"]


async def test_console_task_page_shows_a_running_tasks_steps_and_the_step_running(
    farm: Farm, browser: Any
) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1")
    spec = workflow_spec(login=[tap()], search=[wait_action(1)], pay=[tap()])
    task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec))
    a = await host.acquire_one("s1")
    await host.renew(a.lease_id)

    page = await open_page(browser, farm, f"/tasks/{task.task_id}", await farm.token(Role.CLIENT))
    field = page.locator("dd[data-field='progress']")
    await field.filter(has_text="0 of 3 steps done; running step 1 login for").wait_for()
    running = page.locator("table.steps tr.running-step")
    assert (await running.locator("td").nth(1).inner_text()) == "login"
    # Its time ticks between reads of the task.
    first = await running.locator(".elapsed").inner_text()
    await page.wait_for_function(
        "t => document.querySelector('tr.running-step .elapsed').textContent !== t", arg=first
    )

    # A step kept: the page, told by the server, shows it done and the next one running.
    await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))
    await field.filter(has_text="1 of 3 steps done; running step 2 search for").wait_for()
    rows = page.locator("table.steps tbody tr")
    assert await rows.count() == 2
    # Numbered from 1, as the progress line and `amc` number them.
    assert (await rows.nth(0).locator("td").all_inner_texts())[:4] == ["1", "login", "ok", "1.5s"]
    assert (await running.locator("td").all_inner_texts())[:2] == ["2", "search"]

    # The report ends it: its result is all the page shows.
    await host.c.lease.ReportResult(
        lease_pb2.ReportResultRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            outcome=lease_pb2.OUTCOME_DONE,
            result=task_pb2.TaskResult(steps=[step(0, "login"), step(1, "search"), step(2, "pay")]),
        )
    )
    await page.locator("#task-status", has_text="done").wait_for()
    await running.wait_for(state="detached")
    assert await field.count() == 0
    names = await page.locator("table.steps tbody tr td:nth-child(2)").all_inner_texts()
    assert names == ["login", "search", "pay"]
    assert page.errors == []


async def test_console_task_page_of_a_workflow_a_real_agent_runs(farm: Farm, browser: Any) -> None:
    """A real agent on simulated phones: the page shows the steps as its renewals bring
    them, while the workflow runs (the picture is README's, docs/console-task-running.png)."""
    client = await farm.client()
    source = SimulatedSource(1, delay=0.05)
    async with running_agent(farm, source, host_id="rack1-host"):
        spec = workflow_spec(
            **{
                "open the app": [launch("com.example.shop")],
                "log in": [tap(200, 230), wait_action(0.5)],
                "browse": [wait_action(60)],
                "check out": [tap(540, 1900)],
            }
        )
        task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec))
        page = await open_page(
            browser, farm, f"/tasks/{task.task_id}", await farm.token(Role.CLIENT)
        )
        field = page.locator("dd[data-field='progress']")
        await field.filter(has_text="2 of 4 steps done; running step 3 browse for").wait_for(
            timeout=30_000
        )
        names = await page.locator("table.steps tbody tr td:nth-child(2)").all_inner_texts()
        assert names == ["open the app", "log in", "browse"]
        await page.locator("#live.on").wait_for()
        await page.screenshot(path=str(DOCS / "console-task-running.png"), full_page=True)
        await client.scheduler.CancelTask(
            scheduler_pb2.CancelTaskRequest(task_id=task.task_id, reason="picture taken")
        )
        await status_is(farm, task.task_id, "cancelled")
    assert page.errors == []


def launch(package: str) -> task_pb2.Action:
    return task_pb2.Action(launch_app=task_pb2.LaunchApp(package=package))
