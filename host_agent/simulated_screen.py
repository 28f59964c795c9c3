"""What a simulated phone shows: its screen as `uiautomator dump` describes it (`UI_XML`),
its screenshots (`screenshot_png`: the same PNG for every call) and its live frames
(`live_frame`: the home screen, where the last tap landed and a panel of what the phone
did, from its `LiveScreen`). Drawn with `host_agent.screen`, without Pillow.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from host_agent.screen import RGB, Canvas, png_file, text_width
from host_agent.simulated_body import SIMULATED_PROPS

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
    upper, panel = _next_frame(serial, screen)
    width, height = SCREENSHOT_SIZE
    compressor = upper.compressor.copy()
    idat = upper.compressed + compressor.compress(panel.scanlines()) + compressor.flush()
    return png_file(width, height, idat)


def live_pixels(serial: str, screen: LiveScreen) -> bytes:
    """The same live frame as `live_frame`, as its RGB pixels (for a video encoder)."""
    upper, panel = _next_frame(serial, screen)
    return upper.pixels + bytes(panel.pixels)


def _next_frame(serial: str, screen: LiveScreen) -> tuple[_Upper, Canvas]:
    """The next frame's rows above the panel and its panel, drawn."""
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
    return upper, panel


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
    # The rows above the panel, as RGB pixels.
    pixels: bytes

    @staticmethod
    def drawn(serial: str, tap: tuple[int, int] | None) -> _Upper:
        canvas = _home(serial).copy()
        _mark(canvas, tap)
        compressor = zlib.compressobj(1)
        compressed = compressor.compress(canvas.scanlines(0, PANEL_TOP))
        stride = canvas.width * 3
        rows = PANEL_TOP * stride
        return _Upper(
            tap, compressed, compressor, bytes(canvas.pixels[rows:]), bytes(canvas.pixels[:rows])
        )


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
