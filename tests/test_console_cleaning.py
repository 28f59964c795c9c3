"""The console shows a phone its host cleans between leases: `cleaning` as its state's word on
its card of the Host page and the Farm page's wall (the task it cleans after on hover),
counted on the wall, and the clean's steps among the host's events. Playwright on the
system's Chromium, a real host agent with simulated phones."""

from __future__ import annotations

import re
from typing import Any

from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, eventually, tap
from tests.support.agent import running_agent, status_is, submit
from tests.test_cleaning import cleaned_once, cleaning_settings
from tests.test_console import browser, farm, open_page, pytestmark
from tests.test_device_health import is_in

__all__ = ["browser", "farm", "pytestmark"]


async def test_console_host_and_farm_pages_show_a_phone_cleaning_and_its_clean_steps(
    farm: Farm,
    browser: Any,
) -> None:
    """THEN while the clean after a task runs the phone's card says `cleaning` in its
    state's badge, whose title names that task, on the Host page and on the Farm page's
    wall (which counts it); afterwards it is ready again and the clean's steps are events
    of the host, each with its duration."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, **cleaning_settings()) as agent:
        await cleaned_once(farm, agent)
        token = await farm.token(Role.OPERATOR)
        page = await open_page(browser, farm, "/hosts/host-1", token)
        wall = await open_page(browser, farm, "/", token)
        source.clean_delay = 1.0
        task_id = await submit(client, actions_spec(tap()))
        await status_is(farm, task_id, "done")
        badge = page.locator(".phone[data-serial='sim-0'] .badge.state.s-cleaning")
        await badge.wait_for()
        assert await badge.get_attribute("title") == f"after task {task_id}"
        assert await badge.inner_text() == "cleaning"
        card = wall.locator(".phone.s-cleaning[data-serial='sim-0']")
        await card.wait_for()
        assert await card.locator(".badge.state").inner_text() == "cleaning"
        assert await wall.locator("#devices-cleaning b").inner_text() == "1"
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="cleaned", timeout=20)
        await badge.wait_for(state="detached")
        steps = page.locator("tr.host-event .s-cleaning")
        await steps.first.wait_for()
        rows = await page.locator("tr.host-event").all_inner_texts()
        # A second or more reads with one decimal (the step takes clean_delay, 1 s, or more
        # on a loaded machine).
        took = re.compile(r"settings \(\d+\.\d s\)")
        assert any(took.search(row) and "font_scale" in row for row in rows), rows
    await wall.locator(".phone.s-ready[data-serial='sim-0']").wait_for()
    assert page.errors == []
    assert wall.errors == []
