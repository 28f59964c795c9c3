"""The Task page's Log tab in a real browser (Playwright on the system's Chromium), against
a real control plane and a real host agent on simulated phones: a finished task's kept
log with its step marks and its crash standing out, filtered by priority and tag; a
running task's log followed live; another team's task refused; and the route under the
tab refusing bad input with the gRPC code and message."""

from __future__ import annotations

import uuid
from typing import Any

import aiohttp
import pytest

from amc_common import logcat
from control_plane.admin_service import create_token
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, tap, wait_action
from tests.support.agent import finished, running_agent, status_is, submit
from tests.support.console import console_url
from tests.test_console import SEEN, browser, farm, open_page, pytestmark
from tests.test_phone_logs import crashing_spec, launch

__all__ = ["browser", "farm", "pytestmark"]


async def open_log(page: Any) -> Any:
    await page.locator("#log-tab summary").click()
    return page.locator("#log-lines")


async def shown(page: Any) -> list[str]:
    return [x.rstrip("\n") for x in await page.locator("#log-lines .log-line").all_inner_texts()]


async def test_a_finished_tasks_log_shows_its_marks_and_crash_and_filters_on_the_server(
    farm: Farm, browser: Any
) -> None:
    """THEN the Steps table shows the crash and the ANR as their steps' warnings; the tab
    shows the kept log, its step marks and the crash styled apart; E and above leaves only
    E and F lines and the marks; the AndroidRuntime tag only its lines."""
    token = await farm.token(Role.OPERATOR)
    async with running_agent(farm, SimulatedSource(1)) as agent:
        task_id = await submit(await farm.client(), crashing_spec())
        await finished(agent, task_id)
        await status_is(farm, task_id, "done")
    page = await open_page(browser, farm, f"/tasks/{task_id}", token)
    await page.locator(".step-warning").first.wait_for()
    warned = page.locator("table.steps tr", has=page.locator(".step-warning"))
    assert await warned.count() == 2  # the crash's step and the ANR's
    assert "FATAL EXCEPTION: main" in await warned.first.locator(".step-warning").inner_text()
    lines = await open_log(page)
    await lines.locator(".mark", has_text="step 5 'shell' ended").wait_for()
    flag = page.locator(".log-line.flag").first
    assert "FATAL EXCEPTION: main" in await flag.inner_text()
    await page.locator("#log-state", has_text="end of the log").wait_for()
    everything = await shown(page)
    await page.get_by_label("log priority").select_option("E")
    await page.locator("#log-state", has_text="end of the log").wait_for()
    errors = await shown(page)
    assert 0 < len(errors) < len(everything)
    entries = [e for x in errors if (e := logcat.parse(x))]
    assert {e.level for e in entries if e.tag != "amc"} <= {"E", "F"}
    assert sum(e.tag == "amc" for e in entries) >= 10
    await page.get_by_label("log priority").select_option("")
    await page.get_by_label("log tag").fill("AndroidRuntime")
    await page.get_by_role("button", name="Read").click()
    await page.locator("#log-state", has_text="end of the log").wait_for()
    tagged = [e for x in await shown(page) if (e := logcat.parse(x)) and e.tag != "amc"]
    assert tagged and {e.tag for e in tagged} == {"AndroidRuntime"}
    assert page.errors == []


async def test_a_running_tasks_log_is_followed_live_in_the_tab(farm: Farm, browser: Any) -> None:
    """THEN with the tab open on a running task (follow on by itself), a tap done later
    shows as it is logged, and the tab says when the attempt ended."""
    token = await farm.token(Role.OPERATOR)
    source = SimulatedSource(1)
    async with running_agent(farm, source):
        spec = actions_spec(launch(), wait_action(4), tap(321, 654), wait_action(1))
        task_id = await submit(await farm.client(), spec)
        await status_is(farm, task_id, "dispatched")
        page = await open_page(browser, farm, f"/tasks/{task_id}", token)
        assert await page.get_by_label("follow the log").is_checked()
        lines = await open_log(page)
        await page.locator("#log-state", has_text="following").wait_for()
        await lines.locator(".mark", has_text="step 1 'launch_app' began").wait_for()
        await lines.locator(".log-line", has_text="ACTION_UP (x=321.0, y=654.0)").wait_for()
        await status_is(farm, task_id, "done")
        await page.locator("#log-state", has_text="the attempt ended").wait_for(timeout=SEEN)
    assert page.errors == []


async def test_another_teams_task_log_is_refused_in_the_tab(farm: Farm, browser: Any) -> None:
    """THEN a client token of another team sees PERMISSION_DENIED and no line."""
    assert farm.plane is not None
    _, submitter = await create_token(farm.plane.store, Role.CLIENT, None, "test", "qa")
    _, stranger = await create_token(farm.plane.store, Role.CLIENT, None, "test", "web")
    async with running_agent(farm, SimulatedSource(1)) as agent:
        task_id = await submit(farm.clients(submitter), actions_spec(tap()))
        await finished(agent, task_id)
    page = await open_page(browser, farm, f"/tasks/{task_id}", stranger)
    await open_log(page)
    state = page.locator("#log-state", has_text="PERMISSION_DENIED")
    await state.wait_for()
    assert "only its team and operators may read its phone's log" in await state.inner_text()
    assert await shown(page) == []


@pytest.mark.parametrize(
    ("query", "status", "code", "words"),
    [
        ("?level=loud", 400, "INVALID_ARGUMENT", "min_level: 'loud' is not a log priority"),
        ("?tag=a:b", 400, "INVALID_ARGUMENT", "tags: 'a:b' is not a log tag"),
        ("?attempt=x", 400, "INVALID_ARGUMENT", "attempt: must be 0 (the latest) or more"),
        ("?attempt=3", 404, "NOT_FOUND", "has no attempt 3"),
        ("", 409, "FAILED_PRECONDITION", "has not run yet"),
    ],
)
async def test_the_log_route_refuses_bad_input_with_the_grpc_code_and_message(
    farm: Farm, query: str, status: int, code: str, words: str
) -> None:
    """THEN `GET /api/logs/<task>` answers a bad filter or attempt, an attempt the task
    never had and a queued task's log as StreamLogs does (its code, its one-line message,
    the matching HTTP status), a task that does not exist NOT_FOUND, and changes nothing."""
    token = await farm.token(Role.OPERATOR)
    queued = await submit(await farm.client(), actions_spec(tap()))
    before = await farm.snapshot()
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        url = console_url(farm, f"/api/logs/{queued}{query}")
        async with http.get(url, headers=headers) as response:
            got, answer = response.status, await response.json()
        unknown = console_url(farm, f"/api/logs/{uuid.UUID(int=7)}")
        async with http.get(unknown, headers=headers) as response:
            missing = response.status, (await response.json())["code"]
    assert (got, answer["code"]) == (status, code), answer
    assert words in answer["message"] and "\n" not in answer["message"]
    assert missing == (404, "NOT_FOUND")
    assert await farm.snapshot() == before
