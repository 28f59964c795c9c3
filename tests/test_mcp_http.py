"""`amc mcp --http`: one MCP server for many agents, run as a process and driven by the `mcp`
SDK's own client over streamable HTTP (each agent its own HTTP session and bearer token),
against a real control plane and a real agent on simulated phones."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import socket
import ssl
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import Implementation

from amc_client.mcp_http import listen_on
from control_plane.admin_service import create_token
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm as Harness
from tests.support.agent import cancel, get, running_agent, status_is
from tests.support.apks import OLD, ApkFile, apk_cache, old_apk
from tests.support.certs import self_signed
from tests.support.library import library, upload_app
from tests.test_mcp_server import PNG_MAGIC, _content, _error

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["apk_cache", "old_apk"]


@contextlib.asynccontextmanager
async def amc_mcp_http(
    farm: Harness, *flags: str, listen: str = "127.0.0.1:0"
) -> AsyncIterator[tuple[str, Any]]:
    """`amc mcp --http 127.0.0.1:0` as a process: the URL it says it serves at, and the
    process (stopped with SIGTERM at the end, which must exit 0)."""
    command = ["-m", "amc_cli", "mcp", "--http", listen, "--label", "model=Simulated"]
    env = {**os.environ, "AMC_ADDR": farm.address}
    env.pop("AMC_TOKEN", None)
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        *command,
        "--idle-timeout",
        "30s",
        *flags,
        cwd=ROOT,
        env=env,
        stderr=asyncio.subprocess.PIPE,
    )
    assert server.stderr is not None
    try:
        async with asyncio.timeout(30):
            first = (await server.stderr.readline()).decode()
        assert first.startswith("amc mcp: serving MCP at http"), first
        yield first.split()[-1], server
    finally:
        if server.returncode is None:
            server.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await server.wait()


@contextlib.asynccontextmanager
async def agent(
    url: str, token: str, name: str = "agent", mode: str = "legacy", verify: Any = True
) -> AsyncIterator[Client]:
    """The SDK's client over streamable HTTP with `token` as its bearer token; `legacy`:
    the initialize handshake and its own MCP session (what most agents speak today)."""
    headers = {"Authorization": f"Bearer {token}"}
    http = httpx2.AsyncClient(headers=headers, timeout=60, verify=verify)
    info = Implementation(name=name, version="1.0")
    async with (
        http,
        Client(streamable_http_client(url, http_client=http), mode=mode, client_info=info) as mcp,
    ):
        yield mcp


async def team_token(farm: Harness, team: str) -> str:
    assert farm.plane is not None
    _, token = await create_token(farm.plane.store, Role.CLIENT, None, team, team=team)
    return token


def _meta(result: Any) -> dict[str, Any]:
    assert not result.is_error, result
    return dict(result.meta or {})


async def test_agents_over_http_each_drive_their_own_phone_in_their_own_fair_share(
    farm: Harness,
) -> None:
    """THEN two agents of two teams, each its own HTTP session and token, open a session
    each on its own phone; their actions answer with their own session, phone and step;
    the screenshot is MCP image content; neither reaches the other's session (named, it
    is not theirs); each session's task is in its own team's fair share, with the agent's
    name in its metadata; close_session ends each done."""
    tokens = [await team_token(farm, "team-a"), await team_token(farm, "team-b")]
    async with (
        running_agent(farm, SimulatedSource(2, delay=0.01)),
        amc_mcp_http(farm) as (url, _),
        agent(url, tokens[0], "agent-a") as a,
        agent(url, tokens[1], "agent-b") as b,
    ):
        opened = [_content(await m.call_tool("open_session", {}))[0].text for m in (a, b)]
        ids = [o.split()[1] for o in opened]
        serials = [o.split()[-1] for o in opened]
        assert sorted(serials) == ["sim-0", "sim-1"], opened
        for step in range(2):
            answers = await asyncio.gather(
                a.call_tool("tap", {"x": 10, "y": step}), b.call_tool("tap", {"x": 20, "y": step})
            )
            for i, (answer, x) in enumerate(zip(answers, (10, 20), strict=True)):
                assert _content(answer)[0].text == f"tap {x},{step}: ok"
                meta = {"amc/session": ids[i], "amc/phone": serials[i], "amc/step": step}
                assert _meta(answer) == meta
        image, note = _content(await a.call_tool("screenshot", {"session": ids[0]}))
        assert image.type == "image" and image.mime_type == "image/png"
        assert base64.b64decode(image.data).startswith(PNG_MAGIC)
        assert note.text.startswith("screenshot 360x800 of a 1080x2400 screen")
        said = _error(await a.call_tool("tap", {"x": 1, "y": 1, "session": ids[1]}))
        assert said.endswith(
            f"no session '{ids[1]}' of yours (yours are {ids[0]} on {serials[0]})"
        ), said
        for m, task_id in zip((a, b), ids, strict=True):
            (closed,) = _content(await m.call_tool("close_session", {}))
            assert closed.text.startswith(f"session {task_id} done (")
    assert farm.db is not None
    rows = await farm.db.fetch(
        "SELECT task_id::text, fairness_key, status, metadata->>'mcp_client' AS client"
        " FROM tasks ORDER BY fairness_key"
    )
    assert [(r["task_id"], r["fairness_key"], r["status"], r["client"]) for r in rows] == [
        (ids[0], "team-a", "done", "agent-a 1.0"),
        (ids[1], "team-b", "done", "agent-b 1.0"),
    ]
    steps = [s.name for s in (await get(await farm.client(), ids[0])).result.steps]
    assert steps == ["tap", "tap", "screenshot"]


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "curl", "version": "1"},
    },
}


async def test_the_door_refuses_a_request_without_its_due_and_opens_nothing(
    farm: Harness,
) -> None:
    """THEN no bearer token and one the farm does not know are 401 with a Bearer challenge,
    a host's token 403, an Origin not allowed 403, a Host header naming another machine 421,
    another path 404, each with a one-line reason; an allowed Origin with a client's token
    is answered; no task was made."""
    client = await farm.token(Role.CLIENT)
    host = await farm.token(Role.HOST, "host-9")
    accept = {"Accept": "application/json, text/event-stream"}
    async with (
        amc_mcp_http(farm, "--allow-origin", "http://localhost:6274") as (url, _),
        httpx2.AsyncClient(timeout=30) as http,
    ):
        port = url.split(":")[2].split("/")[0]

        async def post(headers: dict[str, str], to: str = url) -> httpx2.Response:
            return await http.post(to, json=INITIALIZE, headers={**accept, **headers})

        refused = await post({})
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith('Bearer realm="amc"')
        assert refused.json()["error_description"] == (
            "a bearer token is required: Authorization: Bearer <your AMC token>"
        )
        cases = [
            ({"Authorization": "Bearer not-a-token"}, 401, "the farm does not know this"),
            ({"Authorization": f"Bearer {host}"}, 403, "this token may not drive phones"),
            (
                {"Authorization": f"Bearer {client}", "Origin": "http://evil.example"},
                403,
                "origin 'http://evil.example' is not allowed (amc mcp --allow-origin)",
            ),
            (
                {"Authorization": f"Bearer {client}", "Host": f"evil.example:{port}"},
                421,
                "the Host header must name this machine's loopback and port",
            ),
        ]
        for headers, status, said in cases:
            answer = await post(headers)
            assert answer.status_code == status, (headers, answer.text)
            assert answer.json()["error_description"].startswith(said), answer.text
        elsewhere = await post({"Authorization": f"Bearer {client}"}, url.removesuffix("/mcp"))
        assert elsewhere.status_code == 404
        assert elsewhere.json()["error_description"] == "nothing is served at /: MCP is at /mcp"
        origin = {"Authorization": f"Bearer {client}", "Origin": "http://localhost:6274"}
        answered = await post(origin)
        assert answered.status_code == 200, answered.text
        assert answered.headers["content-type"] == "application/json"  # not an event stream
        assert "serverInfo" in answered.json()["result"]
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 0


CRASHING_CLIENT = """
import asyncio, sys
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

async def main():
    http = httpx2.AsyncClient(headers={"Authorization": "Bearer " + sys.argv[2]}, timeout=60)
    async with http, Client(streamable_http_client(sys.argv[1], http_client=http),
                            mode="legacy") as mcp:
        opened = await mcp.call_tool("open_session", {})
        print(opened.content[0].text.split()[1], flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_client_that_vanishes_has_its_session_abandoned_after_the_grace(
    farm: Harness,
) -> None:
    """THEN an agent process killed (SIGKILL) with a session open: once its event stream
    has been gone for the reconnect grace (1 s here), its session ends failed "session
    abandoned", well before its idle timeout (30 s), and the server says so on stderr."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        amc_mcp_http(farm, "--reconnect-grace", "1s") as (url, server),
    ):
        client = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CRASHING_CLIENT,
            url,
            token,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert client.stdout is not None
            async with asyncio.timeout(60):
                task_id = (await client.stdout.readline()).decode().strip()
            await status_is(farm, task_id, "dispatched")
        finally:
            client.kill()
            await client.wait()
        async with asyncio.timeout(15):
            await status_is(farm, task_id, "failed")
            said = (await server.stderr.readline()).decode()
    task = await get(await farm.client(), task_id)
    assert task.result.error == "session abandoned"
    assert said == (
        "amc mcp: the MCP client's event stream closed 1 s ago and it did not come back;"
        f" session {task_id} abandoned\n"
    )


async def test_a_client_that_ends_its_mcp_session_has_its_sessions_closed_done(
    farm: Harness,
) -> None:
    """THEN an agent that leaves as the SDK's client does (HTTP DELETE of its MCP session)
    with two sessions open has both closed done, each with its steps; the server then
    stops on SIGTERM, exit 0, saying nothing more."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(2, delay=0.01)),
        amc_mcp_http(farm) as (url, server),
    ):
        async with agent(url, token) as mcp:
            opened = await asyncio.gather(*(mcp.call_tool("open_session", {}) for _ in range(2)))
            ids = [_content(o)[0].text.split()[1] for o in opened]
            for task_id in ids:
                _content(await mcp.call_tool("tap", {"x": 1, "y": 2, "session": task_id}))
        for task_id in ids:
            await status_is(farm, task_id, "done")
        server.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await server.wait() == 0
            assert await server.stderr.read() == b""
    for task_id in ids:
        assert [s.name for s in (await get(await farm.client(), task_id)).result.steps] == ["tap"]


async def test_a_server_that_stops_abandons_the_sessions_still_open(farm: Harness) -> None:
    """THEN SIGTERM to the server with an agent's session open ends it failed ("session
    abandoned"), says so on stderr, and exits 0."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        amc_mcp_http(farm) as (url, server),
        agent(url, token) as mcp,
    ):
        task_id = _content(await mcp.call_tool("open_session", {}))[0].text.split()[1]
        server.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await server.wait() == 0
            said = (await server.stderr.read()).decode()
        await status_is(farm, task_id, "failed")
    assert said == f"amc mcp: the MCP server stopped; session {task_id} abandoned\n"


async def test_parallel_calls_on_two_sessions_of_one_client_each_get_their_own_answer(
    farm: Harness,
) -> None:
    """THEN one agent holding two sessions (its limit, 2) sends 20 taps at once, ten to
    each: each answer is its own (its coordinates, its session and phone, steps 0 to 9 of
    its session once each); a tap naming no session is refused naming both, a third
    open_session is refused, a bad id is refused naming the agent's; once one is closed,
    a tap naming none goes to the other."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(3, delay=0.01)),
        amc_mcp_http(farm, "--sessions-per-client", "2") as (url, _),
        agent(url, token) as mcp,
        asyncio.timeout(60),
    ):
        opened = await asyncio.gather(*(mcp.call_tool("open_session", {}) for _ in range(2)))
        ids = [_content(o)[0].text.split()[1] for o in opened]
        serial = {i: _content(o)[0].text.split()[-1] for i, o in zip(ids, opened, strict=True)}
        calls = [(ids[n % 2], n) for n in range(20)]
        answers = await asyncio.gather(
            *(mcp.call_tool("tap", {"x": n, "y": n, "session": s}) for s, n in calls)
        )
        steps: dict[str, list[int]] = {i: [] for i in ids}
        for (session, n), answer in zip(calls, answers, strict=True):
            assert _content(answer)[0].text == f"tap {n},{n}: ok"
            meta = _meta(answer)
            assert (meta["amc/session"], meta["amc/phone"]) == (session, serial[session])
            steps[session].append(meta["amc/step"])
        assert {i: sorted(s) for i, s in steps.items()} == {i: list(range(10)) for i in ids}
        said = _error(await mcp.call_tool("tap", {"x": 1, "y": 1}))
        assert "you hold 2 open sessions (" in said and "name one as `session`" in said
        said = _error(await mcp.call_tool("open_session", {}))
        assert "you hold 2 sessions, as many as this server lets a client hold" in said, said
        said = _error(await mcp.call_tool("tap", {"x": 1, "y": 1, "session": "nope"}))
        assert "no session 'nope' of yours (yours are " in said, said
        assert all(f"{i} on {serial[i]}" in said for i in ids), said
        _content(await mcp.call_tool("close_session", {"session": ids[0]}))
        assert _meta(await mcp.call_tool("tap", {"x": 1, "y": 1}))["amc/session"] == ids[1]
        said = _error(await mcp.call_tool("tap", {"x": 1, "y": 1, "session": ids[0]}))
        assert said.endswith(f"session {ids[0]} is over: session {ids[0]} done (10 actions)")
        _content(await mcp.call_tool("close_session", {}))


async def test_an_agent_over_http_reads_its_sessions_phone_log_and_not_another_agents(
    farm: Harness,
) -> None:
    """THEN over HTTP (the same tool table as stdio) read_log answers the newest lines of
    the agent's session's phone log with its step marks; another agent naming that session
    is refused as for any tool, reading nothing."""
    token, other = await farm.token(Role.CLIENT), await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        amc_mcp_http(farm) as (url, _),
        agent(url, token) as mcp,
        agent(url, other, name="other") as stranger,
        asyncio.timeout(60),
    ):
        (opened,) = _content(await mcp.call_tool("open_session", {}))
        session = opened.text.split()[1]
        _content(await mcp.call_tool("tap", {"x": 7, "y": 8}))
        while True:  # the mark goes in with the tap's own lines, as the host reads them
            answer = await mcp.call_tool("read_log", {"lines": 100, "tags": ["amc"]})
            (log,) = _content(answer)
            if " I amc     : step 1 'tap' began" in log.text:
                break
            await asyncio.sleep(0.05)
        assert _meta(answer) == {"amc/session": session, "amc/phone": "sim-0"}
        assert log.text.splitlines()[0].endswith(f"(session {session} on phone sim-0)")
        said = _error(await stranger.call_tool("read_log", {"session": session}))
        assert f"no session '{session}' of yours" in said, said
        _content(await mcp.call_tool("close_session", {}))


async def test_an_agent_installs_an_app_of_the_library_and_is_told_its_lease_was_lost(
    farm: Harness, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN over HTTP, open_session with an app of the farm's library answers once it is
    on the phone, install_app installs it again mid-session (an app the library lacks is
    a tool error, the session going on); once the session's lease expires under it, its
    action in flight and every later one are tool errors saying the lease was lost, and
    no other session is opened behind the agent's back."""
    await upload_app(library(farm, await farm.token(Role.CLIENT)), old_apk.data)
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(2, delay=0.01), app_cache_dir=tmp_path),
        amc_mcp_http(farm) as (url, _),
        agent(url, token) as mcp,
        asyncio.timeout(90),
    ):
        (opened,) = _content(await mcp.call_tool("open_session", {"apps": [OLD.package]}))
        assert opened.text.endswith(f", {OLD.package} installed"), opened.text
        task_id = opened.text.split()[1]
        installed = await mcp.call_tool("install_app", {"app": OLD.sha256})
        assert _content(installed)[0].text.startswith(f"install {OLD.sha256}: ok\ninstalled")
        assert _meta(installed)["amc/step"] == 1
        said = _error(await mcp.call_tool("install_app", {"app": "com.example.none"}))
        assert "install com.example.none failed: " in said, said
        (attempt,) = await farm.attempts(task_id)
        await farm.expire_now(str(attempt["lease_id"]))
        waiting = {"text": "never on the screen", "timeout": 45}
        for tool, arguments in (("wait_for", waiting), ("tap", {"x": 1, "y": 1})):
            said = _error(await mcp.call_tool(tool, arguments))
            assert "session ended: failed: lease lost: " in said, said
            assert said.endswith("open_session to get a phone again"), said
    await status_is(farm, task_id, "failed")
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 1
    ended = await get(await farm.client(), task_id)
    assert ended.result.error.startswith("lease lost: "), ended.result.error


async def test_a_sessionless_client_keeps_its_sessions_by_its_token(farm: Harness) -> None:
    """THEN an agent speaking the sessionless protocol (the SDK client's default: no MCP
    session) opens a session, acts on it naming none, and after an operator's cancel is
    told so; another token does not reach it."""
    token, other = await farm.token(Role.CLIENT), await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        amc_mcp_http(farm) as (url, _),
        agent(url, token, mode="auto") as mcp,
        agent(url, other, mode="auto") as stranger,
    ):
        assert mcp.protocol_version >= "2026"
        task_id = _content(await mcp.call_tool("open_session", {}))[0].text.split()[1]
        assert _content(await mcp.call_tool("tap", {"x": 3, "y": 4}))[0].text == "tap 3,4: ok"
        said = _error(await stranger.call_tool("tap", {"x": 3, "y": 4, "session": task_id}))
        assert said.endswith(f"no session '{task_id}' of yours (you hold none)")
        await cancel(await farm.client(), task_id)
        await status_is(farm, task_id, "cancelled")
        said = _error(await mcp.call_tool("tap", {"x": 3, "y": 4}))
        assert said.endswith("session ended: cancelled: test; open_session to get a phone again")
        (closed,) = _content(await mcp.call_tool("close_session", {}))
        assert closed.text == f"session {task_id} cancelled: test (1 actions)"


async def test_beyond_loopback_the_server_serves_https_only(farm: Harness, tmp_path: Path) -> None:
    """THEN `--http 0.0.0.0:0` with a certificate serves HTTPS (an agent trusting it opens
    a session and taps), and a plain HTTP request gets no answer."""
    cert, key = self_signed(tmp_path)
    token = await farm.token(Role.CLIENT)
    trust = ssl.create_default_context(cafile=str(cert))
    flags = ("--http-cert", str(cert), "--http-key", str(key))
    async with (
        running_agent(farm, SimulatedSource(1, delay=0.01)),
        amc_mcp_http(farm, *flags, listen="0.0.0.0:0") as (url, _),
    ):
        assert url.startswith("https://0.0.0.0:"), url
        url = url.replace("0.0.0.0", "127.0.0.1")
        async with agent(url, token, verify=trust) as mcp:
            _content(await mcp.call_tool("open_session", {}))
            assert _content(await mcp.call_tool("tap", {"x": 1, "y": 2}))[0].text == "tap 1,2: ok"
            _content(await mcp.call_tool("close_session", {}))
        async with httpx2.AsyncClient(timeout=10) as http:
            with pytest.raises(httpx2.HTTPError):
                await http.post(url.replace("https:", "http:"), json=INITIALIZE)


async def test_connections_to_the_server_send_at_once() -> None:
    """THEN a connection the server accepts has TCP_NODELAY: an answer's header and body are
    not held back for each other's acknowledgement (Nagle's algorithm against delayed
    ACKs made every answer wait 40 ms)."""
    accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    listening = listen_on("127.0.0.1", 0)
    server = await asyncio.start_server(connected, sock=listening)
    async with server:
        _, writer = await asyncio.open_connection(*listening.getsockname()[:2])
        async with asyncio.timeout(10):
            assert await accepted != 0
        writer.close()
