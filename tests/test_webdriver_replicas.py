"""WebDriver sessions across control-plane replicas (processes on one database): a session
lives on the replica whose endpoint created it, its host's relay may reach another, and a
replica that dies ends the session, the host deleting Appium's session: a WebDriver
session never outlives its relay, nor its lease."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from appium.webdriver.common.appiumby import AppiumBy
from selenium.common.exceptions import InvalidSessionIdException

from control_plane.config import Settings
from control_plane.domain import Role
from control_plane.embedded import free_port
from host_agent.agent import Agent
from host_agent.simulated import SimulatedSource
from tests.support import Farm, eventually
from tests.support.agent import running_agent, status_is
from tests.support.appium import appium_program, fake_caps  # noqa: F401 (a fixture)
from tests.support.replicas import Replica
from tests.test_webdriver import HOST, appium_sessions, connect

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
async def replicas(
    database_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Farm, Replica, Replica]]:
    """An in-process replica for tokens and database reads, and two replica processes: the
    WebDriver endpoint's (serving HTTP) and the host's."""
    farm = Farm(database_url, Settings(lease_ttl=timedelta(seconds=15)))
    await farm.start()
    pair = [
        Replica(database_url, log=tmp_path / "replica0.log", http_port=free_port()),
        Replica(database_url, log=tmp_path / "replica1.log"),
    ]
    try:
        await asyncio.gather(*(r.start() for r in pair))
        yield farm, pair[0], pair[1]
    finally:
        for r in pair:
            r.stop()
        await farm.stop()


@pytest.fixture
async def agent(
    replicas: tuple[Farm, Replica, Replica],
    appium_program: Path,  # noqa: F811
) -> AsyncIterator[Agent]:
    farm, _, host_side = replicas
    caps = fake_caps(appium_program)
    async with running_agent(
        farm,
        SimulatedSource(1, delay=0.01),
        address=host_side.address,
        host_id=HOST,
        appium=str(appium_program),
        appium_caps=caps,
    ) as a:
        yield a


def hub(replica: Replica) -> str:
    return f"http://127.0.0.1:{replica.http_port}/wd/hub"


async def gone(agent: Agent) -> None:
    async def none_left() -> bool:
        return await appium_sessions(agent) == []

    await eventually(none_left, timeout=30, what="Appium's session deleted")


async def test_a_session_whose_host_reached_another_replica_carries_its_commands(
    replicas: tuple[Farm, Replica, Replica], agent: Agent
) -> None:
    farm, endpoint, _ = replicas
    token = await farm.token(Role.CLIENT)
    driver = await asyncio.to_thread(connect, hub(endpoint), token)
    button = await asyncio.to_thread(driver.find_element, AppiumBy.ID, "go")
    await asyncio.to_thread(button.click)
    assert await asyncio.to_thread(button.get_attribute, "clicks") == "1"
    await asyncio.to_thread(driver.quit)
    assert await farm.status(driver.session_id) == "done"
    assert await appium_sessions(agent) == []


async def test_a_large_command_and_answer_cross_between_replicas_whole(
    replicas: tuple[Farm, Replica, Replica],
    appium_program: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """THEN with the host's relay on the other replica (whose calls between replicas take
    at most 2 MiB a message), typing 450 KB of text (a body of about 2.7 MB), then 1.5 MB
    (a body of about 9 MB), and reading each back (the last 1.5 MB) all cross whole."""
    farm, endpoint, host_side = replicas
    app = tmp_path / "input-app.xml"
    app.write_text('<app><MockInputField id="field"/></app>')
    caps = {**fake_caps(appium_program), "appium:app": str(app)}
    token = await farm.token(Role.CLIENT)
    async with running_agent(
        farm,
        SimulatedSource(1, delay=0.01),
        address=host_side.address,
        host_id=HOST,
        appium=str(appium_program),
        appium_caps=caps,
    ):
        driver = await asyncio.to_thread(connect, hub(endpoint), token)
        field = await asyncio.to_thread(driver.find_element, AppiumBy.ID, "field")
        for size in (225_000, 750_000):
            text = secrets.token_hex(size)
            await asyncio.to_thread(field.clear)
            await asyncio.to_thread(field.send_keys, text)
            assert await asyncio.to_thread(lambda: field.text) == text
        await asyncio.to_thread(driver.quit)
        assert await farm.status(driver.session_id) == "done"


async def test_the_death_of_the_hosts_replica_ends_the_session_and_its_appium_session(
    replicas: tuple[Farm, Replica, Replica], agent: Agent
) -> None:
    """THEN the host reports the session failed (its relay lost), the next command is
    `invalid session id` and Appium's session is deleted."""
    farm, endpoint, host_side = replicas
    token = await farm.token(Role.CLIENT)
    driver = await asyncio.to_thread(connect, hub(endpoint), token)
    host_side.kill()
    await status_is(farm, driver.session_id, "failed", within=40)
    with pytest.raises(InvalidSessionIdException):
        await asyncio.to_thread(lambda: driver.page_source)
    await gone(agent)


async def test_the_death_of_the_sessions_replica_ends_it_and_its_appium_session(
    replicas: tuple[Farm, Replica, Replica], agent: Agent
) -> None:
    """THEN the host reports the session failed (its relay lost) and deletes Appium's
    session; the client's endpoint is gone with its replica."""
    farm, endpoint, _ = replicas
    token = await farm.token(Role.CLIENT)
    driver = await asyncio.to_thread(connect, hub(endpoint), token)
    endpoint.kill()
    await status_is(farm, driver.session_id, "failed", within=40)
    assert "session relay lost" in (await farm.task_row(driver.session_id))["error"]
    await gone(agent)
