"""The console's Queue page in a real browser (Playwright on the system's Chromium): the
queue by selector and, per fairness key, queued, running, cap, weight and oldest wait, as
the control plane counted them, kept current without a reload."""

from __future__ import annotations

from typing import Any

from amc.v1 import admin_pb2, scheduler_pb2, task_pb2
from control_plane.admin_service import create_token
from control_plane.domain import Role
from tests.support import Farm, actions_spec
from tests.test_console import browser, farm, loads, open_page, pytestmark

__all__ = ["browser", "farm", "pytestmark"]


def _task(key: str) -> scheduler_pb2.SubmitTaskRequest:
    return scheduler_pb2.SubmitTaskRequest(
        spec=actions_spec(),
        selector=task_pb2.DeviceSelector(labels={"rack": "r1"}),
        fairness_key=key,
    )


async def _cells(page: Any, key: str) -> list[str]:
    return [t.strip() for t in await page.locator(f"tr[data-key='{key}'] td").all_inner_texts()]


async def test_console_queue_page_shows_each_fairness_keys_queued_running_cap_weight_and_wait(
    farm: Farm, browser: Any
) -> None:
    """THEN the Queue page's fairness keys table has qa (2 queued, 1 running, cap 3, weight
    2, a wait) and ci (1 queued, no cap, weight 1), and follows a change of qa's share and a
    new task without a reload."""
    client = await farm.client()
    operator = await farm.operator()
    await operator.admin.SetFairShare(
        admin_pb2.SetFairShareRequest(fairness_key="qa", weight=2, max_devices=3)
    )
    host = await farm.host("h1", "s1", rack="r1")
    for key in ("qa", "qa", "qa", "ci"):
        await client.scheduler.SubmitTask(_task(key))
    await host.acquire("s1")
    page = await open_page(browser, farm, "/queue", await farm.token(Role.OPERATOR))
    qa = page.locator("tr[data-key='qa'] td.queued", has_text="2")
    await qa.wait_for()
    cells = await _cells(page, "qa")
    assert cells[:5] == ["qa", "2", "1", "3", "2"]
    assert cells[5].endswith("s")
    assert (await _cells(page, "ci"))[:5] == ["ci", "1", "0", "-", "1"]
    assert (await page.locator("#counted").inner_text()).startswith("Counted 20")
    # The group's selector as the control plane writes it (GetQueue's `selector_text`).
    assert await page.locator("table >> nth=0").locator("tbody td >> nth=0").inner_text() == (
        "rack=r1"
    )
    first = await loads(page)
    await operator.admin.SetFairShare(
        admin_pb2.SetFairShareRequest(fairness_key="qa", clear_max_devices=True)
    )
    await client.scheduler.SubmitTask(_task("ci"))
    await page.locator("tr[data-key='ci'] td.queued", has_text="2").wait_for()
    await page.locator("tr[data-key='qa'] td.cap", has_text="-").wait_for()
    assert await loads(page) == first
    assert page.errors == []


async def test_console_queue_page_is_refused_to_a_client_token_as_grpc_would(
    farm: Farm, browser: Any
) -> None:
    """THEN a client token sees the API's refusal, not an empty table."""
    page = await open_page(browser, farm, "/queue", await farm.token(Role.CLIENT))
    refusal = page.get_by_role("alert")
    await refusal.wait_for()
    assert "role 'client' may not call GetQueue" in await refusal.inner_text()
    assert page.errors == []


async def test_console_queue_page_sets_a_keys_share_with_the_checks_amc_queue_set_makes(
    farm: Farm, browser: Any
) -> None:
    """THEN an operator sets qa's weight and cap on the Queue page (SetFairShare, recorded
    with who and why), then takes the cap away; a cap with "no cap", or nothing at all, is
    refused as `amc queue set` refuses it, and a weight out of range as the control plane
    does; a new key's share is set from the form below the table. Nothing refused changes
    anything."""
    assert farm.plane is not None
    _, token = await create_token(farm.plane.store, Role.OPERATOR, None, "dora")
    client = await farm.client()
    await client.scheduler.SubmitTask(_task("qa"))
    page = await open_page(browser, farm, "/queue", token)
    row = page.locator("tr[data-key='qa']")
    await row.wait_for()
    await row.get_by_text("Edit").click()
    form = row.locator("form.share")
    message = form.locator(".share-message")

    await form.get_by_label("qa cap").fill("4")
    await form.get_by_label("qa no-cap").check()
    await form.get_by_role("button", name="Set").click()
    await message.filter(has_text="give a cap or no cap, not both").wait_for()
    await form.get_by_label("qa no-cap").uncheck()
    await form.get_by_label("qa cap").fill("")
    await form.get_by_role("button", name="Set").click()
    await message.filter(has_text="nothing to set").wait_for()
    await form.get_by_label("qa weight").fill("5000")
    await form.get_by_role("button", name="Set").click()
    await message.filter(has_text="weight: must be between 1 and 1000").wait_for()
    assert await _share(farm, "qa") is None

    await form.get_by_label("qa weight").fill("3")
    await form.get_by_label("qa cap").fill("4")
    await form.get_by_label("qa reason").fill("release week")
    await form.get_by_role("button", name="Set").click()
    await row.locator("td.cap", has_text="4").wait_for()
    assert (await _cells(page, "qa"))[3:5] == ["4", "3"]
    assert await _share(farm, "qa") == (3, 4)
    await row.get_by_text("Edit").click()
    await form.get_by_label("qa no-cap").check()
    await form.get_by_role("button", name="Set").click()
    await row.locator("td.cap", has_text="-").wait_for()
    assert await _share(farm, "qa") == (3, None)

    new = page.locator("form.share[data-share='new']")
    await new.get_by_label("new key").fill("ml")
    await new.get_by_label("new weight").fill("2")
    await new.get_by_role("button", name="Set").click()
    await page.locator("tr[data-key='ml'] td.weight", has_text="2").wait_for()
    assert farm.db is not None
    events = await farm.db.fetch(
        "SELECT fairness_key, actor_name, reason FROM fair_share_events ORDER BY event_id"
    )
    assert [tuple(e) for e in events] == [
        ("qa", "dora", "release week"),
        ("qa", "dora", ""),
        ("ml", "dora", ""),
    ]
    assert page.errors == []


async def _share(farm: Farm, key: str) -> tuple[int, int | None] | None:
    assert farm.db is not None
    row = await farm.db.fetchrow(
        "SELECT weight, max_devices FROM fair_shares WHERE fairness_key = $1", key
    )
    return None if row is None else (row["weight"], row["max_devices"])
