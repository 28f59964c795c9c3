"""The console's HTTP side, over a real socket: the JSON mapping of amc.v1.Scheduler (the
same servicer, roles, validation and messages as gRPC), the pages, the event stream."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane.domain import Role
from control_plane.server import ControlPlane
from host_agent.simulated import SimulatedSource
from host_agent.simulated_screen import UI_XML, screenshot_png
from tests.support import Farm, actions_spec, eventually, tap
from tests.support.agent import running_agent, status_is, submit
from tests.support.console import SETTINGS, console_farm, console_url

A = scheduler_pb2
# The console's ES modules, as the package holds them.
STATIC = Path(__file__).resolve().parent.parent / "control_plane" / "console" / "static"
SCRIPTS = sorted(p.name for p in STATIC.glob("*.js"))


@pytest.fixture
async def farm(database_url: str) -> AsyncIterator[Farm]:
    async with console_farm(database_url) as f:
        yield f


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


async def api(
    http: aiohttp.ClientSession,
    farm: Farm,
    method: str,
    body: Any = None,
    *,
    token: str | None = None,
    raw: str | None = None,
    content_type: str = "application/json",
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": content_type}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = raw if raw is not None else json.dumps(body or {})
    url = console_url(farm, f"/api/amc.v1.Scheduler/{method}")
    async with http.post(url, data=data, headers=headers) as response:
        return response.status, await response.json()


async def test_console_api_calls_the_scheduler_with_its_messages_in_json(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """SubmitTask through the console queues the task in the database; GetTask answers the
    proto JSON of the Task, as gRPC would."""
    token = await farm.token(Role.CLIENT)
    # As proto JSON writes it with every field: the list of apps to install first, empty.
    spec = {"actions": {"actions": [{"tap": {"x": 1, "y": 2}}]}, "apps": [], "start_snapshot": ""}
    status, task = await api(
        http, farm, "SubmitTask", {"spec": spec, "selector": {"labels": {"rack": "a"}}}, token=token
    )
    assert status == 200, task
    assert task["status"] == "TASK_STATUS_QUEUED"
    row = await farm.task_row(task["task_id"])
    assert row["status"] == "queued" and row["selector_labels"] == {"rack": "a"}
    status, again = await api(http, farm, "GetTask", {"task_id": task["task_id"]}, token=token)
    assert status == 200 and again["spec"] == spec and again["task_id"] == task["task_id"]


@pytest.mark.parametrize(
    ("role", "method", "body", "status", "code", "words"),
    [
        (None, "ListTasks", {}, 401, "UNAUTHENTICATED", "missing authorization"),
        ("client", "ListHosts", {}, 403, "PERMISSION_DENIED", "may not call ListHosts"),
        ("client", "GetQueue", {}, 403, "PERMISSION_DENIED", "may not call GetQueue"),
        ("client", "GetTask", {"task_id": "nope"}, 400, "INVALID_ARGUMENT", "task_id"),
        ("client", "GetTask", {"task_id": "00000000-0000-4000-8000-000000000000"}, 404,
         "NOT_FOUND", "no task"),
        ("client", "ListTasks", {"page_size": -1}, 400, "INVALID_ARGUMENT", "page_size"),
        ("client", "ListTasks", {"nonsense": 1}, 400, "INVALID_ARGUMENT", "nonsense"),
        ("client", "ListTasks", {"text": "a\nb"}, 400, "INVALID_ARGUMENT", "text"),
        ("client", "RegisterHost", {}, 404, "NOT_FOUND", "no method RegisterHost"),
        ("client", "CreateToken", {}, 404, "NOT_FOUND", "no method CreateToken"),
    ],
)  # fmt: skip
async def test_console_api_refuses_with_the_grpc_code_and_message(
    farm: Farm,
    http: aiohttp.ClientSession,
    role: str | None,
    method: str,
    body: dict[str, Any],
    status: int,
    code: str,
    words: str,
) -> None:
    """Each refusal is the gRPC API's code and message, with the matching HTTP status."""
    token = await farm.token(Role(role)) if role else None
    before = await farm.snapshot()
    got, answer = await api(http, farm, method, body, token=token)
    assert (got, answer["code"]) == (status, code), answer
    assert words in answer["message"]
    assert "Traceback" not in answer["message"]
    assert await farm.snapshot() == before


async def test_console_api_refuses_what_is_not_json_clearly(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """Broken JSON, or another content type (what a page of another site could send), is
    refused before anything runs."""
    token = await farm.token(Role.OPERATOR)
    status, answer = await api(http, farm, "ListTasks", raw="{nope", token=token)
    assert status == 400 and answer["code"] == "INVALID_ARGUMENT"
    assert answer["message"].startswith("request: ")
    status, answer = await api(
        http, farm, "CancelTask", raw="{}", token=token, content_type="text/plain"
    )
    assert status == 400 and "application/json" in answer["message"]
    async with http.get(console_url(farm, "/nothing/here")) as response:
        assert response.status == 404
        assert (await response.json())["code"] == "NOT_FOUND"


async def test_console_api_cancel_of_a_finished_task_is_a_conflict(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """FAILED_PRECONDITION becomes 409 with the gRPC message; the outcome stands."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(A.SubmitTaskRequest(spec=actions_spec(tap())))
    host = await farm.host("h1", "s1")
    a = await host.acquire_one("s1")
    await host.renew(a.lease_id)
    await host.report(a, lease_pb2.OUTCOME_DONE)
    token = await farm.token(Role.CLIENT)
    status, answer = await api(http, farm, "CancelTask", {"task_id": task.task_id}, token=token)
    assert (status, answer["code"]) == (409, "FAILED_PRECONDITION")
    assert "already done" in answer["message"]
    assert await farm.status(task.task_id) == "done"


async def test_list_tasks_filters_by_selector_label_and_text(farm: Farm) -> None:
    """Labels the selector must carry; text: the id's start, or within the request id or
    metadata, literally (a `%` matches only a `%`)."""
    client = await farm.client()

    async def submit(**fields: Any) -> str:
        task = await client.scheduler.SubmitTask(
            A.SubmitTaskRequest(spec=actions_spec(tap()), **fields)
        )
        return str(task.task_id)

    rack_a = await submit(selector={"labels": {"rack": "a", "model": "P7"}})
    rack_b = await submit(selector={"labels": {"rack": "b"}}, request_id="order-77")
    noted = await submit(metadata={"ticket": "OPS-100%"})

    async def listed(**fields: Any) -> set[str]:
        answer = await client.scheduler.ListTasks(A.ListTasksRequest(**fields))
        return {t.task_id for t in answer.tasks}

    assert await listed(selector_labels={"rack": "a"}) == {rack_a}
    assert await listed(selector_labels={"rack": "a", "model": "P7"}) == {rack_a}
    assert await listed(selector_labels={"rack": "c"}) == set()
    assert await listed(text="ORDER-7") == {rack_b}
    assert await listed(text="ops-100%") == {noted}
    assert await listed(text="%") == {noted}
    assert await listed(text="_") == set()
    assert await listed(text=rack_a[:8]) == {rack_a}
    assert await listed() == {rack_a, rack_b, noted}


async def test_get_queue_groups_queued_tasks_by_selector_and_says_why_they_wait(
    farm: Farm,
) -> None:
    """Per selector: count, oldest, the matching devices by state, and the reason, as the
    queue was counted (within a count's period of the submits)."""
    client = await farm.client()
    operator = await farm.operator()

    async def submit(**labels: str) -> None:
        await client.scheduler.SubmitTask(
            A.SubmitTaskRequest(spec=actions_spec(tap()), selector={"labels": labels})
        )

    host = await farm.host("h1", "s1", rack="a")
    await submit(rack="a")
    await host.acquire_one("s1")  # s1 busy from here on
    await submit(rack="a")
    await submit(rack="a")
    await submit(rack="z")

    async def counted() -> A.GetQueueResponse | None:
        answer = await operator.scheduler.GetQueue(A.GetQueueRequest())
        return answer if answer.total == 3 else None

    answer = await eventually(counted, what="the three queued tasks counted")
    assert answer.HasField("counted_at")
    busy, nowhere = answer.groups
    assert (dict(busy.selector.labels), busy.count) == ({"rack": "a"}, 2)
    assert (busy.devices_idle, busy.devices_busy, busy.devices_unavailable) == (0, 1, 0)
    assert busy.waiting_because == "1 matching device, busy"
    assert busy.HasField("oldest_queued_at")
    assert (dict(nowhere.selector.labels), nowhere.count) == ({"rack": "z"}, 1)
    assert nowhere.waiting_because == "no registered device matches rack=z"


async def test_console_events_tell_a_browser_which_task_changed(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """After `hello`, a task submitted through gRPC arrives as a `task` event with its id;
    without a token the stream is refused like the API."""
    async with http.get(console_url(farm, "/api/events")) as refused:
        assert refused.status == 401
    token = await farm.token(Role.CLIENT)
    headers = {"Authorization": f"Bearer {token}"}
    async with http.get(console_url(farm, "/api/events"), headers=headers) as stream:
        assert stream.status == 200
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        assert await stream.content.readline() == b"event: hello\n"
        client = await farm.client()
        task = await client.scheduler.SubmitTask(A.SubmitTaskRequest(spec=actions_spec(tap())))
        async with asyncio.timeout(10):
            while True:
                line = await stream.content.readline()
                if line == f"data: {task.task_id}\n".encode():
                    break


async def test_console_page_carries_the_statuses_and_answers_their_selectors_as_text(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """The page is given the task statuses the control plane has (in order; which end a
    task, which run one) instead of its script declaring them, and every selector in an
    answer comes with the control plane's writing of it beside it (`selector_text`)."""
    async with http.get(console_url(farm, "/tasks")) as response:
        html = await response.text()
    block = html.split('<script type="application/json" id="statuses">', 1)[1]
    assert json.loads(block.split("</script>", 1)[0]) == {
        "statuses": ["queued", "assigned", "dispatched", "done", "failed", "cancelled"],
        "terminal": ["done", "failed", "cancelled"],
        "in_flight": ["assigned", "dispatched"],
    }
    token = await farm.token(Role.OPERATOR)
    spec = {"actions": {"actions": [{"tap": {"x": 1, "y": 2}}]}}
    selector = {"labels": {"rack": "a", "model": "P7"}}
    _, labelled = await api(
        http, farm, "SubmitTask", {"spec": spec, "selector": selector}, token=token
    )
    _, anywhere = await api(http, farm, "SubmitTask", {"spec": spec}, token=token)
    _, got = await api(http, farm, "GetTask", {"task_id": labelled["task_id"]}, token=token)
    assert (labelled["selector_text"], got["selector_text"]) == ("model=P7,rack=a",) * 2
    assert anywhere["selector_text"] == "any device"
    _, listed = await api(http, farm, "ListTasks", {}, token=token)
    assert sorted(t["selector_text"] for t in listed["tasks"]) == ["any device", "model=P7,rack=a"]

    async def counted() -> dict[str, Any] | None:
        _, queue = await api(http, farm, "GetQueue", {}, token=token)
        return queue if queue.get("total") == 2 else None

    queue = await eventually(counted, what="the two queued tasks counted")
    texts = sorted(g["selector_text"] for g in queue["groups"])
    assert texts == ["any device", "model=P7,rack=a"]


async def test_console_pages_are_one_document_with_a_strict_policy(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """Every page path serves the console's page; scripts only from the console itself,
    each of its ES modules as JavaScript (a browser runs no module served otherwise)."""
    for path in ("/", "/queue", "/tasks", "/tasks/abc", "/hosts/h1"):
        async with http.get(console_url(farm, path)) as response:
            assert response.status == 200
            assert '<script type="module" src="/static/console.js">' in await response.text()
            policy = response.headers["Content-Security-Policy"]
            assert "default-src 'self'" in policy and "img-src 'self' blob:;" in policy
    assert "console.js" in SCRIPTS and len(SCRIPTS) > 1
    for name in SCRIPTS:
        async with http.get(console_url(farm, f"/static/{name}")) as response:
            assert response.status == 200, name
            assert response.content_type == "text/javascript", name


async def test_insecure_console_is_open_on_loopback_only(
    database_url: str, http: aiohttp.ClientSession
) -> None:
    """With --insecure no token is asked for on 127.0.0.1; another Host name is refused,
    and a non-loopback address is refused at start."""
    async with console_farm(database_url, insecure=True) as open_farm:
        status, answer = await api(http, open_farm, "ListHosts")
        assert (status, answer) == (200, {"hosts": []})
        url = console_url(open_farm, "/api/amc.v1.Scheduler/ListHosts")
        async with http.post(url, json={}, headers={"Host": "attacker.example"}) as response:
            assert response.status == 403
    with pytest.raises(ValueError, match="loopback"):
        ControlPlane(database_url, SETTINGS, insecure=True, http_listen="0.0.0.0:8080")


async def test_console_serves_an_artifact_as_getartifact_does_with_its_type_size_and_sha256(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """GET /api/artifacts/<task>/<artifact>: the bytes GetArtifact streams, typed by kind,
    with their length and SHA-256; refused without a token (401), to a host token (403),
    for a malformed id (400) and an artifact that is not the task's (404), each with the
    API's one-line message."""
    client = await farm.client()
    screenshot = task_pb2.Action(screenshot=task_pb2.Screenshot())
    ui_dump = task_pb2.Action(ui_dump=task_pb2.UiDump())
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        task_id = await submit(client, actions_spec(screenshot, ui_dump))
        await status_is(farm, task_id, "done")
    kept = await client.scheduler.ListArtifacts(A.ListArtifactsRequest(task_id=task_id))
    png, xml, log = kept.artifacts
    assert log.kind == "logcat"  # the run's phone log, kept with its last step
    for token in (await farm.token(Role.CLIENT), await farm.token(Role.OPERATOR)):
        headers = {"Authorization": f"Bearer {token}"}
        for artifact, body, kind in (
            (png, screenshot_png("sim-0"), "image/png"),
            (xml, UI_XML.encode(), "application/xml"),
        ):
            request = A.GetArtifactRequest(task_id=task_id, artifact_id=artifact.artifact_id)
            streamed = [m async for m in client.scheduler.GetArtifact(request)]
            assert b"".join(m.chunk for m in streamed[1:]) == body
            url = console_url(farm, f"/api/artifacts/{task_id}/{artifact.artifact_id}")
            async with http.get(url, headers=headers) as response:
                assert response.status == 200
                assert response.content_type == kind
                assert response.content_length == len(body) == artifact.size_bytes
                assert response.headers["X-Amc-Sha256"] == artifact.sha256
                assert await response.read() == body
                assert hashlib.sha256(body).hexdigest() == artifact.sha256

    other = await submit(client, actions_spec(tap()))
    refusals = [
        (None, task_id, png.artifact_id, 401, "UNAUTHENTICATED", "missing authorization"),
        (await farm.token(Role.HOST, "h1"), task_id, png.artifact_id, 403,
         "PERMISSION_DENIED", "may not call GetArtifact"),
        (await farm.token(Role.CLIENT), task_id, "nope", 400, "INVALID_ARGUMENT",
         "artifact_id"),
        (await farm.token(Role.CLIENT), other, png.artifact_id, 404, "NOT_FOUND", "artifact"),
        (await farm.token(Role.CLIENT), task_id, str(uuid.uuid4()), 404, "NOT_FOUND",
         "artifact"),
    ]  # fmt: skip
    for token, task, artifact_id, status, code, words in refusals:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = console_url(farm, f"/api/artifacts/{task}/{artifact_id}")
        async with http.get(url, headers=headers) as response:
            answer = await response.json()
            assert (response.status, answer["code"]) == (status, code), answer
            assert words in answer["message"] and "\n" not in answer["message"]


async def test_console_does_not_pass_off_damaged_artifact_bytes_as_whole(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """Bytes that no longer match the stored SHA-256 (damaged in the database) are cut
    short of their Content-Length: the browser's fetch fails rather than show them."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        task_id = await submit(
            client, actions_spec(task_pb2.Action(screenshot=task_pb2.Screenshot()))
        )
        await status_is(farm, task_id, "done")
    listing = await client.scheduler.ListArtifacts(A.ListArtifactsRequest(task_id=task_id))
    png, _log = listing.artifacts
    assert farm.db is not None
    await farm.db.execute(
        "UPDATE artifact_chunks SET data = overlay(data placing '\\x00'::bytea from 20)"
        " WHERE artifact_id = $1",
        uuid.UUID(png.artifact_id),
    )
    headers = {"Authorization": f"Bearer {await farm.token(Role.CLIENT)}"}
    url = console_url(farm, f"/api/artifacts/{task_id}/{png.artifact_id}")
    async with http.get(url, headers=headers) as response:
        assert response.status == 200 and response.content_length == png.size_bytes
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()
