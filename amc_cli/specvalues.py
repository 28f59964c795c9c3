"""A spec file's single values read as their message fields want them: text, numbers,
booleans, and keys by name (KEYCODES); each refusal a ValueError saying what was found."""

from __future__ import annotations

import difflib
import re
from datetime import date
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

# Android KeyEvent codes an operator is likely to want by name.
KEYCODES = {
    "home": 3,
    "back": 4,
    "call": 5,
    "endcall": 6,
    "dpad_up": 19,
    "dpad_down": 20,
    "dpad_left": 21,
    "dpad_right": 22,
    "dpad_center": 23,
    "volume_up": 24,
    "volume_down": 25,
    "power": 26,
    "camera": 27,
    "tab": 61,
    "space": 62,
    "enter": 66,
    "del": 67,
    "backspace": 67,
    "menu": 82,
    "search": 84,
    "media_play_pause": 85,
    "page_up": 92,
    "page_down": 93,
    "escape": 111,
    "forward_del": 112,
    "move_home": 122,
    "move_end": 123,
    "app_switch": 187,
    "sleep": 223,
    "wakeup": 224,
}


def describe(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return repr(value)


def suggest(word: object, choices: list[str]) -> str:
    close = difflib.get_close_matches(str(word), choices, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def scalar(value: Any, f: FieldDescriptor) -> Any:
    t = f.type
    if t == FieldDescriptor.TYPE_STRING:
        return _text(value)
    if t == FieldDescriptor.TYPE_BOOL:
        if isinstance(value, bool):
            return value
        raise ValueError(f"expected true or false, got {describe(value)}")
    if t == FieldDescriptor.TYPE_ENUM:
        return value
    if t in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        if isinstance(value, int | float) and not isinstance(value, bool):
            return value
        raise ValueError(f"expected a number, got {describe(value)}")
    if f.full_name == "amc.v1.Key.keycode" and isinstance(value, str):
        return _keycode(value)
    return _whole_number(value)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, date):  # YAML reads 2024-05-01 as a date
        return value.isoformat()
    if isinstance(value, str | int | float):
        return str(value)
    raise ValueError(f"expected text, got {describe(value)}")


def _whole_number(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d+\s*", value):
        return int(value)
    raise ValueError(f"expected a whole number, got {describe(value)}")


def _keycode(value: str) -> int:
    name = value.strip().lower().removeprefix("keycode_")
    if name in KEYCODES:
        return KEYCODES[name]
    if name.isdigit():
        return int(name)
    raise ValueError(
        f"unknown key {value!r}; {suggest(name, list(KEYCODES))}use a keycode number or a name"
        " such as enter, back, home, tab, del (list in docs/cli.md)"
    )
