"""The console shows each phone's condition: the Farm page's `devices held` count, a
badge for a held phone (its reason on hover) and the battery and temperature its host's
probes read. Playwright on the system's Chromium, a real host agent with simulated
phones."""

from __future__ import annotations

from typing import Any

from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, eventually
from tests.support.agent import running_agent
from tests.test_console import browser, farm, open_page, pytestmark
from tests.test_device_health import is_in

__all__ = ["browser", "farm", "pytestmark"]


async def test_console_farm_page_shows_held_phones_with_their_battery_and_heat(
    farm: Farm,
    browser: Any,
) -> None:
    """A hot phone has a too_hot badge saying why, every phone its battery and
    temperature, and the count of held phones is 1."""
    source = SimulatedSource(2, prefix="pixel-")
    source.set_body("pixel-0", temperature=47.0)
    source.set_body("pixel-1", battery=64.0, charging=False)
    async with running_agent(farm, source, probe_interval=0.3, probe_timeout=0.5):
        await eventually(lambda: is_in(farm, "pixel-0", "too_hot"), what="held too hot")
        await eventually(
            lambda: farm.db.fetchval(  # type: ignore[union-attr]
                "SELECT battery_percent = 64 FROM devices WHERE serial = 'pixel-1'"
            )
        )
        page = await open_page(browser, farm, "/", await farm.token(Role.OPERATOR))
        hot = page.locator("tr[data-serial='pixel-0'] .s-too_hot")
        await hot.wait_for()
        assert "45 °C" in (await hot.get_attribute("title") or "")
        assert await page.locator("#devices-held b").inner_text() == "1"
        assert await page.locator("tr[data-serial='pixel-0'] .health").inner_text() == (
            "100% charging · 47 °C"
        )
        assert await page.locator("tr[data-serial='pixel-1'] .health").inner_text() == (
            "64% · 30 °C"
        )
        assert await page.locator("tr[data-serial='pixel-1'] .s-too_hot").count() == 0
