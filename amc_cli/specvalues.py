"""A spec file's single values read as their message fields want them: text, numbers,
booleans, and keys by name (amc_common.keycodes); each refusal a ValueError saying what was
found."""

from __future__ import annotations

import difflib
import re
from datetime import date
from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from amc_common.keycodes import keycode


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
        return keycode(value)
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
