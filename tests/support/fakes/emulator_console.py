"""The emulator double's console (tests.support.fakes.emulator): the telnet protocol of
developer.android.com/studio/run/emulator-console, on 127.0.0.1:<console port>.

As the documentation's example session shows it: on connecting, the banner

    Android Console: Authentication required
    Android Console: type 'auth <auth_token>' to authenticate
    Android Console: you can find your <auth_token> in
    '/home/me/.emulator_console_auth_token'
    OK

then `auth <token>` (the token is the contents of ~/.emulator_console_auth_token; a file
that does not exist is created with a random one, an empty file means no authentication,
as the page says), after which commands are answered with their lines and `OK`, or one
line `KO: why`. Lines end in CR LF. The commands served: `auth`, `help`, `ping`, `avd
name`, `avd status`, `avd snapshot list|save NAME|load NAME|delete NAME`, `kill`,
`quit`/`exit`. `avd snapshot list` prints as a real emulator does (a table headed "List of
snapshots present on all disks:", one `--  TAG  SIZE DATE TIME CLOCK` row per snapshot).

Not from the documentation, and approximations: the exact words of a KO (an unknown command,
a wrong token, an unknown snapshot, a save refused under -read-only) and of `kill`'s
answer; that commands before `auth` are refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.support.fakes.emulator import FakeEmulator

TOKEN_FILE = ".emulator_console_auth_token"


def token() -> str:
    """The auth token ("" = none), as the emulator reads it; created when missing."""
    path = Path.home() / TOKEN_FILE
    if not path.exists():
        path.write_text(secrets.token_urlsafe(12))
        path.chmod(0o600)
    return path.read_text().strip()


class ConsoleServer:
    """Serves the console of one emulator double."""

    def __init__(self, emulator: FakeEmulator, port: int) -> None:
        self.emulator = emulator
        self.port = port
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._clients):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(writer)
        self.emulator.note("console")  # a connection accepted
        expected = token()
        try:
            if expected:
                path = Path.home() / TOKEN_FILE
                await _say(
                    writer,
                    "Android Console: Authentication required",
                    "Android Console: type 'auth <auth_token>' to authenticate",
                    "Android Console: you can find your <auth_token> in ",
                    f"'{path}'",
                    "OK",
                )
            else:
                await _say(writer, "Android Console: type 'help' for a list of commands", "OK")
            authed = not expected
            while line := await reader.readline():
                words = line.decode(errors="replace").split()
                if not words:
                    continue
                if words[0] in ("quit", "exit"):
                    break
                if words[0] == "auth":
                    authed = authed or (len(words) == 2 and words[1] == expected)
                    if authed:
                        await _say(writer, "Android Console: type 'help' for a list of commands")
                        await _say(writer, "OK")
                    else:
                        refusal = f"KO: authentication token does not match ~/{TOKEN_FILE}"
                        await _say(writer, refusal)
                    continue
                if not authed and words[0] not in ("help", "ping"):
                    await _say(writer, "KO: unknown command, try 'help'")
                    continue
                await self._command(words, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._clients.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _command(self, words: list[str], writer: asyncio.StreamWriter) -> None:
        emulator = self.emulator
        if words[0] == "help":
            await _say(writer, "Android console commands:", "    ping", "    avd", "    kill", "OK")
        elif words[0] == "ping":
            await _say(writer, "I am alive!", "OK")
        elif words[0] == "kill":
            await _say(writer, "OK: killing emulator, bye bye")
            emulator.kill()
        elif words[:2] == ["avd", "name"]:
            await _say(writer, emulator.avd.name, "OK")
        elif words[:2] == ["avd", "status"]:
            await _say(writer, "virtual device is running", "OK")
        elif words[:2] == ["avd", "snapshot"] and len(words) >= 3:
            await self._snapshot(words[2], words[3:], writer)
        else:
            await _say(writer, "KO: unknown command, try 'help'")

    async def _snapshot(self, verb: str, rest: list[str], writer: asyncio.StreamWriter) -> None:
        emulator = self.emulator
        if verb == "list":
            lines = ["List of snapshots present on all disks:"]
            lines.append("ID        TAG                 VM SIZE                DATE       VM CLOCK")
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            row = "--        {:<20}    75M {}   00:00:12.000"
            lines += [row.format(name, stamp) for name in emulator.kept]
            await _say(writer, *lines, "OK")
            return
        if verb not in ("save", "load", "delete") or len(rest) != 1:
            await _say(writer, f"KO: bad snapshot command: avd snapshot {verb} {' '.join(rest)}")
            return
        name = rest[0]
        if verb == "load":
            why = await emulator.load(name)
        elif verb == "save":
            why = emulator.save(name)
        else:
            why = None if emulator.kept.pop(name, None) is not None else "no such snapshot"
        await _say(writer, "OK" if why is None else f"KO: {why}")


async def _say(writer: asyncio.StreamWriter, *lines: str) -> None:
    writer.write("".join(f"{line}\r\n" for line in lines).encode())
    await writer.drain()
