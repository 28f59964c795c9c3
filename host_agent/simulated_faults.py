"""Faults set on simulated phones from outside (a chaos run, a demo): a JSON file, the host
agent's `--sim-faults`, applied whenever it changes.

Per serial: `unplugged` (true), `hung` ("reboot" or "reconnect": what cures it), `booting`
(seconds from now), `temperature` (°C), `clean` ("hang": a clean's commands never answer)
and `uninstall` ("fail": `pm uninstall` fails). A phone whose entry changed gets its new
entry; what the entry no longer says is undone (plugged, answering, booted, room
temperature, cleans).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from host_agent.simulated_body import ROOM_TEMPERATURE

if TYPE_CHECKING:
    from host_agent.simulated import SimulatedSource


class Faults:
    """The faults of one source's phones, as last applied (`apply`, or `follow` a file)."""

    def __init__(self, source: SimulatedSource) -> None:
        self._source = source
        self._applied: dict[str, dict[str, Any]] = {}

    def apply(self, faults: Mapping[str, Mapping[str, Any]]) -> None:
        """Each phone whose entry changed gets it; what its entry no longer says is undone."""
        for serial in self._source.serials:
            new, old = dict(faults.get(serial, {})), self._applied.get(serial, {})
            if new == old:
                continue
            if new.get("unplugged"):
                self._source.unplug(serial)
            elif not self._source.is_plugged(serial):
                self._source.plug(serial)
            if new.get("hung") or old.get("hung"):
                self._source.hang(serial, bool(new.get("hung")), str(new.get("hung") or "reboot"))
            body = self._source.body(serial)
            if "booting" in new:
                body.booting_until = time.monotonic() + float(new["booting"])
            elif "booting" in old:
                body.booting_until = 0.0
            if "temperature" in new:
                body.temperature = float(new["temperature"])
            elif "temperature" in old:
                body.temperature = ROOM_TEMPERATURE
            self._source.hang_cleans(serial, new.get("clean") == "hang")
            self._source.states[serial].uninstall_fails = new.get("uninstall") == "fail"
            self._applied[serial] = new

    async def follow(self, path: Path, every: float = 0.2) -> None:
        """Apply the faults in `path` (JSON: serial -> fault) whenever the file changes."""
        seen: tuple[int, int] | None = None
        while True:
            seen = self._changed(path, seen)
            await asyncio.sleep(every)

    def _changed(self, path: Path, seen: tuple[int, int] | None) -> tuple[int, int] | None:
        """Apply `path` if it changed since `seen` (its mtime and size); what it is now."""
        try:
            stat = path.stat()
            if (stat.st_mtime_ns, stat.st_size) != seen:
                self.apply(json.loads(path.read_text("utf-8") or "{}"))
            return (stat.st_mtime_ns, stat.st_size)
        except (OSError, ValueError, TypeError, AttributeError):
            return None  # absent, or half written: read it again
