"""amc_client.mcp_server: an AI agent's tool calls drive a real phone session (a real
control plane, a real agent on simulated phones), through the MCP server's own tool
dispatch, and through `amc mcp` run as a subprocess and driven over stdio by the `mcp`
package's own client."""

from __future__ import annotations

import asyncio
import base64
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters, stdio_client

from amc.v1 import task_pb2
from amc_client import Farm
from amc_client.mcp_server import PhoneLender, build_server, compact_ui
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm as Harness
from tests.support.agent import get, running_agent

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[1]


def _content(result: Any) -> list[Any]:
    assert not result.is_error, result
    return list(result.content)


async def test_an_agent_taps_looks_and_closes_through_mcp_tools(farm: Harness) -> None:
    """THEN tap answers ok, screenshot is a PNG image, ui_dump the XML, and close_session
    ends the task done with every action a step."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        lender = PhoneLender(client, {"model": "Simulated"}, idle_timeout=30)
        server = build_server(lender)
        tools = {t.name for t in await server.list_tools()}
        assert {"tap", "swipe", "type_text", "screenshot", "ui_dump", "close_session"} <= tools
        (said,) = _content(await server.call_tool("tap", {"x": 100, "y": 200}))
        assert said.text.startswith("tap 100,200: ok")
        (image,) = _content(await server.call_tool("screenshot", {}))
        assert image.mime_type == "image/png"
        assert base64.b64decode(image.data).startswith(PNG_MAGIC)
        (xml,) = _content(await server.call_tool("ui_dump", {"full": True}))
        assert "<hierarchy" in xml.text
        assert lender.phone is not None
        task_id = lender.phone.task_id
        (closed,) = _content(await server.call_tool("close_session", {}))
        assert "done" in closed.text
    task = await get(await farm.client(), task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["tap", "screenshot", "ui_dump"]


async def test_amc_mcp_serves_an_agent_over_stdio_listing_phones_and_driving_one(
    farm: Harness,
) -> None:
    """THEN `amc mcp`, launched as an MCP client launches a server, lists the phones, opens
    a session, returns the screenshot as an image, taps by coordinates and by element, and
    closing the session ends its task done with every action a step."""
    token = await farm.token(Role.OPERATOR)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "amc_cli", "mcp", "--label", "model=Simulated", "--idle-timeout", "30s"],
        env={"AMC_ADDR": farm.address, "AMC_TOKEN": token},
        cwd=ROOT,
    )
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        asyncio.timeout(60),
        stdio_client(params) as (read, write),
        ClientSession(read, write) as agent,
    ):
        await agent.initialize()
        tools = {t.name for t in (await agent.list_tools()).tools}
        assert {"list_phones", "open_session", "screenshot", "tap", "close_session"} <= tools
        while True:  # the host counts as connected once its stream's opening is written
            (phones,) = _content(await agent.call_tool("list_phones", {}))
            if phones.text != "no phone is online":
                break
            await asyncio.sleep(0.05)
        assert phones.text.startswith("sim-0  model=Simulated  free  ready")
        (opened,) = _content(await agent.call_tool("open_session", {}))
        assert opened.text.startswith("session ") and opened.text.endswith("on phone sim-0")
        task_id = opened.text.split()[1]
        (image,) = _content(await agent.call_tool("screenshot", {}))
        assert image.mime_type == "image/png"
        assert base64.b64decode(image.data).startswith(PNG_MAGIC)
        (tapped,) = _content(await agent.call_tool("tap", {"x": 100, "y": 200}))
        assert tapped.text == "tap 100,200: ok"
        (ui,) = _content(await agent.call_tool("ui_dump", {}))
        assert 'text="OK"' in ui.text and "clickable @(" in ui.text
        (pressed,) = _content(await agent.call_tool("tap_element", {"text": "OK"}))
        assert pressed.text.startswith("tap 'OK': ok")
        (closed,) = _content(await agent.call_tool("close_session", {}))
        assert closed.text == f"session {task_id} done (4 actions)"
    task = await get(await farm.client(), task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["screenshot", "tap", "ui_dump", "tap_on"]


def test_the_compact_ui_tree_keeps_what_can_be_acted_on_with_its_centre() -> None:
    """THEN one line per element with text, id, description or a click, indented by depth,
    with the centre to tap; a dump that is not XML comes back as it was."""
    xml = (
        '<hierarchy><node class="android.widget.FrameLayout" bounds="[0,0][1080,2400]">'
        '<node text="Sign in" resource-id="app:id/title" class="android.widget.TextView"'
        ' bounds="[0,100][1080,200]"/>'
        '<node text="" clickable="true" content-desc="Next" class="android.widget.Button"'
        ' bounds="[100,300][300,400]"/></node></hierarchy>'
    )
    assert compact_ui(xml).splitlines() == [
        '    text="Sign in" id=app:id/title TextView @(540,150)',
        '    desc="Next" Button clickable @(200,350)',
    ]
    assert compact_ui("not xml") == "not xml"
