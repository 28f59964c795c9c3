"""The WebDriver endpoint end to end: a real WebDriver client (the Appium Python client) on
the control plane's `/wd/hub`, a real host agent on simulated phones running a real Appium
server (npm's appium with its fake driver: tests/support/appium.py), and the session's
task, lease and phone read in the database."""

from __future__ import annotations

import asyncio
import io
import json
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from appium import webdriver
from appium.options.common.base import AppiumOptions
from appium.webdriver.client_config import AppiumClientConfig
from appium.webdriver.common.appiumby import AppiumBy
from selenium.common.exceptions import (
    InvalidSessionIdException,
    SessionNotCreatedException,
    WebDriverException,
)
from selenium.webdriver.remote.client_config import AuthType

from amc.v1 import scheduler_pb2, task_pb2
from amc_common import webdriver_body
from amc_common.webdriver_body import MAX_BODY, PART
from control_plane.console.webdriver_caps import parse
from control_plane.domain import Role
from control_plane.embedded import EmbeddedPostgres
from host_agent import webdriver as host_webdriver
from host_agent.agent import Agent
from host_agent.simulated import SimulatedSource
from scripts.launch import HostAgentCommand
from tests.support import Farm, eventually
from tests.support.agent import running_agent, status_is
from tests.support.apks import ApkFile, apk_cache, old_apk  # noqa: F401 (fixtures)
from tests.support.appium import appium_program, fake_caps  # noqa: F401 (a fixture)
from tests.support.console import console_farm, console_url
from tests.support.doc_examples import fences
from tests.support.library import library, upload_app
from tests.test_database_outage import own_database  # noqa: F401 (a fixture)
from tests.test_host_agent_process import agent_process, log_events
from tests.test_sessions import dispatched, last_task

HOST = "wd-host"
ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(180)


@pytest.fixture
async def farm(database_url: str) -> AsyncIterator[Farm]:
    async with console_farm(database_url) as f:
        yield f


@pytest.fixture
async def agent(farm: Farm, appium_program: Path) -> AsyncIterator[Agent]:  # noqa: F811
    source = SimulatedSource(1, delay=0.01)
    caps = fake_caps(appium_program)
    async with running_agent(
        farm, source, host_id=HOST, appium=str(appium_program), appium_caps=caps
    ) as a:
        yield a


def hub(farm: Farm, prefix: str = "/wd/hub") -> str:
    return console_url(farm, prefix)


def connect(url: str, token: str, **caps: Any) -> webdriver.Remote:
    """A new session with the Appium Python client (blocking: run it in a thread)."""
    options = AppiumOptions()
    options.set_capability("platformName", "Android")
    options.set_capability("appium:automationName", "Fake")
    options.set_capability("amc:queueTimeout", 30)
    for name, value in caps.items():
        options.set_capability(name, value)
    config = AppiumClientConfig(url, auth_type=AuthType.BEARER, token=token, timeout=60)
    return webdriver.Remote(url, options=options, client_config=config)


async def appium_get(agent: Agent, path: str) -> Any:
    """The value of the phone's Appium server's answer to GET `path`, asked directly."""
    servers = agent._tools.appium if agent._tools is not None else None
    assert servers is not None
    url = await servers.url("sim-0")
    async with servers.http.get(f"{url}{path}") as answer:
        return (await answer.json())["value"]


async def appium_sessions(agent: Agent) -> list[Any]:
    """The sessions the phone's Appium server has (Appium's own list)."""
    value: list[Any] = await appium_get(agent, "/appium/sessions")
    return value


async def test_a_webdriver_session_drives_the_phone_through_appium_and_delete_frees_it(
    farm: Farm, agent: Agent
) -> None:
    """THEN the new session is a dispatched session task holding the phone; find element,
    click and page source reach Appium's app through the farm; each command is a step of
    the task; DELETE ends it done, the lease ended and the phone free when it answers, and
    Appium's session deleted."""
    token = await farm.token(Role.CLIENT)
    driver = await asyncio.to_thread(connect, hub(farm), token)
    task_id = driver.session_id
    assert await farm.status(task_id) == "dispatched"
    assert await farm.device_holder(HOST, "sim-0") == task_id
    assert (await farm.task_row(task_id))["metadata"] == {"webdriver": "session"}
    button = await asyncio.to_thread(driver.find_element, AppiumBy.ID, "go")
    await asyncio.to_thread(button.click)
    assert await asyncio.to_thread(button.get_attribute, "clicks") == "1"
    assert "Hello, farm" in await asyncio.to_thread(lambda: driver.page_source)
    assert len(await appium_sessions(agent)) == 1
    await asyncio.to_thread(driver.quit)
    assert await farm.status(task_id) == "done"
    assert [a["state"] for a in await farm.attempts(task_id)] == ["done"]
    status, value = await w3c(farm, "GET", f"/session/{task_id}/source", token)
    assert (status, value["error"]) == (404, "invalid session id")
    assert await farm.device_holder(HOST, "sim-0") is None
    assert await appium_sessions(agent) == []
    client = await farm.client()
    got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))
    outputs = [s.output for s in got.result.steps]
    assert outputs[0] == "POST / 200" and outputs[-1] == "DELETE / 200"
    assert "POST /element 200" in outputs and "GET /source 200" in outputs
    assert {s.name for s in got.result.steps} == {"webdriver"}


async def test_appium_2_clients_reach_the_endpoint_without_the_wd_hub_prefix(
    farm: Farm, agent: Agent
) -> None:
    token = await farm.token(Role.CLIENT)
    driver = await asyncio.to_thread(connect, hub(farm, ""), token)
    assert "Hello, farm" in await asyncio.to_thread(lambda: driver.page_source)
    await asyncio.to_thread(driver.quit)
    assert await farm.status(driver.session_id) == "done"


async def test_a_session_no_phone_takes_within_its_queue_timeout_is_not_created_saying_why(
    farm: Farm, agent: Agent
) -> None:
    token = await farm.token(Role.CLIENT)
    with pytest.raises(SessionNotCreatedException) as caught:
        await asyncio.to_thread(
            connect,
            hub(farm),
            token,
            **{"amc:labels": {"rack": "nowhere"}, "amc:queueTimeout": 1},
        )
    assert "queue timeout" in caught.value.msg
    assert "no registered device matches" in caught.value.msg
    assert "rack=nowhere" in caught.value.msg
    assert await farm.device_holder(HOST, "sim-0") is None


async def test_a_host_without_appium_is_given_no_webdriver_session(farm: Farm) -> None:
    """THEN the session waits for a phone labelled appium=yes (a host with --appium), and
    the one phone, of a host without, is never taken."""
    token = await farm.token(Role.CLIENT)
    async with running_agent(farm, SimulatedSource(1, delay=0.01), host_id=HOST):
        with pytest.raises(SessionNotCreatedException) as caught:
            await asyncio.to_thread(connect, hub(farm), token, **{"amc:queueTimeout": 1})
    assert "queue timeout" in caught.value.msg and "appium=yes" in caught.value.msg
    assert await farm.db.fetchval("SELECT count(*) FROM attempts") == 0  # type: ignore[union-attr]


async def test_a_cancelled_session_answers_invalid_session_id_and_its_appium_session_is_gone(
    farm: Farm, agent: Agent
) -> None:
    token = await farm.token(Role.CLIENT)
    driver = await asyncio.to_thread(connect, hub(farm), token)
    task_id = driver.session_id
    operator = await farm.operator()
    await operator.scheduler.CancelTask(
        scheduler_pb2.CancelTaskRequest(task_id=task_id, reason="enough")
    )
    await status_is(farm, task_id, "cancelled")
    with pytest.raises(InvalidSessionIdException):
        await asyncio.to_thread(lambda: driver.page_source)
    assert [a["state"] for a in await farm.attempts(task_id)] == ["cancelled"]

    async def freed() -> bool:
        return await farm.device_holder(HOST, "sim-0") is None

    await eventually(freed, what="the phone freed")
    assert await appium_sessions(agent) == []


async def test_an_idle_session_ends_and_then_answers_invalid_session_id(
    farm: Farm, agent: Agent
) -> None:
    token = await farm.token(Role.CLIENT)
    driver = await asyncio.to_thread(connect, hub(farm), token, **{"amc:idleTimeout": 1})
    await status_is(farm, driver.session_id, "failed")
    assert (await farm.task_row(driver.session_id))["error"] == "idle timeout"
    with pytest.raises(InvalidSessionIdException):
        await asyncio.to_thread(lambda: driver.page_source)


async def w3c(
    farm: Farm, method: str, path: str, token: str | None, body: Any = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as http,
        http.request(method, hub(farm, f"/wd/hub{path}"), json=body, headers=headers) as answer,
    ):
        value: dict[str, Any] = (await answer.json())["value"]
        return answer.status, value


def new_session(**caps: Any) -> dict[str, Any]:
    return {"capabilities": {"alwaysMatch": {"platformName": "Android", **caps}}}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (new_session(colour="red"), "colour"),
        (new_session(**{"amc:colour": "red"}), "amc:colour"),
        ({"capabilities": {"alwaysMatch": {"platformName": "iOS"}}}, "platformName"),
        (new_session(**{"amc:queueTimeout": "soon"}), "amc:queueTimeout"),
        (new_session(**{"amc:idleTimeout": 0}), "amc:idleTimeout"),
        (new_session(**{"amc:labels": ["rack"]}), "amc:labels"),
        (new_session(**{"appium:app": "com.example.nowhere"}), "com.example.nowhere"),
        ({"desiredCapabilities": {"platformName": "Android"}}, "capabilities"),
        (
            {
                "capabilities": {
                    "alwaysMatch": {"platformName": "Android"},
                    "firstMatch": [{"platformName": "Android"}],
                }
            },
            "platformName",
        ),
    ],
)
async def test_a_bad_capability_is_an_invalid_argument_naming_it_and_changes_nothing(
    farm: Farm, body: dict[str, Any], named: str
) -> None:
    token = await farm.token(Role.CLIENT)
    before = await farm.snapshot()
    status, value = await w3c(farm, "POST", "/session", token, body)
    assert (status, value["error"]) == (400, "invalid argument"), value
    assert named in value["message"]
    assert await farm.snapshot() == before


async def test_tokens_reach_only_their_own_sessions_and_a_client_no_maintenance_session(
    farm: Farm, agent: Agent
) -> None:
    """THEN no token, or a client token asking for an operator's maintenance session, gets
    `session not created` and nothing queued; another token's request to a session, or one
    to a session that never was, is `invalid session id`; the owner's still works."""
    client = await farm.token(Role.CLIENT)
    before = await farm.snapshot()
    status, value = await w3c(farm, "POST", "/session", None, new_session())
    assert (status, value["error"]) == (500, "session not created")
    assert "UNAUTHENTICATED" in value["message"]
    maintenance = new_session(
        **{"amc:maintenance": True, "appium:udid": "sim-0", "amc:labels": {"host_id": HOST}}
    )
    status, value = await w3c(farm, "POST", "/session", client, maintenance)
    assert (status, value["error"]) == (500, "session not created")
    assert "PERMISSION_DENIED" in value["message"] and "operator" in value["message"]
    assert await farm.snapshot() == before
    driver = await asyncio.to_thread(connect, hub(farm), client)
    other = await farm.token(Role.OPERATOR)
    for token in (other, None):
        status, value = await w3c(farm, "GET", f"/session/{driver.session_id}/source", token)
        assert (status, value["error"]) == (404, "invalid session id")
    status, value = await w3c(farm, "GET", "/session/not-a-session/source", client)
    assert (status, value["error"]) == (404, "invalid session id")
    assert "Hello, farm" in await asyncio.to_thread(lambda: driver.page_source)
    await asyncio.to_thread(driver.quit)


async def test_the_readme_webdriver_example_runs_as_written(
    farm: Farm,
    agent: Agent,
    old_apk: ApkFile,  # noqa: F811
) -> None:
    """THEN README.md's Appium example, given this farm's address, a client token and the
    names of the fake driver and the test's app, installs the app from the library first,
    clicks, prints the session and ends it done."""
    operator = await farm.token(Role.OPERATOR)
    app = await upload_app(library(farm, operator), old_apk.data)
    (block,) = [b for b in fences(ROOT / "README.md", "python") if "webdriver.Remote(" in b]
    token = await farm.token(Role.CLIENT)
    code = (
        block.replace("http://127.0.0.1:8080/wd/hub", hub(farm))
        .replace('"amc_…"', repr(token))
        .replace('"UiAutomator2"', '"Fake"')
        .replace('"com.example.app"', repr(app.package))
        .replace('{"model": "Pixel 7"}', '{"model": "Simulated"}')
        .replace('"Log in"', '"go"')
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    task_id, _ = out.decode().split(" ", 1)
    assert await farm.status(task_id) == "done"
    client = await farm.client()
    got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))
    assert [s.name for s in got.result.steps][:2] == ["apps", "webdriver"]
    assert got.result.steps[0].status == task_pb2.STEP_STATUS_OK


async def test_a_client_that_leaves_while_its_session_waits_withdraws_it(
    farm: Farm, agent: Agent
) -> None:
    token = await farm.token(Role.CLIENT)
    body = new_session(**{"amc:labels": {"rack": "nowhere"}, "amc:queueTimeout": 60})
    asking = asyncio.create_task(w3c(farm, "POST", "/session", token, body))
    assert farm.db is not None
    task_id = await eventually(
        lambda: farm.db.fetchval("SELECT task_id::text FROM tasks"), what="the session queued"
    )
    asking.cancel()
    await status_is(farm, task_id, "cancelled")


async def test_what_is_no_webdriver_command_is_answered_unknown_command(farm: Farm) -> None:
    token = await farm.token(Role.CLIENT)
    status, value = await w3c(farm, "GET", "/sessions", token)
    assert (status, value["error"]) == (404, "unknown command")


async def test_a_lost_lease_ends_the_webdriver_session_and_its_appium_session(
    farm: Farm, agent: Agent
) -> None:
    """THEN once the sweep expires the session's lease, the task is failed ("lease lost"),
    the host deletes Appium's session, and the next command is `invalid session id`: a
    WebDriver session never outlives its lease. (The relay learns of the sweep's end by
    its notification, a moment after the commit: a lease made to expire in the database
    while its host still renews it can take one more command in that moment.)"""
    token = await farm.token(Role.CLIENT)
    driver = await asyncio.to_thread(connect, hub(farm), token)
    task_id = driver.session_id
    assert len(await appium_sessions(agent)) == 1
    (attempt,) = await farm.attempts(task_id)
    await farm.expire_now(str(attempt["lease_id"]))
    await status_is(farm, task_id, "failed")
    assert (await farm.task_row(task_id))["error"] == "lease lost: it expired"

    async def appium_session_gone() -> bool:
        return await appium_sessions(agent) == []

    await eventually(appium_session_gone, what="Appium's session deleted")
    with pytest.raises(InvalidSessionIdException):
        await asyncio.to_thread(lambda: driver.page_source)


async def test_a_killed_agent_leaves_no_appium_server_behind(
    farm: Farm,
    appium_program: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """THEN the Appium server the agent started for the phone (its session open) stops
    when the agent is killed (SIGKILL: no clean-up of its own), so no Appium session is
    left to drive a phone the agent no longer holds."""
    token = tmp_path / "host.token"
    token.write_text(await farm.token(Role.HOST, HOST) + "\n")
    log = tmp_path / "agent.log"
    command = HostAgentCommand(
        farm.address,
        HOST,
        token_file=token,
        simulated_devices=1,
        sim_delay=0.01,
        log_format="json",
        appium=appium_program,
        appium_caps=json.dumps(fake_caps(appium_program)),
    )
    client = await farm.token(Role.CLIENT)
    async with agent_process(command, log) as proc:
        await asyncio.to_thread(connect, hub(farm), client)
        (started,) = [e for e in log_events(log) if e.get("event") == "appium server started"]
        status_url = f"http://127.0.0.1:{started['port']}/status"
        async with aiohttp.ClientSession() as http, http.get(status_url) as answer:
            assert answer.status == 200
        proc.kill()
        await proc.wait()

    async def stopped() -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(status_url):
                return False
        except aiohttp.ClientConnectionError:
            return True

    await eventually(stopped, what="the Appium server stopped")


async def test_a_screenshot_crosses_the_farm_as_appium_took_it(farm: Farm, agent: Agent) -> None:
    token = await farm.token(Role.CLIENT)
    driver = await asyncio.to_thread(connect, hub(farm), token)
    png = await asyncio.to_thread(driver.get_screenshot_as_png)
    assert png.startswith(b"\x89PNG") and len(png) > 100_000
    await asyncio.to_thread(driver.quit)


def big_app(tmp_path: Path, mib: int) -> Path:
    """An app of the fake driver's whose page source is more than `mib` MiB, each item's
    text its own (a part out of order or lost shows)."""
    big = tmp_path / "big-app.xml"
    items = "".join(
        f'<MockListItem id="i{n}">{n:07d}{"x" * 1000}</MockListItem>' for n in range(mib * 1100)
    )
    big.write_text(f'<app><MockButton id="go">Go</MockButton>{items}<last/></app>')
    return big


async def steps_of(farm: Farm, task_id: str) -> list[str]:
    client = await farm.client()
    got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))
    return [s.output for s in got.result.steps]


async def test_a_page_source_of_several_mib_crosses_the_farm_whole(
    farm: Farm,
    appium_program: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """THEN a page source of more than 3 MiB (more than one message of a host's carries)
    reaches the client as Appium gave it, as one step of the task, and the session goes
    on."""
    app = big_app(tmp_path, 3)
    caps = {**fake_caps(appium_program), "appium:app": str(app)}
    source = SimulatedSource(1, delay=0.01)
    token = await farm.token(Role.CLIENT)
    async with running_agent(
        farm, source, host_id=HOST, appium=str(appium_program), appium_caps=caps
    ) as agent:
        driver = await asyncio.to_thread(connect, hub(farm), token)
        page = await asyncio.to_thread(lambda: driver.page_source)
        (appium_id,) = [s["id"] for s in await appium_sessions(agent)]
        direct = await appium_get(agent, f"/session/{appium_id}/source")
        assert len(page) > 3 << 20 and page == direct and "<last" in page
        button = await asyncio.to_thread(driver.find_element, AppiumBy.ID, "go")
        await asyncio.to_thread(button.click)
        await asyncio.to_thread(driver.quit)
        assert await farm.status(driver.session_id) == "done"
        assert await steps_of(farm, driver.session_id) == [
            "POST / 200",
            "GET /source 200",
            "POST /element 200",
            f"POST /element/{button.id}/click 200",
            "DELETE / 200",
        ]


async def test_an_answer_over_the_farms_cap_is_an_error_naming_it_and_the_session_goes_on(
    farm: Farm,
    appium_program: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN the farm's cap lowered to 2 MiB (64 MiB in earnest: an answer that large is
    more than this machine's tests should make)
    THEN a page source of more than 3 MiB is answered W3C's `unknown error` naming its
    size and the cap, by the host, and the session's next command still works."""
    monkeypatch.setattr(webdriver_body, "MAX_BODY", 2 << 20)
    monkeypatch.setattr(host_webdriver, "MAX_BODY", 2 << 20)
    app = big_app(tmp_path, 3)
    caps = {**fake_caps(appium_program), "appium:app": str(app)}
    source = SimulatedSource(1, delay=0.01)
    token = await farm.token(Role.CLIENT)
    async with running_agent(
        farm, source, host_id=HOST, appium=str(appium_program), appium_caps=caps
    ):
        driver = await asyncio.to_thread(connect, hub(farm), token)
        with pytest.raises(WebDriverException) as caught:
            await asyncio.to_thread(lambda: driver.page_source)
        assert "Appium's answer is" in caught.value.msg, caught.value.msg
        assert "bytes, more than the 2 MiB (2097152 bytes)" in caught.value.msg
        button = await asyncio.to_thread(driver.find_element, AppiumBy.ID, "go")
        await asyncio.to_thread(button.click)
        await asyncio.to_thread(driver.quit)
        assert await farm.status(driver.session_id) == "done"


async def test_a_command_and_its_answer_of_several_mib_cross_the_farm_whole(
    farm: Farm,
    appium_program: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """THEN typing 2 MB of text into a field (the client sends it as a body of about 12
    MB, as a `mobile: pushFile` of an app is a large body) reaches Appium whole, and
    reading the field back brings the 2 MB back whole: each one step of the task."""
    app = tmp_path / "input-app.xml"
    app.write_text('<app><MockInputField id="field"/></app>')
    caps = {**fake_caps(appium_program), "appium:app": str(app)}
    source = SimulatedSource(1, delay=0.01)
    token = await farm.token(Role.CLIENT)
    async with running_agent(
        farm, source, host_id=HOST, appium=str(appium_program), appium_caps=caps
    ):
        driver = await asyncio.to_thread(connect, hub(farm), token)
        field = await asyncio.to_thread(driver.find_element, AppiumBy.ID, "field")
        text = secrets.token_hex(1_000_000)
        await asyncio.to_thread(field.send_keys, text)
        assert await asyncio.to_thread(lambda: field.text) == text
        await asyncio.to_thread(driver.quit)
        assert await farm.status(driver.session_id) == "done"
        assert await steps_of(farm, driver.session_id) == [
            "POST / 200",
            "POST /element 200",
            f"POST /element/{field.id}/value 200",
            f"GET /element/{field.id}/text 200",
            "DELETE / 200",
        ]


def wd(**fields: Any) -> scheduler_pb2.OpenSessionRequest:
    command = task_pb2.WebDriverCommand(**fields)
    return scheduler_pb2.OpenSessionRequest(action=task_pb2.SessionAction(webdriver=command))


async def test_a_lease_that_ends_while_a_large_answer_crosses_ends_the_session_and_drops_it(
    farm: Farm,
    appium_program: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """GIVEN a WebDriver session (its OpenSession, as the endpoint speaks it) half way
    through a page source of more than 3 MiB, carried part by part
    WHEN its lease expires
    THEN the host's session ends (it drops what it held and deletes the Appium session),
    the next ask for a part is answered with the session's end (failed, "lease lost"), not
    a part, and the phone's next session carries a large answer whole."""
    app = big_app(tmp_path, 3)
    caps = {**fake_caps(appium_program), "appium:app": str(app)}
    source = SimulatedSource(1, delay=0.01)
    asked = parse(json.dumps(new_session(**{"appium:automationName": "Fake"})).encode())
    async with running_agent(
        farm, source, host_id=HOST, appium=str(appium_program), appium_caps=caps
    ) as agent:
        client = await farm.client()
        call = client.scheduler.OpenSession()
        await call.write(scheduler_pb2.OpenSessionRequest(open=asked.open))
        task = await dispatched(call)
        await call.write(wd(method="POST", body=asked.appium_request()))
        assert (await asyncio.wait_for(call.read(), 30)).step.webdriver.status == 200
        await call.write(wd(method="GET", path="/source"))
        first = (await asyncio.wait_for(call.read(), 30)).step.webdriver
        assert (first.status, len(first.body)) == (200, PART) and first.size > 3 << 20
        await call.write(wd(rest=True))
        second = (await asyncio.wait_for(call.read(), 30)).step
        assert len(second.webdriver.body) == PART and not second.HasField("step")
        (attempt,) = await farm.attempts(task.task_id)
        await farm.expire_now(str(attempt["lease_id"]))
        await status_is(farm, task.task_id, "failed")

        async def appium_session_gone() -> bool:
            return await appium_sessions(agent) == []

        await eventually(appium_session_gone, what="Appium's session deleted")
        await call.write(wd(rest=True))
        final = await last_task(call)
        assert final.status == task_pb2.TASK_STATUS_FAILED
        assert final.result.error == "lease lost: it expired"
        token = await farm.token(Role.CLIENT)
        driver = await asyncio.to_thread(connect, hub(farm), token)
        page = await asyncio.to_thread(lambda: driver.page_source)
        assert len(page) > 3 << 20 and "<last" in page
        await asyncio.to_thread(driver.quit)


async def test_a_malformed_part_is_refused_naming_it_and_the_session_goes_on(
    farm: Farm, agent: Agent
) -> None:
    """THEN a part that names a method, a rest with a body, or one both part and rest is
    refused INVALID_ARGUMENT naming `action.webdriver`, reaches no host (no step), and
    the session's next command is answered."""
    asked = parse(json.dumps(new_session(**{"appium:automationName": "Fake"})).encode())
    client = await farm.client()
    call = client.scheduler.OpenSession()
    await call.write(scheduler_pb2.OpenSessionRequest(open=asked.open))
    task = await dispatched(call)
    await call.write(wd(method="POST", body=asked.appium_request()))
    assert (await asyncio.wait_for(call.read(), 30)).step.webdriver.status == 200
    for bad in (
        {"part": True, "method": "GET", "body": b"x"},
        {"rest": True, "body": b"x"},
        {"part": True, "rest": True},
    ):
        await call.write(wd(**bad))
        refused = (await asyncio.wait_for(call.read(), 30)).refused
        assert refused.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], bad
        assert refused.message.startswith("action.webdriver: "), refused.message
    await call.write(wd(method="GET", path="/source"))
    source = (await asyncio.wait_for(call.read(), 30)).step
    assert source.webdriver.status == 200 and source.step.index == 1
    await call.write(wd(method="DELETE"))
    assert (await asyncio.wait_for(call.read(), 30)).step.webdriver.status == 200
    await call.done_writing()
    final = await last_task(call)
    assert final.status == task_pb2.TASK_STATUS_DONE
    assert [s.output for s in final.result.steps] == [
        "POST / 200",
        "GET /source 200",
        "DELETE / 200",
    ]
    assert final.task_id == task.task_id


async def test_a_command_over_the_farms_cap_is_refused_naming_its_size_and_changes_nothing(
    farm: Farm, agent: Agent
) -> None:
    """THEN a command whose body is more than MAX_BODY is answered W3C's `invalid argument`
    naming its size and the cap: Appium never sees it (what it holds is unchanged), no
    step is recorded, and the session goes on."""
    token = await farm.token(Role.CLIENT)
    driver = await asyncio.to_thread(connect, hub(farm), token)
    task_id = driver.session_id
    await asyncio.to_thread(driver.execute_script, "fake: setThing", {"thing": "before"})
    padding = b"x" * (MAX_BODY + 1 - len(b'{"script":"fake: setThing","args":[{"thing":""}]}'))
    body = b'{"script":"fake: setThing","args":[{"thing":"' + padding + b'"}]}'
    assert len(body) == MAX_BODY + 1
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            hub(farm, f"/wd/hub/session/{task_id}/execute/sync"),
            data=io.BytesIO(body),
            headers=headers,
        ) as answer,
    ):
        status, value = answer.status, (await answer.json())["value"]
    del body, padding
    assert (status, value["error"]) == (400, "invalid argument"), value
    assert f"{MAX_BODY + 1} bytes" in value["message"] and "64 MiB" in value["message"]
    assert await asyncio.to_thread(driver.execute_script, "fake: getThing") == "before"
    assert await farm.status(task_id) == "dispatched"
    await asyncio.to_thread(driver.quit)
    assert await steps_of(farm, task_id) == [
        "POST / 200",
        "POST /execute/sync 200",
        "POST /execute/sync 200",
        "DELETE / 200",
    ]


async def test_delete_is_answered_ok_only_once_the_sessions_end_is_recorded(
    own_database: EmbeddedPostgres,  # noqa: F811
    appium_program: Path,  # noqa: F811
) -> None:
    """GIVEN a WebDriver session, and then its database gone
    WHEN its client DELETEs it (Appium's session is deleted: the relay needs no database)
    THEN the answer is not OK, since the session's end cannot be recorded and its phone is
    not free, but `unknown error` saying so; once the database is back the task ends (done,
    or failed where its lease expired meanwhile) and the phone is free."""
    async with console_farm(own_database.url) as farm:
        source = SimulatedSource(1, delay=0.01)
        caps = fake_caps(appium_program)
        async with running_agent(
            farm, source, host_id=HOST, appium=str(appium_program), appium_caps=caps
        ) as agent:
            token = await farm.token(Role.CLIENT)
            asked = new_session(**{"appium:automationName": "Fake", "amc:queueTimeout": 30})
            status, value = await w3c(farm, "POST", "/session", token, asked)
            assert status == 200, value
            task_id = value["sessionId"]
            assert len(await appium_sessions(agent)) == 1
            own_database.stop("immediate")
            status, value = await w3c(farm, "DELETE", f"/session/{task_id}", token)
            assert (status, (value or {}).get("error")) == (500, "unknown error"), (status, value)
            assert "its end is not recorded" in value["message"], value
            assert await appium_sessions(agent) == []
            own_database.start()
            await farm.reconnect_db()
            # Done, or failed where its lease expired while its report could not be recorded.
            await status_is(farm, task_id, "done", "failed", within=30)

            async def phone_free() -> bool:
                return await farm.device_holder(HOST, "sim-0") is None

            await eventually(phone_free, what="the phone free")
