"""Phones through an adb server: the driver (`AdbDevice`: one phone's commands) and the
source (`AdbSource`: what the server lists, reconnects and reboots).

The adb host protocol itself (framing, deadlines, error mapping, the one import of
`ppadb`) is host_agent.adb_protocol; every call here runs under its `guard` (one deadline,
→ `DeviceTimeout`) on a connection of its own, closed in ``finally``, but a held phone's
input commands: while a session holds the phone (`hold_control`), its ``input tap``,
``swipe``, ``text`` and ``keyevent`` share one kept ``sh`` (host_agent.adb_kept_shell),
closed as the hold ends. ppadb's own ``shell()`` and ``screencap()`` are not used: output
is decoded leniently here, and a screenshot is read over ``exec-out`` (no pty, so no
newline rewriting).

Where scrcpy's server runs for a phone (host_agent.scrcpy_link: while its stream is
watched or recorded, or a session holds it), taps, swipes, keys and text go through its
control socket; elsewhere, or when that fails, through `input`. Each says which ran it.

Exit codes come from a marker: ``<command>; echo <marker>$?``. A reply without the
marker means the connection ended before the command did; the adb server is then asked
whether the phone is still there to tell `DeviceLost` from a dropped connection.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import structlog

from host_agent import adb_files
from host_agent.adb_kept_shell import KeptShell
from host_agent.adb_listing import info_from_props, parse_devices_l, parse_getprop
from host_agent.adb_logcat import AdbPhoneLog
from host_agent.adb_protocol import ClientAsync, device_session, failure_to_error, guard, host_query
from host_agent.adb_server_door import AdbServerDoor
from host_agent.baselines import Baselines
from host_agent.clean_profile import CleanProfile
from host_agent.cleaning import ShellCleaner
from host_agent.devices import (
    AttachedDevice,
    CommandFailed,
    DeviceError,
    DeviceLost,
    InputPath,
    ShellResult,
    VideoFps,
)
from host_agent.scrcpy_link import Link, Links, ScrcpyVideo, ServerJar
from host_agent.screen import PNG_SIGNATURE

__all__ = [
    "AdbDevice",
    "AdbSource",
    "UnsupportedText",
    "escape_input_text",
]

log = structlog.get_logger(__name__)

DEFAULT_CALL_TIMEOUT = 30.0
UI_DUMP_PATH = "/sdcard/amc_window_dump.xml"
_EXIT_CODE = re.compile(rb"^(\d+)")
# A phone the adb server reached over the network (`adb connect HOST:PORT`).
_NETWORK_SERIAL = re.compile(r"^[\w.\-\[\]:]+:\d+$")
_RECONNECT_POLL = 0.05


class UnsupportedText(DeviceError, ValueError):
    """`input text` cannot type this text (see `escape_input_text`)."""


# -- parsing -------------------------------------------------------------------------------


def _split_exit_marker(raw: bytes, marker: bytes) -> tuple[int, bytes] | None:
    """(exit code, output before the marker), or None when the marker never came."""
    at = raw.rfind(marker)
    if at < 0:
        return None
    code = _EXIT_CODE.match(raw[at + len(marker) :])
    if code is None:
        return None
    return int(code[1]), raw[:at]


def escape_input_text(text: str) -> str:
    """Text for ``input text``, escaped for the device's ``sh``.

    Supported: printable ASCII (letters, digits, punctuation, spaces). Spaces become
    ``%s`` (``input`` turns them back); every other non-alphanumeric character gets a
    backslash so ``sh`` passes it literally (``; & | $ ` " ' ( ) < > * ? ~ # \\`` …).
    Not supported, raising `UnsupportedText`: non-ASCII, control characters (newline,
    tab: send key events instead) and a literal ``%s`` (``input`` would type a space).
    """
    if not (text.isascii() and text.isprintable()):
        raise UnsupportedText(f"input text supports printable ASCII only: {text!r}")
    if "%s" in text:
        raise UnsupportedText("input text cannot type a literal '%s'")
    return "".join("%s" if c == " " else c if c.isalnum() else "\\" + c for c in text)


def _png_from(raw: bytes) -> bytes:
    start = raw.find(PNG_SIGNATURE)
    if start < 0:
        raise CommandFailed(f"screencap printed no PNG: {raw[:200]!r}")
    return raw[start:]


def _xml_from(output: str) -> str:
    start = output.find("<?xml")
    if start < 0:
        start = output.find("<hierarchy")
    end = output.rfind("</hierarchy>")
    if start < 0 or end < start:
        raise CommandFailed(f"uiautomator printed no hierarchy: {output[:300]!r}")
    return output[start : end + len("</hierarchy>")]


def _raise_if_reported(command: str, output: str, needles: tuple[str, ...]) -> None:
    # `am start` and `monkey` may exit 0 after printing their own error.
    if any(needle in output for needle in needles):
        raise CommandFailed(f"`{command}` failed: {output.strip()}")


# -- the driver ----------------------------------------------------------------------------


class AdbDevice(AdbPhoneLog):
    """One phone behind the adb server. Each call opens its own connection, but a held
    phone's input commands (one kept `sh`)."""

    def __init__(
        self, client: ClientAsync, serial: str, call_timeout: float, links: Links | None = None
    ):
        self.serial = serial
        self._client = client
        self._call_timeout = call_timeout
        self._links = links or Links(client, None, 30)
        self._kept = KeptShell(client, serial)

    # -- Device protocol ---------------------------------------------------------------

    async def shell(self, command: str, timeout: float) -> ShellResult:
        """Run `command` with ``sh``; a non-zero exit is a result, not an error.

        The command must be a complete list for ``sh -c`` that can be followed by
        ``; echo …`` (no trailing ``&``, comment or ``exit``).
        """
        async with guard(self.serial, f"shell `{command}`", timeout):
            code, output = await self._run("shell", command)
        return ShellResult(code, output.decode("utf-8", errors="replace"))

    async def tap(self, x: int, y: int) -> InputPath:
        if await self._control(lambda link: link.tap(x, y)):
            return "control"
        await self._action(f"input tap {int(x)} {int(y)}", kept=True)
        return "input"

    async def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int) -> InputPath:
        if await self._control(lambda link: link.swipe(x1, y1, x2, y2, duration_ms)):
            return "control"
        points = " ".join(str(int(v)) for v in (x1, y1, x2, y2, duration_ms))
        await self._action(f"input swipe {points}", kept=True)
        return "input"

    async def input_text(self, text: str) -> InputPath:
        escaped = escape_input_text(text) if text else ""  # the same text either way
        if text and await self._control(lambda link: link.text(text)):
            return "control"
        if text:
            await self._action(f"input text {escaped}", kept=True)
        return "input"

    async def key(self, keycode: int) -> InputPath:
        if await self._control(lambda link: link.key(keycode)):
            return "control"
        await self._action(f"input keyevent {int(keycode)}", kept=True)
        return "input"

    async def _control(self, act: Callable[[Link], Awaitable[None]]) -> bool:
        """Done through scrcpy's control socket, if its server runs for this phone."""
        link = self._links.running(self.serial)
        if link is None:
            return False
        try:
            await act(link)
        except DeviceError as exc:
            log.info("scrcpy control failed: input instead", device=self.serial, error=str(exc))
            return False
        return True

    async def open_video(self, fps: VideoFps) -> ScrcpyVideo:
        """The phone's H.264 stream from scrcpy's server (at the host's frame rate: the
        server's is set as it starts); VideoUnavailable without one configured."""
        return await ScrcpyVideo(self._links, self.serial).open()

    @asynccontextmanager
    async def hold_control(self) -> AsyncIterator[bool]:
        """scrcpy's server kept running for the block (a session: its input goes through
        the control socket); False when it has none or it could not start. Input that
        goes through `input` meanwhile shares one kept `sh`, closed as the block ends."""
        async with AsyncExitStack() as held:
            await held.enter_async_context(self._kept.hold())
            try:
                if self._links.jar is not None:
                    await held.enter_async_context(self._links.hold(self.serial))
            except DeviceError as exc:
                log.info("scrcpy did not start: input instead", device=self.serial, error=str(exc))
            yield self._links.running(self.serial) is not None

    async def launch_app(self, package: str, activity: str) -> None:
        if activity:
            command = f"am start -n {shlex.quote(f'{package}/{activity}')}"
            needles = ("Error:", "Error type")
        else:
            command = f"monkey -p {shlex.quote(package)} -c android.intent.category.LAUNCHER 1"
            needles = ("monkey aborted", "No activities found")
        _raise_if_reported(command, await self._action(command), needles)

    async def stop_app(self, package: str) -> None:
        await self._action(f"am force-stop {shlex.quote(package)}")

    async def screenshot(self) -> bytes:
        """``screencap -p`` over ``exec-out`` (no pty, so no newline rewriting)."""
        command = "screencap -p"
        async with guard(self.serial, command, self._call_timeout):
            code, raw = await self._run("exec-out", command)
        if code != 0:
            raise CommandFailed(f"`{command}` exited {code}: {raw[:200]!r}")
        return _png_from(raw)

    async def ui_dump(self) -> str:
        output = await self._action(f"uiautomator dump {UI_DUMP_PATH} && cat {UI_DUMP_PATH}")
        return _xml_from(output)

    async def exec_in(self, command: str, data: Path, timeout: float) -> str:
        async with guard(self.serial, f"exec `{command}`", timeout):
            return await adb_files.exec_in(self._client, self.serial, command, data)

    async def push(self, local: Path, remote: str, timeout: float) -> None:
        async with guard(self.serial, f"push to {remote}", timeout):
            await adb_files.push(self._client, self.serial, local, remote)

    async def pull(self, remote: str, limit: int, timeout: float) -> bytes:
        async with guard(self.serial, f"pull of {remote}", timeout):
            return await adb_files.pull(self._client, self.serial, remote, limit)

    # -- internals ---------------------------------------------------------------------

    async def _action(self, command: str, *, kept: bool = False) -> str:
        """Run an action command; its output, or CommandFailed on a non-zero exit.
        `kept`: an input command, run by the kept `sh` while the phone is held."""
        async with guard(self.serial, f"`{command}`", self._call_timeout):
            code, raw = await self._run("shell", command, kept=kept)
        output = raw.decode("utf-8", errors="replace")
        if code != 0:
            raise CommandFailed(f"`{command}` exited {code}: {output.strip()}")
        return output

    async def _run(self, service: str, command: str, *, kept: bool = False) -> tuple[int, bytes]:
        """Run under the caller's guard: (exit code, raw output). `kept`: by the kept
        `sh` while the phone is held; else, or not held, on a connection of its own."""
        marker = f"AMC_EXIT_{uuid.uuid4().hex}_"
        wrapped = f"{command.rstrip().rstrip(';')}; echo {marker}$?"
        raw = await self._kept.exchange(wrapped, marker) if kept else None
        if raw is None:
            raw = await self._exchange(f"{service}:{wrapped}")
        result = _split_exit_marker(raw, marker.encode())
        if result is None:
            raise await self._why_cut_short(command)
        return result

    async def _exchange(self, request: str) -> bytes:
        async with device_session(self._client, self.serial) as phone:
            await phone.request(request)
            return await phone.read_to_end()

    async def _why_cut_short(self, command: str) -> DeviceError:
        listing = await host_query(self._client, "host:devices")
        states = {serial: state for serial, state, _ in parse_devices_l(listing)}
        state = states.get(self.serial)
        if state != "device":
            return DeviceLost(f"device lost: {self.serial} ({state or 'gone'}) during `{command}`")
        return DeviceError(f"{self.serial}: connection dropped during `{command}`")


class AdbSource:
    """The phones an adb server (default: the local one on 5037) knows about."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 5037,
        call_timeout: float = DEFAULT_CALL_TIMEOUT,
        scrcpy_server: ServerJar | None = None,
        video_max_fps: int = 30,
    ):
        self._client = ClientAsync(host=host, port=port)
        self._call_timeout = call_timeout
        # scrcpy's servers running on the phones (none without a server configured).
        self.links = Links(self._client, scrcpy_server, video_max_fps)

    async def inventory(self) -> list[AttachedDevice]:
        """Every device adb lists; online ones are described from one `getprop` each."""
        async with guard("adb", "host:devices-l", self._call_timeout):
            listing = await host_query(self._client, "host:devices-l")
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(self._describe(*e)) for e in parse_devices_l(listing)]
        return [info for task in tasks if (info := task.result()) is not None]

    def device(self, serial: str) -> AdbDevice:
        return AdbDevice(self._client, serial, self._call_timeout, self.links)

    def door(self, serial: str) -> AdbServerDoor:
        """The phone's adb services for an adb door (host_agent.adb_door)."""
        return AdbServerDoor(self._client, self.device(serial), self._call_timeout)

    async def reconnect_device(self, serial: str) -> None:
        """The recovery ladder's `adb reconnect`: the adb server drops its connection to
        the phone (`host-serial:<serial>:reconnect`), which clears a wedged transport. A USB
        phone comes back by itself; one the server reached over the network (`adb connect`,
        a host:port serial) is forgotten, so it is connected again (`host:connect:`) once
        the server has let it go. The server answers OKAY either way, saying what it did."""
        async with guard(serial, "adb reconnect", self._call_timeout):
            answer = await host_query(self._client, f"host-serial:{serial}:reconnect")
            if not answer.startswith("reconnecting"):
                raise failure_to_error(serial, answer.strip() or "no answer to reconnect")
            if not _NETWORK_SERIAL.match(serial):
                return
            while True:  # the server forgets the phone a moment after it answered
                if serial not in await self._listed():
                    break
                await asyncio.sleep(_RECONNECT_POLL)
            answer = await host_query(self._client, f"host:connect:{serial}")
        if "connected to" not in answer:
            raise DeviceLost(f"device lost: {serial}: adb connect: {answer.strip()}")

    async def _listed(self) -> set[str]:
        listing = await host_query(self._client, "host:devices")
        return {s for s, _, _ in parse_devices_l(listing)}

    async def reboot_device(self, serial: str) -> None:
        """The recovery ladder's reboot: adb's `reboot:` service (what `adb reboot` asks);
        the phone then drops off and boots (the ladder waits for sys.boot_completed)."""
        async with guard(serial, "reboot", self._call_timeout):
            async with device_session(self._client, serial) as phone:
                await phone.request("reboot:")

    def cleaner(self, serial: str, profile: CleanProfile, baselines: Baselines) -> ShellCleaner:
        """A phone over adb is cleaned by shell commands (host_agent.cleaning)."""
        return ShellCleaner(self.device(serial), profile, baselines, self.reboot_device)

    async def close(self) -> None:
        """Nothing to release: every call opens and closes its own connection."""

    async def _describe(
        self, serial: str, state: str, labels: dict[str, str]
    ) -> AttachedDevice | None:
        if state != "device":
            return AttachedDevice(serial=serial, state=state, labels=labels)
        try:
            result = await self.device(serial).shell("getprop", self._call_timeout)
        except DeviceLost:
            return None  # unplugged between the listing and getprop
        except DeviceError as exc:
            return AttachedDevice(serial=serial, state=state, labels={**labels, "error": str(exc)})
        return info_from_props(serial, state, parse_getprop(result.output), labels)
