"""What the host agent needs from a phone, whatever drives it.

Two implementations: `host_agent.adb` (a real adb server via pure-python-adb) and
`host_agent.simulated` (no phone at all). The runner only sees these types.

A source also says how each of its phones is cleaned between leases (`cleaner`): the one
seam where device kinds differ in what a clean is. A phone over adb (real or simulated) is
cleaned by shell commands (host_agent.cleaning.ShellCleaner: uninstall, clear, files,
settings, reboot); an emulator the host runs (host_agent.emulator) by loading its
snapshot, a step of its own, without a branch anywhere else (host_agent.device_life runs
whatever steps it is given, times them, reports them and quarantines a phone whose clean
fails). Likewise a source's optional `prepare` (before a lease's first action: an emulator
loads the snapshot the task starts from) and `pools` (the phones the host starts and stops
itself: an emulator pool), asked through this module's `prepare` and `pools`, which stand
in for a source without them (a phone over adb, a simulated one).

Errors::

    DeviceError             any failure talking to a device
    ├── DeviceLost          the device is gone (unplugged, offline, adb server lost it)
    │   └── DeviceUnresponsive  it (or the adb server) stopped answering mid-run: as good
    │                       as gone for the task (host_agent.executor raises it)
    ├── DeviceTimeout       a call took longer than its deadline
    ├── SourceUnreachable   the device source (the adb server) cannot be reached
    ├── CommandFailed       the device answered, but the command did not succeed
    ├── VideoUnavailable    this phone has no H.264 stream here (its still frames serve)
    └── CleanFailed         a step of a clean between leases did not succeed

DeviceLost ends a run as an infrastructure failure, not the task's: the task is given back
to run on another phone (host_agent.worker).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from host_agent.baselines import Baselines
    from host_agent.clean_profile import CleanProfile
    from host_agent.h264 import VideoPacket


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


class VideoUnavailable(DeviceError):
    """The phone has no H.264 stream here (no scrcpy server configured or able to start,
    no PyAV for a simulated phone): its viewers get still frames."""


# Which way an input action reached a real phone: scrcpy's control socket ("control") or
# the `input` command ("input"). A simulated phone says nothing.
InputPath = Literal["control", "input"]


class CleanFailed(DeviceError):
    """A step of a clean between leases failed (what it said is the message)."""


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

    # The input actions say which way they reached the phone (None: not said).
    async def tap(self, x: int, y: int) -> InputPath | None: ...

    async def swipe(
        self, x1: int, y1: int, x2: int, y2: int, duration_ms: int
    ) -> InputPath | None: ...

    async def input_text(self, text: str) -> InputPath | None: ...

    async def key(self, keycode: int) -> InputPath | None: ...

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
        """`logcat -v threadtime -v usec`: what the log holds, then what is written to it
        as it is, until the phone goes (or the reader stops reading)."""
        ...

    async def mark_log(self, tag: str, message: str, timeout: float) -> None:
        """`log -p i -t TAG MESSAGE`: a line written into the phone's own log."""
        ...


class VideoStream(Protocol):
    """A phone's screen as H.264 (`open_video` of a driver that has one)."""

    async def next(self) -> VideoPacket:
        """The next encoded frame; DeviceError when the stream broke."""
        ...

    def want_key_frame(self) -> None:
        """Ask for a key frame soon (a viewer fell behind, a recording starts)."""
        ...

    async def close(self) -> None: ...


# A driver with a stream also has `async open_video(fps: Callable[[], int]) -> VideoStream`
# (`fps()`: the frame rate wanted now), which raises VideoUnavailable when this phone has
# none; host_agent.screencast looks for it.
VideoFps = Callable[[], int]


# One step of a clean: runs it, and returns what it did (one line), or raises a DeviceError
# (CleanFailed) saying why it failed.
CleanStepRun = Callable[[], Awaitable[str]]


@dataclass(frozen=True)
class CleanedStep:
    """A step of a clean as it ended: what it did or why it failed, how long it took."""

    name: str
    detail: str
    seconds: float
    ok: bool


class Cleaner(Protocol):
    """How one phone is brought back to its baseline between leases, its kind's way."""

    def steps(self, *, first: bool, reboot: bool) -> list[tuple[str, CleanStepRun]]:
        """The clean's steps, in order, by name. `first`: the host agent sees the phone for
        the first time (its baseline is recorded if it has none); `reboot`: its profile's
        every-N-leases reboot is due."""
        ...


class PoolHost(Protocol):
    """What a pool of phones the host runs itself (host_agent.emulator_pool) asks of the
    phones' life on the host (host_agent.device_life.DeviceLife)."""

    def ready(self, serial: str) -> bool:
        """Whether `serial` waits for work (ready: not leased, cleaning or quarantined)."""
        ...

    def retire(self, serial: str) -> bool:
        """Take a ready `serial` out of service for good, to stop it; False if it is not
        ready (a lease, a clean or the ladder has it)."""
        ...

    async def lost(self, serial: str, why: str) -> None:
        """`serial`'s process died: returns once its task, if any, is stopped and its
        lease given back (device_lost); it is cleaned before it takes work again."""
        ...

    def broken(self, serial: str, why: str) -> None:
        """`serial` would not start again: quarantined, its recovery ladder (whose reboot
        starts it afresh) brings it back or leaves it for an operator."""
        ...

    def fresh(self, serial: str) -> None:
        """A new instance answers as `serial` (a retired one's serial again, or its first):
        cleaned before its first lease."""
        ...

    async def changed(self) -> None:
        """The phones listed changed: register them again now."""
        ...


class Pools(Protocol):
    """The phones a host starts and stops itself, by pool (emulators)."""

    def advertised(self) -> list[tuple[str, dict[str, str]]]:
        """Each pool's name and the labels its phones carry (a selector's view)."""
        ...

    def want(self, wanted: Mapping[str, int]) -> None:
        """How many queued tasks each pool's phones would take (the control plane's hint)."""
        ...

    async def run(self, host: PoolHost) -> None:
        """Keep the pools (until cancelled)."""
        ...


class _NoPools:
    def advertised(self) -> list[tuple[str, dict[str, str]]]:
        return []

    def want(self, wanted: Mapping[str, int]) -> None:
        pass

    async def run(self, host: PoolHost) -> None:
        pass


# The pools of a source whose phones come and go by themselves.
NO_POOLS: Pools = _NoPools()


class DeviceSource(Protocol):
    """The phones attached to this host."""

    async def inventory(self) -> list[AttachedDevice]: ...

    def device(self, serial: str) -> Device: ...

    def cleaner(self, serial: str, profile: CleanProfile, baselines: Baselines) -> Cleaner:
        """How `serial` is cleaned between leases, as `profile` asks, against its
        baseline in `baselines`."""
        ...

    async def close(self) -> None: ...


async def prepare(source: DeviceSource, serial: str, snapshot: str) -> str:
    """Before a lease's first action: the phone brought to `snapshot` (the task's
    start_snapshot; "" for none) by its source's `prepare`, if it has one (an emulator's);
    what was done ("" nothing). CommandFailed for a phone that has no snapshots, DeviceLost
    for one that could not be brought there."""
    own: Callable[[str, str], Awaitable[str]] | None = getattr(source, "prepare", None)
    if own is not None:
        return await own(serial, snapshot)
    if snapshot:
        raise CommandFailed(f"cannot start from snapshot {snapshot!r}: not an emulator")
    return ""


def pools(source: DeviceSource) -> Pools:
    """The phones `source` starts and stops itself (its `pools()`, if it has one; else
    NO_POOLS: its phones come and go by themselves)."""
    own: Callable[[], Pools] | None = getattr(source, "pools", None)
    return own() if own is not None else NO_POOLS
