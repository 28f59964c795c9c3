"""Runs the Appium servers of this host's WebDriver sessions: one server per phone, started
on demand (`--appium PATH`) on a port of its own and kept for the phone's later sessions.

A server listens on 127.0.0.1 only, on a port the system picks free when it starts; it is
ready once its `/status` answers. A server that exited (or never became ready) is started
again for the next session. All of them stop with the agent (SIGTERM, then SIGKILL), and
on Linux a server is also told by the kernel when the agent dies without stopping it
(PR_SET_PDEATHSIG: a killed agent leaves no Appium server, and so no Appium session,
behind it to drive a phone it no longer holds).

`--appium-caps` are capabilities the host puts over every client's (the operator's word
on what this host's Appium needs, e.g. a driver's own settings); the phone's serial as
`appium:udid` is put over both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import structlog

log = structlog.get_logger(__name__)
# How long a server may take to answer its /status after it was started.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 5.0


class AppiumError(Exception):
    """An Appium server could not be had for a phone (one line)."""


@dataclass(frozen=True)
class AppiumSettings:
    # The `appium` program (an executable; Node.js's `appium` from npm).
    path: str
    # Capabilities put over every client's (`--appium-caps`, a JSON object).
    caps: Mapping[str, Any] = field(default_factory=dict)


def servers(path: str | None, caps: Mapping[str, Any]) -> AppiumServers | None:
    """The host's Appium servers, with --appium; None without."""
    return AppiumServers(AppiumSettings(path, caps)) if path else None


# Runs in a fresh interpreter (one thread) and becomes Appium: SIGTERM to it when the
# agent dies (Linux's PR_SET_PDEATHSIG, kept across exec), given before the exec. Not in a
# preexec_fn: a forked copy of the agent (gRPC's threads, their locks) calling into ctypes
# before its exec could crash (SIGSEGV) or hang.
_LAUNCH = """
import ctypes, os, signal, sys
if sys.platform.startswith("linux"):
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)  # the agent died before the signal was asked
os.execv(sys.argv[2], sys.argv[2:])
"""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class _Server:
    process: asyncio.subprocess.Process
    url: str


class AppiumServers:
    """The host's Appium servers, by phone serial; one HTTP client for all of them."""

    def __init__(self, settings: AppiumSettings) -> None:
        self.settings = settings
        self._servers: dict[str, _Server] = {}
        self._starting: dict[str, asyncio.Lock] = {}
        self._http: aiohttp.ClientSession | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            )
        return self._http

    async def url(self, serial: str) -> str:
        """The base URL of the phone's Appium server, started first if it is not running."""
        lock = self._starting.setdefault(serial, asyncio.Lock())
        async with lock:
            server = self._servers.get(serial)
            if server is not None and server.process.returncode is None:
                return server.url
            server = await self._start(serial)
            self._servers[serial] = server
            return server.url

    async def _start(self, serial: str) -> _Server:
        port = _free_port()
        program = shutil.which(self.settings.path)
        if program is None:
            raise AppiumError(f"--appium {self.settings.path}: no such executable program")
        argv = [sys.executable, "-c", _LAUNCH, str(os.getpid()), program]
        argv += ["--address", "127.0.0.1", "--port", str(port), "--log-level", "warn"]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise AppiumError(f"--appium {self.settings.path}: {exc.strerror or exc}") from None
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if process.returncode is not None:
                raise AppiumError(f"Appium exited at its start (exit {process.returncode})")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with self.http.get(f"{url}/status") as answer:
                    if answer.status == 200:
                        log.info("appium server started", serial=serial, port=port)
                        return _Server(process, url)
            await asyncio.sleep(0.1)
        await _stop(process)
        raise AppiumError(f"Appium did not answer on port {port} within {START_TIMEOUT:.0f} s")

    async def close(self) -> None:
        """Stop every server (the agent's end)."""
        servers, self._servers = list(self._servers.values()), {}
        await asyncio.gather(*(_stop(s.process) for s in servers))
        if self._http is not None:
            await self._http.close()
            self._http = None


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, 15)
    try:
        await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, 9)
        await process.wait()
