"""What the host agent needs from a phone, whatever drives it.

Two implementations: `host_agent.adb` (a real adb server via pure-python-adb) and
`host_agent.simulated` (no phone at all). The runner only sees these types.

Errors::

    DeviceError             any failure talking to a device
    ├── DeviceLost          the device is gone (unplugged, offline, adb server lost it)
    │   └── DeviceUnresponsive  it (or the adb server) stopped answering mid-run: as good
    │                       as gone for the task (host_agent.executor raises it)
    ├── DeviceTimeout       a call took longer than its deadline
    ├── SourceUnreachable   the device source (the adb server) cannot be reached
    └── CommandFailed       the device answered, but the command did not succeed

DeviceLost ends a run as an infrastructure failure, not the task's: the task is given back
to run on another phone (host_agent.worker).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


class DeviceError(Exception):
    """The device could not be driven."""


class DeviceLost(DeviceError):
    """device lost: it is no longer attached to this host."""


class DeviceUnresponsive(DeviceLost):
    """device unresponsive: it stopped answering, so nothing more can run on it."""


class SourceUnreachable(DeviceError):
    """The adb server (the device source) cannot be reached."""


class DeviceTimeout(DeviceError):
    """The device did not answer in time."""


class CommandFailed(DeviceError):
    """The command ran but failed."""


@dataclass(frozen=True)
class AttachedDevice:
    """A phone as the device source lists it (attached to this host, online or not) with
    what it says of itself: what RegisterHost reports (lease_pb2.DeviceInfo). The control
    plane's record of a device, with its task and condition, is the plane's own."""

    serial: str
    # "device" (online, authorized), "offline", "unauthorized", or what adb reports.
    state: str
    model: str = ""
    manufacturer: str = ""
    sdk: int = 0
    abi: str = ""
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ShellResult:
    exit_code: int
    output: str


class Device(Protocol):
    """One phone. Every method has its own deadline and raises DeviceError subclasses."""

    serial: str

    async def shell(self, command: str, timeout: float) -> ShellResult: ...

    async def tap(self, x: int, y: int) -> None: ...

    async def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int) -> None: ...

    async def input_text(self, text: str) -> None: ...

    async def key(self, keycode: int) -> None: ...

    async def launch_app(self, package: str, activity: str) -> None: ...

    async def stop_app(self, package: str) -> None: ...

    async def screenshot(self) -> bytes:
        """A PNG image."""
        ...

    async def ui_dump(self) -> str:
        """The `uiautomator dump` XML of the current screen."""
        ...

    async def exec_in(self, command: str, data: Path, timeout: float) -> str:
        """Run `command` with adb's `exec:` service (no shell: no exit code), the file on
        its stdin; what it printed."""
        ...

    async def push(self, local: Path, remote: str, timeout: float) -> None:
        """`adb push`: the file to `remote` on the phone, replacing what is there."""
        ...

    async def pull(self, remote: str, limit: int, timeout: float) -> bytes:
        """`adb pull`: the file at `remote`; CommandFailed if it is over `limit` bytes."""
        ...


@runtime_checkable
class PhoneLogs(Protocol):
    """A phone whose log (logcat) the agent keeps for each run (host_agent.logcat): an adb
    phone and a simulated one. Not actions: they are not in a task's steps."""

    async def clear_log(self, timeout: float) -> None:
        """`logcat -c`: the log emptied."""
        ...

    def follow_log(self) -> AsyncIterator[bytes]:
        """`logcat -v threadtime`: what the log holds, then what is written to it as it
        is, until the phone goes (or the reader stops reading)."""
        ...

    async def mark_log(self, tag: str, message: str, timeout: float) -> None:
        """`log -p i -t TAG MESSAGE`: a line written into the phone's own log."""
        ...


class DeviceSource(Protocol):
    """The phones attached to this host."""

    async def inventory(self) -> list[AttachedDevice]: ...

    def device(self, serial: str) -> Device: ...

    async def close(self) -> None: ...
