"""A phone's screen in the console (issue 24), in a real browser (Playwright on the system's
Chromium) against a real control plane and a real host agent on simulated phones: the
Control page drives an idle phone in an interactive session (a click taps where it lands,
in the phone's pixels), and a running task's page watches its phone without touching the
task. The tests save the README's pictures of both pages."""

from __future__ import annotations

from typing import Any

import pytest

from amc.v1 import scheduler_pb2, task_pb2
from control_plane import screens
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm, eventually, tap, wait_action, workflow_spec
from tests.support.agent import running_agent, status_is
from tests.support.console import console_url
from tests.support.fakes.tcp_proxy import TcpProxy
from tests.test_console import DOCS, browser, farm, open_page, pytestmark

__all__ = ["browser", "farm", "pytestmark"]

HOST = "rack1-host"


async def frame_after(page: Any, seq: int) -> int:
    """The seq of the first frame drawn after frame `seq`."""
    await page.wait_for_function(
        "s => Number(document.querySelector('canvas.screen').dataset.seq || 0) > s", arg=seq
    )
    return int(await page.locator("canvas.screen").get_attribute("data-seq"))


async def pixel(page: Any, x: int, y: int) -> list[int]:
    """The drawn frame's colour at the phone's pixel (x, y)."""
    return list(
        await page.evaluate(
            """([x, y]) => Array.from(document.querySelector('canvas.screen')
                 .getContext('2d').getImageData(x, y, 1, 1).data.slice(0, 3))""",
            [x, y],
        )
    )


async def test_console_control_click_taps_the_phone_where_it_lands_and_the_next_frame_shows_it(
    farm: Farm, browser: Any
) -> None:
    """From the Farm page's Control on an idle phone: a click on the live screen taps the
    phone at that point in its pixels (the phone's own record, the session's steps, the
    action log), and the next frame shows the tap's mark there; Back is a key press."""
    source = SimulatedSource(2, delay=0.01)
    async with running_agent(farm, source, host_id=HOST):
        page = await open_page(browser, farm, "/", await farm.token(Role.OPERATOR))
        row = page.locator(".phone[data-serial='sim-0']")
        await row.get_by_role("link", name="Control").click()
        status = page.locator("#control-status")
        await status.filter(has_text="Controlling sim-0").wait_for()
        task_id = (await status.get_by_role("link").inner_text()).strip()
        seen = await frame_after(page, 0)
        canvas = page.locator("canvas.screen")
        box = await canvas.bounding_box()
        width, height = (int(v) for v in await canvas.evaluate("c => [c.width, c.height]"))
        # A point a third across and two thirds down the drawn screen.
        at = {"x": box["width"] / 3, "y": box["height"] * 2 / 3}
        x, y = round(at["x"] / box["width"] * width), round(at["y"] / box["height"] * height)
        await canvas.click(position=at)
        log = page.locator("#action-log li")
        await log.filter(has_text=f"tap ({x}, {y}) → ok").wait_for()
        taps = [r.args for r in source.actions_for("sim-0") if r.action == "tap"]
        assert taps == [{"x": x, "y": y}]
        await frame_after(page, seen)
        await page.wait_for_function(
            """([x, y]) => { const d = document.querySelector('canvas.screen').getContext('2d')
                 .getImageData(x, y, 1, 1).data; return d[0] > 200 && d[1] < 60 && d[2] < 60; }""",
            arg=[x, y],
        )
        # Decoded from the phone's H.264 stream (WebCodecs): near the mark's red, as
        # H.264 keeps it.
        assert await canvas.get_attribute("data-codec") == "h264"
        shown = await pixel(page, x, y)
        assert all(abs(a - b) < 40 for a, b in zip(shown, [230, 20, 20], strict=True))

        await page.get_by_role("button", name="Back").click()
        await log.filter(has_text="key BACK → ok").wait_for()
        await page.get_by_label("text to type").fill("hello")
        await page.get_by_role("button", name="Type").click()
        await log.filter(has_text='type "hello" → ok').wait_for()

        await page.get_by_role("button", name="End session").click()
        await status_is(farm, task_id, "done")
        client = await farm.client()
        got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))
        assert [s.name for s in got.result.steps] == ["tap", "key", "input_text"]
        assert got.metadata["control"] == "console"
        assert await farm.device_holder(HOST, "sim-0") is None
        assert page.errors == []


async def test_console_control_session_ends_and_frees_the_phone_when_the_page_closes(
    farm: Farm, browser: Any
) -> None:
    """THEN closing the Control page's tab ends its session done and frees the phone."""
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id=HOST):
        page = await open_page(
            browser, farm, f"/control?host_id={HOST}&serial=sim-0", await farm.token(Role.OPERATOR)
        )
        status = page.locator("#control-status")
        await status.filter(has_text="Controlling sim-0").wait_for()
        task_id = (await status.get_by_role("link").inner_text()).strip()
        assert await farm.device_holder(HOST, "sim-0") == task_id
        await page.context.close()
        await status_is(farm, task_id, "done")
        await eventually(
            lambda: _free(farm), what="the phone freed once the page closed", timeout=15
        )


def _leases(attempts: list[Any]) -> list[tuple[Any, ...]]:
    return [(a["attempt"], a["lease_id"], a["state"]) for a in attempts]


async def _free(farm: Farm) -> bool:
    return await farm.device_holder(HOST, "sim-0") is None


async def test_console_control_of_a_busy_phone_or_by_a_client_is_refused_clearly(
    farm: Farm, browser: Any
) -> None:
    """THEN a client token sees no Control anywhere and /control answers PERMISSION_DENIED;
    the Host page offers Control on the idle phone only, and an operator's Control of the
    busy one says which task holds it; nothing is created."""
    async with running_agent(farm, SimulatedSource(2, delay=0.01), host_id=HOST):
        client = await farm.client()
        busy = await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(
                spec=workflow_spec(wait=[wait_action(60)]),
                selector=task_pb2.DeviceSelector(serial="sim-0"),
            )
        )
        await status_is(farm, busy.task_id, "dispatched")
        path = f"/control?host_id={HOST}&serial=sim-0"
        page = await open_page(browser, farm, "/", await farm.token(Role.CLIENT))
        await page.locator(".refusal").wait_for()
        assert await page.locator("a.control-link").count() == 0
        await page.goto(console_url(farm, path))
        refused = page.locator("#control-refusal [role=alert]")
        await refused.filter(has_text="Your token may not control phones").wait_for()
        assert "role 'client' may not control a phone" in await refused.inner_text()
        assert "PERMISSION_DENIED" not in await page.locator("main").inner_text()

        operator = await open_page(browser, farm, f"/hosts/{HOST}", await farm.token(Role.OPERATOR))
        idle = operator.locator(".phone[data-serial='sim-1'] a.control-link")
        await idle.wait_for()
        assert await idle.get_attribute("href") == f"/control?host_id={HOST}&serial=sim-1"
        busy_row = operator.locator(".phone[data-serial='sim-0']")
        await busy_row.get_by_role("link", name=busy.task_id).wait_for()
        assert await busy_row.locator("a.control-link").count() == 0
        await operator.goto(console_url(farm, path))
        # Said in words, with the task that holds the phone to watch; no screen, no End
        # session, no gRPC code's name.
        refused = operator.locator("#control-refusal [role=alert]")
        await refused.filter(has_text="This phone cannot be controlled now").wait_for()
        assert f"phone 'sim-0' is busy with task {busy.task_id}" in await refused.inner_text()
        watch = refused.get_by_role("link", name="Watch its task")
        await watch.wait_for()
        assert await watch.get_attribute("href") == f"/tasks/{busy.task_id}?watch=1"
        assert not await operator.locator("canvas.screen").is_visible()
        assert not await operator.get_by_role("button", name="End session").is_visible()
        assert "FAILED_PRECONDITION" not in await operator.locator("main").inner_text()
        tasks = await client.scheduler.ListTasks(scheduler_pb2.ListTasksRequest())
        assert [t.task_id for t in tasks.tasks] == [busy.task_id]
        assert page.errors == [] and operator.errors == []
        await client.scheduler.CancelTask(
            scheduler_pb2.CancelTaskRequest(task_id=busy.task_id, reason="test over")
        )
        await status_is(farm, busy.task_id, "cancelled")


async def test_console_watching_a_running_task_changes_none_of_its_steps(
    farm: Farm, browser: Any
) -> None:
    """THEN a running task's page streams its phone's frames on "Watch screen", and the
    task runs exactly its own actions with its one lease, its steps as without a viewer;
    the watch stops when the task ends (the README's picture, docs/console-watch-screen.png)."""
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source, host_id=HOST):
        token = await farm.token(Role.CLIENT)
        client = farm.clients(token)
        spec = workflow_spec(
            **{"log in": [tap(200, 230), wait_action(0.5)], "browse": [wait_action(30)]}
        )
        task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec))
        page = await open_page(browser, farm, f"/tasks/{task.task_id}", token)
        await (
            page.locator("dd[data-field='progress']")
            .filter(has_text="running step 2 browse")
            .wait_for(timeout=30_000)
        )
        before = [(r.action, r.args) for r in source.actions_for("sim-0") if r.action != "shell"]
        attempts = await farm.attempts(task.task_id)
        await page.get_by_role("button", name="Watch screen").click()
        first = await frame_after(page, 0)
        await frame_after(page, first + 2)  # several frames, across the page's redraws
        await page.locator("#live.on").wait_for()
        # The README's picture is of the stream, decoded in the page.
        assert await page.locator("canvas.screen").get_attribute("data-codec") == "h264"
        await page.screenshot(path=str(DOCS / "console-watch-screen.png"), full_page=True)
        after = [(r.action, r.args) for r in source.actions_for("sim-0") if r.action != "shell"]
        assert after == before == [("tap", {"x": 200, "y": 230})]
        assert _leases(await farm.attempts(task.task_id)) == _leases(attempts)
        await client.scheduler.CancelTask(
            scheduler_pb2.CancelTaskRequest(task_id=task.task_id, reason="picture taken")
        )
        await status_is(farm, task.task_id, "cancelled")
        await page.locator("#task-status", has_text="cancelled").wait_for()
        assert await page.locator("#watch").count() == 0
        got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))
        assert [s.name for s in got.result.steps] == ["log in", "browse"]
        assert page.errors == []


@pytest.mark.parametrize("video", [True, False], ids=["mp4", "apng"])
async def test_console_task_page_shows_the_screen_recording_a_session_kept(
    farm: Farm, browser: Any, video: bool
) -> None:
    """THEN a Control session opened with record=1 shows its recording on its Task page once
    it ended, loaded and its sha256 checked, in a section of its own: an MP4 of the
    phone's stream playing in a <video>, or (a phone without a stream) an animated PNG."""
    source = SimulatedSource(1, delay=0.01)
    source.video = video
    kind = "screen_video" if video else "screen_recording"
    async with running_agent(farm, source, host_id=HOST):
        page = await open_page(
            browser,
            farm,
            f"/control?host_id={HOST}&serial=sim-0&record=1",
            await farm.token(Role.OPERATOR),
        )
        status = page.locator("#control-status")
        await status.filter(has_text="its screen recorded").wait_for()
        task_id = (await status.get_by_role("link").inner_text()).strip()
        await frame_after(page, 0)
        done = page.locator("#action-log li").filter(has_text="→ ok")
        for n, x in enumerate((50, 150, 250)):  # a few seconds of the phone's screen
            await page.locator("canvas.screen").click(position={"x": x, "y": 50 + x})
            await done.nth(n).wait_for()
            await page.wait_for_timeout(400)  # taps spaced as a person would: not a wait
        await page.get_by_role("button", name="End session").click()
        await status_is(farm, task_id, "done")
        await page.goto(console_url(farm, f"/tasks/{task_id}"))
        await page.locator("h2", has_text="Screen recording").wait_for()
        box = page.locator(f".recordings .artifact[data-kind='{kind}']")
        await box.locator(".checked", has_text="✓ checked").wait_for()
        if video:
            # Chromium plays it: its first picture decoded, at the stream's size.
            await page.wait_for_function(
                """() => { const v = document.querySelector('.recordings .artifact video');
                           return v && v.readyState >= 2 && v.videoWidth === 360
                             && v.duration > 0; }"""
            )
            await page.screenshot(path=str(DOCS / "console-recording.png"), full_page=True)
        else:
            await page.wait_for_function(
                """() => { const i = document.querySelector('.recordings .artifact img');
                           return i && i.complete && i.naturalWidth > 0; }"""
            )
        assert await page.locator(f"table.steps [data-kind='{kind}']").count() == 0
        assert page.errors == []


async def test_console_watch_lost_with_its_host_opens_again_by_itself_when_the_host_is_back(
    farm: Farm, browser: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """THEN a watch lost because the phone's host dropped off the replica (its connection
    cut: UNAVAILABLE) says so and opens again by itself once the host is back, and frames
    come again; nobody clicks, and the task runs on with its one lease."""
    monkeypatch.setattr(screens, "STALE", 0.5)
    assert farm.plane is not None
    async with (
        TcpProxy("127.0.0.1", farm.plane.port) as proxy,
        running_agent(farm, SimulatedSource(1, delay=0.01), host_id=HOST, address=proxy.address),
    ):
        client = await farm.client()
        task = await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(spec=workflow_spec(wait=[wait_action(60)]))
        )
        await status_is(farm, task.task_id, "dispatched")
        attempts = await farm.attempts(task.task_id)
        page = await open_page(
            browser, farm, f"/tasks/{task.task_id}", await farm.token(Role.OPERATOR)
        )
        await page.get_by_role("button", name="Watch screen").click()
        await frame_after(page, 0)
        state = page.locator(".screen-state")

        proxy.cut()
        await state.filter(has_text="screen lost: UNAVAILABLE").wait_for()
        await state.filter(has_text="opening it again").wait_for()
        proxy.heal()
        await page.wait_for_function(
            "() => document.querySelector('.screen-state').textContent.startsWith('frame ')"
        )
        drawn = int(await page.locator("canvas.screen").get_attribute("data-seq"))
        await frame_after(page, drawn)  # and they keep coming
        assert await page.get_by_role("button", name="Stop watching").count() == 1
        assert await farm.status(task.task_id) == "dispatched"
        assert _leases(await farm.attempts(task.task_id)) == _leases(attempts)
        await client.scheduler.CancelTask(
            scheduler_pb2.CancelTaskRequest(task_id=task.task_id, reason="test over")
        )
        await status_is(farm, task.task_id, "cancelled")
        assert page.errors == []


async def test_console_watch_of_a_task_that_moved_follows_it_onto_its_new_phone(
    farm: Farm, browser: Any
) -> None:
    """THEN a task's watch whose task moved to another phone (its lease ran out, another
    phone took it) says so and opens again by itself onto the task's new phone; nobody
    clicks."""
    source = SimulatedSource(2, delay=0.01)
    async with running_agent(farm, source, host_id=HOST):
        token = await farm.token(Role.CLIENT)
        client = farm.clients(token)

        async def submit(spec: Any, **fields: Any) -> str:
            request = scheduler_pb2.SubmitTaskRequest(spec=spec, **fields)
            return str((await client.scheduler.SubmitTask(request)).task_id)

        busy = await submit(
            workflow_spec(wait=[wait_action(1.0)]), selector=task_pb2.DeviceSelector(serial="sim-1")
        )
        await status_is(farm, busy, "dispatched")
        task_id = await submit(workflow_spec(wait=[wait_action(60)]), max_attempts=2)
        await status_is(farm, task_id, "dispatched")
        (first,) = await farm.attempts(task_id)
        assert first["device_serial"] == "sim-0"
        page = await open_page(browser, farm, f"/tasks/{task_id}", token)
        await page.get_by_role("button", name="Watch screen").click()
        canvas = page.locator("canvas.screen")
        await page.wait_for_function(
            "p => document.querySelector('canvas.screen')?.dataset.phone === p",
            arg=f"{HOST}/sim-0",
        )
        await status_is(farm, busy, "done")
        await farm.expire_now(str(first["lease_id"]))
        await page.locator(".screen-state").filter(has_text="ABORTED").wait_for()
        await page.wait_for_function(
            "p => document.querySelector('canvas.screen')?.dataset.phone === p",
            arg=f"{HOST}/sim-1",
            timeout=30_000,
        )
        attempts = await farm.attempts(task_id)
        assert [(a["attempt"], a["device_serial"]) for a in attempts] == [
            (1, "sim-0"),
            (2, "sim-1"),
        ]
        seq = int(await canvas.get_attribute("data-seq"))
        await frame_after(page, seq)  # and they keep coming
        assert await page.get_by_role("button", name="Stop watching").count() == 1
        await client.scheduler.CancelTask(
            scheduler_pb2.CancelTaskRequest(task_id=task_id, reason="test over")
        )
        await status_is(farm, task_id, "cancelled")
        assert page.errors == []
