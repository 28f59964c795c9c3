"""A phone's log behind the adb server (host_agent.devices.PhoneLogs for AdbDevice):
`logcat -c` to empty it, `logcat -v threadtime -v usec` read on a connection of its own
for as long as the run lasts, and `log -p i -t TAG MESSAGE` to write a line into it; a
run's start does the three in one command (`follow_fresh_log`)."""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator

from host_agent.adb_protocol import ClientAsync, device_session, guard
from host_agent.devices import CommandFailed

FOLLOW = "logcat -v threadtime -v usec"


class AdbPhoneLog:
    """The log commands of a phone behind the adb server; AdbDevice has them."""

    serial: str
    _client: ClientAsync
    _call_timeout: float

    async def _run(self, service: str, command: str) -> tuple[int, bytes]:
        """(exit code, raw output) of a command, under the caller's guard (AdbDevice's)."""
        raise NotImplementedError

    async def clear_log(self, timeout: float) -> None:
        await self._logged("logcat -c", timeout)

    async def follow_log(self) -> AsyncIterator[bytes]:
        """`logcat -v threadtime -v usec` (times to the microsecond: Android 7 and later)
        on a connection of its own, read until it ends (the phone gone) or the caller stops
        reading (the connection is closed: logcat ends). The OKAY is acknowledged at once
        (`Session.ack_now`), else the log's first lines wait for the kernel's delayed ACK."""
        async for chunk in self._follow(FOLLOW):
            yield chunk

    async def follow_fresh_log(
        self, tag: str, first: str, not_cleared: str
    ) -> AsyncIterator[bytes]:
        """As `follow_log`, the log first emptied and `first` written into it, in the same
        command (one connection and round trip where a run's start took three): `logcat -c
        || log -p w -t TAG NOT_CLEARED; log -p i -t TAG FIRST; exec logcat …`. A clear that
        failed is said by the `not_cleared` line before `first`."""
        tag = shlex.quote(tag)
        async for chunk in self._follow(
            f"logcat -c || log -p w -t {tag} {shlex.quote(not_cleared)};"
            f" log -p i -t {tag} {shlex.quote(first)}; exec {FOLLOW}"
        ):
            yield chunk

    async def _follow(self, command: str) -> AsyncIterator[bytes]:
        async with contextlib.AsyncExitStack() as stack:
            async with guard(self.serial, "logcat", self._call_timeout):
                phone = await stack.enter_async_context(device_session(self._client, self.serial))
                await phone.request(f"shell:{command}")
            phone.ack_now()
            while chunk := await phone.read_some():
                yield chunk

    async def mark_log(self, tag: str, message: str, timeout: float) -> None:
        await self._logged(f"log -p i -t {shlex.quote(tag)} {shlex.quote(message)}", timeout)

    async def _logged(self, command: str, timeout: float) -> None:
        async with guard(self.serial, f"`{command}`", timeout):
            code, raw = await self._run("shell", command)
        if code != 0:
            raise CommandFailed(f"`{command}` exited {code}: {raw[:200]!r}")
