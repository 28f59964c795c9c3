"""Durations as people write them (`2s`, `500ms`, `1m30s`, `1.5`): a spec file's
durations and the flags that take one (--deadline, --retry-for, ...)."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from google.protobuf import duration_pb2

_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|ns|h|m|s)")


_NANOS = {
    "h": 3600 * 10**9,
    "m": 60 * 10**9,
    "s": 10**9,
    "ms": 10**6,
    "us": 10**3,
    "µs": 10**3,
    "ns": 1,
}


def parse_duration(value: object) -> duration_pb2.Duration:
    """`2s`, `500ms`, `1m30s`, `1.5` or a number of seconds; raises ValueError."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 2s, 500ms or 1m30s")
    if isinstance(value, int | float):
        text = str(value)
        nanos = Decimal(text) * 10**9
    elif isinstance(value, str):
        text = value.strip()
        negative = text.startswith("-") and text[1:2].isdigit()
        nanos = -_duration_nanos(text[1:]) if negative else _duration_nanos(text)
    else:
        raise ValueError("expected a duration such as 2s, 500ms or 1m30s")
    if not nanos.is_finite():
        raise ValueError("expected a finite duration")
    if nanos < 0:
        # One message whether the unit was written (-5s) or not (-5).
        raise ValueError(f"{text!r} is negative; a duration must be 0 or more")
    d = duration_pb2.Duration()
    try:
        d.FromNanoseconds(int(nanos))
    except (ValueError, OverflowError):
        raise ValueError("too long for a duration") from None
    return d


def _duration_nanos(text: str) -> Decimal:
    try:
        return Decimal(text) * 10**9
    except InvalidOperation:
        pass
    total, pos = Decimal(0), 0
    for match in _DURATION_PART.finditer(text):
        if match.start() != pos:
            break
        total += Decimal(match[1]) * _NANOS[match[2]]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(f"{text!r} is not a duration (try 2s, 500ms, 1m30s or 1.5)")
    return total
