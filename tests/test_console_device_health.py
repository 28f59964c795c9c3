"""The console shows each phone's condition: the Farm page's `devices held` count, a
badge for a held phone (its reason on hover) and the battery and temperature its host's
probes read. Playwright on the system's Chromium, a real host agent with simulated
phones."""

from __future__ import annotations

from typing import Any

from control_plane.admin_service import create_token
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, eventually
from tests.support.agent import running_agent
from tests.test_console import DOCS, browser, farm, open_page, pytestmark
from tests.test_device_health import is_in
from tests.test_device_release import quarantined_phone
from tests.test_host_operations import host_events

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
        hot = page.locator("[data-serial='pixel-0'] .s-too_hot")
        await hot.wait_for()
        assert "45 °C" in (await hot.get_attribute("title") or "")
        assert await page.locator("#devices-held b").inner_text() == "1"
        assert await page.locator("[data-serial='pixel-0'] .health").inner_text() == (
            "100% charging · 47 °C"
        )
        assert await page.locator("[data-serial='pixel-1'] .health").inner_text() == ("64% · 30 °C")
        assert await page.locator("[data-serial='pixel-1'] .s-too_hot").count() == 0


async def test_console_host_page_releases_a_quarantined_phone_with_a_reason(
    farm: Farm,
    browser: Any,
) -> None:
    """A quarantined phone's card on the Host page has a Release button (the others none):
    Admin ReleaseDevice with the reason typed, recorded with who; the phone turns ready.
    The page, with a hot phone and one charging beside it, is the README's screenshot."""
    assert farm.plane is not None
    _, token = await create_token(farm.plane.store, Role.OPERATOR, None, "erin")
    source = SimulatedSource(3, delay=0.02)
    source.set_body("sim-1", temperature=47.0, battery=71.0, charging=False)
    source.set_body("sim-2", battery=15.0)
    async with quarantined_phone(farm, source):
        await eventually(lambda: is_in(farm, "sim-1", "too_hot"), what="sim-1 too hot")
        await eventually(lambda: is_in(farm, "sim-2", "charging_hold"), what="sim-2 held")
        page = await open_page(browser, farm, "/hosts/host-1", token)
        row = page.locator("[data-serial='sim-0']")
        await row.locator(".s-quarantined").wait_for()
        await page.locator("[data-serial='sim-1'] .s-too_hot").wait_for()
        assert await page.locator("[data-serial='sim-1'] details.release").count() == 0
        await page.locator("#live.on").wait_for()
        await page.screenshot(path=str(DOCS / "console-host-conditions.png"), full_page=True)
        await row.get_by_label("sim-0 reason").fill("reseated the cable")
        # A live update redraws the page: the reason stays in the input it was typed in
        # (not in the host's own reason input, the first of that name on the page).
        await page.evaluate("import('/static/shell.js').then((shell) => shell.refresh())")
        assert await row.get_by_label("sim-0 reason").input_value() == "reseated the cable"
        assert await page.get_by_label("reason", exact=True).input_value() == ""
        await row.get_by_role("button", name="Release").click()
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="ready again")
        await page.locator("tr.host-event .s-release").wait_for()
        await row.locator(".s-quarantined").wait_for(state="detached")
        assert await row.locator("details.release").count() == 0
    events = [e for e in await host_events(farm, "host-1") if e["kind"] == "release"]
    assert [(e["serial"], e["actor_name"], e["reason"]) for e in events] == [
        ("sim-0", "erin", "reseated the cable")
    ]
    assert page.errors == []


async def test_console_farm_page_words_a_condition_it_does_not_know_as_held_by_its_name(
    farm: Farm,
    browser: Any,
) -> None:
    """GIVEN a control plane newer than the page, whose ListHosts names a condition the page
    has no words for (`DEVICE_CONDITION_FLASHING`), or one sent as its number THEN the
    phone is `held`, its condition shown by its own name, and the page draws the rest."""
    async with running_agent(farm, SimulatedSource(3, prefix="pixel-")):
        page = await open_page(browser, farm, "/", await farm.token(Role.OPERATOR))
        await page.locator(".phone[data-serial='pixel-2']").wait_for()

        async def newer(route: Any) -> None:
            answer = await route.fetch()
            hosts = await answer.json()
            devices = hosts["hosts"][0]["devices"]
            devices[0]["condition"] = "DEVICE_CONDITION_FLASHING"
            devices[0]["condition_reason"] = "writing a new system image"
            devices[1]["condition"] = 42
            await route.fulfill(response=answer, json=hosts)

        await page.route("**/api/amc.v1.Scheduler/ListHosts", newer)
        await page.reload()
        flashing = page.locator(".phone[data-serial='pixel-0']")
        await flashing.locator(".badge.state", has_text="held").wait_for()
        assert await flashing.locator(".badge.s-flashing").inner_text() == "flashing"
        title = await flashing.locator(".badge.state").get_attribute("title")
        assert "writing a new system image" in title
        numbered = page.locator(".phone[data-serial='pixel-1']")
        assert await numbered.locator(".badge.state").inner_text() == "held"
        assert await numbered.locator(".badge:not(.state)").first.inner_text() == "#42"
        assert await page.locator("#devices-held b").inner_text() == "2"
        assert await page.locator(".phone[data-serial='pixel-2'] .badge.state").inner_text() == (
            "ready"
        )
        assert page.errors == []
