"""What a host-agent flag's value may be: the parsers argparse calls on each (a ValueError
becomes "invalid … value", naming the parser), and the names --help shows for them."""

from __future__ import annotations

import json
import re
from typing import Any

from amc_common import durations
from host_agent.emulator_config import Budget


def duration(text: str) -> float:
    """Seconds, 0 or more, in the grammar every program shares; whether 0 is allowed is
    the flag's (_check_positive)."""
    return durations.zero_or_more(text)


def address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(text)
    return host.strip("[]"), int(port)


address.__name__ = "host:port"  # argparse names the parser in its error message


def address_text(text: str) -> str:
    address(text)
    return text


address_text.__name__ = "host:port"


def label(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(text)
    return key.strip(), value.strip()


label.__name__ = "KEY=VALUE"


def labels_list(text: str) -> dict[str, str]:
    return dict(label(item) for item in text.split(",") if item.strip())


labels_list.__name__ = "comma-separated key=value list"


def count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


def percent(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 100:
        raise ValueError(text)
    return value


percent.__name__ = "percentage (0 to 100)"


def celsius(text: str) -> float:
    value = float(text)
    if not -50 <= value <= 150:
        raise ValueError(text)
    return value


celsius.__name__ = "temperature in °C (-50 to 150)"

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(MB|GB)\s*$", re.IGNORECASE)


def size(text: str) -> int:
    """Bytes, from a size in MB or GB (powers of 1024): 500MB, 1.5GB; 0 needs no unit."""
    if text.strip() == "0":
        return 0
    match = _SIZE.match(text)
    if match is None:
        raise ValueError(text)
    return int(float(match[1]) * (1 << (30 if match[2].upper() == "GB" else 20)))


size.__name__ = "size (e.g. 500MB, 2GB)"


def log_format(text: str) -> str:
    if text not in ("auto", "console", "json"):
        raise ValueError(text)
    return text


log_format.__name__ = "log format (auto, console, json)"


def log_level(text: str) -> str:
    if text.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ValueError(text)
    return text.upper()


log_level.__name__ = "log level"


def budget(text: str) -> Budget:
    """What one emulator takes of the host: CPUS,MEMORY (`2,2GB`, `0.5,512MB`)."""
    cpus, sep, memory = text.partition(",")
    if not sep or float(cpus) <= 0:
        raise ValueError(text)
    return Budget(float(cpus), size(memory))


budget.__name__ = "emulator budget (CPUS,MEMORY: e.g. 2,2GB)"


def port_range(text: str) -> tuple[int, int]:
    """FIRST-LAST console ports (even, 1024 to 65534)."""
    first, sep, last = text.partition("-")
    low, high = int(first), int(last)
    if not sep or not 1024 <= low <= high <= 65534:
        raise ValueError(text)
    return low, high


port_range.__name__ = "port range (FIRST-LAST, e.g. 5554-5682)"


def capabilities(text: str) -> dict[str, Any]:
    """A JSON object of WebDriver capabilities (--appium-caps)."""
    caps = json.loads(text)
    if not isinstance(caps, dict):
        raise ValueError("a JSON object of capabilities")
    return caps
