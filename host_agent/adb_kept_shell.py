"""A held phone's `input` commands over one kept `sh` (`KeptShell`): while a session holds
a phone behind the adb server (host_agent.adb's `AdbDevice.hold_control`), its taps,
swipes, key presses and text go through one connection to the phone running `sh`, opened
with the first of them and closed when the hold ends.

On a connection of its own, each command costs the set-up and tear-down of a connection
on the agent, of a stream on the adb server and of one on the phone's adbd: in a session
of taps on an emulator, about half of the agent's CPU a tap and most of the phone side's.

The connection is ``host:transport:<serial>``, then ``shell:sh``. adbd runs a ``shell:``
service with a command, when the shell protocol (v2, which the agent never asks for) is
not used, as ``sh -c <command>`` with the connection as its stdin, stdout and stderr; so
this `sh` reads command lines from the connection and runs each as its newline comes.
Since Android 7 that connection is raw. Before, adbd gave every ``shell:`` a pty, which
echoes each line written, writes ``\\r\\n`` for ``\\n``, and makes `sh` interactive (its
prompt comes too). So each command is written as ``<command>; echo <marker>$?`` and a
line end, with a fresh marker, and its output is read up to the marker followed by
digits and a newline (a ``\\r`` before it allowed); the echoed line has ``$?`` after the
marker, not digits, and is left out of the output when it comes back whole. None of the
commands sent here (``input tap``, ``swipe``, ``text``, ``keyevent``) reads its stdin, so
none takes the line after it.

One command at a time. A command whose connection breaks, or that times out or is
cancelled while in flight, closes the shell (what it would print next is unknown) and is
never sent again: a tap must not happen twice. The caller raises as on a connection of
its own (the connection ending before the marker is asked about, host_agent.adb's
`_why_cut_short`); the next command opens another shell. A non-zero exit is only a
result: the shell stays. A shell the adb server ended while idle (the phone's transport
went away between commands) is opened again before a command is written (but on a pty,
where a prompt may be left unread, the command finds the end and raises, unsent).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from host_agent.adb_protocol import ClientAsync, Session, open_service

__all__ = ["KeptShell"]

# Room after where the last read ended for a marker it cut, its exit code and "\r\n".
_TAIL = 16
# An exit code's digits and the end of its line, after a marker.
_EXIT_LINE = re.compile(rb"\d+\r?\n")


class KeptShell:
    """One phone's kept `sh`: used while it is held, open from the first command until
    the last holder lets go."""

    def __init__(self, client: ClientAsync, serial: str) -> None:
        self._client, self._serial = client, serial
        self._holders = 0
        self._lock = asyncio.Lock()
        self._phone: Session | None = None

    @property
    def held(self) -> bool:
        return self._holders > 0

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Commands go through the kept shell during the block. As the last holder lets
        go, the command in flight (if another task runs one) ends first, within its own
        deadline, and the shell is closed."""
        self._holders += 1
        try:
            yield
        finally:
            self._holders -= 1
            try:
                async with self._lock:
                    pass
            finally:
                if not self._holders:
                    self._close()

    async def exchange(self, line: str, marker: str) -> bytes | None:
        """`line` (``<command>; echo <marker>$?``) run by the kept shell, under the
        caller's deadline: its output through the marker's line, or all that came before
        the connection ended (no marker: the caller asks why); None when the phone is not
        held, for the caller to run it on a connection of its own."""
        async with self._lock:
            if not self._holders:
                return None
            phone = await self._opened()
            try:
                await phone.write(line.encode() + b"\n")
                raw, whole = await _read_through(phone, marker.encode())
            except BaseException:
                self._close()
                raise
            if not whole:
                self._close()
            return _without_echo(raw, line.encode())

    async def _opened(self) -> Session:
        if self._phone is not None and self._phone.ended():
            self._close()
        if self._phone is None:
            self._phone = await open_service(self._client, self._serial, "shell:sh")
        return self._phone

    def _close(self) -> None:
        # Synchronous: it must also work while a cancellation unwinds.
        phone, self._phone = self._phone, None
        if phone is not None:
            phone.close()


async def _read_through(phone: Session, marker: bytes) -> tuple[bytes, bool]:
    """(what was read, whether it ends with the marker's line) once the marker, its exit
    code and a newline have come, or once the connection ended."""
    data = bytearray()
    while True:
        chunk = await phone.read_some()
        if not chunk:
            return bytes(data), False
        start = max(0, len(data) - len(marker) - _TAIL)
        data += chunk
        # The marker found by bytes, then its code's line (a pattern of its own per marker
        # would be compiled for each command: every marker is new).
        at = data.find(marker, start)
        while at >= 0:
            if (code := _EXIT_LINE.match(data, at + len(marker))) is not None:
                return bytes(data[: code.end()]), True
            at = data.find(marker, at + 1)


def _without_echo(raw: bytes, line: bytes) -> bytes:
    """The output without a pty's echo of the line written (and the prompt before it)."""
    echoed = raw.find(line)
    if echoed < 0:
        return raw
    newline = raw.find(b"\n", echoed + len(line))
    return raw[newline + 1 :] if newline >= 0 else raw
