"""Apps of the farm's library through the client library and the MCP server: a session that
names apps has them installed as its step 0 before its first action (a real, signed APK
uploaded to the library, installed by the real host agent on a simulated phone), an app
installed mid-session, and how a missing app, a bad one and a failed install are told."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from amc.v1 import task_pb2
from amc_client import ActionRefused, Farm, SessionRefused, opening
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm as Harness
from tests.support import eventually
from tests.support.agent import get, running_agent, status_is
from tests.support.apks import OLD, ApkFile, apk_cache, old_apk
from tests.support.library import library, upload_app
from tests.test_device_health import is_in

__all__ = ["apk_cache", "old_apk"]

LISTED = "package:io.appium.settings\n"


async def uploaded(farm: Harness, apk: ApkFile) -> None:
    await upload_app(library(farm, await farm.token(Role.CLIENT)), apk.data)


async def test_a_session_with_apps_has_them_before_its_first_action(
    farm: Harness, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN Farm.session(apps=[package]) opens once the app is on the phone (step 0 "apps",
    its actions from step 1), Phone.install_app installs one mid-session and says what the
    host did, and the task ends done with those steps."""
    await uploaded(farm, old_apk)
    token = await farm.token(Role.CLIENT)
    source = SimulatedSource(1, delay=0.01)
    async with (
        running_agent(farm, source, app_cache_dir=tmp_path),
        Farm(farm.address, token=token) as client,
    ):
        async with client.session(apps=[OLD.package]) as phone:
            assert await phone.shell("pm list packages") == LISTED
            said = await phone.install_app(OLD.sha256, grant_permissions=True)
            assert said.startswith("installed io.appium.settings 3.0.0"), said
        task = await client.get(phone.task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["apps", "shell", "install_app"]
    assert list(source.apps["sim-0"].packages) == [OLD.package]
    assert source.apps["sim-0"].packages[OLD.package].granted


async def test_an_app_that_is_none_is_refused_before_anything_is_sent(farm: Harness) -> None:
    """THEN an app reference that is neither an app id nor a package name raises
    ActionRefused naming it, and no session is opened; one the library lacks is the
    control plane's NOT_FOUND, and nothing waits for it."""
    assert farm.db is not None
    token = await farm.token(Role.CLIENT)
    async with Farm(farm.address, token=token) as client:
        with pytest.raises(ActionRefused, match=r"^apps\[1\]\.app: ") as refused:
            await client.open_session(apps=[OLD.package, "not an app!"])
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await client.open_session(apps=["com.example.none"])
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
        assert "open.apps[0].app: the library has no app" in (missing.value.details() or "")
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 0


async def test_a_failed_install_refuses_the_session_saying_why(
    farm: Harness, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN a phone too old for the app fails the session's apps step: the opening raises
    SessionRefused with the step's error in one line, and the task is failed."""
    await uploaded(farm, old_apk)
    token = await farm.token(Role.CLIENT)
    source = SimulatedSource(1, delay=0.01)
    source.apps["sim-0"].sdk = OLD.min_sdk - 1
    async with (
        running_agent(farm, source, app_cache_dir=tmp_path),
        Farm(farm.address, token=token) as client,
    ):
        with pytest.raises(SessionRefused) as refused:
            await client.open_session(apps=[OLD.package])
    said = str(refused.value)
    assert said.startswith("session failed before it started: step 0 'apps' failed: "), said
    assert "INSTALL_FAILED_OLDER_SDK" in said and "\n" not in said, said
    assert refused.value.task is not None
    await status_is(farm, refused.value.task.task_id, "failed")


async def test_apps_that_install_past_the_queue_timeout_still_open_the_session(
    farm: Harness, old_apk: ApkFile, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """THEN a session a phone took at once, whose apps take longer than its queue timeout
    (and the client's grace after it) to install, is waited for until its host joins: the
    queue timeout bounds the wait in the queue, not the install (the client withdrew it
    as if no phone had come, NoPhone, while its apps were installing)."""
    monkeypatch.setattr(opening, "SWEEP_GRACE", 0.5)
    await uploaded(farm, old_apk)
    token = await farm.token(Role.CLIENT)
    source = SimulatedSource(1, delay=0.01)
    async with (
        running_agent(farm, source, app_cache_dir=tmp_path),
        Farm(farm.address, token=token) as client,
    ):
        await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first probe")
        source.delay = 3.0  # each call to the phone: the apps step takes 6 s or more
        loop = asyncio.get_running_loop()
        began = loop.time()
        phone = await client.open_session(apps=[OLD.package], queue_timeout=2)
        took = loop.time() - began
        source.delay = 0.01
        assert took > 2 + opening.SWEEP_GRACE, took
        assert await phone.shell("pm list packages") == LISTED
        await phone.close()
        task = await client.get(phone.task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["apps", "shell"]


async def test_an_agent_opens_a_session_with_apps_and_installs_one_through_mcp(
    farm: Harness, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN MCP open_session with apps answers once they are on the phone, saying so;
    install_app installs one mid-session; an app the library lacks and one that is no app
    are tool errors of one line, the session going on."""
    pytest.importorskip("mcp")
    from tests.test_mcp_server import _content, _error, agent, lender

    await uploaded(farm, old_apk)
    token = await farm.token(Role.CLIENT)
    source = SimulatedSource(1, delay=0.01)
    async with (
        running_agent(farm, source, app_cache_dir=tmp_path),
        Farm(farm.address, token=token) as client,
    ):
        async with agent(lender(client)) as mcp:
            said = _error(await mcp.call_tool("open_session", {"apps": ["not an app!"]}))
            assert "open_session refused: apps[0].app: must be an app id" in said, said
            (opened,) = _content(
                await mcp.call_tool(
                    "open_session", {"apps": [OLD.package], "grant_permissions": True}
                )
            )
            task_id = opened.text.split()[1]
            assert opened.text.endswith("on phone sim-0, io.appium.settings installed")
            assert source.apps["sim-0"].packages[OLD.package].granted
            (installed,) = _content(await mcp.call_tool("install_app", {"app": OLD.sha256}))
            assert installed.text.startswith(f"install {OLD.sha256}: ok\ninstalled"), installed
            said = _error(await mcp.call_tool("install_app", {"app": "com.example.none"}))
            assert "install com.example.none failed: " in said, said
            _content(await mcp.call_tool("tap", {"x": 5, "y": 5}))
            _content(await mcp.call_tool("close_session", {}))
    task = await get(await farm.client(), task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    names = [s.name for s in task.result.steps]
    assert names == ["apps", "install_app", "install_app", "tap"], names
