"""Android keys by name: the names a spec file's `key:` and the MCP server's `press_key`
take (`home`, `back`, `enter`, …), and how a name or a number is read as a keycode."""

from __future__ import annotations

import difflib

# Android KeyEvent codes a person (or an agent) is likely to want by name.
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


def keycode(value: str) -> int:
    """The keycode a name (any case, `KEYCODE_` prefix optional) or a number names; raises
    ValueError naming the nearest name for anything else."""
    name = value.strip().lower().removeprefix("keycode_")
    if name in KEYCODES:
        return KEYCODES[name]
    if name.isdigit():
        return int(name)
    close = difflib.get_close_matches(name, list(KEYCODES), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(
        f"unknown key {value!r}; {hint}use a keycode number or a name"
        " such as enter, back, home, tab, del (list in docs/cli.md)"
    )
