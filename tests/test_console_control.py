"""The console's remote control of a phone (issue 24), over a real socket: /api/control is
an interactive session of the usual kind (Scheduler.OpenSession in-process) driven by JSON
messages on a WebSocket, relayed to a real host agent on simulated phones."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from amc.v1 import scheduler_pb2, task_pb2
from control_plane import validate
from control_plane.console.calls import SUBPROTOCOL, TOKEN_PROTOCOL
from control_plane.console.control import parse_action
from control_plane.domain import Role
from control_plane.errors import InvalidArgument
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, wait_action
from tests.support.agent import running_agent, status_is
from tests.support.console import SETTINGS as CONSOLE_SETTINGS
from tests.support.console import console_farm, console_url

HOST = "rack1-host"


@pytest.fixture
async def farm(database_url: str) -> AsyncIterator[Farm]:
    async with console_farm(database_url) as f:
        yield f


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session


def control_url(farm: Farm, serial: str = "sim-0", host_id: str = HOST, **query: str) -> str:
    q = "&".join(f"{k}={v}" for k, v in {"host_id": host_id, "serial": serial, **query}.items())
    return console_url(farm, f"/api/control?{q}")


def offered(token: str) -> list[str]:
    """What the console's page offers: the protocol, and its token as one (a browser's
    WebSocket cannot send an Authorization header)."""
    return [SUBPROTOCOL, f"{TOKEN_PROTOCOL}{token}"]


async def answer(ws: aiohttp.ClientWebSocketResponse, key: str) -> dict[str, Any]:
    """The next message that has `key` (the task's changes come between)."""
    async with asyncio.timeout(20):
        while True:
            message = await ws.receive()
            assert message.type is aiohttp.WSMsgType.TEXT, message
            document: dict[str, Any] = json.loads(message.data)
            if key in document:
                return document


async def dispatched(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    while True:
        task = (await answer(ws, "task"))["task"]
        if task["status"] == "TASK_STATUS_DISPATCHED":
            return task


async def rows(farm: Farm) -> list[Any]:
    """What a control request may create or change: tasks and their history."""
    assert farm.db is not None
    return [
        await farm.db.fetch(f"SELECT * FROM {table} ORDER BY 1, 2")
        for table in ("tasks", "attempts", "task_events")
    ]


async def test_console_control_taps_the_phone_and_closing_the_socket_ends_the_session_done(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """THEN each action is one step of the session's task (the phone tapped, swiped, typed
    and keyed as asked, each answer saying the phone's screen size), the task records who
    opened it, and closing the socket ends the task done and frees the phone."""
    source = SimulatedSource(1, delay=0.01)
    token = await farm.token(Role.OPERATOR)
    async with running_agent(farm, source, host_id=HOST):
        ws = await http.ws_connect(control_url(farm), protocols=offered(token))
        assert ws.protocol == SUBPROTOCOL
        task = await dispatched(ws)
        assert task["spec"] == {"session": {"idle_timeout": "300s"}}
        assert task["metadata"]["control"] == "console"
        assert task["host_id"] == HOST and task["device_serial"] == "sim-0"
        assert await farm.device_holder(HOST, "sim-0") == task["task_id"]
        await ws.send_json({"tap": {"x": 540, "y": 1200}})
        step = await answer(ws, "step")
        assert step["action"] == {"tap": {"x": 540, "y": 1200}}
        assert (step["step"]["name"], step["step"]["status"]) == ("tap", "STEP_STATUS_OK")
        assert step["screen"] == {"width": 1080, "height": 2400}
        await ws.send_json({"swipe": {"x1": 10, "y1": 900, "x2": 10, "y2": 100}})
        await ws.send_json({"type": {"text": "hello"}})
        await ws.send_json({"key": "BACK"})
        names = [(await answer(ws, "step"))["step"]["name"] for _ in range(3)]
        assert names == ["swipe", "input_text", "key"]
        await ws.close()
        await status_is(farm, task["task_id"], "done")
    token_id = str(uuid.UUID(hex=token.split("_")[1]))
    assert (await farm.task_row(task["task_id"]))["caller"] == token_id
    assert task["metadata"]["operator"] == f"test ({token_id})"
    done = [(r.action, r.args) for r in source.actions_for("sim-0") if r.action != "shell"]
    assert done == [
        ("tap", {"x": 540, "y": 1200}),
        ("swipe", {"x1": 10, "y1": 900, "x2": 10, "y2": 100, "duration_ms": 300}),
        ("input_text", {"text": "hello"}),
        ("key", {"keycode": 4}),
    ]
    client = await farm.client()
    got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task["task_id"]))
    assert [s.name for s in got.result.steps] == ["tap", "swipe", "input_text", "key"]
    assert await farm.device_holder(HOST, "sim-0") is None


async def test_console_control_refuses_a_bad_action_and_the_session_goes_on(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """THEN a message that is not an action gets INVALID_ARGUMENT naming what is wrong,
    nothing reaches the phone, and the next good action is the session's first step."""
    source = SimulatedSource(1, delay=0.01)
    token = await farm.token(Role.OPERATOR)
    async with running_agent(farm, source, host_id=HOST):
        ws = await http.ws_connect(control_url(farm), protocols=offered(token))
        task = await dispatched(ws)
        bad = [
            ("{not json", "message: not JSON"),
            ('{"tap": {"x": 1}}', "tap.y: required: a whole number of phone pixels"),
            ('{"tap": {"x": "1", "y": 2}}', "tap.x: required: a whole number of phone pixels"),
            ('{"tap": {"x": 1, "y": 200000}}', "action.tap.y"),
            ('{"key": "WARP"}', "key: one of BACK, HOME, APP_SWITCH, POWER"),
            ('{"rotate": "up"}', "rotate: left or right"),
            ('{"type": {"text": ""}}', "type.text: required: the text to type"),
            ('{"tap": {"x": 1, "y": 2}, "key": "BACK"}', "message: one of tap, swipe"),
            ("[1, 2]", "message: one of tap, swipe"),
        ]
        for text, message in bad:
            await ws.send_str(text)
            error = (await answer(ws, "error"))["error"]
            assert error["code"] == "INVALID_ARGUMENT", error
            assert error["message"].startswith(message), (text, error)
        await ws.send_bytes(b"\x00")
        assert (await answer(ws, "error"))["error"]["message"] == "message: send JSON text"
        assert [r for r in source.actions_for("sim-0") if r.action != "shell"] == []
        await ws.send_json({"tap": {"x": 3, "y": 4}})
        step = (await answer(ws, "step"))["step"]
        assert step.get("index", 0) == 0 and step["name"] == "tap"
        await ws.close()
        await status_is(farm, task["task_id"], "done")


async def test_console_control_is_for_operators_only(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """THEN a client token gets PERMISSION_DENIED, no token UNAUTHENTICATED, as JSON before
    any socket opens, and no task is created."""
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source, host_id=HOST):
        before = await rows(farm)
        client = await farm.token(Role.CLIENT)
        async with http.get(control_url(farm), headers={"Authorization": f"Bearer {client}"}) as r:
            assert r.status == 403
            body = await r.json()
            assert body["code"] == "PERMISSION_DENIED"
            assert body["message"].startswith("role 'client' may not control a phone")
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(control_url(farm), protocols=offered(client))
        assert refused.value.status == 403
        async with http.get(control_url(farm)) as r:
            assert r.status == 401 and (await r.json())["code"] == "UNAUTHENTICATED"
        assert await rows(farm) == before


async def test_console_control_refuses_an_unknown_or_busy_phone_and_bad_queries(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """THEN an unknown host or phone is NOT_FOUND, a busy phone FAILED_PRECONDITION naming
    its task, a malformed query INVALID_ARGUMENT; each as JSON, nothing created."""
    source = SimulatedSource(2, delay=0.01)
    token = await farm.token(Role.OPERATOR)
    headers = {"Authorization": f"Bearer {token}"}
    async with running_agent(farm, source, host_id=HOST):
        client = await farm.client()
        busy = await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(
                spec=actions_spec(wait_action(30)),
                selector=task_pb2.DeviceSelector(serial="sim-1"),
            )
        )
        await status_is(farm, busy.task_id, "dispatched")
        before = await rows(farm)
        cases = [
            (control_url(farm, "sim-9"), 404, "NOT_FOUND", "no phone 'sim-9' on host 'rack1-host'"),
            (control_url(farm, host_id="nowhere"), 404, "NOT_FOUND", "no host 'nowhere'"),
            (
                control_url(farm, "sim-1"),
                409,
                "FAILED_PRECONDITION",
                f"phone 'sim-1' is busy with task {busy.task_id}: only an idle ready phone",
            ),
            (console_url(farm, "/api/control?serial=sim-0"), 400, "INVALID_ARGUMENT", "host_id"),
            (control_url(farm, "bad serial"), 400, "INVALID_ARGUMENT", "serial: may hold"),
            (control_url(farm, idle_timeout="0"), 400, "INVALID_ARGUMENT", "idle_timeout"),
            (control_url(farm, idle_timeout="x"), 400, "INVALID_ARGUMENT", "idle_timeout"),
            (control_url(farm, record="yes"), 400, "INVALID_ARGUMENT", "record: 1 to keep"),
        ]
        for url, status, code, message in cases:
            async with http.get(url, headers=headers) as r:
                body = await r.json()
                assert (r.status, body["code"]) == (status, code), (url, body)
                assert body["message"].startswith(message), (url, body)
        assert await rows(farm) == before
        await client.scheduler.CancelTask(
            scheduler_pb2.CancelTaskRequest(task_id=busy.task_id, reason="test over")
        )
        await status_is(farm, busy.task_id, "cancelled")


async def test_an_idle_console_control_session_ends_and_frees_the_phone(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """THEN a session sent nothing for its idle timeout ends failed ("idle timeout"),
    its socket is closed by the server, and the phone is free again."""
    token = await farm.token(Role.OPERATOR)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id=HOST):
        ws = await http.ws_connect(control_url(farm, idle_timeout="1"), protocols=offered(token))
        task = await dispatched(ws)
        final = await answer(ws, "task")
        assert final["task"]["status"] == "TASK_STATUS_FAILED"
        assert final["task"]["result"]["error"] == "idle timeout"
        closed = await asyncio.wait_for(ws.receive(), 10)
        assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert await farm.status(task["task_id"]) == "failed"
        assert await farm.device_holder(HOST, "sim-0") is None


async def test_console_control_with_record_keeps_the_sessions_screen_recording(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """THEN a session opened with record=1 keeps a recording of the phone's screen (an MP4
    of its stream) with its last step once it ends."""
    token = await farm.token(Role.OPERATOR)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id=HOST):
        ws = await http.ws_connect(control_url(farm, record="1"), protocols=offered(token))
        task = await dispatched(ws)
        assert task["spec"]["record_screen"] == {}
        await ws.send_json({"tap": {"x": 540, "y": 1200}})
        await answer(ws, "step")
        await ws.close()
        await status_is(farm, task["task_id"], "done")
    client = await farm.client()
    got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task["task_id"]))
    kept = [(a.kind, a.content_type) for s in got.result.steps for a in s.artifacts]
    assert kept == [("logcat", "application/gzip"), ("screen_video", "video/mp4")]


FIELDS = st.sampled_from(["x", "y", "x1", "y1", "x2", "y2", "duration_ms", "text"])
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.sampled_from(["BACK", "HOME", "APP_SWITCH"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(FIELDS | st.text(max_size=5), inner, max_size=5)
    ),
    max_leaves=12,
)
KINDS = st.sampled_from(["tap", "swipe", "type", "key"])
# Mostly one action's key, over any value or an object of the actions' fields.
MESSAGES = st.one_of(
    JSON,
    st.builds(lambda kind, value: {kind: value}, KINDS, JSON),
    st.builds(lambda kind, value: {kind: value}, KINDS, st.dictionaries(FIELDS, JSON, max_size=6)),
)


@settings(
    max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.one_of(MESSAGES.map(json.dumps), st.text(max_size=40)))
@example('{"type": {"text": "\\ud800"}}')  # JSON may carry a lone surrogate
def test_console_control_messages_are_an_action_or_a_clear_refusal(text: str) -> None:
    """THEN any message a page may send is either an action that passes the actions' own
    check, or an INVALID_ARGUMENT naming what is wrong: nothing else escapes."""
    try:
        _, action = parse_action(text)
        validate.action(action, "action")
    except InvalidArgument as exc:
        assert exc.field and exc.problem


async def test_console_control_session_asks_for_its_host_s_phone_not_another_of_the_serial(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """THEN a serial is a host's own (every first emulator is emulator-5554): the session
    asks for the phone by serial and host (`host_id`, a label every device has), so an idle
    phone of the same serial on another host, asking for work all along, never takes it; the
    page's host's phone does."""
    token = await farm.token(Role.OPERATOR)
    wanted = await farm.host("host-a", "sim-0")  # connected, asks for work only when told
    stream = wanted.stream()
    await stream.renew()
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source, host_id="host-b"):
        ws = await http.ws_connect(control_url(farm, host_id="host-a"), protocols=offered(token))
        task = (await answer(ws, "task"))["task"]
        assert task["status"] == "TASK_STATUS_QUEUED"
        assert task["selector"] == {"serial": "sim-0", "labels": {"host_id": "host-a"}}
        # host-b's sim-0 is idle and polling: it would have taken a serial-only session.
        assignment = await wanted.acquire_one("sim-0")
        assert assignment.task_id == task["task_id"]
        assert await farm.device_holder("host-b", "sim-0") is None
        assert (await farm.device_holder("host-a", "sim-0")) == task["task_id"]
        await ws.close()
        await wanted.release(assignment.lease_id)
        assert [r for r in source.actions_for("sim-0") if r.action != "shell"] == []
    await stream.close()


async def test_console_control_session_cancelled_elsewhere_ends_and_closes_the_socket(
    farm: Farm, http: aiohttp.ClientSession
) -> None:
    """THEN a Control session is cancelled like any task (CancelTask from anywhere): the
    page gets the task cancelled, the server closes the socket, the phone is freed."""
    token = await farm.token(Role.OPERATOR)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id=HOST):
        ws = await http.ws_connect(control_url(farm), protocols=offered(token))
        task = await dispatched(ws)
        operator = await farm.operator()
        await operator.scheduler.CancelTask(
            scheduler_pb2.CancelTaskRequest(task_id=task["task_id"], reason="phone needed")
        )
        final = (await answer(ws, "task"))["task"]
        assert final["status"] == "TASK_STATUS_CANCELLED"
        assert final["cancel_reason"] == "phone needed"
        closed = await asyncio.wait_for(ws.receive(), 10)
        assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        assert await farm.device_holder(HOST, "sim-0") is None


async def test_console_sockets_refuse_a_page_of_another_site(
    database_url: str, http: aiohttp.ClientSession
) -> None:
    """THEN with authentication off (loopback), a WebSocket opened by another site's page
    (its Origin) is refused PERMISSION_DENIED, /api/control and /api/screen alike, and
    nothing is created; the console's own page is served."""
    async with console_farm(database_url, insecure=True) as farm:
        async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id=HOST):
            before = await rows(farm)
            evil = {"Origin": "http://evil.example"}
            screen = console_url(farm, f"/api/screen?host_id={HOST}&serial=sim-0")
            for url in (control_url(farm), screen):
                async with http.get(url, headers=evil) as r:
                    assert r.status == 403, url
                    assert await r.json() == {
                        "code": "PERMISSION_DENIED",
                        "message": "not from this console: http://evil.example",
                    }
            assert await rows(farm) == before
            own = console_url(farm, "").rstrip("/")
            ws = await http.ws_connect(
                control_url(farm), protocols=[SUBPROTOCOL], headers={"Origin": own}
            )
            task = await dispatched(ws)
            await ws.close()
            await status_is(farm, task["task_id"], "done")


async def test_console_sockets_behind_a_tls_terminating_proxy_accept_the_console_s_own_page(
    database_url: str, http: aiohttp.ClientSession
) -> None:
    """GIVEN the console behind a proxy that ends TLS (the request arrives as http, its
    page's Origin is https://) THEN a live screen opens when the proxy says what it was
    asked for (X-Forwarded-Proto, X-Forwarded-Host) or the origin is the replica's
    --console-origin; another site's page is refused whatever it forwards."""
    settings = replace(CONSOLE_SETTINGS, console_origins=("https://amc.example.com",))
    async with console_farm(database_url, settings=settings) as farm:
        token = await farm.token(Role.OPERATOR)
        auth = {"Authorization": f"Bearer {token}"}
        own = console_url(farm, "").rstrip("/").replace("http://", "https://")
        port = own.rsplit(":", 1)[1]
        screen = console_url(farm, f"/api/screen?host_id={HOST}&serial=sim-0")
        accepted = [
            {"Origin": own, "X-Forwarded-Proto": "https"},
            {
                "Origin": "https://public.example.net",
                "X-Forwarded-Proto": "https",
                "X-Forwarded-Host": "public.example.net, 10.0.0.7",
            },
            {"Origin": "https://public.example.net:443", "X-Forwarded-Proto": "https",
             "X-Forwarded-Host": "public.example.net"},
            {"Origin": "https://amc.example.com"},  # --console-origin, Host rewritten
        ]  # fmt: skip
        refused = [
            {"Origin": own},  # https page, no word from a proxy: not this console's own
            {"Origin": "https://evil.example", "X-Forwarded-Proto": "https"},
            {"Origin": f"https://evil.example:{port}", "X-Forwarded-Proto": "https"},
            {"Origin": "https://public.example.net", "X-Forwarded-Host": "public.example.net"},
        ]
        async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id=HOST):
            for headers in accepted:
                async with http.ws_connect(screen, headers=auth | headers) as ws:
                    message = await asyncio.wait_for(ws.receive(), 20)
                    assert message.type == aiohttp.WSMsgType.BINARY, headers
            for headers in refused:
                async with http.get(screen, headers=auth | headers) as r:
                    assert r.status == 403, headers
                    body = await r.json()
                    assert body["code"] == "PERMISSION_DENIED"
                    assert body["message"] == f"not from this console: {headers['Origin']}"
