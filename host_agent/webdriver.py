"""A WebDriver session's commands on the host: each is sent to the phone's Appium server
(host_agent.appium) and answered with Appium's status and body, as a step named
"webdriver" of the session.

The first command creates the Appium session (POST with an empty path: the client's
new-session request, its capabilities merged by the control plane into `alwaysMatch`):
the host's `--appium-caps` go over the client's, then the phone's serial as `appium:udid`
over both, and `appium:newCommandTimeout` 0 unless asked (the session's idle timeout is
the farm's). Every later command goes to `/session/<Appium's id><path>`: a client reaches
its own Appium session only, never the server's other routes. The Appium session is
deleted when the farm's session ends, however it ends.

Bodies larger than one message (amc_common.webdriver_body) cross in parts: a command's
body comes as parts (`part`, each answered at once with no step) gathered until the command
itself; an answer larger than PART goes back as its first part with its whole size, and
the rest is sent part by part as asked (`rest`). Either is held only while it crosses,
never more than MAX_BODY, and dropped when the next command comes or the session ends.
"""

from __future__ import annotations

import io
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import structlog

from amc.v1 import task_pb2
from amc_common.webdriver_body import MAX_BODY, PART, too_big
from host_agent.appium import AppiumError, AppiumServers
from host_agent.results import StepResult, StepStatus
from host_agent.stop_token import StopToken

log = structlog.get_logger(__name__)
STEP = "webdriver"
DELETE_TIMEOUT = 10.0
READ_CHUNK = 1 << 16


def w3c_error(status: int, error: str, message: str) -> task_pb2.WebDriverReply:
    """A W3C error answer made on the host (no Appium answer to pass on)."""
    body = {"value": {"error": error, "message": message, "stacktrace": ""}}
    return task_pb2.WebDriverReply(status=status, body=json.dumps(body).encode())


class WebDriverSession:
    """One farm session's Appium session on its phone."""

    def __init__(self, servers: AppiumServers | None, serial: str, token: StopToken) -> None:
        self._servers = servers
        self._serial = serial
        self._token = token
        self._url: str | None = None
        self._session: str | None = None
        # The parts of the next command's body so far; what is left to send of the last
        # answer, from `_sent`.
        self._body = bytearray()
        self._answer = b""
        self._sent = 0

    async def answer(
        self, index: int, command: task_pb2.WebDriverCommand
    ) -> tuple[StepResult | None, task_pb2.WebDriverReply]:
        """The session's next message: a part of a body (gathered; no step), the ask for
        the next part of the last answer (no step), or a command sent to Appium, its step
        and Appium's answer (its first part where it is larger than PART)."""
        if command.rest:
            return None, self._next_part()
        self._answer, self._sent = b"", 0
        if command.part:
            if len(self._body) + len(command.body) > MAX_BODY:
                size = len(self._body) + len(command.body)
                self._body = bytearray()
                return None, w3c_error(400, "invalid argument", too_big("the command's body", size))
            self._body += command.body
            return None, task_pb2.WebDriverReply()
        if self._body:
            self._body += command.body
            body, self._body = self._body, bytearray()
            command = task_pb2.WebDriverCommand(method=command.method, path=command.path)
            step, reply = await self.run(index, command, body)
        else:
            step, reply = await self.run(index, command, command.body)
        if len(reply.body) > PART:
            self._answer, self._sent = reply.body, PART
            reply = task_pb2.WebDriverReply(
                status=reply.status, body=reply.body[:PART], size=len(reply.body)
            )
        return step, reply

    def _next_part(self) -> task_pb2.WebDriverReply:
        if self._sent >= len(self._answer):
            return w3c_error(400, "invalid argument", "no answer is left to send")
        part = self._answer[self._sent : self._sent + PART]
        self._sent += len(part)
        if self._sent >= len(self._answer):
            self._answer, self._sent = b"", 0
        return task_pb2.WebDriverReply(body=part)

    async def run(
        self, index: int, command: task_pb2.WebDriverCommand, body: bytes | bytearray
    ) -> tuple[StepResult, task_pb2.WebDriverReply]:
        """The command (its `body` apart) sent to Appium, as a step and Appium's answer."""
        started, clock = datetime.now(UTC), time.monotonic()
        reply = await self._token.race(self._send(command, body))
        status = StepStatus.OK if reply.status < 400 else StepStatus.FAILED
        error = "" if status is StepStatus.OK else _error_line(reply.body)
        step = StepResult(
            index,
            STEP,
            status,
            started_at=started,
            duration=timedelta(seconds=time.monotonic() - clock),
            output=f"{command.method} {command.path or '/'} {reply.status}",
            error=error,
        )
        return step, reply

    async def _send(
        self, command: task_pb2.WebDriverCommand, body: bytes | bytearray
    ) -> task_pb2.WebDriverReply:
        if not command.path and command.method == "POST":
            return await self._create(body)
        if self._session is None or self._url is None:
            return w3c_error(404, "invalid session id", "the Appium session is not open")
        url = f"{self._url}/session/{self._session}{command.path}"
        reply = await self._call(command.method, url, body)
        if not command.path and command.method == "DELETE":
            self._session = None
        return reply

    async def _create(self, body: bytes | bytearray) -> task_pb2.WebDriverReply:
        if self._session is not None:
            return w3c_error(500, "session not created", "this session has its Appium session")
        try:
            asked = json.loads(body)
            caps: dict[str, Any] = dict(asked["capabilities"]["alwaysMatch"])
        except (ValueError, KeyError, TypeError):
            return w3c_error(400, "invalid argument", "no capabilities.alwaysMatch object")
        servers = self._servers
        if servers is None:
            return w3c_error(500, "session not created", "this host runs no Appium (--appium)")
        caps.setdefault("appium:newCommandTimeout", 0)
        caps.update(servers.settings.caps)
        caps["appium:udid"] = self._serial
        try:
            self._url = await servers.url(self._serial)
        except AppiumError as exc:
            return w3c_error(500, "session not created", str(exc))
        request = {"capabilities": {"alwaysMatch": caps, "firstMatch": [{}]}}
        reply = await self._call("POST", f"{self._url}/session", json.dumps(request).encode())
        if reply.status == 200:
            try:
                self._session = str(json.loads(reply.body)["value"]["sessionId"])
            except (ValueError, KeyError, TypeError):
                return w3c_error(500, "session not created", "Appium gave no session id")
            log.info("appium session created", serial=self._serial, session=self._session)
        return reply

    async def _call(
        self, method: str, url: str, body: bytes | bytearray
    ) -> task_pb2.WebDriverReply:
        assert self._servers is not None
        headers = {"Content-Type": "application/json; charset=utf-8"}
        # A large body is written a chunk at a time (as bytes, at once, it would hold the
        # event loop while it is copied out).
        data = (io.BytesIO(body) if len(body) > PART else body) if method == "POST" else None
        try:
            async with self._servers.http.request(
                method, url, data=data, headers=headers
            ) as answer:
                data = await _read(answer)
        except (aiohttp.ClientError, OSError) as exc:
            return w3c_error(500, "unknown error", f"Appium did not answer: {exc}")
        except _TooBig as exc:  # read no further: the farm would not carry it
            return w3c_error(500, "unknown error", too_big("Appium's answer", exc.size))
        return task_pb2.WebDriverReply(status=answer.status, body=data)

    async def close(self) -> None:
        """Delete the Appium session if it is still open (the farm's session ended), and
        drop any body or answer held part way."""
        self._body, self._answer, self._sent = bytearray(), b"", 0
        session, self._session = self._session, None
        if session is None or self._url is None or self._servers is None:
            return
        try:
            async with self._servers.http.delete(
                f"{self._url}/session/{session}",
                timeout=aiohttp.ClientTimeout(total=DELETE_TIMEOUT),
            ) as answer:
                await answer.read()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            log.warning("appium session not deleted", serial=self._serial, error=str(exc))


class _TooBig(Exception):
    def __init__(self, size: int | None) -> None:
        super().__init__(size)
        self.size = size


async def _read(answer: aiohttp.ClientResponse) -> bytes:
    """Appium's answer's body, read no further than MAX_BODY (_TooBig past it)."""
    if answer.content_length is not None and answer.content_length > MAX_BODY:
        raise _TooBig(answer.content_length)
    data = bytearray()
    async for chunk in answer.content.iter_chunked(READ_CHUNK):
        data += chunk
        if len(data) > MAX_BODY:
            raise _TooBig(None)
    return bytes(data)


def _error_line(body: bytes) -> str:
    """A W3C error answer as one line: its error code and message's first line."""
    try:
        value = json.loads(body)["value"]
        line = f"{value['error']}: {str(value.get('message', '')).splitlines()[0]}"
    except (ValueError, KeyError, TypeError, IndexError):
        return body[:200].decode(errors="replace")
    return line[:500]
