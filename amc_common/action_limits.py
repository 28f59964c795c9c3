"""What a field of an action may hold, and how it is read from a message: the limits
(`Whole`, `Text`, `Seconds`, `Selector`, `Switch`, `Digest`, `DevicePath`), the field types
that carry them (`Coord` is a whole number from 0 to MAX_COORD), `UiSelector`, and
`ActionError`, which a value past its limit raises. amc_common.action_table builds the
action table from these.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar

MAX_COORD = 100_000
MAX_KEYCODE = 10_000
MAX_SECONDS = 24 * 3600
# A selector's value, and other short text.
MAX_STRING = 4096
# Typed text and shell commands.
MAX_TEXT = 16 * 1024
MAX_PACKAGE = 255
# A path on the phone (push_file, pull_file).
MAX_DEVICE_PATH = 1024
# Where on the phone push_file and pull_file may reach: the shared storage and adb's own
# scratch folder, which the shell user reads and writes on every phone; never the system.
DEVICE_PATH_ROOTS = ("/sdcard/", "/storage/emulated/0/", "/data/local/tmp/")

SELECTOR_FIELDS = ("text", "resource_id", "content_desc")
# Whole-string pattern (fullmatch only: `$` also matches before a final "\n").
_PACKAGE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+")
_DIGEST = re.compile(r"[0-9a-f]{64}")
# An app of the library: its id (a sha256) or a package name.
_APP = re.compile(rf"{_DIGEST.pattern}|{_PACKAGE.pattern}")


class ActionError(ValueError):
    """An action its definition refuses: `field` is where, as a path inside `amc.v1.Action`
    ("wait_for.timeout"; empty for the action as a whole), `problem` what is wrong."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}" if field else problem)
        self.field = field
        self.problem = problem

    def inside(self, outer: str) -> ActionError:
        """The same problem, seen from the message that holds `outer`."""
        return ActionError(f"{outer}.{self.field}" if self.field else outer, self.problem)


class _Unset:
    """A message field that is not set (a Duration or a selector left out)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = _Unset()


# -- limits: what a field's type allows, and how it is read from a message ----------------


class Limit:
    """A field's limit. `proto` names the field's type in task.proto; `read` takes the value
    from a message (UNSET for a message field left out) and `check` refuses a value past the
    limit; both raise ValueError with the problem."""

    proto: ClassVar[str]
    missing: ClassVar[str] = "required"

    def read(self, message: Any, name: str) -> object:
        return getattr(message, name)

    def check(self, value: object) -> None:
        raise NotImplementedError


@dataclass(frozen=True)
class Whole(Limit):
    """An int32 from `low` to `high`; `what` names what the number is, if it is more than a
    number ("an Android keycode"). An int32 has no presence on the wire: left out of a
    message, it reads as 0."""

    proto: ClassVar[str] = "int32"
    low: int
    high: int
    what: str = ""

    def check(self, value: object) -> None:
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and self.low <= value <= self.high
        ):
            return
        if self.what:
            raise ValueError(f"must be {self.what} ({self.low} to {self.high})")
        raise ValueError(f"must be between {self.low} and {self.high}")


@dataclass(frozen=True)
class Text(Limit):
    """A string of at most `limit` characters, no NUL; `required`: not empty; `pattern`: the
    whole of it matches, and `pattern_means` says what that means to a person."""

    proto: ClassVar[str] = "string"
    limit: int
    required: bool = False
    pattern: re.Pattern[str] | None = None
    pattern_means: str = ""

    def check(self, value: object) -> None:
        if not isinstance(value, str):
            raise ValueError("must be text")
        if not value:
            if self.required:
                raise ValueError("required")
            return
        if len(value) > self.limit:
            raise ValueError(f"longer than {self.limit} characters")
        if "\x00" in value:
            raise ValueError("contains a NUL character")
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise ValueError(f"must be {self.pattern_means}")


@dataclass(frozen=True)
class Seconds(Limit):
    """A google.protobuf.Duration, as seconds: from 0 (or just above it, if `positive`) to
    `high`."""

    proto: ClassVar[str] = "google.protobuf.Duration"
    high: float = MAX_SECONDS
    positive: bool = False

    def read(self, message: Any, name: str) -> object:
        if not message.HasField(name):
            return UNSET
        d = getattr(message, name)
        seconds, nanos = int(d.seconds), int(d.nanos)
        if seconds < 0 or nanos < 0 or nanos >= 1_000_000_000:
            raise ValueError("must be a non-negative duration")
        return seconds + nanos / 1e9

    def check(self, value: object) -> None:
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ValueError("must be a duration")
        if not value >= 0 or math.isinf(value):
            raise ValueError("must be a non-negative duration")
        if self.positive and value == 0:
            raise ValueError("must be longer than 0 s (leave it out for the default)")
        if value > self.high:
            raise ValueError(f"longer than {self.high:g} s")


@dataclass(frozen=True)
class Selector(Limit):
    """An amc.v1.UiSelector: exactly one of its fields, not empty."""

    proto: ClassVar[str] = "amc.v1.UiSelector"
    missing: ClassVar[str] = "required: set one of text, resource_id, content_desc"

    def read(self, message: Any, name: str) -> object:
        if not message.HasField(name):
            return UNSET
        selector = getattr(message, name)
        by = selector.WhichOneof("by")
        if by is None:
            raise ValueError("set one of text, resource_id, content_desc")
        return UiSelector(**{by: getattr(selector, by)})

    def check(self, value: object) -> None:
        if not isinstance(value, UiSelector):
            raise ValueError("must be a UiSelector")


@dataclass(frozen=True)
class Switch(Limit):
    """A bool; left out of a message, it reads as false."""

    proto: ClassVar[str] = "bool"

    def check(self, value: object) -> None:
        if not isinstance(value, bool):
            raise ValueError("must be true or false")


@dataclass(frozen=True)
class Digest(Limit):
    """A sha256 as 64 lowercase hex digits: the id of an app or a file of the library."""

    proto: ClassVar[str] = "string"

    def check(self, value: object) -> None:
        if not isinstance(value, str):
            raise ValueError("must be text")
        if not value:
            raise ValueError("required")
        if not _DIGEST.fullmatch(value):
            raise ValueError("must be a library id: a sha256 as 64 lowercase hex digits")


@dataclass(frozen=True)
class DevicePath(Limit):
    """A path on the phone that push_file and pull_file may reach: absolute, under one of
    DEVICE_PATH_ROOTS, with no `.` or `..` part (so it cannot climb out of them), no empty
    part, and printable (no control characters)."""

    proto: ClassVar[str] = "string"
    limit: int = MAX_DEVICE_PATH

    def check(self, value: object) -> None:
        if not isinstance(value, str):
            raise ValueError("must be text")
        if not value:
            raise ValueError("required")
        if len(value) > self.limit:
            raise ValueError(f"longer than {self.limit} characters")
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise ValueError("contains a control character")
        if not value.startswith(DEVICE_PATH_ROOTS) or value.endswith("/"):
            raise ValueError(f"must be a file under {', '.join(DEVICE_PATH_ROOTS)}")
        if any(part in ("", ".", "..") for part in value[1:].split("/")):
            raise ValueError("must not have an empty, `.` or `..` part")


_SELECTOR_VALUE = Text(MAX_STRING, required=True)


@dataclass(frozen=True)
class UiSelector:
    """Finds one element of the UI hierarchy: exactly one of the fields, matched exactly."""

    text: str | None = None
    resource_id: str | None = None
    content_desc: str | None = None

    def __post_init__(self) -> None:
        chosen = [name for name in SELECTOR_FIELDS if getattr(self, name) is not None]
        if len(chosen) != 1:
            given = f", not {' and '.join(chosen)}" if chosen else ""
            raise ActionError("", f"set one of text, resource_id, content_desc{given}")
        try:
            _SELECTOR_VALUE.check(getattr(self, chosen[0]))
        except ValueError as exc:
            raise ActionError(chosen[0], str(exc)) from None

    @property
    def by(self) -> str:
        return next(name for name in SELECTOR_FIELDS if getattr(self, name) is not None)

    @property
    def value(self) -> str:
        return str(getattr(self, self.by))

    def __str__(self) -> str:
        return f"{self.by}={self.value!r}"


# -- the field types ----------------------------------------------------------------------

Coord = Annotated[int, Whole(0, MAX_COORD)]
Keycode = Annotated[int, Whole(0, MAX_KEYCODE, "an Android keycode")]
Package = Annotated[
    str,
    Text(
        MAX_PACKAGE,
        required=True,
        pattern=_PACKAGE,
        pattern_means="an Android package name, e.g. com.example.app",
    ),
]
Activity = Annotated[str, Text(MAX_PACKAGE)]
AppRef = Annotated[
    str,
    Text(
        MAX_PACKAGE,
        required=True,
        pattern=_APP,
        pattern_means="an app id (64 lowercase hex digits) or a package name, e.g. com.example.app",
    ),
]
FileId = Annotated[str, Digest()]
PhonePath = Annotated[str, DevicePath()]
Flag = Annotated[bool, Switch()]
LongText = Annotated[str, Text(MAX_TEXT, required=True)]
Element = Annotated[UiSelector, Selector()]
Duration = Annotated[float, Seconds()]
# None: the host agent's own default (its --shell-timeout).
ShellTimeout = Annotated[float | None, Seconds(positive=True)]


@dataclass(frozen=True)
class Field:
    """One field of an action, as the table defines it."""

    name: str
    limit: Limit
    # dataclasses.MISSING: the field must be given.
    default: object

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING

    def check(self, value: object) -> None:
        if value is None and self.default is None:
            return
        self.limit.check(value)
