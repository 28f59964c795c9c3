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
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
import structlog

from amc.v1 import task_pb2
from host_agent.appium import AppiumError, AppiumServers
from host_agent.results import StepResult, StepStatus
from host_agent.stop_token import StopToken

log = structlog.get_logger(__name__)
STEP = "webdriver"
DELETE_TIMEOUT = 10.0
# The most of Appium's answer a step carries: the control plane takes at most 1 MiB a
# message from a host, and the step's other fields need a little of it.
MAX_REPLY = (1 << 20) - (16 << 10)


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

    async def run(
        self, index: int, command: task_pb2.WebDriverCommand
    ) -> tuple[StepResult, task_pb2.WebDriverReply]:
        """The command sent to Appium, as a step and Appium's answer."""
        started, clock = datetime.now(UTC), time.monotonic()
        reply = await self._token.race(self._send(command))
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

    async def _send(self, command: task_pb2.WebDriverCommand) -> task_pb2.WebDriverReply:
        if not command.path and command.method == "POST":
            return await self._create(command.body)
        if self._session is None or self._url is None:
            return w3c_error(404, "invalid session id", "the Appium session is not open")
        url = f"{self._url}/session/{self._session}{command.path}"
        reply = await self._call(command.method, url, command.body)
        if not command.path and command.method == "DELETE":
            self._session = None
        return reply

    async def _create(self, body: bytes) -> task_pb2.WebDriverReply:
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

    async def _call(self, method: str, url: str, body: bytes) -> task_pb2.WebDriverReply:
        assert self._servers is not None
        headers = {"Content-Type": "application/json; charset=utf-8"}
        try:
            async with self._servers.http.request(
                method, url, data=body if method == "POST" else None, headers=headers
            ) as answer:
                data = await answer.read()
        except (aiohttp.ClientError, OSError) as exc:
            return w3c_error(500, "unknown error", f"Appium did not answer: {exc}")
        if len(data) > MAX_REPLY:  # refused here: sent, it would break the session's relay
            why = f"Appium's answer is {len(data)} bytes, more than the {MAX_REPLY} a farm carries"
            return w3c_error(500, "unknown error", why)
        return task_pb2.WebDriverReply(status=answer.status, body=data)

    async def close(self) -> None:
        """Delete the Appium session if it is still open (the farm's session ended)."""
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


def _error_line(body: bytes) -> str:
    """A W3C error answer as one line: its error code and message's first line."""
    try:
        value = json.loads(body)["value"]
        line = f"{value['error']}: {str(value.get('message', '')).splitlines()[0]}"
    except (ValueError, KeyError, TypeError, IndexError):
        return body[:200].decode(errors="replace")
    return line[:500]
