"""amc_client.mcp_server: an AI agent's tool calls drive a real phone session (a real
control plane, a real agent on simulated phones), through the `mcp` package's own client:
over the SDK's in-memory streams (the server's real JSON-RPC loop, each request in its own
task as over stdio), and `amc mcp` run as a subprocess and driven over stdio."""

from __future__ import annotations

import asyncio
import base64
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp_types import Implementation

from amc.v1 import task_pb2
from amc_client import Farm
from amc_client.mcp_log import LINE_CHARS, MAX_CHARS, shown
from amc_client.mcp_server import ClientSessions, Defaults, OneClient, build_server, compact_ui
from amc_client.phone import Phone
from amc_common import logcat
from amc_common.version import version
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm as Harness
from tests.support import eventually
from tests.support.agent import cancel, get, running_agent, status_is

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
ROOT = Path(__file__).resolve().parents[1]
AGENT = Implementation(name="test-agent", version="1.0")


def _content(result: Any) -> list[Any]:
    assert not result.is_error, result
    return list(result.content)


def _error(result: Any) -> str:
    """The one line a tool error says."""
    assert result.is_error, result
    (said,) = result.content
    assert "\n" not in said.text, said.text
    return str(said.text)


def lender(farm: Farm, idle_timeout: float = 30) -> ClientSessions:
    """A stdio server's one client's sessions, on simulated phones by default."""
    defaults = Defaults({"model": "Simulated"}, idle_timeout=idle_timeout, implicit=True)
    return ClientSessions(farm, defaults)


def agent(sessions: ClientSessions) -> Client:
    """The SDK's client on the server's JSON-RPC loop, over in-memory streams."""
    server = build_server(OneClient(sessions), sessions.defaults)
    return Client(server, mode="legacy", client_info=AGENT)


async def _tasks(farm: Harness) -> int:
    assert farm.db is not None
    return int(await farm.db.fetchval("SELECT count(*) FROM tasks"))


async def test_an_agent_taps_looks_and_closes_through_mcp_tools(farm: Harness) -> None:
    """THEN tap answers ok, ui_dump the XML, screenshot is a PNG image with a line saying
    it is a third of the 1080x2400 screen taps use, close_session ends the task done with
    every action a step; serverInfo says the package's version, and the session's metadata
    the MCP client's name."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        sessions = lender(client)
        async with agent(sessions) as mcp:
            assert mcp.server_info is not None and mcp.server_info.version == version() != ""
            (said,) = _content(await mcp.call_tool("tap", {"x": 100, "y": 200}))
            assert said.text == "tap 100,200: ok"
            (xml,) = _content(await mcp.call_tool("ui_dump", {"full": True}))
            assert "<hierarchy" in xml.text
            image, note = _content(await mcp.call_tool("screenshot", {}))
            assert image.mime_type == "image/png"
            assert base64.b64decode(image.data).startswith(PNG_MAGIC)
            assert note.text.startswith("screenshot 360x800 of a 1080x2400 screen;")
            assert note.text.endswith("multiply a point on this image by 3")
            (phone,) = sessions.held
            task_id = phone.task_id
            (closed,) = _content(await mcp.call_tool("close_session", {}))
            assert closed.text == f"session {task_id} done (3 actions)"
    task = await get(await farm.client(), task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["tap", "ui_dump", "screenshot"]
    assert dict(task.metadata) == {"control": "mcp", "mcp_client": "test-agent 1.0"}


async def test_a_sessions_first_screenshot_says_the_screens_size(farm: Harness) -> None:
    """THEN a screenshot that is the session's first action already says it is 360x800 of
    a 1080x2400 screen (from the step, no UI dump needed)."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        sessions = lender(client)
        async with agent(sessions) as mcp:
            _, note = _content(await mcp.call_tool("screenshot", {}))
            _content(await mcp.call_tool("close_session", {}))
    assert note.text.startswith("screenshot 360x800 of a 1080x2400 screen;"), note.text


async def test_tool_calls_at_once_share_one_session_and_each_gets_its_own_answer(
    farm: Harness,
) -> None:
    """THEN two calls with no session open open one session, not two; four calls of four
    kinds at once all answer, each with its own kind of answer; every action is a step of
    the one task, which ends done."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(2, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        sessions = lender(client)
        async with agent(sessions) as mcp, asyncio.timeout(30):
            first = await asyncio.gather(
                mcp.call_tool("tap", {"x": 1, "y": 1}), mcp.call_tool("tap", {"x": 2, "y": 2})
            )
            assert [_content(r)[0].text for r in first] == ["tap 1,1: ok", "tap 2,2: ok"]
            assert await _tasks(farm) == 1
            shot, dump, tapped, pressed = await asyncio.gather(
                mcp.call_tool("screenshot", {}),
                mcp.call_tool("ui_dump", {"full": True}),
                mcp.call_tool("tap", {"x": 3, "y": 3}),
                mcp.call_tool("tap_element", {"text": "OK"}),
            )
            assert _content(shot)[0].mime_type == "image/png"
            assert "<hierarchy" in _content(dump)[0].text
            assert _content(tapped)[0].text == "tap 3,3: ok"
            assert _content(pressed)[0].text.startswith("tap 'OK': ok")
            (phone,) = sessions.held
            task_id = phone.task_id
            _content(await mcp.call_tool("close_session", {}))
    assert await _tasks(farm) == 1
    task = await get(await farm.client(), task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    names = [s.name for s in task.result.steps]
    assert sorted(names) == sorted(["tap", "tap", "screenshot", "ui_dump", "tap", "tap_on"])


async def test_a_bad_argument_is_a_one_line_tool_error_and_the_session_goes_on(
    farm: Harness,
) -> None:
    """THEN tap(-1, 5) says which field is wrong and why (the action table's words), sends
    nothing, and the same session taps on and closes done; an unknown key is named; a
    tap_element that finds nothing is a tool error too."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        sessions = lender(client)
        async with agent(sessions) as mcp:
            _content(await mcp.call_tool("tap", {"x": 5, "y": 5}))
            said = _error(await mcp.call_tool("tap", {"x": -1, "y": 5}))
            assert said.endswith("tap.x: must be between 0 and 100000 (nothing ran)"), said
            said = _error(await mcp.call_tool("press_key", {"key": "HOEM"}))
            assert "unknown key 'HOEM'; did you mean 'home'?" in said
            said = _error(await mcp.call_tool("tap_element", {"text": "No such button"}))
            assert said.endswith(
                "tap 'No such button' failed: element not found: text='No such button'"
            )
            (ok,) = _content(await mcp.call_tool("tap", {"x": 5, "y": 6}))
            assert ok.text == "tap 5,6: ok"
            (pressed,) = _content(await mcp.call_tool("press_key", {"key": "ENTER"}))
            assert pressed.text == "key ENTER: ok"
            (phone,) = sessions.held
            task_id = phone.task_id
            (closed,) = _content(await mcp.call_tool("close_session", {}))
            assert closed.text == f"session {task_id} done (4 actions)"
    assert await _tasks(farm) == 1
    task = await get(await farm.client(), task_id)
    assert [s.name for s in task.result.steps] == ["tap", "tap_on", "tap", "key"]
    assert [s.status for s in task.result.steps][1] == task_pb2.STEP_STATUS_FAILED


async def test_an_ended_session_is_said_and_never_replaced_behind_the_agents_back(
    farm: Harness,
) -> None:
    """THEN after an operator's cancel every action is a tool error saying the session was
    cancelled and why, and no other session is opened; close_session says how it ended;
    open_session then opens a new one, which acts."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(2, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        sessions = lender(client)
        async with agent(sessions) as mcp:
            (opened,) = _content(await mcp.call_tool("open_session", {}))
            task_id = opened.text.split()[1]
            _content(await mcp.call_tool("tap", {"x": 5, "y": 5}))
            await cancel(await farm.client(), task_id)
            await status_is(farm, task_id, "cancelled")
            for _ in range(2):
                said = _error(await mcp.call_tool("tap", {"x": 5, "y": 5}))
                assert said.endswith(
                    "session ended: cancelled: test; open_session to get a phone again"
                ), said
            assert await _tasks(farm) == 1
            (closed,) = _content(await mcp.call_tool("close_session", {}))
            assert closed.text == f"session {task_id} cancelled: test (1 actions)"
            (again,) = _content(await mcp.call_tool("open_session", {}))
            assert again.text.split()[1] != task_id
            _content(await mcp.call_tool("tap", {"x": 5, "y": 5}))
            _content(await mcp.call_tool("close_session", {}))


async def test_an_idle_session_is_said_to_have_timed_out(farm: Harness) -> None:
    """THEN the action after the idle timeout ended the session is a tool error saying so,
    not "session abandoned" as if the agent had vanished."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        sessions = lender(client, idle_timeout=1)
        async with agent(sessions) as mcp:
            (opened,) = _content(await mcp.call_tool("open_session", {}))
            await status_is(farm, opened.text.split()[1], "failed")
            said = _error(await mcp.call_tool("tap", {"x": 5, "y": 5}))
            assert "session ended: idle" in said and said.endswith(
                "open_session to get a phone again"
            )
        assert await _tasks(farm) == 1


async def test_a_session_no_phone_can_take_is_refused_at_once_and_a_busy_one_waits_as_asked(
    farm: Harness,
) -> None:
    """THEN open_session for a model no phone has answers at once with the control plane's
    reason, and its task is withdrawn; for the one phone, busy with another session, it
    waits its queue_timeout and then says the phone was busy."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        sessions = lender(client)
        async with agent(sessions) as mcp:
            async with asyncio.timeout(5):
                said = _error(await mcp.call_tool("open_session", {"labels": {"model": "Nope"}}))
            assert said.endswith(
                "no phone can take this session: no registered device matches model=Nope;"
                " nothing was opened (list_phones shows the phones there are)"
            ), said
            assert farm.db is not None
            withdrawn = await farm.db.fetchval("SELECT task_id::text FROM tasks")
            await status_is(farm, withdrawn, "cancelled")
            async with client.session(labels={"model": "Simulated"}):
                loop = asyncio.get_running_loop()
                began = loop.time()
                said = _error(await mcp.call_tool("open_session", {"queue_timeout": 1}))
                assert loop.time() - began < 10
            assert "no phone took the session within 1 s: 1 matching device, busy" in said, said


async def test_every_tool_and_parameter_is_described_and_wait_for_is_bounded(
    farm: Harness,
) -> None:
    """THEN each tool and each of its parameters has a description, press_key takes a name,
    and wait_for waits for an element that is there, fails as a tool error for one that is
    not, and refuses a wait longer than a tool call may take."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        sessions = lender(client)
        async with agent(sessions) as mcp:
            tools = (await mcp.list_tools()).tools
            assert {t.name for t in tools} >= {"wait_for", "press_key", "open_session"}
            for tool in tools:
                assert tool.description, tool.name
                for name, schema in tool.input_schema.get("properties", {}).items():
                    assert schema.get("description"), f"{tool.name}.{name}"
            key = next(t for t in tools if t.name == "press_key").input_schema["properties"]["key"]
            assert {"type": "string"} in key["anyOf"]
            (found,) = _content(await mcp.call_tool("wait_for", {"text": "OK"}))
            assert found.text.startswith("wait for 'OK': ok")
            said = _error(await mcp.call_tool("wait_for", {"text": "Nope", "timeout": 0.3}))
            assert "wait for 'Nope' failed:" in said
            said = _error(await mcp.call_tool("wait_for", {"text": "OK", "timeout": 3600}))
            assert "wait_for.timeout: at most 50 s here" in said
            _content(await mcp.call_tool("close_session", {}))


async def test_read_log_gives_the_sessions_newest_phone_log_lines_filtered_and_bounded(
    farm: Harness,
) -> None:
    """THEN read_log with no session open is a tool error and opens none; on a session it
    answers the newest lines of its phone's log oldest first, the step marks among them
    and a crash the app had by itself; level and tags filter (the marks always pass),
    `lines` bounds the count; it adds no step; a bad argument is a one-line tool error
    naming it; the crash, between two actions, is the first one's warning."""
    token = await farm.token(Role.CLIENT)
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source), Farm(farm.address, token=token) as client:
        sessions = lender(client)
        async with agent(sessions) as mcp:
            said = _error(await mcp.call_tool("read_log", {}))
            assert said.endswith(": no session is open: open_session first"), said
            assert await _tasks(farm) == 0
            _content(await mcp.call_tool("launch_app", {"package": "com.example.shop"}))
            source.logs["sim-0"].crash("com.example.shop")  # the app dies by itself
            _content(await mcp.call_tool("tap", {"x": 5, "y": 6}))
            async with asyncio.timeout(20):
                while True:  # the marks go in with the actions' own lines, as they are read
                    (log,) = _content(await mcp.call_tool("read_log", {"lines": 500}))
                    if "step 2 'tap' began" in log.text and "FATAL EXCEPTION" in log.text:
                        break
                    await asyncio.sleep(0.05)
            head, *lines = log.text.splitlines()
            assert head.startswith(f"{len(lines)} lines of the phone's log (session ")
            marks = [e.message for x in lines if (e := logcat.parse(x)) and e.tag == "amc"]
            assert {"step 1 'launch_app' began", "step 2 'tap' began"} <= set(marks), marks
            assert any("E AndroidRuntime: FATAL EXCEPTION: main" in x for x in lines)
            args = {"level": "error", "tags": ["AndroidRuntime"]}
            (errors,) = _content(await mcp.call_tool("read_log", args))
            entries = [logcat.parse(x) for x in errors.text.splitlines()[1:]]
            assert all(
                e is not None and (e.tag == "amc" or (e.tag, e.level) == ("AndroidRuntime", "E"))
                for e in entries
            ), errors.text
            assert any(e is not None and e.message == "FATAL EXCEPTION: main" for e in entries)
            (two,) = _content(await mcp.call_tool("read_log", {"lines": 2}))
            assert len(two.text.splitlines()) == 3 and two.text.startswith("2 lines of ")
            for wrong, says in (
                ({"lines": 0}, "lines: 0 is not 1 to 500"),
                ({"lines": 501}, "lines: 501 is not 1 to 500"),
                ({"level": "loud"}, "level: 'loud' is not a log priority"),
                ({"tags": ["a:b"]}, "tags: 'a:b' is not a log tag"),
            ):
                said = _error(await mcp.call_tool("read_log", wrong))
                assert f"read_log refused: {says}" in said, said
            said = _error(await mcp.call_tool("read_log", {"session": "nope"}))
            assert "no session 'nope' of yours" in said, said
            (closed,) = _content(await mcp.call_tool("close_session", {}))
            assert closed.text.endswith("done (2 actions)"), closed.text
            task_id = closed.text.split()[1]
    steps = (await get(await farm.client(), task_id)).result.steps
    assert [s.name for s in steps] == ["launch_app", "tap"]
    assert "FATAL EXCEPTION" in steps[0].warnings[0] and not steps[1].warnings


def test_read_logs_answer_stays_within_its_characters_newest_kept() -> None:
    """THEN a line past LINE_CHARS is cut, and past MAX_CHARS in all the oldest lines go,
    said in the first line."""
    phone = Phone.__new__(Phone)  # only its task's id and phone are read
    phone.task = task_pb2.Task(task_id="t-1", device_serial="sim-0")
    lines = [f"{i:05d} " + "x" * 1000 for i in range(100)]
    head, *kept = shown(lines, phone).splitlines()
    assert all(len(x) <= LINE_CHARS for x in kept) and kept[-1].startswith("00099 ")
    assert sum(len(x) + 1 for x in kept) <= MAX_CHARS < sum(len(x) + 1 for x in kept) + 401
    assert head == (
        f"{len(kept)} lines of the phone's log (session t-1 on phone sim-0);"
        f" {100 - len(kept)} older left out (at most 16,000 characters)"
    )
    assert shown([], phone) == "no line of the phone's log (session t-1 on phone sim-0)" + (
        " passes the filters yet"
    )


def _amc_mcp(farm: Harness, token: str, rc_file: Path) -> StdioServerParameters:
    """`amc mcp` as an MCP client starts it, its exit status written to `rc_file`."""
    command = ["-m", "amc_cli", "mcp", "--label", "model=Simulated", "--idle-timeout", "30s"]
    return StdioServerParameters(
        command="sh",
        args=["-c", f'"$0" "$@"; echo $? > {rc_file}', sys.executable, *command],
        env={"AMC_ADDR": farm.address, "AMC_TOKEN": token, "PATH": "/usr/bin:/bin"},
        cwd=ROOT,
    )


async def test_amc_mcp_serves_an_agent_over_stdio_listing_phones_and_driving_one(
    farm: Harness, tmp_path: Path
) -> None:
    """THEN `amc mcp`, launched as an MCP client launches a server, lists the phones, opens
    a session, returns the screenshot as an image, taps by coordinates and by element, and
    closing the session ends its task done with every action a step; the client leaving
    ends the server quietly, exit 0."""
    token = await farm.token(Role.OPERATOR)
    rc_file = tmp_path / "rc"
    with (tmp_path / "stderr").open("w") as errlog:
        async with (
            running_agent(farm, SimulatedSource(1, delay=0.01)),
            asyncio.timeout(60),
            stdio_client(_amc_mcp(farm, token, rc_file), errlog=errlog) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            tools = {t.name for t in (await session.list_tools()).tools}
            assert {"list_phones", "open_session", "screenshot", "tap", "close_session"} <= tools
            while True:  # the host counts as connected once its stream's opening is written
                (phones,) = _content(await session.call_tool("list_phones", {}))
                if "offline" not in phones.text and "registered" not in phones.text:
                    break
                await asyncio.sleep(0.05)
            count, line = phones.text.splitlines()
            assert count == "1 phone: 1 free"
            assert line.startswith("sim-0  free  abi="), line
            (opened,) = _content(await session.call_tool("open_session", {}))
            assert opened.text.startswith("session ") and opened.text.endswith("on phone sim-0")
            task_id = opened.text.split()[1]
            image, _ = _content(await session.call_tool("screenshot", {}))
            assert image.mime_type == "image/png"
            assert base64.b64decode(image.data).startswith(PNG_MAGIC)
            (tapped,) = _content(await session.call_tool("tap", {"x": 100, "y": 200}))
            assert tapped.text == "tap 100,200: ok"
            (ui,) = _content(await session.call_tool("ui_dump", {}))
            assert 'text="OK"' in ui.text and "clickable @(" in ui.text
            (pressed,) = _content(await session.call_tool("tap_element", {"text": "OK"}))
            assert pressed.text.startswith("tap 'OK': ok")
            (closed,) = _content(await session.call_tool("close_session", {}))
            assert closed.text == f"session {task_id} done (4 actions)"
    task = await get(await farm.client(), task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["screenshot", "tap", "ui_dump", "tap_on"]
    assert rc_file.read_text() == "0\n"
    assert (tmp_path / "stderr").read_text() == ""


async def test_a_client_that_leaves_mid_action_ends_its_session_done_and_the_server_quietly(
    farm: Harness, tmp_path: Path
) -> None:
    """THEN an MCP client that shuts down (closing the server's stdin) while a wait_for
    runs: the action finishes, the session ends done, and `amc mcp` exits 0 saying
    nothing."""
    token = await farm.token(Role.CLIENT)
    rc_file = tmp_path / "rc"
    source = SimulatedSource(1, delay=0.01)
    with (tmp_path / "stderr").open("w") as errlog:
        async with running_agent(farm, source):
            async with (
                asyncio.timeout(60),
                stdio_client(_amc_mcp(farm, token, rc_file), errlog=errlog) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                (opened,) = _content(await session.call_tool("open_session", {}))
                task_id = opened.text.split()[1]
                waiting = asyncio.create_task(
                    session.call_tool("wait_for", {"text": "Nope", "timeout": 1})
                )
                await eventually(
                    lambda: any(r.action == "ui_dump" for r in source.actions),
                    what="the wait_for to look at the screen",
                )
                waiting.cancel()
            await status_is(farm, task_id, "done")
    await eventually(rc_file.exists, what="amc mcp to exit")
    assert rc_file.read_text() == "0\n"
    assert (tmp_path / "stderr").read_text() == ""
    task = await get(await farm.client(), task_id)
    assert [s.name for s in task.result.steps] == ["wait_for"]


CRASHING_CLIENT = """
import asyncio, json, sys
from mcp import ClientSession, StdioServerParameters, stdio_client

async def main():
    params = StdioServerParameters(**json.loads(sys.argv[1]))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        opened = await session.call_tool("open_session", {})
        print(opened.content[0].text.split()[1], flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_crashed_client_abandons_its_session(farm: Harness, tmp_path: Path) -> None:
    """THEN an MCP client killed (SIGKILL) with a session open: `amc mcp` sees its stdin and
    stdout's reader gone together, the session ends failed "session abandoned" (not done),
    and the server exits 0 with one line on stderr."""
    token = await farm.token(Role.CLIENT)
    rc_file = tmp_path / "rc"
    params = _amc_mcp(farm, token, rc_file)
    params_json = params.model_dump_json(include={"command", "args", "env", "cwd"})
    with (tmp_path / "stderr").open("w") as errlog:
        async with running_agent(farm, SimulatedSource(1, delay=0.01)):
            client = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                CRASHING_CLIENT,
                params_json,
                cwd=ROOT,
                stdout=asyncio.subprocess.PIPE,
                stderr=errlog,
            )
            try:
                assert client.stdout is not None
                async with asyncio.timeout(60):
                    task_id = (await client.stdout.readline()).decode().strip()
                await status_is(farm, task_id, "dispatched")
            finally:
                client.kill()
                await client.wait()
            await status_is(farm, task_id, "failed")
            await eventually(rc_file.exists, what="amc mcp to exit")
    task = await get(await farm.client(), task_id)
    assert task.result.error == "session abandoned"
    assert rc_file.read_text() == "0\n"
    said = (tmp_path / "stderr").read_text()
    assert said == f"amc mcp: the MCP client left without closing; session {task_id} abandoned\n"


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (
            ["-m", "amc_client.mcp_server", "--address", "127.0.0.1:1", "--label", "model"],
            "amc-mcp: error: argument --label: expected KEY=VALUE, got 'model' (see --help)",
        ),
        (
            ["-m", "amc_client.mcp_server", "--address", "127.0.0.1:1", "--idle-timeout", "nan"],
            "amc-mcp: error: argument --idle-timeout: 'nan' is not a duration (e.g. 15s, 1m30s,"
            " 1h) (see --help)",
        ),
        (
            ["-m", "amc_client.mcp_server", "--address", "127.0.0.1:1", "--idle-timeout", "2h"],
            "amc-mcp: error: argument --idle-timeout: '2h' is out of range (1s to 1h) (see --help)",
        ),
        (
            ["-m", "amc_cli", "--addr", "127.0.0.1:1", "mcp", "--idle-timeout", "nan"],
            "amc: error: --idle-timeout: 'nan' is not a duration (e.g. 15s, 1m30s, 1h)",
        ),
        (
            ["-m", "amc_cli", "--addr", "127.0.0.1:1", "mcp", "--queue-timeout", "0s"],
            "amc: error: --queue-timeout: '0s' must be above 0 (e.g. 15s, 1m30s, 1h)",
        ),
        (
            ["-m", "amc_cli", "--addr", "127.0.0.1:1", "mcp", "--queue-timeout", "500ms"],
            "amc: error: --queue-timeout: '500ms' is out of range (1s to 30d)",
        ),
        (
            ["-m", "amc_cli", "--addr", "127.0.0.1:1", "mcp", "--http", "0.0.0.0:8765"],
            "amc: error: --http: serving beyond this machine (0.0.0.0) needs --http-cert and"
            " --http-key (agents' tokens must not cross a network in clear)",
        ),
        (
            ["-m", "amc_cli", "--addr", "127.0.0.1:1", "mcp", "--allow-origin", "http://a:1"],
            "amc: error: --allow-origin goes with --http",
        ),
        (
            ["-m", "amc_client.mcp_server", "--address", "127.0.0.1:1", "--http", "1:99999"],
            "amc-mcp: error: --http: expected [HOST:]PORT with PORT 0 to 65535, got '1:99999'"
            " (see --help)",
        ),
        (
            [
                *("-m", "amc_cli", "--addr", "127.0.0.1:1", "mcp", "--http", "8765"),
                *("--allow-origin", "localhost:6274"),
            ],
            "amc: error: --allow-origin: expected an origin such as http://localhost:6274, got"
            " 'localhost:6274'",
        ),
        (
            ["-m", "amc_cli", "--addr", "127.0.0.1:1", "mcp", "--sessions-per-client", "0"],
            "amc: error: --sessions-per-client: expected a number from 1 to 100, got '0'",
        ),
        (
            ["-m", "amc_cli", "--addr", "127.0.0.1:1", "mcp", "--reconnect-grace", "0s"],
            "amc: error: --reconnect-grace: '0s' must be above 0 (e.g. 15s, 1m30s, 1h)",
        ),
    ],
    ids=[
        "label",
        "nan",
        "too-long",
        "amc-nan",
        "amc-zero",
        "amc-too-short",
        "http-beyond-loopback-in-clear",
        "origin-without-http",
        "http-bad-port",
        "origin-not-an-origin",
        "no-sessions",
        "no-grace",
    ],
)
def test_a_bad_flag_is_refused_in_one_line_naming_it(command: list[str], said: str) -> None:
    """THEN the server's command line (and `amc mcp`'s) refuses a label without `=`, an
    idle timeout that is not a duration from 1s to 1h (in the duration grammar's words, as
    every program's), HTTP beyond loopback without TLS, a port or an origin that is none,
    HTTP's flags without --http, and no sessions, with one line naming the flag, exit 2,
    and serves nothing."""
    done = subprocess.run(
        [sys.executable, *command], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert (done.returncode, done.stderr, done.stdout) == (2, said + "\n", "")


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


def test_a_port_in_use_is_said_in_one_line(tmp_path: Path) -> None:
    """THEN `amc mcp --http` on a port another program holds exits 1 saying so in one line,
    before it reaches for the farm."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "amc_cli", "--addr", "127.0.0.1:1", "mcp", "--http", str(port)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
    said = f"amc mcp: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert (done.returncode, done.stderr, done.stdout) == (1, said, "")


async def test_the_server_opens_no_tracing_span_per_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """THEN the messages an agent sends (initialize, tools/list) are answered without the
    SDK's OpenTelemetry span around each: no exporter is installed, and the spans cost the
    HTTP server CPU on every action."""
    from mcp.server import _otel

    spans: list[str] = []
    real = _otel.otel_span

    def counted(*args: Any, **kwargs: Any) -> Any:
        spans.append(str(kwargs.get("name", args[0] if args else "")))
        return real(*args, **kwargs)

    monkeypatch.setattr(_otel, "otel_span", counted)
    defaults = Defaults({"model": "Simulated"}, idle_timeout=30, implicit=True)
    server = build_server(OneClient(ClientSessions(Farm("127.0.0.1:1"), defaults)), defaults)
    async with Client(server, mode="legacy", client_info=AGENT) as mcp:
        tools = (await mcp.list_tools()).tools
    assert {t.name for t in tools} >= {"tap", "open_session"}
    assert spans == []
