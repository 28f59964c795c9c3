"""Durations as people write them, one grammar for every program: `15s`, `1m30s`, `1h`,
`250ms`, `2d`, or a bare number of seconds (`1.5`).

The control plane's and the host agent's flags, the MCP server's --idle-timeout, `amc`'s
flags and its spec files all read a time through this module, so a value one program takes
every other takes too, and a value one refuses every other refuses in the same words. The
grammar: one or more parts, each a number (`1`, `1.5`, `.5`) and a unit (`d`, `h`, `m`,
`s`, `ms`, `us`/`µs`, `ns`; any case; a space may stand between them), or a bare number
(an exponent allowed: `1e3`), which is seconds. `nan`, `inf` and anything else are not
durations; a leading `-` makes a negative one, which no flag takes.

What a flag accepts beyond the grammar is its own: `above_zero` (a lease TTL, an
interval), `zero_or_more` (a grace period, where 0 means none), `span_or_off` (retention:
`off` or 0 turns it off, and a bare number is refused there, since `30` meant as days
would delete a month of history if read as seconds). Each raises argparse's
ArgumentTypeError with one line, which the parser prefixes with the flag's name.
"""

from __future__ import annotations

import argparse
import re
from datetime import timedelta
from decimal import Decimal

from google.protobuf import duration_pb2

# What a refusal shows as examples, and what --help says a DURATION is.
EXAMPLES = "e.g. 15s, 1m30s, 1h"
GRAMMAR = "A DURATION is 15s, 1m30s, 1h, 250ms, 2d, or a number of seconds (1.5)."

_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(ms|us|µs|ns|d|h|m|s)", re.IGNORECASE)
_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?", re.IGNORECASE)
_NANOS = {
    "d": 86400 * 10**9,
    "h": 3600 * 10**9,
    "m": 60 * 10**9,
    "s": 10**9,
    "ms": 10**6,
    "us": 10**3,
    "µs": 10**3,
    "ns": 1,
}
# The longest duration: google.protobuf.Duration's (10,000 years), far below timedelta's.
MAX_SECONDS = 315_576_000_000


class DurationError(ValueError):
    """A value that is not a duration, or not one its use takes; the message is one line
    quoting the value."""


def not_a_duration(text: str, examples: str = EXAMPLES) -> DurationError:
    return DurationError(f"{text!r} is not a duration ({examples})")


def nanoseconds(text: str, examples: str = EXAMPLES) -> Decimal:
    """The grammar: `text` in nanoseconds, negative for a leading `-`. Raises
    DurationError: not a duration (showing `examples`), or longer than MAX_SECONDS."""
    body = text.strip()
    sign = -1 if body.startswith("-") else 1
    if body.startswith(("-", "+")):
        body = body[1:].lstrip()
    if _NUMBER.fullmatch(body):
        try:
            nanos = Decimal(body) * 10**9
        except ArithmeticError:  # an exponent past what Decimal holds
            raise DurationError(f"{text.strip()!r} is too long for a duration") from None
    else:
        nanos, pos = Decimal(0), 0
        for part in _PART.finditer(body):
            if part.start() != pos:
                break
            nanos += Decimal(part[1]) * _NANOS[part[2].lower()]
            pos = part.end()
        if not body or pos != len(body):
            raise not_a_duration(text, examples)
    if nanos > MAX_SECONDS * 10**9:
        raise DurationError(f"{text.strip()!r} is too long for a duration")
    return sign * nanos


def seconds(text: str) -> float:
    """The grammar, in seconds (negative for a leading `-`); raises DurationError."""
    return float(nanoseconds(text) / 10**9)


def negative(text: str) -> DurationError:
    return DurationError(f"{text.strip()!r} is negative; a duration must be 0 or more")


def parse_duration(value: object) -> duration_pb2.Duration:
    """A duration of a spec file or a flag of `amc`: the grammar's text, or a number of
    seconds (a YAML or JSON number), 0 or more; raises DurationError."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise DurationError(f"expected a duration ({EXAMPLES})")
    text = value if isinstance(value, str) else str(value)
    nanos = nanoseconds(text)
    if nanos < 0:
        raise negative(text)
    d = duration_pb2.Duration()
    try:
        d.FromNanoseconds(int(nanos))
    except (ValueError, OverflowError):
        raise DurationError(f"{text.strip()!r} is too long for a duration") from None
    return d


# -- flag types: argparse's `type=`, or called with the flag's value ------------------------


def above_zero(text: str) -> float:
    """A time above 0, in seconds: `0`, negative, `nan` and `inf` are refused."""
    value = zero_or_more(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text.strip()!r} must be above 0 ({EXAMPLES})")
    return value


def within(text: str, low: float, high: float) -> float:
    """A time from `low` to `high` seconds, as seconds; ArgumentTypeError of one line, in
    the grammar's words, for anything else (the caller names the flag)."""
    span = above_zero(text)
    if not low <= span <= high:
        raise argparse.ArgumentTypeError(
            f"{text.strip()!r} is out of range ({span_text(low)} to {span_text(high)})"
        )
    return span


def span_text(seconds: float) -> str:
    """A whole number of days, hours or minutes as such (`7d`, `1h`), else seconds."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def zero_or_more(text: str) -> float:
    """A time in seconds, 0 or more (0: none, or off, as the flag says)."""
    try:
        value = seconds(text)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value < 0:
        raise argparse.ArgumentTypeError(str(negative(text)))
    return value


def span_or_off(text: str) -> timedelta | None:
    """A span with its unit (`30d`, `12h`, `1m30s`), or `off` (also `0`, or any zero): None.
    A bare number other than 0 is refused: seconds or days? A guess could delete history."""
    examples = "e.g. 30d, 12h, 1m30s, or off"
    body = text.strip()
    if body.lower() == "off":
        return None
    try:
        nanos = nanoseconds(body, examples)
    except DurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if nanos < 0:
        raise argparse.ArgumentTypeError(str(negative(text)))
    if nanos == 0:
        return None
    if _NUMBER.fullmatch(body):
        raise argparse.ArgumentTypeError(
            f"{body!r} has no unit, and a bare number is not read as seconds here ({examples})"
        )
    return timedelta(microseconds=int(nanos / 1000))
