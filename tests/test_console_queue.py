"""The console's Queue page in a real browser (Playwright on the system's Chromium): the
queue by selector and, per fairness key, queued, running, cap, weight and oldest wait, as
the control plane counted them, kept current without a reload."""

from __future__ import annotations

from typing import Any

from amc.v1 import admin_pb2, scheduler_pb2, task_pb2
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
