"""The simulated device source: phones that are not there, but behave and leave a trail."""

from __future__ import annotations

import asyncio
import json
import struct
import time
import xml.etree.ElementTree as ET
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest

from host_agent.devices import DeviceLost, DeviceTimeout, ShellResult
from host_agent.screen import GLYPH_GAP, GLYPH_WIDTH, PNG_SIGNATURE, glyph_pixels
from host_agent.simulated import SimulatedDevice, SimulatedSource
from host_agent.simulated_screen import (
    BUTTON_BOUNDS,
    SCREEN_SCALE,
    SCREENSHOT_SIZE,
    TITLE_BOUNDS,
    UI_XML,
    screenshot_png,
)

DEADLINE = 2.0


async def assert_eventually(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, raw scanlines) after checking the signature and every chunk CRC."""
    assert data.startswith(PNG_SIGNATURE)
    at, chunks = len(PNG_SIGNATURE), dict[bytes, bytes]()
    while at < len(data):
        (length,) = struct.unpack(">I", data[at : at + 4])
        kind, body = data[at + 4 : at + 8], data[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", data[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(kind + body), f"bad CRC in {kind!r}"
        chunks[kind] = chunks.get(kind, b"") + body
        at += 12 + length
    assert list(chunks)[-1] == b"IEND"
    width, height = struct.unpack(">II", chunks[b"IHDR"][:8])
    return width, height, zlib.decompress(chunks[b"IDAT"])


async def test_inventory_lists_count_phones_online_as_simulated() -> None:
    """THEN sim-0 … sim-2 are listed in state "device" with model "Simulated"."""
    source = SimulatedSource(3)

    inventory = await source.inventory()

    assert [i.serial for i in inventory] == ["sim-0", "sim-1", "sim-2"]
    assert {(i.state, i.model, i.sdk) for i in inventory} == {("device", "Simulated", 34)}


async def test_prefix_names_the_phones() -> None:
    """THEN the serials start with the given prefix."""
    inventory = await SimulatedSource(2, prefix="rack7-").inventory()

    assert [i.serial for i in inventory] == ["rack7-0", "rack7-1"]


async def test_every_action_succeeds_and_is_recorded_with_its_arguments() -> None:
    """THEN each call leaves one "ok" record naming the phone, the action and its args."""
    source = SimulatedSource(1)
    device = source.device("sim-0")

    await device.tap(1, 2)
    await device.swipe(1, 2, 3, 4, 300)
    await device.input_text("hi there")
    await device.key(66)
    await device.launch_app("com.example", ".Main")
    await device.stop_app("com.example")
    await device.screenshot()
    await device.ui_dump()
    await device.shell("echo hi", timeout=DEADLINE)

    assert [(r.serial, r.action, r.args, r.outcome) for r in source.actions] == [
        ("sim-0", "tap", {"x": 1, "y": 2}, "ok"),
        ("sim-0", "swipe", {"x1": 1, "y1": 2, "x2": 3, "y2": 4, "duration_ms": 300}, "ok"),
        ("sim-0", "input_text", {"text": "hi there"}, "ok"),
        ("sim-0", "key", {"keycode": 66}, "ok"),
        ("sim-0", "launch_app", {"package": "com.example", "activity": ".Main"}, "ok"),
        ("sim-0", "stop_app", {"package": "com.example"}, "ok"),
        ("sim-0", "screenshot", {}, "ok"),
        ("sim-0", "ui_dump", {}, "ok"),
        ("sim-0", "shell", {"command": "echo hi"}, "ok"),
    ]


async def test_actions_take_the_configured_delay_and_record_their_window() -> None:
    """THEN an action lasts at least `delay`, and its record spans that window on both clocks."""
    source = SimulatedSource(1, delay=0.05)
    wall_before = time.time()

    await source.device("sim-0").tap(5, 5)

    [record] = source.actions
    assert record.ended_monotonic - record.started_monotonic >= 0.05
    assert wall_before <= record.started_wall <= record.ended_wall <= time.time()


async def test_action_log_gets_one_flushed_json_line_per_action(tmp_path: Path) -> None:
    """THEN the file can be read after each action and holds exactly the actions so far."""
    log = tmp_path / "actions.jsonl"
    source = SimulatedSource(2, action_log=log)

    await source.device("sim-0").tap(1, 1)
    first = log.read_text().splitlines()
    await source.device("sim-1").key(4)
    lines = [json.loads(line) for line in log.read_text().splitlines()]

    assert len(first) == 1
    assert [(line["serial"], line["action"], line["args"]) for line in lines] == [
        ("sim-0", "tap", {"x": 1, "y": 1}),
        ("sim-1", "key", {"keycode": 4}),
    ]
    assert {"started_monotonic", "ended_monotonic", "started_wall", "ended_wall"} <= set(lines[0])


async def test_two_sources_append_to_one_action_log(tmp_path: Path) -> None:
    """THEN several host agents can share a log: every source's lines are kept."""
    log = tmp_path / "actions.jsonl"
    first, second = (
        SimulatedSource(1, action_log=log),
        SimulatedSource(1, prefix="b-", action_log=log),
    )

    await asyncio.gather(first.device("sim-0").tap(1, 1), second.device("b-0").tap(2, 2))

    serials = sorted(json.loads(line)["serial"] for line in log.read_text().splitlines())
    assert serials == ["b-0", "sim-0"]


async def test_screenshot_is_a_valid_png_that_differs_per_phone() -> None:
    """THEN the bytes decode as a PNG with matching size, and two phones look different."""
    source = SimulatedSource(2)

    first = await source.device("sim-0").screenshot()
    second = await source.device("sim-1").screenshot()

    width, height, pixels = read_png(first)
    assert len(pixels) == height * (1 + 3 * width)
    assert first != second


def on_screenshot(bounds: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    left, top, right, bottom = bounds
    return (
        left // SCREEN_SCALE,
        top // SCREEN_SCALE,
        right // SCREEN_SCALE,
        bottom // SCREEN_SCALE,
    )


class Picture:
    """A decoded truecolour PNG (every scanline unfiltered), pixel by pixel."""

    def __init__(self, png: bytes) -> None:
        self.width, self.height, raw = read_png(png)
        stride = 1 + 3 * self.width
        assert all(raw[y * stride] == 0 for y in range(self.height))
        self.rows = [raw[y * stride + 1 : (y + 1) * stride] for y in range(self.height)]

    def at(self, x: int, y: int) -> tuple[int, int, int]:
        r, g, b = self.rows[y][3 * x : 3 * x + 3]
        return (r, g, b)

    def text_in(
        self, box: tuple[int, int, int, int], ink: tuple[int, int, int], scale: int = 2
    ) -> str:
        """The text drawn in `ink` inside `box` (left, top, right, bottom), read back glyph
        by glyph against the font at `scale`: what a person would read there."""
        left, top, right, bottom = box
        lit = {
            (x, y) for y in range(top, bottom) for x in range(left, right) if self.at(x, y) == ink
        }
        assert lit, f"nothing drawn in {ink} inside {box}"
        x0, y0 = min(x for x, _ in lit), min(y for _, y in lit)
        glyphs = {c: frozenset(glyph_pixels(c)) for c in map(chr, range(32, 127))}
        text, cell = "", (GLYPH_WIDTH + GLYPH_GAP) * scale
        for n in range((max(x for x, _ in lit) - x0) // cell + 1):
            seen = frozenset(
                ((x - x0 - n * cell) // scale, (y - y0) // scale)
                for x, y in lit
                if x0 + n * cell <= x < x0 + (n + 1) * cell
            )
            text += next(c for c, pixels in glyphs.items() if pixels == seen)
        return text


async def test_a_screenshot_shows_the_screen_the_ui_dump_describes() -> None:
    """THEN the PNG is the phone's screen at a third of its size: the app's title
    "Simulated" and its "OK" button drawn where the UI dump puts them, the phone's serial
    in the status bar, and it is the same picture every time."""
    xml = ET.fromstring(UI_XML)
    nodes = {n.get("text"): n.get("bounds") for n in xml.iter("node")}
    assert (nodes["Simulated"], nodes["OK"]) == ("[40,100][1040,180]", "[100,200][300,260]")
    shot = await SimulatedSource(1, prefix="rack1-").device("rack1-0").screenshot()
    picture = Picture(shot)
    assert (picture.width, picture.height) == SCREENSHOT_SIZE == (1080 // 3, 2400 // 3)
    white = (255, 255, 255)
    assert picture.text_in(on_screenshot(TITLE_BOUNDS), white, scale=3) == "Simulated"
    assert picture.text_in(on_screenshot(BUTTON_BOUNDS), white) == "OK"
    assert picture.text_in((0, 0, picture.width // 2, 24), white) == "rack1-0"
    colours = {picture.at(x, y) for y in range(0, picture.height, 7) for x in range(0, 360, 7)}
    assert len(colours) >= 5, colours
    assert screenshot_png("rack1-0") == shot


async def test_ui_dump_is_uiautomator_xml_with_a_confirm_button() -> None:
    """THEN the XML parses and has the OK button with its id, description and bounds."""
    xml = await SimulatedSource(1).device("sim-0").ui_dump()

    root = ET.fromstring(xml.encode())
    [button] = [n for n in root.iter("node") if n.get("resource-id") == "android:id/button1"]
    assert root.tag == "hierarchy"
    assert (button.get("text"), button.get("content-desc")) == ("OK", "confirm")
    assert button.get("bounds") == "[100,200][300,260]"


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("echo hello world", ShellResult(0, "hello world\n")),
        ("getprop ro.product.model", ShellResult(0, "Simulated\n")),
        ("false", ShellResult(1, "")),
        ("input keyevent 3", ShellResult(0, "")),
    ],
)
async def test_shell_answers_plausibly(command: str, expected: ShellResult) -> None:
    """THEN echo echoes, getprop knows the model, false fails, anything else succeeds."""
    assert await SimulatedSource(1).device("sim-0").shell(command, timeout=DEADLINE) == expected


async def test_shell_slower_than_its_timeout_raises_device_timeout() -> None:
    """THEN a delay above the shell timeout ends in DeviceTimeout at about the timeout."""
    device = SimulatedSource(1, delay=5.0).device("sim-0")
    started = time.monotonic()

    with pytest.raises(DeviceTimeout):
        await device.shell("echo slow", timeout=0.05)

    assert time.monotonic() - started < 1.0


async def test_unplugged_phone_raises_device_lost_and_leaves_the_inventory() -> None:
    """THEN calls raise DeviceLost ("device lost"), inventory omits it, plug brings it back."""
    source = SimulatedSource(2)
    device = source.device("sim-1")

    source.unplug("sim-1")

    with pytest.raises(DeviceLost, match="device lost"):
        await device.tap(1, 1)
    assert [i.serial for i in await source.inventory()] == ["sim-0"]

    source.plug("sim-1")
    await device.tap(1, 1)
    assert [i.serial for i in await source.inventory()] == ["sim-0", "sim-1"]


async def test_unplug_interrupts_an_action_in_flight_with_device_lost() -> None:
    """THEN the running action fails at once with DeviceLost and is recorded as "lost"."""
    source = SimulatedSource(1, delay=30.0)
    call = asyncio.create_task(source.device("sim-0").tap(1, 1))
    await assert_eventually(lambda: source.in_flight("sim-0") == 1, "the tap to start")

    source.unplug("sim-0")

    with pytest.raises(DeviceLost):
        await call
    assert [r.outcome for r in source.actions] == ["lost"]


async def test_unknown_serial_raises_device_lost() -> None:
    """THEN a serial the source never had behaves like an unplugged phone."""
    device: SimulatedDevice = SimulatedSource(1).device("sim-9")

    with pytest.raises(DeviceLost, match="device lost"):
        await device.key(3)


async def test_cancelling_an_action_stops_it_and_records_its_window(tmp_path: Path) -> None:
    """THEN cancellation ends the delay at once and the log still shows the attempt's window."""
    log = tmp_path / "actions.jsonl"
    source = SimulatedSource(1, delay=30.0, action_log=log)
    call = asyncio.create_task(source.device("sim-0").swipe(0, 0, 9, 9, 100))
    await assert_eventually(lambda: source.in_flight("sim-0") == 1, "the swipe to start")

    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call

    [line] = [json.loads(text) for text in log.read_text().splitlines()]
    assert (line["action"], line["outcome"]) == ("swipe", "cancelled")
    assert line["ended_monotonic"] - line["started_monotonic"] < 5.0
    assert source.in_flight("sim-0") == 0
