"""The console in a real browser: Playwright driving the system's Chromium against a
control plane on real sockets, with a real host agent and its simulated phones. The tests
save the README's screenshots under docs/."""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from amc.v1 import admin_pb2, scheduler_pb2, task_pb2
from amc_cli.specfile import load_request
from control_plane.admin_service import create_token
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from host_agent.simulated_screen import UI_XML, screenshot_png
from tests.support import Farm, actions_spec, eventually, seconds, tap, wait_action, workflow_spec
from tests.support.agent import running_agent, status_is
from tests.support.console import console_farm, console_url
from tests.test_cli import EXAMPLES

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on this machine (apt-get install chromium)"
)
DOCS = Path(__file__).resolve().parent.parent / "docs"
# Long enough for an event to arrive, short enough for a failing test to fail soon.
SEEN = 15_000


@pytest.fixture
async def farm(database_url: str) -> AsyncIterator[Farm]:
    async with console_farm(database_url) as f:
        yield f


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield chromium
        finally:
            await chromium.close()


async def open_page(browser: Any, farm: Farm, path: str, token: str | None) -> Any:
    """A fresh tab on `path`, signed in through the token form when `token` is given."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    page.set_default_timeout(SEEN)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.errors = errors
    await page.goto(console_url(farm, path))
    if token is not None:
        await page.get_by_label("token").fill(token)
        await page.get_by_role("button", name="Use token").click()
    return page


async def loads(page: Any) -> int:
    """How many times the document was loaded: a live update must not reload it."""
    return int(await page.evaluate("performance.getEntriesByType('navigation').length"))


async def test_console_farm_page_is_a_wall_of_phones_with_thumbnails_and_a_busy_phones_task(
    farm: Farm, browser: Any
) -> None:
    """Behind the token form, the Farm page shows the host with a `connected` badge and when
    it was last seen, and each simulated phone as a card with its live thumbnail and its
    state in a word: the busy one its running step, for how long, who submitted it and a
    Watch button; a cordoned one a maintenance Control; the idle one Control; the counts."""
    source = SimulatedSource(3, prefix="pixel-", delay=0.01)
    assert farm.plane is not None
    _, token = await create_token(farm.plane.store, Role.CLIENT, None, "nightly-ci")
    async with running_agent(farm, source, host_id="rack1-host"):
        op = await farm.operator()
        await op.admin.CordonDevice(
            admin_pb2.CordonDeviceRequest(serial="pixel-2", reason="cracked screen")
        )
        busy = await farm.clients(token).scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(
                spec=workflow_spec(login=[tap()], soak=[wait_action(120)]),
                selector=task_pb2.DeviceSelector(serial="pixel-0"),
            )
        )
        page = await open_page(browser, farm, "/", await farm.token(Role.OPERATOR))
        cards = {
            serial: page.locator(f".phone[data-serial='{serial}']") for serial in source.serials
        }
        await cards["pixel-0"].locator(".running-what", has_text="step 2/2 (soak)").wait_for()
        running = cards["pixel-0"].locator(".running")
        assert await running.locator(".submitter").inner_text() == "nightly-ci"
        assert await running.locator(".elapsed").inner_text() != ""
        watch = running.get_by_role("link", name="Watch")
        assert await watch.get_attribute("href") == f"/tasks/{busy.task_id}?watch=1"
        words = {s: await c.locator(".badge.state").inner_text() for s, c in cards.items()}
        assert words == {"pixel-0": "busy", "pixel-1": "ready", "pixel-2": "cordoned"}
        assert await cards["pixel-1"].locator("a.control-link").inner_text() == "Control"
        maintenance = cards["pixel-2"].locator("a.control-link.maintenance")
        assert await maintenance.get_attribute("href") == (
            "/control?host_id=rack1-host&serial=pixel-2&maintenance=1"
        )
        assert await cards["pixel-0"].locator("a.control-link").count() == 0
        # Each phone's thumbnail: a picture of its screen, by one socket for the page.
        for card in cards.values():
            await card.locator("img.thumb").wait_for()
        host = page.locator("section[data-host='rack1-host']")
        state = host.locator(".host-state")
        assert await state.locator(".badge").all_inner_texts() == ["connected"]
        assert (await host.locator(".seen").inner_text()).startswith("last seen 20")
        assert await page.locator("#devices-online b").inner_text() == "3"
        assert await page.locator("#devices-busy b").inner_text() == "1"
        assert await page.locator("#devices-ready b").inner_text() == "1"
        assert await page.locator("#devices-cordoned b").inner_text() == "1"
        assert await page.locator("#hosts-connected b").inner_text() == "1 / 1"
        await page.locator("#live.on").wait_for()
        await page.screenshot(path=str(DOCS / "console-farm.png"), full_page=True)
        # Watch: the busy phone's task, its screen watched at once.
        await watch.click()
        await page.locator("#task-status", has_text="dispatched").wait_for()
        await page.wait_for_function(
            "() => Number(document.querySelector('#watch canvas.screen')?.dataset.seq) > 0"
        )
        assert page.errors == []
        await op.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=busy.task_id))


async def test_console_task_submitted_through_grpc_appears_and_reaches_done_without_reload(
    farm: Farm, browser: Any
) -> None:
    """The Tasks page, opened before the task exists, shows it and then `done` as the
    agent runs it, with no reload; its Task page has the attempt and the events."""
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source, host_id="rack1-host"):
        page = await open_page(browser, farm, "/tasks", await farm.token(Role.CLIENT))
        await page.locator("#live.on").wait_for()
        before = await loads(page)
        client = await farm.client()
        task = await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(
                spec=actions_spec(tap(), wait_action(1), tap()), metadata={"ticket": "OPS-7"}
            )
        )
        row = page.locator(f"tr[data-task='{task.task_id}']")
        await row.wait_for()
        await row.locator("td.status", has_text="done").wait_for()
        assert await loads(page) == before
        assert await farm.status(task.task_id) == "done"

        await row.get_by_role("link", name=task.task_id).click()
        await page.locator("#task-status", has_text="done").wait_for()
        attempts = page.locator("table.attempts tbody tr")
        assert await attempts.count() == 1
        assert "rack1-host" in await attempts.inner_text()
        events = await page.locator("table.events tbody tr td:nth-child(3)").all_inner_texts()
        assert events == [e["kind"] for e in await farm.events(task.task_id)]
        assert page.errors == []


async def test_console_task_page_shows_the_queue_timeout_and_the_deadline(
    farm: Farm, browser: Any
) -> None:
    """The Task page shows both limits as a spec file writes them, and the `queue timeout`
    error once the sweep failed the task (live, no reload)."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(
            spec=actions_spec(tap()),
            selector=task_pb2.DeviceSelector(serial="nowhere"),
            queue_timeout=seconds(2),
            deadline=seconds(90),
        )
    )
    page = await open_page(browser, farm, f"/tasks/{task.task_id}", await farm.token(Role.CLIENT))
    await page.locator("dd[data-field='deadline']", has_text="1m30s per attempt").wait_for()
    assert await page.locator("dd[data-field='queue timeout']").inner_text() == "2s"
    # The selector as the control plane writes it (GetTask's `selector_text`).
    assert await page.locator("dd[data-field='selector']").inner_text() == "serial=nowhere"
    await page.locator("#task-status", has_text="failed").wait_for()
    await page.locator("dd[data-field='error']", has_text="queue timeout").wait_for()
    events = await page.locator("table.events tbody tr td:nth-child(3)").all_inner_texts()
    assert events == ["submit", "queue_timeout"]
    assert page.errors == []


async def test_console_cancel_on_the_task_page_ends_a_running_task_cancelled(
    farm: Farm, browser: Any
) -> None:
    """Cancel on the Task page of a running task asks for confirmation and a reason; then
    the page shows it `cancelled` without a reload, and the database has the task cancelled
    with that reason."""
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source, host_id="rack1-host"):
        client = await farm.client()
        task = await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap(), wait_action(120), tap()))
        )
        await eventually(
            lambda: _status_is(farm, task.task_id, "dispatched"), what="running", timeout=15
        )
        page = await open_page(
            browser, farm, f"/tasks/{task.task_id}", await farm.token(Role.OPERATOR)
        )
        await page.locator("#task-status", has_text="dispatched").wait_for()
        await page.locator("#live.on").wait_for()
        before = await loads(page)
        # It asks first, and wants a reason; "Keep it running" leaves it be.
        await page.get_by_role("button", name="Cancel task").click()
        await page.get_by_role("button", name="Keep it running").click()
        await page.get_by_role("button", name="Cancel task").click()
        await page.get_by_role("button", name="Yes, cancel it").click()
        await page.locator("#cancel-message", has_text="say why").wait_for()
        assert await farm.status(task.task_id) == "dispatched"
        await page.get_by_label("cancel reason").fill("wrong build")
        await page.get_by_role("button", name="Yes, cancel it").click()
        await page.locator("#task-status", has_text="cancelled").wait_for()
        assert await loads(page) == before
        row = await farm.task_row(task.task_id)
        assert (row["status"], row["cancel_reason"]) == ("cancelled", "wrong build")
        assert await page.get_by_role("button", name="Cancel task").count() == 0
        await page.locator("table.attempts", has_text="cancelled").wait_for()
        assert page.errors == []


async def test_console_task_page_shows_the_screenshot_and_links_the_ui_dump_a_step_kept(
    farm: Farm, browser: Any
) -> None:
    """The README's login workflow on a simulated phone: its Task page shows the evidence
    step's screenshot as an image (loaded, the very bytes GetArtifact streams) with its
    kind, size and sha256; a ui_dump's XML is a link to its bytes."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source, host_id="rack1-host"):
        login = await client.scheduler.SubmitTask(
            load_request(str(EXAMPLES / "login-workflow.yaml"))
        )
        dump = await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(
                spec=actions_spec(task_pb2.Action(ui_dump=task_pb2.UiDump()))
            )
        )
        for task in (login, dump):
            await status_is(farm, task.task_id, "done")
    (shot,) = await _artifacts(client, login.task_id)
    (xml,) = await _artifacts(client, dump.task_id)
    streamed = await _artifact_bytes(client, login.task_id, shot.artifact_id)
    assert streamed == screenshot_png(source.serials[0])

    page = await open_page(browser, farm, f"/tasks/{login.task_id}", await farm.token(Role.CLIENT))
    box = page.locator(f"[data-artifact='{shot.artifact_id}']")
    await box.locator("img").wait_for()
    await page.wait_for_function(
        "id => { const img = document.querySelector(`[data-artifact='${id}'] img`);"
        " return img && img.complete && img.naturalWidth > 0; }",
        arg=shot.artifact_id,
    )
    img = box.locator("img")
    # The simulated phone's drawn screen, a third of its 1080 x 2400.
    assert await img.evaluate("img => [img.naturalWidth, img.naturalHeight]") == [360, 800]
    # What the page fetched and checked before showing it: the bytes GetArtifact streams.
    assert await box.get_attribute("data-checked") == hashlib.sha256(streamed).hexdigest()
    served = await page.evaluate(
        "async path => Array.from(new Uint8Array(await (await fetch(path, {headers:"
        " {Authorization: `Bearer ${sessionStorage.getItem('amc.token')}`}})).arrayBuffer()))",
        f"/api/artifacts/{login.task_id}/{shot.artifact_id}",
    )
    assert bytes(served) == streamed
    full = box.locator("a.thumb")
    assert await full.get_attribute("href") == await img.get_attribute("src")
    assert await full.get_attribute("target") == "_blank"
    facts = await box.locator(".artifact-facts").inner_text()
    shown = f"{len(streamed)} B" if len(streamed) < 1024 else f"{len(streamed) / 1024:.1f} KiB"
    assert facts == f"screenshot · {shown} · sha256 {shot.sha256} ✓ checked"
    await page.screenshot(path=str(DOCS / "console-task.png"), full_page=True)

    await page.goto(console_url(farm, f"/tasks/{dump.task_id}"))
    link = page.locator(f"[data-artifact='{xml.artifact_id}'] a.open")
    await page.wait_for_function(
        "id => { const a = document.querySelector(`[data-artifact='${id}'] a.open`);"
        " return a && a.href.startsWith('blob:'); }",
        arg=xml.artifact_id,
    )
    assert await link.inner_text() == "ui_dump XML"
    assert await link.get_attribute("target") == "_blank"
    save = page.locator(f"[data-artifact='{xml.artifact_id}'] a.save")
    assert await save.get_attribute("href") == await link.get_attribute("href")
    assert await save.get_attribute("download") == f"ui_dump-{xml.artifact_id}.xml"
    async with page.expect_download() as saving:
        await save.click()
    saved = await (await saving.value).path()
    assert await asyncio.to_thread(Path(saved).read_text) == UI_XML
    assert page.errors == []


async def test_console_refuses_a_role_without_access_clearly(farm: Farm, browser: Any) -> None:
    """A client token on the Farm page sees the API's refusal, not a broken page; a wrong
    token is asked for again with the reason."""
    page = await open_page(browser, farm, "/", await farm.token(Role.CLIENT))
    refusal = page.get_by_role("alert")
    await refusal.wait_for()
    text = await refusal.inner_text()
    assert "Refused" in text and "role 'client' may not call ListHosts" in text
    assert "Traceback" not in await page.content()

    other = await open_page(browser, farm, "/tasks", "amc_not-a-token")
    await other.get_by_text("malformed token").wait_for()
    assert await other.get_by_label("token").count() == 1
    assert page.errors == [] and other.errors == []


async def test_console_bad_input_gets_the_apis_message_on_the_page(
    farm: Farm, browser: Any
) -> None:
    """A malformed task id in the address, or a label filter without `=`, is answered
    with a clear message on the page."""
    token = await farm.token(Role.OPERATOR)
    page = await open_page(browser, farm, "/tasks/not-a-task", token)
    alert = page.get_by_role("alert")
    await alert.wait_for()
    assert "INVALID_ARGUMENT" in await alert.inner_text()
    assert "task_id" in await alert.inner_text()
    await page.goto(console_url(farm, "/tasks?label=rack"))
    await page.get_by_role("alert").wait_for()
    assert "key=value" in await page.get_by_role("alert").inner_text()
    assert page.errors == []


async def _artifacts(client: Any, task_id: str) -> list[task_pb2.Artifact]:
    """The files its steps' actions kept (not the run's phone log: test_console_log)."""
    request = scheduler_pb2.ListArtifactsRequest(task_id=task_id)
    found = (await client.scheduler.ListArtifacts(request)).artifacts
    return [a for a in found if a.kind != "logcat"]


async def _artifact_bytes(client: Any, task_id: str, artifact_id: str) -> bytes:
    request = scheduler_pb2.GetArtifactRequest(task_id=task_id, artifact_id=artifact_id)
    return b"".join([m.chunk async for m in client.scheduler.GetArtifact(request)][1:])


async def _status_is(farm: Farm, task_id: str, status: str) -> bool:
    return await farm.status(task_id) == status
