"""The Tasks page as an operator reads it, the console's icon, and the console with its
control plane gone, in a real browser (Playwright on the system's Chromium) against a real
control plane and a real host agent on simulated phones. It saves the README's picture of
the Tasks page."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from amc.v1 import scheduler_pb2, task_pb2
from control_plane.admin_service import create_token
from control_plane.domain import Role
from control_plane.server import ControlPlane
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, seconds, tap, wait_action
from tests.support.agent import running_agent, status_is
from tests.support.console import SETTINGS, console_url
from tests.test_console import DOCS, browser, farm, open_page, pytestmark

__all__ = ["browser", "farm", "pytestmark"]

NOWHERE = task_pb2.DeviceSelector(labels={"model": "Pixel9"})
MISSING = task_pb2.Action(tap_on=task_pb2.TapOn(selector=task_pb2.UiSelector(text="Pay now")))


async def session(client: Any, **metadata: str) -> str:
    """A session opened with `metadata` for a phone nobody has: it fails by its queue
    timeout (its task stays listed, as a finished session does)."""
    call = client.scheduler.OpenSession()
    await call.write(
        scheduler_pb2.OpenSessionRequest(
            open=scheduler_pb2.SessionOpen(
                selector=NOWHERE,
                idle_timeout=seconds(60),
                queue_timeout=seconds(1),
                metadata=metadata,
            )
        )
    )
    first = await asyncio.wait_for(call.read(), 20)
    while (await asyncio.wait_for(call.read(), 20)).task.status == task_pb2.TASK_STATUS_QUEUED:
        pass
    call.cancel()
    return str(first.task.task_id)


async def test_console_tasks_page_says_why_who_how_long_and_names_sessions_by_their_opener(
    farm: Farm, browser: Any
) -> None:
    """THEN each row has its reason or error (a failed task's error, a cancelled one's
    reason, a queued one's wait), who submitted it (its token's name), how long it took
    (ticking while it runs), and a session is named by what opened it: the console's
    Control (its operator), an MCP client (its name) or a program over the API; the
    search box shows its whole placeholder."""
    assert farm.plane is not None
    store = farm.plane.store
    ci = farm.clients((await create_token(store, Role.CLIENT, None, "nightly-ci"))[1])
    alice = farm.clients((await create_token(store, Role.OPERATOR, None, "alice"))[1])
    agent_token = (await create_token(store, Role.CLIENT, None, "support-bot"))[1]
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id="rack1-host"):
        submit = ci.scheduler.SubmitTask
        done = (await submit(scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap())))).task_id
        await status_is(farm, done, "done")
        failed = (await submit(scheduler_pb2.SubmitTaskRequest(spec=actions_spec(MISSING)))).task_id
        await status_is(farm, failed, "failed")
        running = (
            await submit(scheduler_pb2.SubmitTaskRequest(spec=actions_spec(wait_action(120))))
        ).task_id
        await status_is(farm, running, "dispatched")
        waiting = (
            await submit(
                scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap()), selector=NOWHERE)
            )
        ).task_id
        dropped = (
            await submit(
                scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap()), selector=NOWHERE)
            )
        ).task_id
        await alice.scheduler.CancelTask(
            scheduler_pb2.CancelTaskRequest(task_id=dropped, reason="wrong build")
        )
        console = await session(alice, control="console", operator="alice (1d3f…)")
        mcp = await session(farm.clients(agent_token), control="mcp", mcp_client="claude-desktop")
        api = await session(ci)

        page = await open_page(browser, farm, "/tasks", await farm.token(Role.OPERATOR))
        rows = {
            task_id: page.locator(f"tr[data-task='{task_id}']")
            for task_id in (done, failed, running, waiting, dropped, console, mcp, api)
        }
        await rows[api].wait_for()
        cell = lambda task_id, name: rows[task_id].locator(f"td.{name}")  # noqa: E731
        assert await cell(failed, "why").inner_text() == (
            "step 1 (tap_on) failed: element not found: text='Pay now'"
        )
        assert await cell(dropped, "why").inner_text() == "cancel: wrong build"
        assert (
            await cell(waiting, "why").inner_text() == "no registered device matches model=Pixel9"
        )
        assert await cell(done, "why").inner_text() == ""
        assert await cell(done, "submitter").inner_text() == "nightly-ci"
        assert (
            await cell(console, "what").inner_text() == "console Control session of alice (1d3f…)"
        )
        assert await cell(mcp, "what").inner_text() == "MCP session of claude-desktop (support-bot)"
        assert await cell(api, "what").inner_text() == "session opened over the API (nightly-ci)"
        assert "queue timeout" in await cell(mcp, "why").inner_text()
        # A finished task's duration stays; a running one's ticks.
        assert (await cell(done, "duration").inner_text()).endswith("s")
        ticking = await cell(running, "duration").inner_text()
        await page.wait_for_function(
            "([id, t]) => document.querySelector(`tr[data-task='${id}'] td.duration`)"
            ".textContent !== t",
            arg=[running, ticking],
        )
        search = page.get_by_label("id, request id or metadata")
        assert await search.evaluate("el => el.scrollWidth <= el.clientWidth")
        assert await search.get_attribute("placeholder") == "id, request id or metadata"
        await page.screenshot(path=str(DOCS / "console-tasks.png"), full_page=True)
        assert page.errors == []
        await ci.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=running))


async def test_the_console_has_an_icon_and_no_page_asks_for_something_missing(
    farm: Farm, browser: Any
) -> None:
    """THEN /favicon.ico is an icon (no 404), and a page asks the console for nothing it
    answers 404."""
    async with aiohttp.ClientSession() as http, http.get(console_url(farm, "/favicon.ico")) as icon:
        assert icon.status == 200 and icon.content_type == "image/vnd.microsoft.icon"
        body = await icon.read()
        assert body[:4] == b"\x00\x00\x01\x00"  # an ICO's header
    context = await browser.new_context()
    page = await context.new_page()
    missing: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    await page.goto(console_url(farm, "/tasks"))
    await page.get_by_label("token").wait_for()
    await page.wait_for_load_state("networkidle")
    icon = await page.evaluate("document.querySelector('link[rel=icon]').href")
    assert icon.endswith("/favicon.ico")
    assert missing == []


async def test_console_offline_greys_the_page_out_disables_its_actions_and_says_since_when(
    farm: Farm, browser: Any
) -> None:
    """GIVEN the Farm page of a live console WHEN its control plane stops THEN the page
    keeps what it showed, greyed out, every button and input off and no Control to click,
    under a banner saying since when; WHEN the control plane is back THEN the page is live
    again and its actions on."""
    assert farm.plane is not None
    ports = (farm.plane.port, farm.plane.http_port)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id="rack1-host"):
        page = await open_page(browser, farm, "/", await farm.token(Role.OPERATOR))
        card = page.locator(".phone[data-serial='sim-0']")
        await card.locator("a.control-link").wait_for()
        await page.locator("#live.on").wait_for()
        await farm.plane.stop(0)
        banner = page.locator("#offline")
        await banner.filter(
            has_text="Offline: the control plane has not answered since 20"
        ).wait_for()
        assert await page.locator("#live").inner_text() == "offline"
        assert await page.evaluate("document.body.classList.contains('offline')")
        await card.locator("summary").click(force=True)
        buttons = page.locator("main button, main input")
        assert await buttons.count() > 0
        assert all([await b.is_disabled() for b in await buttons.all()])
        link = card.locator("a.control-link")
        assert await link.evaluate("a => getComputedStyle(a).pointerEvents") == "none"
        assert await card.locator(".badge.state").inner_text() == "ready"  # as it was

        farm.plane = ControlPlane(
            farm.dsn,
            SETTINGS,
            listen=f"127.0.0.1:{ports[0]}",
            http_listen=f"127.0.0.1:{ports[1]}",
        )
        await farm.plane.start()
        await page.locator("#live.on").wait_for(timeout=30_000)
        await banner.wait_for(state="hidden")
        assert not await page.evaluate("document.body.classList.contains('offline')")
        assert await link.evaluate("a => getComputedStyle(a).pointerEvents") == "auto"
        assert not any([await b.is_disabled() for b in await buttons.all()])
        assert page.errors == []
