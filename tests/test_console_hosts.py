"""The console shows what operators did to hosts: the Farm page's `cordoned` and
`draining` badges (live), and a queued task's Task page says why it waits. Playwright on
the system's Chromium, a real host agent with simulated phones."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from amc.v1 import admin_pb2, scheduler_pb2, task_pb2
from control_plane.admin_service import create_token
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, tap
from tests.support.agent import running_agent
from tests.support.console import console_url
from tests.test_console import browser, farm, open_page, pytestmark
from tests.test_host_operations import host_events, host_flags

__all__ = ["browser", "farm", "pytestmark"]


async def test_console_farm_page_shows_cordoned_and_draining_live(
    farm: Farm,
    browser: Any,
) -> None:
    """Cordoning a phone, then draining its host, shows the badges and the counts (hosts
    cordoned; phones that take no new work, their own cordon or their host's) without a
    reload."""
    source = SimulatedSource(2, prefix="pixel-")
    op = await farm.operator()
    async with running_agent(farm, source, host_id="rack1-host"):
        page = await open_page(browser, farm, "/", await farm.token(Role.OPERATOR))
        await page.locator("[data-serial='pixel-0']").wait_for()
        await page.locator("#live.on").wait_for()
        await op.admin.CordonDevice(admin_pb2.CordonDeviceRequest(serial="pixel-0"))
        await page.locator("[data-serial='pixel-0'] .s-cordoned").wait_for()
        assert await page.locator("[data-serial='pixel-1'] .s-cordoned").count() == 0
        assert await page.locator("#devices-cordoned b").inner_text() == "1"
        await op.admin.DrainHost(admin_pb2.DrainHostRequest(host_id="rack1-host"))
        await page.locator("section[data-host='rack1-host'] .s-draining").wait_for()
        assert await page.locator("#hosts-cordoned b").inner_text() == "1"
        assert await page.locator("#devices-cordoned b").inner_text() == "2"
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


async def test_console_host_page_lists_operator_events(
    farm: Farm,
    browser: Any,
) -> None:
    """The Host page shows who cordoned the host and why, and the uncordon live."""
    assert farm.plane is not None
    _, op_token = await create_token(farm.plane.store, Role.OPERATOR, None, "carol")
    op = farm.clients(op_token)
    await farm.host("rack1-host", "pixel-0")
    await op.admin.CordonHost(
        admin_pb2.CordonHostRequest(host_id="rack1-host", reason="swap the USB hub")
    )
    page = await open_page(browser, farm, "/hosts/rack1-host", op_token)
    rows = page.locator("tr.host-event")
    await rows.first.wait_for()
    text = await rows.first.inner_text()
    assert "cordon" in text and "carol" in text and "swap the USB hub" in text
    await page.locator("#live.on").wait_for()
    await op.admin.UncordonHost(admin_pb2.UncordonHostRequest(host_id="rack1-host"))
    await page.locator("tr.host-event .s-uncordon").wait_for()
    assert await rows.count() == 2
    assert page.errors == []


async def test_console_api_serves_the_host_pages_admin_calls_to_operators_only(
    farm: Farm,
) -> None:
    """POST /api/amc.v1.Admin/GetHost, CordonHost, DrainHost and UncordonHost answer an
    operator; a client is refused as gRPC would refuse it; no other Admin method (tokens,
    RemoveHost) is served."""
    await farm.host("h1", "s1")
    url = console_url(farm, "/api/amc.v1.Admin/")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:

        async def post(method: str, token: str, body: dict[str, Any]) -> tuple[int, Any]:
            headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
            async with http.post(url + method, data=json.dumps(body), headers=headers) as r:
                return r.status, await r.json()

        operator = await farm.token(Role.OPERATOR)
        status, answer = await post("GetHost", operator, {"host_id": "h1"})
        assert status == 200 and answer["host"]["host_id"] == "h1", answer
        status, answer = await post("GetHost", await farm.token(Role.CLIENT), {"host_id": "h1"})
        assert (status, answer["code"]) == (403, "PERMISSION_DENIED")
        status, answer = await post("GetHost", operator, {"host_id": "nope"})
        assert (status, answer["code"]) == (404, "NOT_FOUND")
        client = await farm.token(Role.CLIENT)
        status, answer = await post("CordonHost", client, {"host_id": "h1"})
        assert (status, answer["code"]) == (403, "PERMISSION_DENIED")
        assert await host_flags(farm, "h1") == (False, False)
        status, answer = await post("CordonHost", operator, {"host_id": "h1", "reason": "hub"})
        assert status == 200 and answer["host"]["cordoned"] is True, answer
        status, answer = await post("DrainHost", operator, {"host_id": "h1"})
        assert status == 200 and answer["host"]["draining"] is True, answer
        assert await host_flags(farm, "h1") == (True, True)
        status, answer = await post("UncordonHost", operator, {"host_id": "h1"})
        assert status == 200 and answer["host"]["cordoned"] is False, answer
        for method in ("RemoveHost", "CreateToken", "ListTokens"):
            status, answer = await post(method, operator, {"host_id": "h1"})
            assert (status, answer["code"]) == (404, "NOT_FOUND"), method
    assert await host_flags(farm, "h1") == (False, False)


async def test_console_farm_page_cordons_and_uncordons_a_phone_with_a_reason(
    farm: Farm,
    browser: Any,
) -> None:
    """THEN a phone's Operate on the Farm page cordons it with the reason typed (recorded
    with who, as `amc devices cordon`), its card says so live, and Uncordon gives it work
    again; a client token is refused the same calls by the API."""
    assert farm.plane is not None
    _, token = await create_token(farm.plane.store, Role.OPERATOR, None, "frank")
    source = SimulatedSource(2, prefix="pixel-")
    async with running_agent(farm, source, host_id="rack1-host"):
        page = await open_page(browser, farm, "/", token)
        card = page.locator(".phone[data-serial='pixel-0']")
        await card.locator(".badge.state", has_text="ready").wait_for()
        await card.locator("summary").click()
        await card.get_by_label("pixel-0 reason").fill("battery swollen")
        await card.get_by_role("button", name="Cordon").click()
        await card.locator(".badge.state", has_text="cordoned").wait_for()
        assert await page.locator(".phone[data-serial='pixel-1'] .badge.state").inner_text() == (
            "ready"
        )
        events = await host_events(farm, "rack1-host")
        assert [(e["serial"], e["kind"], e["actor_name"], e["reason"]) for e in events] == [
            ("pixel-0", "cordon", "frank", "battery swollen")
        ]
        # The card's operations stay open across the live redraw.
        await card.get_by_role("button", name="Uncordon").click()
        await card.locator(".badge.state", has_text="ready").wait_for()
        assert [e["kind"] for e in await host_events(farm, "rack1-host")] == ["cordon", "uncordon"]
        assert page.errors == []
