"""The Android emulator's console, as a client: the telnet protocol of
developer.android.com/studio/run/emulator-console, one connection per command.

    connect 127.0.0.1:<console port>  ← banner lines, then `OK`
    (the banner says "Authentication required")  → auth <token>  ← … `OK`
    → avd snapshot load NAME                      ← `OK`, or one line `KO: why`

The token is the contents of ~/.emulator_console_auth_token (the emulator's own file, in
the home of the user it runs as, the agent's); an empty or missing file sends none. Lines
end in CR LF; an answer ends at a line that is `OK` (or starts `OK:`, as `kill`'s does) or
starts `KO:`. What was not tried on a real emulator: the exact words of its KO lines (the
client takes any `KO:` line as the refusal, whatever it says) and how long it keeps a
command waiting while a load runs (the caller's deadline bounds it).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Console:
    """The console of the emulator listening on `port` (127.0.0.1)."""

    port: int
    token_file: Path | None = None

    async def command(self, line: str, timeout: float) -> list[str]:
        """Send one command; the lines it answered before its `OK`. ConsoleError on a KO,
        DeviceLost when nothing listens, DeviceTimeout past `timeout`."""
        what = f"emulator console {self.port}: {line}"
        try:
            async with asyncio.timeout(timeout):
                return await self._exchange(line, what)
        except TimeoutError:
            raise DeviceTimeout(f"{what}: no answer within {timeout:g}s") from None
        except (ConnectionRefusedError, ConnectionResetError, asyncio.IncompleteReadError) as exc:
            raise DeviceLost(f"device lost: {what}: {exc or type(exc).__name__}") from None
        except OSError as exc:
            raise DeviceError(f"{what}: {exc}") from None

    async def _exchange(self, line: str, what: str) -> list[str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port, limit=_MAX_LINE)
        try:
            banner = await _answer(reader, what)
            if any("Authentication required" in b for b in banner):
                token = read_token(self.token_file)
                await _send(writer, f"auth {token}" if token else "auth")
                await _answer(reader, f"{what} (auth)")
            await _send(writer, line)
            return await _answer(reader, what)
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

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
