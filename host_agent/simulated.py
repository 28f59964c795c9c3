"""Phones that are not there: a `DeviceSource` for demos, load tests and chaos tests.

`SimulatedSource(count)` offers ``sim-0 … sim-{count-1}``, all online. Every action
waits `delay` seconds (cancellable) and then succeeds. Each action, finished or not, is
recorded as an `ActionRecord` in `SimulatedSource.actions` and, when `action_log` is a
path, appended to it as one flushed JSON line (host_agent.simulated_log). Each phone
has a log (host_agent.simulated_logcat) where what is done on it is written as Android
writes it, which the agent keeps for each run (`clear_log`, `follow_log`, `mark_log`: not
actions, so not in the action log).

`unplug(serial)` takes a phone away (calls raise `DeviceLost`, an action in flight is
interrupted, `inventory()` omits it); `plug(serial)` brings it back.

Each phone has a body (`Body`, host_agent.simulated_body): a battery that drains under
load and charges while on power, a temperature that rises under load and falls back when
idle (the rates are the source's, all 0 by default: a phone stays as it is set), and it
may hang (`hang`: every
call waits until the caller gives up, until a reboot, or an `adb reconnect` for a hang of
its transport) or reboot (`reboot`: `sys.boot_completed` is not 1
for `boot_time` seconds, and actions fail as on a phone that is starting). The health
probe's reads (`getprop sys.boot_completed`, `dumpsys battery`, `df /data`) are answered
from the body at once and are not actions: they are not in the action log. What its
screenshots and live frames show is drawn by host_agent.simulated_screen.

Each phone keeps packages, files and settings (`PhoneState`, host_agent.simulated_state),
which a task's shell actions change and the host's clean between leases restores
(`cleaner`: the shell cleaner, its commands taking `clean_delay` each and logged as
`clean` actions, apart from `actions`, in `cleans`).

Faults are also set from outside (a chaos run, a demo: `faults`, the agent's
`--sim-faults`, host_agent.simulated_faults).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from host_agent import simulated_video
from host_agent.baselines import Baselines
from host_agent.clean_profile import CleanProfile
from host_agent.cleaning import ShellCleaner
from host_agent.devices import (
    AttachedDevice,
    CommandFailed,
    DeviceLost,
    DeviceTimeout,
    ShellResult,
    VideoFps,
    VideoStream,
)
from host_agent.simulated_apps import PhoneApps
from host_agent.simulated_body import (
    PROBE_COMMANDS,
    SIMULATED_PROPS,
    Body,
    Physics,
    probe_answer,
    shell_answer,
)
from host_agent.simulated_faults import Faults
from host_agent.simulated_log import ActionRecord, Recorder
from host_agent.simulated_logcat import PhoneLog
from host_agent.simulated_screen import PHONE_SIZE, UI_XML, LiveScreen, live_frame, screenshot_png
from host_agent.simulated_state import PhoneState

if TYPE_CHECKING:
    from host_agent.simulated_door import SimulatedDoor

__all__ = ["ActionRecord", "SimulatedDevice", "SimulatedSource"]


class SimulatedSource:
    def __init__(
        self,
        count: int,
        delay: float = 0.0,
        prefix: str = "sim-",
        action_log: str | Path | None = None,
        physics: Physics | None = None,
    ):
        self.delay = delay
        self.physics = physics or Physics()
        # How long a reboot by the recovery ladder takes; how long an action on a hung phone
        # waits before it times out (the adb driver's call timeout).
        self.boot_time = 1.0
        self.call_timeout = 30.0
        self.serials = [f"{prefix}{i}" for i in range(count)]
        self.bodies: dict[str, Body] = {s: Body() for s in self.serials}
        self._recorder = Recorder(Path(action_log) if action_log is not None else None)
        # Set when a phone is unplugged; replaced by a fresh one when it comes back.
        self._unplugged: dict[str, asyncio.Event] = {s: asyncio.Event() for s in self.serials}
        self._in_flight: dict[str, int] = dict.fromkeys(self.serials, 0)
        # Faults set from outside (host_agent.simulated_faults: the agent's --sim-faults).
        self.faults = Faults(self)
        # What each phone's live frames show; how many frames were captured in all.
        self.screens: dict[str, LiveScreen] = {s: LiveScreen() for s in self.serials}
        self.captures = 0
        # Whether the phones have an H.264 stream (host_agent.simulated_video; PyAV too).
        self.video = True
        # The recovery ladder's steps that disturbed a phone: (serial, "reconnect" or
        # "reboot", time.time() when asked).
        self.recovery_steps: list[tuple[str, str, float]] = []
        # Each phone's packages and files (host_agent.simulated_apps), and the rest of what
        # a clean restores (host_agent.simulated_state); how long a clean's command takes.
        sdk = int(SIMULATED_PROPS["ro.build.version.sdk"])
        self.apps: dict[str, PhoneApps] = {s: PhoneApps(sdk) for s in self.serials}
        # Each phone's log (host_agent.simulated_logcat).
        self.logs: dict[str, PhoneLog] = {s: PhoneLog(s) for s in self.serials}
        self.states: dict[str, PhoneState] = {s: PhoneState(self.apps[s]) for s in self.serials}
        self.clean_delay = 0.0
        self._clean_hangs: set[str] = set()

    @property
    def actions(self) -> list[ActionRecord]:
        return self._recorder.records

    @property
    def cleans(self) -> list[ActionRecord]:
        """The commands of the cleans between leases (`clean` actions), in order."""
        return self._recorder.cleans

    async def inventory(self) -> list[AttachedDevice]:
        return [
            AttachedDevice(
                serial=serial,
                state="device",
                model=SIMULATED_PROPS["ro.product.model"],
                manufacturer=SIMULATED_PROPS["ro.product.manufacturer"],
                sdk=int(SIMULATED_PROPS["ro.build.version.sdk"]),
                abi=SIMULATED_PROPS["ro.product.cpu.abi"],
                labels={"simulated": "true"},
            )
            for serial in self.serials
            if self.is_plugged(serial)
        ]

    def device(self, serial: str) -> SimulatedDevice:
        return SimulatedDevice(self, serial)

    def cleaner(self, serial: str, profile: CleanProfile, baselines: Baselines) -> ShellCleaner:
        """Cleaned by shell commands, as a phone over adb is (its commands logged apart)."""
        device = SimulatedDevice(self, serial, cleaning=True)
        return ShellCleaner(device, profile, baselines, self.reboot_device)

    def hang_cleans(self, serial: str, hung: bool = True) -> None:
        """From now on a clean's commands on `serial` never answer (until unplugged)."""
        (self._clean_hangs.add if hung else self._clean_hangs.discard)(serial)

    async def close(self) -> None:
        """Nothing to release: the log file is opened per line."""

    def unplug(self, serial: str) -> None:
        self._unplugged[serial].set()

    def plug(self, serial: str) -> None:
        if serial in self._unplugged:
            self._unplugged[serial] = asyncio.Event()

    def body(self, serial: str) -> Body:
        """The phone's body, brought up to now (load since the last look counted)."""
        body = self.bodies[serial]
        body.advance(self.physics, loaded=self.in_flight(serial) > 0)
        return body

    def set_body(self, serial: str, **facts: Any) -> None:
        """Set a phone's battery, temperature, charging (or any Body field) now."""
        body = self.body(serial)
        for name, value in facts.items():
            setattr(body, name, value)

    def hang(self, serial: str, hung: bool = True, cured_by: str = "reboot") -> None:
        """From now on every call to the phone waits until its caller gives up, until
        `cured_by` ("reboot", or "reconnect": a wedged transport) or `hang(serial, False)`."""
        body = self.body(serial)
        body.hung, body.hang_cured_by = hung, cured_by

    async def reconnect_device(self, serial: str) -> None:
        """The recovery ladder's `adb reconnect`: ends a hang of the phone's transport."""
        self.recovery_steps.append((serial, "reconnect", time.time()))
        if not self.is_plugged(serial):
            raise DeviceLost(f"device lost: {serial} is not attached")
        body = self.body(serial)
        if body.hang_cured_by == "reconnect":
            body.hung = False

    def reboot(self, serial: str, boot_time: float) -> None:
        """The phone restarts: it boots for `boot_time` seconds."""
        body = self.body(serial)
        body.hung = False
        body.booting_until = max(body.booting_until, time.monotonic() + boot_time)

    async def reboot_device(self, serial: str) -> None:
        """The recovery ladder's reboot: `boot_time` seconds of booting."""
        self.recovery_steps.append((serial, "reboot", time.time()))
        if not self.is_plugged(serial):
            raise DeviceLost(f"device lost: {serial} is not attached")
        self.reboot(serial, self.boot_time)

    def booted(self, serial: str) -> bool:
        return time.monotonic() >= self.body(serial).booting_until

    async def probe_read(self, serial: str, command: str) -> ShellResult:
        """A health probe's read, answered from the body (not an action: not logged)."""
        unplugged = self._unplugged.get(serial)
        if unplugged is None or unplugged.is_set():
            raise DeviceLost(f"device lost: {serial} is not attached")
        body = self.body(serial)
        if body.hung:
            await unplugged.wait()
            raise DeviceLost(f"device lost: {serial} was unplugged during the probe")
        return probe_answer(body, self.booted(serial), command)

    def unplugged(self, serial: str) -> asyncio.Event:
        """Set when the phone is unplugged (its current plug-in's)."""
        return self._unplugged[serial]

    def is_plugged(self, serial: str) -> bool:
        event = self._unplugged.get(serial)
        return event is not None and not event.is_set()

    def in_flight(self, serial: str) -> int:
        """How many actions are running on `serial` right now."""
        return self._in_flight.get(serial, 0)

    def door(self, serial: str) -> SimulatedDoor:
        """The phone's adb services, for an adb door (host_agent.simulated_door)."""
        from host_agent.simulated_door import SimulatedDoor  # which builds on this module

        return SimulatedDoor(self, serial)

    def actions_for(self, serial: str) -> list[ActionRecord]:
        return [record for record in self.actions if record.serial == serial]

    def record(self, record: ActionRecord) -> None:
        self._recorder.add(record)

    async def pause(self, serial: str, cleaning: bool = False) -> None:
        """Wait `delay` seconds (`clean_delay` for a clean's command) as a phone would;
        DeviceLost if unplugged meanwhile."""
        unplugged = self._unplugged.get(serial)
        if unplugged is None or unplugged.is_set():
            raise DeviceLost(f"device lost: {serial} is not attached")
        body = self.body(serial)
        if not self.booted(serial):
            raise DeviceLost(f"device lost: {serial} is rebooting")
        took = self.clean_delay if cleaning else self.delay
        if cleaning and serial in self._clean_hangs:
            took = float("inf")  # until the caller gives up, or the phone is unplugged
        self._in_flight[serial] += 1
        try:
            async with asyncio.timeout(self.call_timeout if body.hung else took):
                await unplugged.wait()
        except TimeoutError:
            if body.hung:
                raise DeviceTimeout(f"{serial}: no answer in {self.call_timeout:g}s") from None
            return  # the work took `delay` and the phone stayed
        finally:
            self.body(serial)  # the load so far counted before it ends
            self._in_flight[serial] -= 1
        raise DeviceLost(f"device lost: {serial} was unplugged during the action")


class SimulatedDevice:
    """One simulated phone; every method goes through `_act` for timing and the log
    (`cleaning`: the device a clean between leases drives, its commands `clean` actions)."""

    def __init__(self, source: SimulatedSource, serial: str, cleaning: bool = False):
        self.serial = serial
        self._source = source
        self._cleaning = cleaning

    async def shell(self, command: str, timeout: float) -> ShellResult:
        try:
            async with asyncio.timeout(timeout):
                if command in PROBE_COMMANDS:
                    return await self._source.probe_read(self.serial, command)
                await self._act("clean" if self._cleaning else "shell", command=command)
        except TimeoutError:
            raise DeviceTimeout(f"{self.serial}: shell `{command}` timed out") from None
        answered = self._source.states[self.serial].answer(command)
        if answered is None:
            answered = self._source.logs[self.serial].answer(command)
        return ShellResult(*answered) if answered is not None else shell_answer(command)

    async def tap(self, x: int, y: int) -> None:
        await self._act("tap", x=x, y=y)

    async def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int) -> None:
        await self._act("swipe", x1=x1, y1=y1, x2=x2, y2=y2, duration_ms=duration_ms)

    async def input_text(self, text: str) -> None:
        await self._act("input_text", text=text)

    async def key(self, keycode: int) -> None:
        await self._act("key", keycode=keycode)

    async def launch_app(self, package: str, activity: str) -> None:
        await self._act("launch_app", package=package, activity=activity)

    async def stop_app(self, package: str) -> None:
        await self._act("stop_app", package=package)

    async def screenshot(self) -> bytes:
        await self._act("screenshot")
        return screenshot_png(self.serial)

    async def ui_dump(self) -> str:
        await self._act("ui_dump")
        return UI_XML

    async def exec_in(self, command: str, data: Path, timeout: float) -> str:
        await self._act("exec_in", command=command)
        apk = await asyncio.to_thread(data.read_bytes)
        answer = self._source.apps[self.serial].stdin_command(command, apk)
        return answer if answer is not None else f"/system/bin/sh: {command}: not found\n"

    async def push(self, local: Path, remote: str, timeout: float) -> None:
        await self._act("push", path=remote)
        self._source.apps[self.serial].files[remote] = await asyncio.to_thread(local.read_bytes)

    async def pull(self, remote: str, limit: int, timeout: float) -> bytes:
        await self._act("pull", path=remote)
        data = self._source.apps[self.serial].files.get(remote)
        if data is None or len(data) > limit:
            raise CommandFailed(f"pull of {remote} failed: no such file (or over {limit} bytes)")
        return data

    def screen_size(self) -> tuple[int, int]:
        """The phone's screen in its own pixels (the coordinates taps take, the UI dump's
        bounds); its screenshots and live frames are drawn at a third of it."""
        return PHONE_SIZE

    async def screen_frame(self) -> bytes:
        """A live frame (`screencap` for a viewer): not an action, so neither logged nor
        timed as one, and it never waits for the phone's actions."""
        source = self._source
        if not source.is_plugged(self.serial):
            raise DeviceLost(f"device lost: {self.serial} is not attached")
        if source.body(self.serial).hung:
            raise DeviceTimeout(f"{self.serial}: screencap: no answer")
        source.captures += 1
        return live_frame(self.serial, source.screens[self.serial])

    async def clear_log(self, timeout: float) -> None:
        self._log().clear()

    def follow_log(self) -> AsyncIterator[bytes]:
        return self._log().follow(self._source.unplugged(self.serial), usec=True)

    async def mark_log(self, tag: str, message: str, timeout: float) -> None:
        self._log().write("I", tag, message)

    def _log(self) -> PhoneLog:
        """The phone's log (not an action: neither logged nor timed as one)."""
        if not self._source.is_plugged(self.serial):
            raise DeviceLost(f"device lost: {self.serial} is not attached")
        return self._source.logs[self.serial]

    async def open_video(self, fps: VideoFps) -> VideoStream:
        """Its live frames as H.264 (host_agent.simulated_video), drawn at `fps()`."""
        return simulated_video.open_stream(self._source, self.serial, fps)

    async def _act(self, action: str, **args: Any) -> None:
        started_monotonic, started_wall = time.monotonic(), time.time()
        outcome = "cancelled"  # also what a timeout from the caller looks like here
        try:
            await self._source.pause(self.serial, self._cleaning)
            outcome = "ok"
            self._source.screens[self.serial].saw(action, args)
            self._source.logs[self.serial].saw(action, args)
        except DeviceLost:
            outcome = "lost"
            raise
        finally:
            self._source.record(
                ActionRecord(
                    serial=self.serial,
                    action=action,
                    args=args,
                    started_monotonic=started_monotonic,
                    ended_monotonic=time.monotonic(),
                    started_wall=started_wall,
                    ended_wall=time.time(),
                    outcome=outcome,
                )
            )
