"""The Android emulator's console, as a client: the telnet protocol of
developer.android.com/studio/run/emulator-console, one connection per command (`Console`),
or one kept open for an instance's life (`KeptConsole`: its resets' loads).

    connect 127.0.0.1:<console port>  ← banner lines, then `OK`
    (the banner says "Authentication required")  → auth <token>  ← … `OK`
    → avd snapshot load NAME                      ← `OK`, or one line `KO: why`

The token is the contents of ~/.emulator_console_auth_token (the emulator's own file, in
the home of the user it runs as, the agent's); an empty or missing file sends none. Lines
end in CR LF; an answer ends at a line that is `OK` (or starts `OK:`, as `kill`'s does) or
starts `KO:`. What was not tried on a real emulator: the exact words of its KO lines (the
client takes any `KO:` line as the refusal, whatever it says), how long it keeps a
command waiting while a load runs (the caller's deadline bounds it), and whether it ever
closes an idle console connection (a kept one it closed is opened again).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from amc_common.device_selector import SNAPSHOT_NAME
from host_agent.devices import DeviceError, DeviceLost, DeviceTimeout

TOKEN_FILE = ".emulator_console_auth_token"
_MAX_LINE = 64 * 1024


class ConsoleError(DeviceError):
    """The emulator's console refused a command (its KO line is the message)."""


def token_path() -> Path:
    return Path.home() / TOKEN_FILE


def read_token(path: Path | None = None) -> str:
    """The console's auth token ("" when the file is empty or missing)."""
    try:
        return (path or token_path()).read_text().strip()
    except FileNotFoundError:
        return ""


def snapshot_tags(lines: list[str]) -> list[str]:
    """The snapshot names `avd snapshot list` printed: the TAG column of its table rows
    (`--        default_boot     75M 2026-09-09 11:41:45   00:10:07.753`)."""
    tags = []
    for line in lines:
        words = line.split()
        if len(words) >= 2 and (words[0] == "--" or words[0].isdigit()):
            tags.append(words[1])
    return tags


@dataclass
class Console:
    """The console of the emulator listening on `port` (127.0.0.1)."""

    port: int
    token_file: Path | None = None

    async def command(self, line: str, timeout: float) -> list[str]:
        """Send one command; the lines it answered before its `OK`. ConsoleError on a KO,
        DeviceLost when nothing listens, DeviceTimeout past `timeout`."""
        what = f"emulator console {self.port}: {line}"
        with _mapped(what, timeout):
            async with asyncio.timeout(timeout):
                reader, writer = await _open(self.port, self.token_file, what)
                try:
                    await _send(writer, line)
                    return await _answer(reader, what)
                finally:
                    await _close(writer)
        raise AssertionError("unreachable: _mapped raises")

    async def load(self, snapshot: str, timeout: float) -> None:
        """`avd snapshot load NAME`: the emulator is back in that snapshot's state."""
        await self.command(f"avd snapshot load {_name(snapshot)}", timeout)

    async def snapshots(self, timeout: float) -> list[str]:
        """`avd snapshot list`: the snapshots this emulator can load."""
        return snapshot_tags(await self.command("avd snapshot list", timeout))

    async def kill(self, timeout: float) -> None:
        """`kill`: the emulator exits."""
        await self.command("kill", timeout)

    async def ping(self, timeout: float) -> None:
        await self.command("ping", timeout)


@dataclass
class KeptConsole(Console):
    """The console of one instance (one emulator process) on one connection kept open
    between commands, one command at a time: connecting, its banner and `auth` are paid
    once, not at each reset's load. A connection the emulator closed while idle is opened
    again; one that fails or times out in a command is dropped (the next opens a new one),
    and the failure is the emulator's as for `Console` (DeviceLost when it dropped or
    nothing listens). Its owner `close()`s it when the process goes, so a connection never
    outlives the instance it was opened to."""

    _link: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = field(
        default=None, init=False, repr=False
    )
    _busy: asyncio.Lock = field(default_factory=asyncio.Lock, init=False, repr=False)

    @property
    def open(self) -> bool:
        """Whether a connection is kept (and the emulator has not closed it)."""
        return self._link is not None and not self._link[0].at_eof()

    async def command(self, line: str, timeout: float) -> list[str]:
        what = f"emulator console {self.port}: {line}"
        async with self._busy:
            with _mapped(what, timeout, self.close):
                async with asyncio.timeout(timeout):
                    if not self.open:
                        self.close()  # none yet, or closed by the emulator while idle
                    if self._link is None:
                        self._link = await _open(self.port, self.token_file, what)
                    reader, writer = self._link
                    await _send(writer, line)
                    return await _answer(reader, what)
        raise AssertionError("unreachable: _mapped raises")

    def close(self) -> None:
        if self._link is not None:
            self._link[1].close()
            self._link = None


@contextlib.contextmanager
def _mapped(what: str, timeout: float, drop: Callable[[], None] = lambda: None) -> Iterator[None]:
    """A command's failures as device errors; `drop` is called for any but a KO (the
    connection is no longer in step with the console)."""
    try:
        yield
    except ConsoleError:
        raise
    except TimeoutError:
        drop()
        raise DeviceTimeout(f"{what}: no answer within {timeout:g}s") from None
    except (ConnectionRefusedError, ConnectionResetError, asyncio.IncompleteReadError) as exc:
        drop()
        raise DeviceLost(f"device lost: {what}: {exc or type(exc).__name__}") from None
    except OSError as exc:
        drop()
        raise DeviceError(f"{what}: {exc}") from None
    except BaseException:  # cancelled mid-command: its answer may still come
        drop()
        raise


async def _open(
    port: int, token_file: Path | None, what: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the console, past its banner and `auth`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=_MAX_LINE)
    try:
        banner = await _answer(reader, what)
        if any("Authentication required" in b for b in banner):
            token = read_token(token_file)
            await _send(writer, f"auth {token}" if token else "auth")
            await _answer(reader, f"{what} (auth)")
    except BaseException:
        await _close(writer)
        raise
    return reader, writer


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


def _name(value: str) -> str:
    if not SNAPSHOT_NAME.fullmatch(value):
        raise ConsoleError(f"not a snapshot name the console takes: {value!r}")
    return value


async def _send(writer: asyncio.StreamWriter, line: str) -> None:
    writer.write(f"{line}\r\n".encode())
    await writer.drain()


async def _answer(reader: asyncio.StreamReader, what: str) -> list[str]:
    """Lines up to the one that ends an answer: `OK` (or `OK: …`), or `KO: …` (raised)."""
    lines: list[str] = []
    while True:
        raw = await reader.readline()
        if not raw:
            raise asyncio.IncompleteReadError(b"".join(x.encode() for x in lines), None)
        text = raw.decode(errors="replace").strip()
        if text == "OK" or text.startswith("OK:"):
            return lines
        if text.startswith("KO"):
            raise ConsoleError(f"{what}: {text}")
        lines.append(text)
