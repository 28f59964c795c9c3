"""amc_client.mcp_server: an AI agent's tool calls drive a real phone session (a real
control plane, a real agent on simulated phones), through the MCP server's own tool
dispatch."""

from __future__ import annotations

import base64
from typing import Any

import pytest

pytest.importorskip("mcp")

from amc.v1 import task_pb2
from amc_client import Farm
from amc_client.mcp_server import PhoneLender, build_server
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm as Harness
from tests.support.agent import get, running_agent

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


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
        (xml,) = _content(await server.call_tool("ui_dump", {}))
        assert "<hierarchy" in xml.text
        assert lender.phone is not None
        task_id = lender.phone.task_id
        (closed,) = _content(await server.call_tool("close_session", {}))
        assert "done" in closed.text
    task = await get(await farm.client(), task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["tap", "screenshot", "ui_dump"]
