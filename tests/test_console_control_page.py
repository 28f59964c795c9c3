"""The Control page as an operator uses it, in a real browser (Playwright on the system's
Chromium) against a real control plane and a real host agent on simulated phones: the
phone's screen as tall as the window, typing from the computer's keyboard, the phone's keys
(power, volume, rotation), its details, a screenshot to download, Start again after End
session, and a maintenance session on a cordoned phone. It saves the README's picture."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path
from typing import Any

from amc.v1 import admin_pb2, scheduler_pb2
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm
from tests.support.agent import running_agent, status_is
from tests.test_console import DOCS, browser, farm, open_page, pytestmark
from tests.test_console_screen import frame_after

__all__ = ["browser", "farm", "pytestmark"]

HOST = "rack1-host"


async def controlling(page: Any, serial: str = "sim-0") -> str:
    """The session's task id, once the page says it controls the phone."""
    status = page.locator("#control-status")
    await status.filter(has_text=f"Controlling {serial}").wait_for()
    return str(await status.get_by_role("link").inner_text()).strip()


async def test_console_control_page_fits_the_window_types_from_the_keyboard_and_starts_again(
    farm: Farm, browser: Any, tmp_path: Path
) -> None:
    """THEN the phone's screen is as tall as the window allows; keys typed on the focused
    screen reach the phone (text as one action, Enter and Backspace as keys), as do Power,
    Volume + and a rotation; the page shows the phone's model, Android version, resolution,
    battery and temperature; Screenshot downloads the screen as a PNG in the phone's pixels;
    after End session, Start again opens a new session on the phone."""
    source = SimulatedSource(1, delay=0.01)
    source.set_body("sim-0", battery=82.0, charging=False, temperature=31.0)
    async with running_agent(farm, source, host_id=HOST, probe_interval=0.3, probe_timeout=0.5):
        page = await open_page(
            browser, farm, f"/control?host_id={HOST}&serial=sim-0", await farm.token(Role.OPERATOR)
        )
        first = await controlling(page)
        canvas = page.locator("canvas.screen")
        await frame_after(page, 0)
        box = await canvas.bounding_box()
        viewport = page.viewport_size
        assert box["height"] > 0.75 * viewport["height"], (box, viewport)
        assert box["y"] + box["height"] <= viewport["height"]

        log = page.locator("#action-log li")
        await canvas.focus()
        await page.keyboard.type("hi")
        await page.keyboard.press("Enter")
        await page.keyboard.press("Backspace")
        await log.filter(has_text='type "hi" → ok').wait_for()
        await log.filter(has_text="key ENTER → ok").wait_for()
        await log.filter(has_text="key DEL → ok").wait_for()
        for button, logged in [
            ("Power", "key POWER"),
            ("Volume +", "key VOLUME_UP"),
            ("Rotate ⟳", "rotate right"),
        ]:
            await page.get_by_role("button", name=button).click()
            await log.filter(has_text=f"{logged} → ok").wait_for()
        done = [(r.action, r.args) for r in source.actions_for("sim-0")]
        assert ("input_text", {"text": "hi"}) in done
        keys = [args["keycode"] for action, args in done if action == "key"]
        assert keys == [66, 67, 26, 24]
        (rotation,) = [args["command"] for action, args in done if action == "shell"]
        assert "settings put system user_rotation" in rotation and "+ 3) % 4" in rotation

        facts = page.locator("#phone-details")
        await facts.locator("dd[data-field='battery']", has_text="82%").wait_for()
        assert await facts.locator("dd[data-field='model']").inner_text() == "Simulated (AMC)"
        assert await facts.locator("dd[data-field='Android']").inner_text() == "14 (SDK 34)"
        resolution = facts.locator("dd[data-field='resolution']")
        await resolution.filter(has_text="1080 × 2400").wait_for()  # noqa: RUF001
        assert await facts.locator("dd[data-field='temperature']").inner_text() == "31 °C"
        await frame_after(page, await frame_after(page, 0))
        # The README's picture is of the stream, decoded in the page.
        assert await page.locator("canvas.screen").get_attribute("data-codec") == "h264"
        await page.screenshot(path=str(DOCS / "console-control.png"))

        async with page.expect_download() as saving:
            await page.get_by_role("button", name="Screenshot").click()
        download = await saving.value
        assert download.suggested_filename.startswith("sim-0-")
        png = await asyncio.to_thread(Path(await download.path()).read_bytes)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        assert struct.unpack(">II", png[16:24]) == (1080, 2400)

        await page.get_by_role("button", name="End session").click()
        await status_is(farm, first, "done")
        again = page.get_by_role("button", name="Start again")
        await again.click()
        second = await controlling(page)
        assert second != first
        await page.get_by_role("button", name="End session").click()
        await status_is(farm, second, "done")
        assert page.errors == []


async def test_console_maintenance_control_takes_a_cordoned_phone_for_an_operator(
    farm: Farm, browser: Any
) -> None:
    """THEN Control on a cordoned phone is refused in words with a maintenance Control to
    take instead; that opens a maintenance session on the phone (recorded so), which stays
    cordoned after."""
    op = await farm.operator()
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id=HOST):
        await op.admin.CordonDevice(
            admin_pb2.CordonDeviceRequest(host_id=HOST, serial="sim-0", reason="flaky USB")
        )
        page = await open_page(
            browser, farm, f"/control?host_id={HOST}&serial=sim-0", await farm.token(Role.OPERATOR)
        )
        refused = page.locator("#control-refusal [role=alert]")
        await refused.filter(has_text="phone 'sim-0' is cordoned").wait_for()
        await refused.get_by_role("link", name="Control (maintenance)").click()
        task_id = (
            await page.locator("#control-status")
            .filter(has_text="Controlling sim-0: a maintenance session")
            .get_by_role("link")
            .inner_text()
        )
        await page.locator("canvas.screen").click(position={"x": 40, "y": 40})
        await page.locator("#action-log li").filter(has_text="→ ok").wait_for()
        await page.get_by_role("button", name="End session").click()
        await status_is(farm, task_id, "done")
        got = await op.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))
        assert got.spec.session.maintenance and got.metadata["control"] == "console"
        assert farm.db is not None
        assert await farm.db.fetchval("SELECT cordoned FROM devices WHERE serial = 'sim-0'")
        assert page.errors == []


async def test_console_farm_page_offers_a_maintenance_control_on_a_drained_hosts_phone(
    farm: Farm, browser: Any
) -> None:
    """GIVEN a drained host THEN its idle phone's card on the Farm page says `cordoned` and
    offers Control (maintenance), which opens a maintenance session on it, taken although
    the host stays drained."""
    op = await farm.operator()
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id=HOST):
        await op.admin.DrainHost(admin_pb2.DrainHostRequest(host_id=HOST, reason="new cable"))
        page = await open_page(browser, farm, "/", await farm.token(Role.OPERATOR))
        card = page.locator(".phone[data-serial='sim-0']")
        await card.locator(".badge.state", has_text="cordoned").wait_for()
        link = card.locator("a.control-link.maintenance")
        assert await link.inner_text() == "Control (maintenance)"
        await link.click()
        task_id = (
            await page.locator("#control-status")
            .filter(has_text="Controlling sim-0: a maintenance session")
            .get_by_role("link")
            .inner_text()
        )
        await page.locator("canvas.screen").click(position={"x": 40, "y": 40})
        await page.locator("#action-log li").filter(has_text="→ ok").wait_for()
        await page.get_by_role("button", name="End session").click()
        await status_is(farm, task_id, "done")
        assert farm.db is not None
        assert await farm.db.fetchval("SELECT draining FROM hosts WHERE host_id = $1", HOST)
        assert page.errors == []
