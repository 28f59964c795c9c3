"""A small in-memory Device for the runner tests: records every call, can be slowed down,
made to hang, fail, or lose the device, and lets a test act at the moment a call starts.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from host_agent.devices import ShellResult

HOME_SCREEN = """<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>
<hierarchy rotation="0">
  <node index="0" text="" resource-id="" class="android.widget.FrameLayout"
        package="com.example" content-desc="" bounds="[0,0][1080,2400]">
    <node index="0" text="Welcome" resource-id="com.example:id/title"
          class="android.widget.TextView" content-desc="" bounds="[100,200][980,300]" />
    <node index="1" text="OK" resource-id="com.example:id/ok"
          class="android.widget.Button" content-desc="" bounds="[100,1000][500,1200]" />
    <node index="2" text="" resource-id="com.example:id/menu"
          class="android.widget.ImageButton" content-desc="Open menu"
          bounds="[960,40][1060,140]" />
  </node>
</hierarchy>"""

EMPTY_SCREEN = """<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>
<hierarchy rotation="0">
  <node index="0" text="" resource-id="" class="android.widget.FrameLayout"
        package="com.example" content-desc="" bounds="[0,0][1080,2400]" />
</hierarchy>"""

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 56


@dataclass
class Call:
    method: str
    args: tuple[object, ...]
    started: float
    ended: float | None = None
    cancelled: bool = False


@dataclass
class FakeDevice:
    """Every method records a Call, runs `on_call`, waits its delay, then fails or answers."""

    serial: str = "fake-1"
    # Seconds each call of a method takes; math.inf: until cancelled.
    delays: dict[str, float] = field(default_factory=dict)
    # Raised by every call of a method.
    failures: dict[str, Exception] = field(default_factory=dict)
    # Successive ui_dump answers; the last one repeats.
    screens: list[str] = field(default_factory=lambda: [HOME_SCREEN])
    shell_result: ShellResult = field(default_factory=lambda: ShellResult(0, "ok\n"))
    png: bytes = PNG
    # Called (and awaited if it returns an awaitable) as each call starts.
    on_call: Callable[[Call], Awaitable[None] | None] | None = None
    calls: list[Call] = field(default_factory=list)

    def methods(self) -> list[str]:
        return [c.method for c in self.calls]

    def count(self, method: str) -> int:
        return sum(c.method == method for c in self.calls)

    async def _call(self, method: str, *args: object) -> None:
        call = Call(method, args, time.monotonic())
        self.calls.append(call)
        try:
            if self.on_call is not None:
                maybe = self.on_call(call)
                if maybe is not None:
                    await maybe
            delay = self.delays.get(method, 0.0)
            if delay == math.inf:
                await asyncio.Event().wait()
            elif delay > 0:
                await asyncio.sleep(delay)
            if method in self.failures:
                raise self.failures[method]
        except asyncio.CancelledError:
            call.cancelled = True
            raise
        finally:
            call.ended = time.monotonic()

    async def shell(self, command: str, timeout: float) -> ShellResult:
        await self._call("shell", command, timeout)
        return self.shell_result

    async def tap(self, x: int, y: int) -> None:
        await self._call("tap", x, y)

    async def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int) -> None:
        await self._call("swipe", x1, y1, x2, y2, duration_ms)

    async def input_text(self, text: str) -> None:
        await self._call("input_text", text)

    async def key(self, keycode: int) -> None:
        await self._call("key", keycode)

    async def launch_app(self, package: str, activity: str) -> None:
        await self._call("launch_app", package, activity)

    async def stop_app(self, package: str) -> None:
        await self._call("stop_app", package)

    async def screenshot(self) -> bytes:
        await self._call("screenshot")
        return self.png

    async def ui_dump(self) -> str:
        await self._call("ui_dump")
        index = min(self.count("ui_dump"), len(self.screens)) - 1
        return self.screens[index]
