"""Every action a task can ask of a phone, defined once: its fields, their types, defaults
and limits.

One frozen dataclass per member of the `amc.v1.Action` oneof, named after its message
(`Tap` for `amc.v1.Tap`), with the message's fields in the message's order. A field's type
carries its limit (`Coord` is a whole number from 0 to MAX_COORD); a field with a default
may be left out of a spec, and the default written here is the one that runs. The limits
and the field types that carry them are amc_common.action_limits'. Everything
that reads an action reads it through this module:

- the control plane checks each submitted action with `check` (validate.action): the
  checks of `from_message`, without making the action it only passes on;
- the host agent turns each assigned action into one of these classes with `from_message`
  (wire.spec_from_proto) and runs it (executor.py), so what ran is what was checked;
- the CLI fills its shorthands from `FIELDS` (`tap: [540, 1200]` gives x and y in that
  order) and checks each action of a spec file with `from_message` before sending it.

Making one of these classes checks it too: a value past its limit raises ActionError,
whose `field` is the path inside `amc.v1.Action` ("wait_for.timeout").

Plain Python, no generated code: `from_message` reads a protobuf message through its own
methods (WhichOneof, HasField), and a test holds this table to protos/amc/v1/task.proto.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from typing import Any, ClassVar, TypeAlias

from amc_common.action_limits import (
    MAX_COORD,
    MAX_SECONDS,
    MAX_STRING,
    MAX_TEXT,
    UNSET,
    ActionError,
    Activity,
    AppRef,
    Coord,
    Duration,
    Element,
    Field,
    FileId,
    Flag,
    Keycode,
    Limit,
    LongText,
    Package,
    PhonePath,
    Seconds,
    Selector,
    ShellTimeout,
    Text,
    UiSelector,
    Whole,
)

# Importers take an action's limits from here too (action_limits holds them).
__all__ = [
    "ACTIONS",
    "FIELDS",
    "KEEPS",
    "MAX_COORD",
    "MAX_SECONDS",
    "MAX_STRING",
    "MAX_TEXT",
    "Action",
    "ActionError",
    "AssertVisible",
    "BaseAction",
    "Field",
    "InputText",
    "InstallApp",
    "Key",
    "LaunchApp",
    "PullFile",
    "PushFile",
    "Screenshot",
    "Seconds",
    "Selector",
    "Shell",
    "StopApp",
    "Swipe",
    "Tap",
    "TapOn",
    "Text",
    "UiDump",
    "UiSelector",
    "UninstallApp",
    "Wait",
    "WaitFor",
    "Whole",
    "check",
    "from_message",
]


# -- the actions --------------------------------------------------------------------------


@dataclass(frozen=True)
class BaseAction:
    """What every action shares: its `kind` (its name in the oneof) and checks on making."""

    kind: ClassVar[str]

    def __init_subclass__(cls, *, kind: str, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.kind = kind

    def __post_init__(self) -> None:
        for f in FIELDS[self.kind]:
            try:
                f.check(getattr(self, f.name))
            except ValueError as exc:
                raise ActionError(f"{self.kind}.{f.name}", str(exc)) from None


@dataclass(frozen=True)
class Tap(BaseAction, kind="tap"):
    """Taps the screen at (x, y)."""

    x: Coord
    y: Coord


@dataclass(frozen=True)
class TapOn(BaseAction, kind="tap_on"):
    """Taps the centre of the element the selector finds."""

    selector: Element


@dataclass(frozen=True)
class Swipe(BaseAction, kind="swipe"):
    """Drags from (x1, y1) to (x2, y2) in `duration` seconds."""

    x1: Coord
    y1: Coord
    x2: Coord
    y2: Coord
    duration: Duration = 0.3


@dataclass(frozen=True)
class InputText(BaseAction, kind="input_text"):
    """Types the text into the focused field."""

    text: LongText


@dataclass(frozen=True)
class Key(BaseAction, kind="key"):
    """Presses the key (an Android KeyEvent code; 0 does nothing)."""

    keycode: Keycode


@dataclass(frozen=True)
class LaunchApp(BaseAction, kind="launch_app"):
    """Starts the package at `activity`, or at its default activity when that is empty."""

    package: Package
    activity: Activity = ""


@dataclass(frozen=True)
class StopApp(BaseAction, kind="stop_app"):
    """Force-stops the package."""

    package: Package


@dataclass(frozen=True)
class Shell(BaseAction, kind="shell"):
    """Runs the command in `adb shell`; it fails on a non-zero exit or after `timeout`."""

    command: LongText
    timeout: ShellTimeout = None


@dataclass(frozen=True)
class Screenshot(BaseAction, kind="screenshot"):
    """Takes a screenshot and keeps the PNG: an artifact of the task (its size and sha256
    are in the step's data too)."""


@dataclass(frozen=True)
class Wait(BaseAction, kind="wait"):
    """Waits `duration` seconds."""

    duration: Duration


@dataclass(frozen=True)
class WaitFor(BaseAction, kind="wait_for"):
    """Looks at the screen until the element is there, for at most `timeout` seconds (0: look
    once)."""

    selector: Element
    timeout: Duration = 10.0


@dataclass(frozen=True)
class AssertVisible(BaseAction, kind="assert_visible"):
    """Fails unless the element is on the screen now."""

    selector: Element


@dataclass(frozen=True)
class UiDump(BaseAction, kind="ui_dump"):
    """Takes a `uiautomator dump` of the screen and keeps the XML: an artifact of the task."""


@dataclass(frozen=True)
class InstallApp(BaseAction, kind="install_app"):
    """Installs an app of the library: by its id (the sha256 of its APK) or its package
    (the library's newest upload of it); `replace` an installed copy (keeping its data),
    `grant_permissions` every runtime permission it asks for."""

    app: AppRef
    replace: Flag = False
    grant_permissions: Flag = False


@dataclass(frozen=True)
class UninstallApp(BaseAction, kind="uninstall_app"):
    """Removes the package from the phone."""

    package: Package


@dataclass(frozen=True)
class PushFile(BaseAction, kind="push_file"):
    """Copies a library file (by its id, its sha256) to `path` on the phone."""

    file: FileId
    path: PhonePath


@dataclass(frozen=True)
class PullFile(BaseAction, kind="pull_file"):
    """Copies the file at `path` on the phone and keeps it: an artifact of the task."""

    path: PhonePath


Action: TypeAlias = (
    Tap
    | TapOn
    | Swipe
    | InputText
    | Key
    | LaunchApp
    | StopApp
    | Shell
    | Screenshot
    | Wait
    | WaitFor
    | AssertVisible
    | UiDump
    | InstallApp
    | UninstallApp
    | PushFile
    | PullFile
)

# The kinds of files a task keeps (artifacts) -> their content type: what an action saw (a
# screenshot, a UI dump), a file pulled from the phone, the task's screen recording
# (TaskSpec.record_screen: an MP4 of the phone's H.264 stream where it has one, else an
# animated PNG), or the attempt's phone log (logcat's text, gzipped).
KEEPS: dict[str, str] = {
    "screenshot": "image/png",
    "ui_dump": "application/xml",
    "screen_recording": "image/apng",
    "pulled_file": "application/octet-stream",
    "screen_video": "video/mp4",
    "logcat": "application/gzip",
}

# kind -> class, in the oneof's order.
ACTIONS: dict[str, type[Action]] = {cls.kind: cls for cls in typing.get_args(Action)}


def _fields(cls: type[BaseAction]) -> tuple[Field, ...]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(Field(f.name, _limit(hints[f.name]), f.default) for f in dataclasses.fields(cls))


def _limit(hint: object) -> Limit:
    limits = [m for m in getattr(hint, "__metadata__", ()) if isinstance(m, Limit)]
    if len(limits) != 1:
        raise TypeError(f"an action field's type needs one limit (Annotated[..., Limit]): {hint}")
    return limits[0]


# The table itself: kind -> its fields, in order, each with its limit and default.
FIELDS: dict[str, tuple[Field, ...]] = {kind: _fields(cls) for kind, cls in ACTIONS.items()}
FIELD: dict[tuple[str, str], Field] = {(k, f.name): f for k, fs in FIELDS.items() for f in fs}


def from_message(message: Any) -> Action:
    """The action an `amc.v1.Action` message asks for, checked against its definition, with
    the defaults of the fields it leaves out. Raises ActionError."""
    cls = _class(message)
    return cls(**_values(cls, getattr(message, cls.kind)))  # type: ignore[arg-type]


def check(message: Any) -> None:
    """The checks of `from_message` without making the action (in a third of its time):
    for the control plane, which only passes an action on. Raises ActionError."""
    cls = _class(message)
    for name, value in _values(cls, getattr(message, cls.kind)).items():
        try:
            FIELD[cls.kind, name].check(value)
        except ValueError as exc:
            raise ActionError(f"{cls.kind}.{name}", str(exc)) from None


def _class(message: Any) -> type[Action]:
    kind = message.WhichOneof("kind")
    if kind is None:
        raise ActionError("", f"empty action: set one of {', '.join(ACTIONS)}")
    cls = ACTIONS.get(kind)
    if cls is None:
        raise ActionError(kind, "not an action this version knows")
    return cls


def _values(cls: type[Action], body: Any) -> dict[str, object]:
    """The fields `body` sets, read by their limits (required ones checked as given)."""
    values: dict[str, object] = {}
    for f in FIELDS[cls.kind]:
        where = f"{cls.kind}.{f.name}"
        try:
            value = f.limit.read(body, f.name)
        except ActionError as exc:
            raise exc.inside(where) from None
        except ValueError as exc:
            raise ActionError(where, str(exc)) from None
        if value is UNSET:
            if f.required:
                raise ActionError(where, f.limit.missing)
            continue
        values[f.name] = value
    return values
