"""`amc adb` for the tests: the door as a real subprocess (`python -m amc_cli adb`, with
AMC_ADDR and AMC_TOKEN, as a person runs it), its `adb connect` line read from its stdout,
and a private real adb server (the user's) connected to it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.fakes.real_adb import RealAdbServer, poll_until

ROOT = Path(__file__).resolve().parents[2]
_CONNECT = re.compile(rb"^adb connect (127\.0\.0\.1:\d+)$")


@dataclass
class Door:
    proc: asyncio.subprocess.Process
    address: str = ""
    stderr: list[str] = field(default_factory=list)
    _reading: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return int(self.address.rpartition(":")[2])

    def said(self) -> str:
        return "".join(self.stderr)

    async def wait(self, within: float = 30.0) -> int:
        """The door's exit code, once it exited by itself."""
        code = await asyncio.wait_for(self.proc.wait(), within)
        if self._reading is not None:
            await asyncio.wait_for(self._reading, 5)
        return code

    async def stop(self, within: float = 30.0) -> int:
        """Ctrl-C, as its user stops it; the exit code."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGINT)
        return await self.wait(within)


def door_env(address: str, token: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMC_")}
    env.update(AMC_ADDR=address, AMC_TOKEN=token, PYTHONPATH=str(ROOT))
    return env


@contextlib.asynccontextmanager
async def door(
    address: str, token: str, *args: str, ready: bool = True, within: float = 60.0
) -> AsyncIterator[Door]:
    """`amc adb ARGS` running; with `ready`, once it printed its `adb connect` line."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "amc_cli",
        "adb",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=door_env(address, token),
        cwd=ROOT,
    )
    opened = Door(proc)
    found: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def read_stdout() -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            if (match := _CONNECT.match(line.strip())) and not found.done():
                found.set_result(match[1].decode())
        if not found.done():
            found.set_exception(AssertionError("the door exited before it opened"))

    async def read_stderr() -> None:
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            opened.stderr.append(line.decode(errors="replace"))

    readers = asyncio.gather(read_stdout(), read_stderr())
    opened._reading = asyncio.ensure_future(readers)
    try:
        if ready:
            try:
                opened.address = await asyncio.wait_for(asyncio.shield(found), within)
            except (AssertionError, TimeoutError):
                raise AssertionError(f"amc adb did not open: {opened.said()}") from None
        yield opened
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        opened._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await opened._reading
        if not found.done():
            found.cancel()
        elif not found.cancelled():
            found.exception()


def user_key(server: RealAdbServer) -> Path:
    """The public key the private adb server signs with (made as it started)."""
    return server.home / ".android" / "adbkey.pub"


async def connected(server: RealAdbServer, address: str, within: float = 30.0) -> None:
    """`adb connect` to the door, until `adb devices` lists it as a device."""
    await server.connect(address, within=within)


async def offline(server: RealAdbServer, address: str, within: float = 30.0) -> None:
    """Until `adb devices` no longer lists the door as a device (offline, or gone)."""

    async def gone() -> bool:
        return (await server.devices()).get(address) != "device"

    await poll_until(gone, within, f"{address} to go offline")
