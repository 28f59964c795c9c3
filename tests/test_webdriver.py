"""The WebDriver endpoint end to end: a real WebDriver client (the Appium Python client) on
the control plane's `/wd/hub`, a real host agent on simulated phones running a real Appium
server (npm's appium with its fake driver: tests/support/appium.py), and the session's
task, lease and phone read in the database."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
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
from control_plane.domain import Role
from control_plane.embedded import EmbeddedPostgres
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


async def appium_sessions(agent: Agent) -> list[Any]:
    """The sessions the phone's Appium server has (Appium's own list)."""
    servers = agent._tools.appium if agent._tools is not None else None
    assert servers is not None
    url = await servers.url("sim-0")
    async with servers.http.get(f"{url}/appium/sessions") as answer:
        value: list[Any] = (await answer.json())["value"]
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
    the next command is `invalid session id`, and the host deletes Appium's session: a
    WebDriver session never outlives its lease."""
    token = await farm.token(Role.CLIENT)
    driver = await asyncio.to_thread(connect, hub(farm), token)
    task_id = driver.session_id
    assert len(await appium_sessions(agent)) == 1
    (attempt,) = await farm.attempts(task_id)
    await farm.expire_now(str(attempt["lease_id"]))
    await status_is(farm, task_id, "failed")
    assert (await farm.task_row(task_id))["error"] == "lease lost: it expired"
    with pytest.raises(InvalidSessionIdException):
        await asyncio.to_thread(lambda: driver.page_source)

    async def appium_session_gone() -> bool:
        return await appium_sessions(agent) == []

    await eventually(appium_session_gone, what="Appium's session deleted")


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


async def test_an_answer_too_big_for_the_farm_is_an_error_and_the_session_goes_on(
    farm: Farm,
    appium_program: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """THEN a page source of more than a MiB (what a host's message may carry) is answered
    W3C's `unknown error` saying so, and the session's next command still works."""
    big = tmp_path / "big-app.xml"
    items = "".join(f'<MockListItem id="i{n}">{"x" * 1000}</MockListItem>' for n in range(1200))
    big.write_text(f'<app><MockButton id="go">Go</MockButton>{items}</app>')
    caps = {**fake_caps(appium_program), "appium:app": str(big)}
    source = SimulatedSource(1, delay=0.01)
    token = await farm.token(Role.CLIENT)
    async with running_agent(
        farm, source, host_id=HOST, appium=str(appium_program), appium_caps=caps
    ):
        driver = await asyncio.to_thread(connect, hub(farm), token)
        with pytest.raises(WebDriverException) as caught:
            await asyncio.to_thread(lambda: driver.page_source)
        assert "bytes, more than the" in caught.value.msg
        button = await asyncio.to_thread(driver.find_element, AppiumBy.ID, "go")
        await asyncio.to_thread(button.click)
        await asyncio.to_thread(driver.quit)
        assert await farm.status(driver.session_id) == "done"


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
