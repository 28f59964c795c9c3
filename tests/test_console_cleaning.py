"""The console shows a phone its host cleans between leases: a `cleaning` badge on its row
of the Host page (the task it cleans after on hover), and the clean's steps among the
host's events. Playwright on the system's Chromium, a real host agent with simulated
phones."""

from __future__ import annotations

from typing import Any

from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, eventually, tap
from tests.support.agent import running_agent, status_is, submit
from tests.test_cleaning import cleaned_once, cleaning_settings
from tests.test_console import browser, farm, open_page, pytestmark
from tests.test_device_health import is_in

__all__ = ["browser", "farm", "pytestmark"]


async def test_console_host_page_shows_a_phone_cleaning_and_its_clean_steps(
    farm: Farm,
    browser: Any,
) -> None:
    """THEN while the clean after a task runs the phone's row has a `cleaning` badge whose
    title names that task; afterwards the badge is gone and the clean's steps are events
    of the host, each with its duration."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, **cleaning_settings()) as agent:
        await cleaned_once(farm, agent)
        page = await open_page(browser, farm, "/hosts/host-1", await farm.token(Role.OPERATOR))
        source.clean_delay = 1.0
        task_id = await submit(client, actions_spec(tap()))
        await status_is(farm, task_id, "done")
        badge = page.locator("tr[data-serial='sim-0'] .s-cleaning")
        await badge.wait_for()
        assert await badge.get_attribute("title") == f"after task {task_id}"
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="cleaned", timeout=20)
        await badge.wait_for(state="detached")
        steps = page.locator("tr.host-event .s-cleaning")
        await steps.first.wait_for()
        rows = await page.locator("tr.host-event").all_inner_texts()
        assert any("settings (1.0" in row and "font_scale" in row for row in rows), rows
    assert page.errors == []
