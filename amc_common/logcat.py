"""A phone's log as logcat writes it (`logcat -v threadtime`): a line's parts, the
priorities and the filters on them, the lines that flag a step (an app's `FATAL
EXCEPTION`, an `ANR in`), and the marks the host agent writes where each step begins and
ends; for the host agent (its capture, the simulated phones' logs), the control plane
(StreamLogs' filters) and `amc logs`.

A threadtime line::

    12-04 23:03:01.123  4242  4242 E AndroidRuntime: FATAL EXCEPTION: main

(date, time, pid, tid, priority, tag padded to 8, `: `, message; with `-v usec` the time
has microseconds, as the host agent reads it). A step mark is a line of tag `amc`,
priority I, that the host agent puts into a run's kept log at the time (on the phone's
clock) a step began and ended: `step 2 'tap' began`, `step 2 'tap' ended: ok in 0.31s`.
Its step number counts from 1 (the index the wire carries is 0-based). logcat's own
dividers (`--------- beginning of main`) and the agent's notes (`--------- amc: …`) are
lines that are no log entry.
"""

from __future__ import annotations

import calendar
import functools
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

# Priorities from the lowest: verbose, debug, info, warn, error, fatal (logcat writes an
# assert as F, and some builds A).
LEVELS = "VDIWEF"
LEVEL_NAMES = {
    "verbose": "V",
    "debug": "D",
    "info": "I",
    "warn": "W",
    "warning": "W",
    "error": "E",
    "fatal": "F",
    "assert": "F",
}
MARK_TAG = "amc"
DIVIDER = "--------- "
# Tags a filter may name at most, and the longest tag.
MAX_TAGS = 20
MAX_TAG = 128
# A flagged line is cut to this many characters (with its time and tag).
WARNING_CHARS = 300

_LINE = re.compile(
    r"^(?P<date>\d\d-\d\d) (?P<time>\d\d:\d\d:\d\d\.\d{3}(?:\d{3})?)\s+(?P<pid>\d+)\s+(?P<tid>\d+)"
    r" (?P<level>[VDIWEFAS]) (?P<tag>.*?)\s*: (?P<message>.*)$"
)
_MARK = re.compile(r"^step (?P<number>\d+) '(?P<name>.*)' (?P<edge>began|ended)\b")


@dataclass(frozen=True)
class Entry:
    """A line of the log that is an entry (not a divider)."""

    when: str  # "12-04 23:03:01.123" (with `-v usec`: "….123456"), the phone's clock
    pid: int
    level: str
    tag: str
    message: str

    @property
    def rank(self) -> int:
        return LEVELS.find(self.level) if self.level in LEVELS else LEVELS.find("F")


def parse(line: str) -> Entry | None:
    """The entry a threadtime line is; None for what is none (a divider, a cut line)."""
    found = _LINE.match(line)
    if found is None:
        return None
    return Entry(
        f"{found['date']} {found['time']}",
        int(found["pid"]),
        found["level"],
        found["tag"],
        found["message"],
    )


def level(text: str) -> str:
    """A priority as a filter names it: a letter (V, D, I, W, E, F) or a word (verbose,
    debug, info, warn, error, fatal), any case; "" for none. ValueError naming them."""
    word = text.strip()
    if not word:
        return ""
    if len(word) == 1 and word.upper() in LEVELS:
        return word.upper()
    if word.lower() in LEVEL_NAMES:
        return LEVEL_NAMES[word.lower()]
    raise ValueError(f"{text!r} is not a log priority (V, D, I, W, E, F or verbose … fatal)")


def tags(values: Iterable[str]) -> frozenset[str]:
    """Tags as a filter takes them: at most MAX_TAGS, each 1 to MAX_TAG printable
    characters with no ':' (ValueError saying which is wrong)."""
    found = [t.strip() for t in values]
    if len(found) > MAX_TAGS:
        raise ValueError(f"at most {MAX_TAGS} tags")
    for tag in found:
        if not tag or len(tag) > MAX_TAG or not tag.isprintable() or ":" in tag:
            raise ValueError(f"{tag!r} is not a log tag (1 to {MAX_TAG} characters, no ':')")
    return frozenset(found)


@dataclass(frozen=True)
class Filter:
    """Which lines a reader wants: of `min_level` or higher, of one of `tags` (none: any).
    Step marks and dividers always pass: they say where the lines are."""

    min_level: str = ""
    tags: frozenset[str] = frozenset()

    @property
    def everything(self) -> bool:
        return not self.min_level and not self.tags

    def passes(self, line: str) -> bool:
        if self.everything:
            return True
        entry = parse(line)
        if entry is None or entry.tag == MARK_TAG:
            return True
        if self.min_level and entry.rank < LEVELS.index(self.min_level):
            return False
        return not self.tags or entry.tag in self.tags

    def apply(self, lines: Iterable[str]) -> list[str]:
        return list(lines) if self.everything else [x for x in lines if self.passes(x)]


def warning_of(entry: Entry) -> str | None:
    """What a line flags on its step: an app's crash (`FATAL EXCEPTION`, AndroidRuntime's
    E line) or an `ANR in` (ActivityManager's); None for any other line."""
    message = entry.message.lstrip()
    if entry.tag == MARK_TAG or entry.rank < LEVELS.index("E"):
        return None
    if message.startswith("FATAL EXCEPTION") or message.startswith("ANR in "):
        return f"{entry.when} {entry.tag}: {message}"[:WARNING_CHARS]
    return None


def _shown(name: str) -> str:
    return " ".join(name.split())[:80]


def began(index: int, name: str) -> str:
    """The message of the mark a step's beginning writes (`index` 0-based)."""
    return f"step {index + 1} '{_shown(name)}' began"


def ended(index: int, name: str, status: str, seconds: float) -> str:
    """The message of the mark a step's end writes."""
    return f"step {index + 1} '{_shown(name)}' ended: {status} in {seconds:.2f}s"


def mark_of(entry: Entry) -> tuple[int, bool] | None:
    """A step mark's step (0-based) and whether it is its beginning; None for any other."""
    if entry.tag != MARK_TAG:
        return None
    found = _MARK.match(entry.message)
    if found is None or int(found["number"]) < 1:
        return None
    return int(found["number"]) - 1, found["edge"] == "began"


def divider(text: str) -> str:
    """A note of the agent's among the lines (no log entry)."""
    return f"{DIVIDER}amc: {text}"


def line(
    when: float,
    pid: int,
    tid: int,
    priority: str,
    tag: str,
    message: str,
    *,
    usec: bool = False,
    local: bool = True,
) -> str:
    """A threadtime line for `when` (seconds since the epoch, shown in this machine's local
    time; `local=False`: a phone clock's reading as `seconds` gives it), its time to the
    millisecond (`usec`: to the microsecond, as `logcat -v threadtime -v usec` writes it):
    what a simulated phone writes, and a mark the agent writes itself."""
    whole = int(when // 1)
    stamp = _second(whole, local)
    fraction = f"{int((when - whole) * 1e6):06d}" if usec else f"{int((when - whole) * 1e3):03d}"
    return f"{stamp}.{fraction} {pid:5d} {tid:5d} {priority} {tag:<8}: {message}"


@functools.lru_cache(maxsize=16)
def _second(whole: int, local: bool) -> str:
    """ "MM-DD HH:MM:SS" of a second since the epoch (lines come many to a second)."""
    return time.strftime("%m-%d %H:%M:%S", time.localtime(whole) if local else time.gmtime(whole))


def seconds(when: str, near: float) -> float | None:
    """An entry's time (`Entry.when`: the phone's clock, with no year) as seconds on a
    scale of its own (its fields read as UTC), in the year that puts it nearest `near`
    (on that scale); None for a time that is none."""
    try:
        day, clock = when.split(" ")
        month, mday = (int(x) for x in day.split("-"))
        hms, fraction = clock.split(".")
        hour, minute, second = (int(x) for x in hms.split(":"))
        year = time.gmtime(near).tm_year
        found = [
            calendar.timegm((y, month, mday, hour, minute, second, 0, 0, 0))
            + int(fraction) / 10.0 ** len(fraction)
            for y in (year - 1, year, year + 1)
        ]
    except ValueError:
        return None
    return min(found, key=lambda x: abs(x - near))
