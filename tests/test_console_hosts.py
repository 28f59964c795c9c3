"""The console shows what operators did to hosts: the Farm page's `cordoned` and
`draining` badges (live), and a queued task's Task page says why it waits. Playwright on
the system's Chromium, a real host agent with simulated phones."""

from __future__ import annotations

from typing import Any

from amc.v1 import admin_pb2, scheduler_pb2, task_pb2
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, tap
from tests.support.agent import running_agent
from tests.test_console import browser, farm, open_page, pytestmark

__all__ = ["browser", "farm", "pytestmark"]


async def test_console_farm_page_shows_cordoned_and_draining_live(
    farm: Farm,
    browser: Any,
) -> None:
    """Cordoning a phone, then draining its host, shows the badges and the count without
    a reload."""
    source = SimulatedSource(2, prefix="pixel-")
    op = await farm.operator()
    async with running_agent(farm, source, host_id="rack1-host"):
        page = await open_page(browser, farm, "/", await farm.token(Role.OPERATOR))
        await page.locator("tr[data-serial='pixel-0']").wait_for()
        await page.locator("#live.on").wait_for()
        await op.admin.CordonDevice(admin_pb2.CordonDeviceRequest(serial="pixel-0"))
        await page.locator("tr[data-serial='pixel-0'] .s-cordoned").wait_for()
        assert await page.locator("tr[data-serial='pixel-1'] .s-cordoned").count() == 0
        await op.admin.DrainHost(admin_pb2.DrainHostRequest(host_id="rack1-host"))
        await page.locator("tr[data-host='rack1-host'] .s-draining").wait_for()
        assert await page.locator("#hosts-cordoned b").inner_text() == "1"
        assert page.errors == []


async def test_console_task_page_says_why_a_queued_task_waits(
    farm: Farm,
    browser: Any,
) -> None:
    """A task no device matches: its page's `waiting` field says so."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(
            spec=actions_spec(tap()), selector=task_pb2.DeviceSelector(labels={"model": "Pixel9"})
        )
    )
    page = await open_page(browser, farm, f"/tasks/{task.task_id}", await farm.token(Role.CLIENT))
    waiting = page.locator("dd[data-field='waiting']")
    await waiting.wait_for()
    assert await waiting.inner_text() == "no registered device matches model=Pixel9"
    assert page.errors == []
