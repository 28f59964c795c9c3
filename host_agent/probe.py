"""What a health probe reads from a phone: `getprop sys.boot_completed` (its round trip is
the responsiveness check), `dumpsys battery` and `df /data`, sent at once and read into a
`Reading` (host_agent.health judges it)."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass

from host_agent import metrics
from host_agent.devices import Device, DeviceTimeout


@dataclass(frozen=True)
class Reading:
    """What one probe saw (None: not read)."""

    boot_completed: bool
    battery_percent: int | None = None
    temperature_celsius: float | None = None
    charging: bool | None = None
    free_bytes: int | None = None
    round_trip: float = 0.0


_FIELD = re.compile(r"^\s*([A-Za-z ]+):\s*(\S+)\s*$", re.MULTILINE)


def parse_battery(text: str) -> tuple[int | None, float | None, bool | None]:
    """Level (%), temperature (°C) and charging from `dumpsys battery`."""
    fields = {k.strip().lower(): v for k, v in _FIELD.findall(text)}
    level = scale = None
    if fields.get("level", "").lstrip("-").isdigit():
        level = int(fields["level"])
        scale = int(fields["scale"]) if fields.get("scale", "").isdigit() else 100
        level = max(0, min(100, round(level * 100 / scale))) if scale > 0 else None
    temperature = None
    if fields.get("temperature", "").lstrip("-").isdigit():
        temperature = int(fields["temperature"]) / 10  # tenths of a degree
    powered = [v == "true" for k, v in fields.items() if k.endswith(" powered")]
    charging = None
    if powered or "status" in fields:
        charging = any(powered) or fields.get("status") == "2"  # 2: BATTERY_STATUS_CHARGING
    return level, temperature, charging


def parse_df(text: str) -> int | None:
    """Bytes available on the filesystem `df` listed last (1K blocks)."""
    lines = [line.split() for line in text.strip().splitlines()[1:]]
    for parts in reversed(lines):
        if len(parts) >= 4 and parts[3].isdigit():
            return int(parts[3]) * 1024
    return None


async def probe(device: Device, timeout: float) -> Reading:
    """Read a phone's health, in at most `timeout` seconds (DeviceTimeout past it). The
    three reads go at once (one round trip, not three); a phone that has not booted is
    judged by `getprop` alone (what the others said, or how they failed, is dropped)."""

    async def booted() -> tuple[str, float]:
        started = time.monotonic()
        boot = await device.shell("getprop sys.boot_completed", timeout)
        return boot.output, time.monotonic() - started

    try:
        async with asyncio.timeout(timeout):
            first, battery, df = await asyncio.gather(
                booted(),
                device.shell("dumpsys battery", timeout),
                device.shell("df /data", timeout),
                return_exceptions=True,
            )
    except TimeoutError:
        raise DeviceTimeout(f"{device.serial}: no answer to a probe in {timeout:g}s") from None
    if isinstance(first, BaseException):
        raise _failed(device, first, timeout)
    boot, round_trip = first
    metrics.PROBE_SECONDS.observe(round_trip)
    if boot.strip() != "1":
        return Reading(boot_completed=False, round_trip=round_trip)
    if isinstance(battery, BaseException):
        raise _failed(device, battery, timeout)
    if isinstance(df, BaseException):
        raise _failed(device, df, timeout)
    level, temperature, charging = parse_battery(battery.output)
    return Reading(True, level, temperature, charging, parse_df(df.output), round_trip)


def _failed(device: Device, exc: BaseException, timeout: float) -> BaseException:
    if isinstance(exc, TimeoutError):
        return DeviceTimeout(f"{device.serial}: no answer to a probe in {timeout:g}s")
    return exc
