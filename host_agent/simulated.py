"""Phones that are not there: a `DeviceSource` for demos, load tests and chaos tests.

`SimulatedSource(count)` offers ``sim-0 … sim-{count-1}``, all online. Every action
waits `delay` seconds (cancellable) and then succeeds. Each action, finished or not, is
recorded as an `ActionRecord` in `SimulatedSource.actions` and, when `action_log` is a
path, appended to it as one flushed JSON line, so a test can check from outside that
two attempts never drove the same phone at the same time.

`unplug(serial)` takes a phone away (calls raise `DeviceLost`, an action in flight is
interrupted, `inventory()` omits it); `plug(serial)` brings it back.

Each phone has a body (`Body`): a battery that drains under load and charges while on
power, a temperature that rises under load and falls back when idle (the rates are the
source's, all 0 by default: a phone stays as it is set), and it may hang (`hang`: every
call waits until the caller gives up, until a reboot, or an `adb reconnect` for a hang of
its transport) or reboot (`reboot`: `sys.boot_completed` is not 1
for `boot_time` seconds, and actions fail as on a phone that is starting). The health
probe's reads (`getprop sys.boot_completed`, `dumpsys battery`, `df /data`) are answered
from the body at once and are not actions: they are not in the action log.

`follow_faults(path)` (the agent's `--sim-faults`) applies faults set from outside (a
chaos run, a demo) from a JSON file, whenever it changes: per serial, `unplugged` (true),
`hung` ("reboot" or "reconnect": what cures it), `booting` (seconds from now) and
`temperature` (°C). A phone whose entry changed gets its new entry; what the entry no
longer says is undone (plugged, answering, booted, room temperature).
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
import zlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from host_agent.devices import DeviceInfo, DeviceLost, DeviceTimeout, ShellResult
from host_agent.screen import PNG_SIGNATURE, RGB, Canvas, png_file, text_width

__all__ = [
    "PNG_SIGNATURE",
    "ActionRecord",
    "SimulatedDevice",
    "SimulatedSource",
    "make_png",
    "screenshot_png",
]

SIMULATED_PROPS: dict[str, str] = {
    "ro.product.model": "Simulated",
    "ro.product.manufacturer": "AMC",
    "ro.build.version.sdk": "34",
    "ro.product.cpu.abi": "x86_64",
}

UI_XML = (
    "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>"
    '<hierarchy rotation="0">'
    '<node index="0" text="" resource-id="" class="android.widget.FrameLayout" '
    'package="com.amc.simulated" content-desc="" clickable="false" bounds="[0,0][1080,2400]">'
    '<node index="0" text="Simulated" resource-id="com.amc.simulated:id/title" '
    'class="android.widget.TextView" package="com.amc.simulated" content-desc="" '
    'clickable="false" bounds="[40,100][1040,180]" />'
    '<node index="1" text="OK" resource-id="android:id/button1" '
    'class="android.widget.Button" package="com.amc.simulated" content-desc="confirm" '
    'clickable="true" bounds="[100,200][300,260]" />'
    "</node></hierarchy>"
)


def make_png(width: int = 4, height: int = 3, rgb: RGB = (30, 144, 255)) -> bytes:
    """A valid truecolour PNG filled with one colour, written without Pillow."""
    return Canvas(width, height, rgb).png()


@dataclass(frozen=True)
class ActionRecord:
    serial: str
    action: str
    args: dict[str, Any]
    started_monotonic: float
    ended_monotonic: float
    started_wall: float
    ended_wall: float
    # "ok", "lost" or "cancelled" (which is also how a caller's timeout looks from here).
    outcome: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass
class _Recorder:
    log_path: Path | None
    records: list[ActionRecord] = field(default_factory=list)

    def add(self, record: ActionRecord) -> None:
        self.records.append(record)
        if self.log_path is not None:
            # Open, write, close per line: several sources (processes) may share the file.
            with self.log_path.open("a", encoding="utf-8") as log:
                log.write(record.to_json() + "\n")
                log.flush()


@dataclass
class Body:
    """A simulated phone's physical state."""

    battery: float = 100.0
    temperature: float = 30.0
    charging: bool = True
    hung: bool = False
    # What ends a hang: "reboot" (the phone itself), or "reconnect" (its transport: the
    # recovery ladder's `adb reconnect` clears it, as a reboot does).
    hang_cured_by: str = "reboot"
    # time.monotonic() until which it boots (sys.boot_completed is not 1).
    booting_until: float = 0.0
    free_kb: int = 8_000_000
    updated: float = field(default_factory=time.monotonic)


# Where an idle phone's temperature settles.
ROOM_TEMPERATURE = 30.0
PROBE_COMMANDS = ("getprop sys.boot_completed", "dumpsys battery", "df /data")


@dataclass(frozen=True)
class Physics:
    """How fast bodies change, per second (0: not at all)."""

    drain_under_load: float = 0.0
    charge: float = 0.0
    heat_under_load: float = 0.0
    cool: float = 0.0


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
        self._recorder = _Recorder(Path(action_log) if action_log is not None else None)
        # Set when a phone is unplugged; replaced by a fresh one when it comes back.
        self._unplugged: dict[str, asyncio.Event] = {s: asyncio.Event() for s in self.serials}
        self._in_flight: dict[str, int] = dict.fromkeys(self.serials, 0)
        # The faults last applied from outside (follow_faults), by serial.
        self._faults: dict[str, dict[str, Any]] = {}
        # What each phone's live frames show; how many frames were captured in all.
        self.screens: dict[str, LiveScreen] = {s: LiveScreen() for s in self.serials}
        self.captures = 0

    @property
    def actions(self) -> list[ActionRecord]:
        return self._recorder.records

    async def inventory(self) -> list[DeviceInfo]:
        return [
            DeviceInfo(
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
        now = time.monotonic()
        elapsed, body.updated = now - body.updated, now
        p = self.physics
        loaded = self.in_flight(serial) > 0
        if body.charging:
            body.battery += p.charge * elapsed
        if loaded:
            body.battery -= p.drain_under_load * elapsed
            body.temperature += p.heat_under_load * elapsed
        else:
            body.temperature = max(ROOM_TEMPERATURE, body.temperature - p.cool * elapsed)
        body.battery = max(0.0, min(100.0, body.battery))
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
        if not self.is_plugged(serial):
            raise DeviceLost(f"device lost: {serial} is not attached")
        self.reboot(serial, self.boot_time)

    def apply_faults(self, faults: Mapping[str, Mapping[str, Any]]) -> None:
        """Each phone whose entry changed gets it; what its entry no longer says is undone."""
        for serial in self.serials:
            new, old = dict(faults.get(serial, {})), self._faults.get(serial, {})
            if new == old:
                continue
            if new.get("unplugged"):
                self.unplug(serial)
            elif not self.is_plugged(serial):
                self.plug(serial)
            if new.get("hung") or old.get("hung"):
                self.hang(serial, bool(new.get("hung")), str(new.get("hung") or "reboot"))
            body = self.body(serial)
            if "booting" in new:
                body.booting_until = time.monotonic() + float(new["booting"])
            elif "booting" in old:
                body.booting_until = 0.0
            if "temperature" in new:
                body.temperature = float(new["temperature"])
            elif "temperature" in old:
                body.temperature = ROOM_TEMPERATURE
            self._faults[serial] = new

    async def follow_faults(self, path: Path, every: float = 0.2) -> None:
        """Apply the faults in `path` (JSON: serial -> fault) whenever the file changes."""
        seen: tuple[int, int] | None = None
        while True:
            seen = self._faults_changed(path, seen)
            await asyncio.sleep(every)

    def _faults_changed(self, path: Path, seen: tuple[int, int] | None) -> tuple[int, int] | None:
        """Apply `path` if it changed since `seen` (its mtime and size); what it is now."""
        try:
            stat = path.stat()
            if (stat.st_mtime_ns, stat.st_size) != seen:
                self.apply_faults(json.loads(path.read_text("utf-8") or "{}"))
            return (stat.st_mtime_ns, stat.st_size)
        except (OSError, ValueError, TypeError, AttributeError):
            return None  # absent, or half written: read it again

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
        if command == "getprop sys.boot_completed":
            return ShellResult(0, "1\n" if self.booted(serial) else "\n")
        if command == "dumpsys battery":
            return ShellResult(0, battery_text(body))
        return ShellResult(
            0,
            "Filesystem     1K-blocks    Used Available Use% Mounted on\n"
            f"/dev/block/dm-5 16000000 {16_000_000 - body.free_kb} {body.free_kb} 50% /data\n",
        )

    def is_plugged(self, serial: str) -> bool:
        event = self._unplugged.get(serial)
        return event is not None and not event.is_set()

    def in_flight(self, serial: str) -> int:
        """How many actions are running on `serial` right now."""
        return self._in_flight.get(serial, 0)

    def actions_for(self, serial: str) -> list[ActionRecord]:
        return [record for record in self.actions if record.serial == serial]

    def record(self, record: ActionRecord) -> None:
        self._recorder.add(record)

    async def pause(self, serial: str) -> None:
        """Wait `delay` seconds as a phone would; DeviceLost if unplugged meanwhile."""
        unplugged = self._unplugged.get(serial)
        if unplugged is None or unplugged.is_set():
            raise DeviceLost(f"device lost: {serial} is not attached")
        body = self.body(serial)
        if not self.booted(serial):
            raise DeviceLost(f"device lost: {serial} is rebooting")
        self._in_flight[serial] += 1
        try:
            async with asyncio.timeout(self.call_timeout if body.hung else self.delay):
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
    """One simulated phone; every method goes through `_act` for timing and the log."""

    def __init__(self, source: SimulatedSource, serial: str):
        self.serial = serial
        self._source = source

    async def shell(self, command: str, timeout: float) -> ShellResult:
        try:
            async with asyncio.timeout(timeout):
                if command in PROBE_COMMANDS:
                    return await self._source.probe_read(self.serial, command)
                await self._act("shell", command=command)
        except TimeoutError:
            raise DeviceTimeout(f"{self.serial}: shell `{command}` timed out") from None
        return _shell_result(command)

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

    async def _act(self, action: str, **args: Any) -> None:
        started_monotonic, started_wall = time.monotonic(), time.time()
        outcome = "cancelled"  # also what a timeout from the caller looks like here
        try:
            await self._source.pause(self.serial)
            outcome = "ok"
            self._source.screens[self.serial].saw(action, args)
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


def battery_text(body: Body) -> str:
    """`dumpsys battery` as Android prints it."""
    return (
        "Current Battery Service state:\n"
        f"  AC powered: {str(body.charging).lower()}\n"
        "  USB powered: false\n"
        "  Wireless powered: false\n"
        f"  status: {2 if body.charging else 3}\n"
        "  health: 2\n"
        "  present: true\n"
        f"  level: {int(body.battery)}\n"
        "  scale: 100\n"
        "  voltage: 4100\n"
        f"  temperature: {round(body.temperature * 10)}\n"
        "  technology: Li-ion\n"
    )


def _shell_result(command: str) -> ShellResult:
    """Plausible output for a few commands; anything else succeeds silently."""
    words = command.split()
    if not words:
        return ShellResult(0, "")
    if words[0] == "echo":
        return ShellResult(0, " ".join(words[1:]) + "\n")
    if words[0] == "getprop":
        if len(words) > 1:
            return ShellResult(0, SIMULATED_PROPS.get(words[1], "") + "\n")
        return ShellResult(0, "".join(f"[{k}]: [{v}]\n" for k, v in SIMULATED_PROPS.items()))
    if words[0] == "false":
        return ShellResult(1, "")
    return ShellResult(0, "")


# The screen UI_XML describes is 1080 x 2400; a screenshot is drawn at a third of that.
SCREEN_SCALE = 3
PHONE_SIZE = (1080, 2400)
SCREENSHOT_SIZE = (PHONE_SIZE[0] // SCREEN_SCALE, PHONE_SIZE[1] // SCREEN_SCALE)
# Where UI_XML puts the app's title and its OK button: [left, top, right, bottom].
TITLE_BOUNDS = (40, 100, 1040, 180)
BUTTON_BOUNDS = (100, 200, 300, 260)
_INK: RGB = (55, 60, 70)
_WHITE: RGB = (255, 255, 255)
_BAR: RGB = (32, 33, 36)


@functools.cache
def screenshot_png(serial: str) -> bytes:
    """What a screenshot of the simulated phone `serial` is: its screen as UI_XML describes
    it (the app's title "Simulated" and its OK button, in the phone's own colour), a status
    bar naming the phone, and a few lines saying it is simulated. The same for every call."""
    return _home(serial).png()


# A tap's mark on a live frame: a square this many pixels wide, in this colour.
TAP_MARK = 12
TAP_RGB: RGB = (230, 20, 20)


@dataclass
class LiveScreen:
    """What a simulated phone's live frames show beside its home screen: where the last
    tap landed, the text typed, the app in front, and how many frames were taken."""

    tap: tuple[int, int] | None = None
    typed: str = ""
    app: str = "com.amc.simulated"
    frames: int = 0
    actions: int = 0
    # The frame's rows above its panel, for the last tap's place (live_frame).
    upper: _Upper | None = field(default=None, repr=False, compare=False)

    def saw(self, action: str, args: Mapping[str, Any]) -> None:
        self.actions += 1
        if action == "tap":
            self.tap = (int(args["x"]), int(args["y"]))
        elif action == "swipe":
            self.tap = (int(args["x2"]), int(args["y2"]))
        elif action == "input_text":
            self.typed = (self.typed + str(args["text"]))[-40:]
        elif action == "launch_app":
            self.app = str(args["package"])
        elif action == "key" and int(args["keycode"]) == 3:  # HOME
            self.app = "com.amc.simulated"


def live_frame(serial: str, screen: LiveScreen) -> bytes:
    """A live frame of the phone: its home screen, a red square where the last tap landed
    (in the phone's 1080 x 2400 coordinates, drawn at a third), and a panel saying the app
    in front, the text typed, the actions done and the frame's number.

    Only the panel changes from frame to frame: the rows above it are compressed once per
    tap place (`_Upper`), and each frame compresses the panel's rows after them (a copy of
    the compressor's state), so a frame costs ~1 ms instead of ~4."""
    screen.frames += 1
    width, height = SCREENSHOT_SIZE
    upper = screen.upper
    if upper is None or upper.tap != screen.tap:
        upper = screen.upper = _Upper.drawn(serial, screen.tap)
    panel = Canvas(width, height - PANEL_TOP, _WHITE)
    panel.pixels[:] = upper.panel
    panel.fill(0, 0, width, height - PANEL_TOP - 30, (225, 228, 235))
    panel.text(8, 6, f"app {screen.app}"[:28], _INK)
    panel.text(8, 30, f"typed {screen.typed[-22:]}", _INK)
    panel.text(8, 54, f"actions {screen.actions}", _INK)
    panel.text(8, 78, f"frame {screen.frames}", _INK)
    _mark(panel, screen.tap, -PANEL_TOP)
    compressor = upper.compressor.copy()
    idat = upper.compressed + compressor.compress(panel.scanlines()) + compressor.flush()
    return png_file(width, height, idat)


# The live frame's panel: its rows from here to the bottom.
PANEL_TOP = SCREENSHOT_SIZE[1] - 150


def _mark(canvas: Canvas, tap: tuple[int, int] | None, dy: int = 0) -> None:
    if tap is not None:
        x, y = (v // SCREEN_SCALE for v in tap)
        half = TAP_MARK // 2
        canvas.fill(x - half, y - half + dy, x + half, y + half + dy, TAP_RGB)


@dataclass
class _Upper:
    """A live frame's rows above the panel for one tap place, compressed, with the
    compressor's state after them; and the panel's rows as they are under the panel."""

    tap: tuple[int, int] | None
    compressed: bytes
    compressor: Any  # zlib's compressor object, copied for each frame
    panel: bytes

    @staticmethod
    def drawn(serial: str, tap: tuple[int, int] | None) -> _Upper:
        canvas = _home(serial).copy()
        _mark(canvas, tap)
        compressor = zlib.compressobj(1)
        compressed = compressor.compress(canvas.scanlines(0, PANEL_TOP))
        stride = canvas.width * 3
        return _Upper(tap, compressed, compressor, bytes(canvas.pixels[PANEL_TOP * stride :]))


@functools.cache
def _home(serial: str) -> Canvas:
    width, height = SCREENSHOT_SIZE
    accent = _colour_for(serial)
    canvas = Canvas(width, height, (246, 247, 249))
    canvas.fill(0, 0, width, 24, _BAR)
    canvas.text(8, 5, serial, _WHITE)
    canvas.text(width - 8 - text_width("12:00"), 5, "12:00", _WHITE)
    # Capitals are 7 rows of the font: 21 pixels tall at scale 3, 14 at scale 2.
    left, top, _, bottom = (v // SCREEN_SCALE for v in TITLE_BOUNDS)
    canvas.fill(0, 24, width, bottom + 4, accent)
    canvas.text(left, top + (bottom - top - 21) // 2, "Simulated", _WHITE, scale=3)
    left, top, right, bottom = (v // SCREEN_SCALE for v in BUTTON_BOUNDS)
    canvas.fill(left, top, right, bottom, accent)
    canvas.text(left + (right - left - text_width("OK")) // 2, top + 3, "OK", _WHITE)
    props = SIMULATED_PROPS
    lines = [
        "Simulated phone",
        f"serial {serial}",
        f"model {props['ro.product.model']}",
        f"SDK {props['ro.build.version.sdk']}, {props['ro.product.cpu.abi']}",
        "com.amc.simulated",
        "",
        "AMC draws this",
        "screen: no phone",
        "is plugged in.",
    ]
    for number, line in enumerate(lines):
        canvas.text(16, 124 + 36 * number, line, _INK, scale=3)
    canvas.fill(0, height - 30, width, height, _BAR)
    for x in (width // 4, width // 2, 3 * width // 4):
        canvas.fill(x - 6, height - 21, x + 6, height - 9, (200, 200, 200))
    return canvas


def _colour_for(serial: str) -> RGB:
    """Stable per phone, so screenshots of different phones differ; dark enough for white
    text on it."""
    digest = zlib.crc32(serial.encode())
    return (
        30 + (digest & 0xFF) * 130 // 255,
        30 + ((digest >> 8) & 0xFF) * 130 // 255,
        30 + ((digest >> 16) & 0xFF) * 130 // 255,
    )
