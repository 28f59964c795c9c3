"""What a newcomer reads on the console's pages, in a real browser (Playwright on the
system's Chromium): times in the one format `amc` prints too, durations rounded, empty
fields left out, a live indicator that tells the connection, and the Host page's buttons
that cordon, drain and uncordon a host for an operator."""

from __future__ import annotations

import asyncio
import os
import re
import sys
import uuid
from typing import Any

from amc.v1 import scheduler_pb2
from amc_cli.render import seconds as cli_seconds
from control_plane.admin_service import create_token
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, tap, wait_action
from tests.support.agent import running_agent, status_is
from tests.support.console import console_url
from tests.test_console import SEEN, browser, farm, open_page, pytestmark
from tests.test_host_operations import host_flags

__all__ = ["browser", "farm", "pytestmark"]

# A zone with a half-hour offset: a format that forgot the minutes would show.
ZONE = "Asia/Kolkata"
ISO_LOCAL = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+05:30$")


async def amc_get(farm: Farm, task_id: str, token: str) -> str:
    """`amc get TASK` as a person in ZONE runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AMC_", "GRPC_"))}
    env |= {"AMC_ADDR": farm.address, "AMC_TOKEN": token, "TZ": ZONE}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "amc_cli", "get", task_id, stdout=asyncio.subprocess.PIPE, env=env
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0
    return out.decode()


async def page_in_zone(browser: Any, farm: Farm, path: str, token: str) -> Any:
    context = await browser.new_context(viewport={"width": 1280, "height": 800}, timezone_id=ZONE)
    page = await context.new_page()
    page.set_default_timeout(SEEN)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    await page.goto(console_url(farm, path))
    await page.get_by_label("token").fill(token)
    await page.get_by_role("button", name="Use token").click()
    return page


async def test_console_and_amc_write_a_time_the_same_way_with_its_zone(
    farm: Farm, browser: Any
) -> None:
    """THEN the Task page's `created` is ISO 8601 in the browser's zone with its offset,
    the very text `amc get` prints for it in that zone."""
    token = await farm.token(Role.OPERATOR)
    client = await farm.client()
    task = await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap()))
    )
    page = await page_in_zone(browser, farm, f"/tasks/{task.task_id}", token)
    created = await page.locator("dd[data-field='created']").inner_text()
    assert ISO_LOCAL.match(created), created
    printed = await amc_get(farm, task.task_id, token)
    assert re.search(rf"^created\s+{re.escape(created)}\s*$", printed, re.MULTILINE), printed
    events = await page.locator("table.events tbody tr td:nth-child(1)").all_inner_texts()
    assert events and all(ISO_LOCAL.match(e) for e in events), events
    assert page.errors == []


async def test_console_finished_task_hides_empty_fields_and_rounds_step_durations(
    farm: Farm, browser: Any
) -> None:
    """A done task's page has no `waiting`, `deadline`, `queue timeout`, `cancel` or
    `error` rows of "-", and each step's time is rounded as `amc` rounds it (0.1s)."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, host_id="rack1-host"):
        task = await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap(), wait_action(0.3)))
        )
        await status_is(farm, task.task_id, "done")
    done = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))
    page = await open_page(browser, farm, f"/tasks/{task.task_id}", await farm.token(Role.CLIENT))
    await page.locator("#task-status", has_text="done").wait_for()
    fields = await page.locator("dl.grid dt").all_inner_texts()
    assert fields == [
        "status",
        "what",
        "submitted by",
        "where",
        "selector",
        "priority",
        "created",
        "updated",
        "finished",
    ]
    assert "-" not in await page.locator("dl.grid dd").all_inner_texts()
    took = await page.locator("table.steps tbody tr td:nth-child(4)").all_inner_texts()
    assert took == [cli_seconds(s.duration) for s in done.result.steps], took
    assert all(re.fullmatch(r"\d+\.\ds", t) for t in took), took
    assert page.errors == []


async def test_console_live_indicator_on_a_task_not_found_says_live_until_the_server_goes(
    farm: Farm, browser: Any
) -> None:
    """A task that does not exist is an answer from a live control plane: the page says
    NOT_FOUND and the indicator `live`; when the control plane stops, `offline`."""
    page = await open_page(browser, farm, f"/tasks/{uuid.uuid4()}", await farm.token(Role.OPERATOR))
    alert = page.get_by_role("alert")
    await alert.wait_for()
    assert "NOT_FOUND" in await alert.inner_text()
    await page.locator("#live.on", has_text="live").wait_for()
    assert farm.plane is not None
    await farm.plane.stop(0)
    farm.plane = None
    await page.locator("#live.off", has_text="offline").wait_for()
    assert page.errors == []


async def test_console_host_page_cordons_drains_and_uncordons_with_a_reason(
    farm: Farm, browser: Any
) -> None:
    """An operator's buttons on the Host page: each is the Admin call `amc hosts` makes,
    recorded as a host event with who and the reason typed, and the page follows."""
    assert farm.plane is not None
    _, token = await create_token(farm.plane.store, Role.OPERATOR, None, "carol")
    source = SimulatedSource(1)
    async with running_agent(farm, source, host_id="rack1-host"):
        page = await open_page(browser, farm, "/hosts/rack1-host", token)
        form = page.locator("#host-operations")
        await form.wait_for()
        assert await form.get_by_role("button").all_inner_texts() == ["Cordon", "Drain"]

        await form.get_by_label("reason").fill("swap the USB hub")
        await form.get_by_role("button", name="Cordon").click()
        await page.locator("h1 .s-cordoned").wait_for()
        assert await host_flags(farm, "rack1-host") == (True, False)
        assert await form.get_by_role("button").all_inner_texts() == ["Drain", "Uncordon"]

        await form.get_by_label("reason").fill("kernel update")
        await form.get_by_role("button", name="Drain").click()
        await page.locator("h1 .s-draining").wait_for()
        assert await host_flags(farm, "rack1-host") == (True, True)

        await form.get_by_role("button", name="Uncordon").click()
        await page.locator("tr.host-event .s-uncordon").wait_for()
        assert await host_flags(farm, "rack1-host") == (False, False)
        # Each row's cells as text, read in one go: a row's innerText has its cells'
        # tabs only while the row is laid out, which a re-render may catch it not being.
        rows = await page.locator("tr.host-event").evaluate_all(
            "rows => rows.map((r) => [...r.cells].map((c) => c.textContent))"
        )
    kinds = [row[1] for row in rows]
    assert kinds == ["uncordon", "drain", "cordon"], rows
    assert "carol (" in rows[2][3] and rows[2][4] == "swap the USB hub", rows
    assert rows[1][4] == "kernel update", rows
    assert page.errors == []


async def test_console_host_page_buttons_are_refused_to_a_client_token_as_grpc_would(
    farm: Farm, browser: Any
) -> None:
    """The Host page is an operator's: a client token gets the API's refusal, no buttons."""
    await farm.host("rack1-host", "pixel-0")
    page = await open_page(browser, farm, "/hosts/rack1-host", await farm.token(Role.CLIENT))
    await page.get_by_role("alert").wait_for()
    assert "may not call GetHost" in await page.get_by_role("alert").inner_text()
    assert await page.locator("#host-operations").count() == 0
    assert await host_flags(farm, "rack1-host") == (False, False)
