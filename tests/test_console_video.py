"""A phone's live screen in the console as video, in a real browser (Playwright on the
system's Chromium, whose WebCodecs decode H.264 here) against a real control plane and a
real host agent on simulated phones: the Control page decodes the phone's H.264 stream
and shows a click's tap in the decoded pixels; a browser without WebCodecs, or whose
decoder fails, is shown still images instead."""

from __future__ import annotations

import asyncio
from typing import Any

from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, eventually
from tests.support.agent import running_agent
from tests.support.console import console_url
from tests.test_console import SEEN, browser, farm, pytestmark
from tests.test_console_screen import HOST, frame_after

__all__ = ["browser", "farm", "pytestmark"]

# A browser without WebCodecs (an older one, or a page that is no secure context).
NO_WEBCODECS = "delete window.VideoDecoder; delete window.EncodedVideoChunk;"
# A browser that says it decodes H.264 and then fails to.
FAILING_DECODER = """
window.VideoDecoder = class {
  constructor(init) { this.init = init; this.state = "unconfigured"; this.decodeQueueSize = 0; }
  static isConfigSupported() { return Promise.resolve({ supported: true }); }
  configure() { this.state = "configured"; }
  decode() {
    this.state = "closed";
    setTimeout(() => this.init.error(new DOMException("no H.264 here", "NotSupportedError")));
  }
  close() { this.state = "closed"; }
};
"""


async def control_page(browser: Any, farm: Farm, script: str | None = None) -> Any:
    """The Control page of sim-0, opened from the Farm page, with `script` run first."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    if script is not None:
        await context.add_init_script(script)
    page = await context.new_page()
    page.set_default_timeout(SEEN)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    await page.goto(console_url(farm, "/"))
    await page.get_by_label("token").fill(await farm.token(Role.OPERATOR))
    await page.get_by_role("button", name="Use token").click()
    card = page.locator(".phone[data-serial='sim-0']")
    await card.get_by_role("link", name="Control", exact=True).click()
    await page.locator("#control-status").filter(has_text="Controlling sim-0").wait_for()
    return page


async def red_at(page: Any, x: int, y: int) -> bool:
    return bool(
        await page.evaluate(
            """([x, y]) => { const d = document.querySelector('canvas.screen')
                 .getContext('2d').getImageData(x, y, 1, 1).data;
                 return d[0] > 200 && d[1] < 60 && d[2] < 60; }""",
            [x, y],
        )
    )


async def click_and_see(page: Any) -> None:
    """A click a third across and two thirds down; the tap's mark drawn there."""
    seen = await frame_after(page, 0)
    canvas = page.locator("canvas.screen")
    box = await canvas.bounding_box()
    width, height = (int(v) for v in await canvas.evaluate("c => [c.width, c.height]"))
    at = {"x": box["width"] / 3, "y": box["height"] * 2 / 3}
    x, y = round(at["x"] / box["width"] * width), round(at["y"] / box["height"] * height)
    assert not await red_at(page, x, y)
    await canvas.click(position=at)
    await page.locator("#action-log li").filter(has_text=f"tap ({x}, {y}) → ok").wait_for()
    await frame_after(page, seen)
    await page.wait_for_function(
        """([x, y]) => { const d = document.querySelector('canvas.screen').getContext('2d')
             .getImageData(x, y, 1, 1).data; return d[0] > 200 && d[1] < 60 && d[2] < 60; }""",
        arg=[x, y],
    )


async def test_console_control_decodes_the_phone_s_h264_and_a_click_shows_in_its_pixels(
    farm: Farm, browser: Any
) -> None:
    """THEN the Control page watches the stream (WebCodecs), the host captures video only,
    and the decoded pixels under a click turn the tap mark's red."""
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source, host_id=HOST) as agent:
        page = await control_page(browser, farm)
        await click_and_see(page)
        assert await page.locator("canvas.screen").get_attribute("data-codec") == "h264"
        assert agent.screens is not None and agent.screens.captures("sim-0") == {"video"}
        assert page.errors == []


async def test_console_without_webcodecs_shows_still_images(farm: Farm, browser: Any) -> None:
    """THEN a browser without VideoDecoder asks for still images, and a click shows."""
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source, host_id=HOST) as agent:
        page = await control_page(browser, farm, NO_WEBCODECS)
        await click_and_see(page)
        assert await page.locator("canvas.screen").get_attribute("data-codec") == "image"
        assert agent.screens is not None and agent.screens.captures("sim-0") == {"images"}
        assert page.errors == []


async def test_console_whose_decoder_fails_falls_back_to_still_images(
    farm: Farm, browser: Any
) -> None:
    """THEN a decoder that fails has the page say so and watch still images instead; the
    host stops streaming the phone."""
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source, host_id=HOST) as agent:
        page = await control_page(browser, farm, FAILING_DECODER)
        await (
            page.locator(".screen-state")
            .filter(has_text="still images: H.264 could not be decoded here (no H.264 here)")
            .wait_for()
        )
        await click_and_see(page)
        assert await page.locator("canvas.screen").get_attribute("data-codec") == "image"
        assert agent.screens is not None
        await eventually(
            lambda: agent.screens.captures("sim-0") == {"images"}, what="video to stop"
        )
        assert page.errors == []


CLICK_TO_PIXEL = """([px, py]) => new Promise((resolve) => {
  const canvas = document.querySelector('canvas.screen');
  const context = canvas.getContext('2d', { willReadFrequently: true });
  const look = () => {
    const d = context.getImageData(px, py, 1, 1).data;
    if (window.clickedAt !== undefined && d[0] > 200 && d[1] < 60 && d[2] < 60) {
      resolve(performance.now() - window.clickedAt);
    } else {
      requestAnimationFrame(look);
    }
  };
  requestAnimationFrame(look);
})"""


async def test_console_click_to_changed_pixel_over_the_stream_is_timed(
    farm: Farm, browser: Any
) -> None:
    """THEN 20 clicks at spread-out points of the Control page's decoded stream, each timed
    in the page from its pointerdown to the first animation frame whose pixel under it is
    the tap's red: printed (docs/performance.md quotes a run), and held to the issue's
    p50 target loosely (a loaded machine's tail is its own)."""
    source = SimulatedSource(1, delay=0.0)
    async with running_agent(farm, source, host_id=HOST):
        page = await control_page(browser, farm)
        await frame_after(page, 0)
        canvas = page.locator("canvas.screen")
        await canvas.evaluate(
            "c => c.addEventListener('pointerdown', () => { window.clickedAt ="
            " performance.now(); }, true)"
        )
        box = await canvas.bounding_box()
        width, height = (int(v) for v in await canvas.evaluate("c => [c.width, c.height]"))
        grid = [(fx / 6, fy / 8) for fy in range(1, 8) for fx in range(1, 6)]
        times = []
        for n in range(23):
            fx, fy = grid[(n * 7) % len(grid)]
            at = {"x": box["width"] * fx, "y": box["height"] * fy}
            px, py = round(fx * width), round(fy * height)
            await page.evaluate("() => { delete window.clickedAt; }")
            shown = asyncio.ensure_future(page.evaluate(CLICK_TO_PIXEL, [px, py]))
            await canvas.click(position=at)
            times.append(await asyncio.wait_for(shown, 10))
        times = sorted(times[3:])  # the first three warm the session up
        p50, p90 = times[len(times) // 2], times[int(len(times) * 0.9)]
        print(
            f"click to changed pixel (H.264, WebCodecs): p50 {p50:.0f} ms, p90 {p90:.0f}"
            f" ms, max {times[-1]:.0f} ms"
        )
        assert await canvas.get_attribute("data-codec") == "h264"
        assert p50 < 500
