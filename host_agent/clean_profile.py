"""Cleaning profiles: what the host agent restores on a phone between leases, by pool.

A profile file (`--clean-profile`, YAML) has `defaults` and `pools`; a pool names the
labels its phones have (`match`: the labels a task's selector matches, and `serial`) and
overrides the defaults for them, field by field (`settings` key by key). A phone takes the
first pool that matches it, or the defaults. Without a file every phone has the defaults
below. `load` reads and checks a file at start-up: anything wrong is one line naming the
field (`pools[1].reboot_every: must be a whole number, 0 or more`).

    defaults:
      timeout: 3m                 # a clean running longer fails: the phone is quarantined
      uninstall: true             # packages not in the baseline are uninstalled
      baseline_packages: [...]    # the baseline's third-party packages (else recorded
                                  # when the phone is first seen)
      keep_packages: [...]        # never uninstalled
      clear_packages: [...]       # `pm clear`ed after every lease
      remove_files: true          # what was not there at the baseline, under file_roots
      file_roots: [/sdcard/, /data/local/tmp/]
      clear_dirs: [...]           # emptied after every lease
      settings: {locale: en-US, font_scale: 1.0, screen_timeout: 10m,
                 airplane_mode: false, animations: false, global/auto_time: 1}
      commands: [...]             # shell commands run last, each must succeed
      reboot_every: 0             # reboot after every N-th lease (0: never)
    pools:
      - match: {model: Pixel 7}
        reboot_every: 20
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from amc_common import durations

DEFAULT_ROOTS = ("/sdcard/", "/data/local/tmp/")
# The named settings and the namespace/key form (`global/auto_time`).
NAMED_SETTINGS = ("locale", "font_scale", "screen_timeout", "airplane_mode", "animations")
_RAW_SETTING = re.compile(r"^(system|secure|global)/[A-Za-z0-9_.]+$")
_PACKAGE = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$")
_LOCALE = re.compile(r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8})*$")
_SETTING_VALUE = re.compile(r"^[A-Za-z0-9_.,:+-]*$")


class ProfileError(ValueError):
    """A cleaning profile that cannot be used; the message is one line naming the field."""


@dataclass(frozen=True)
class CleanProfile:
    """How the phones of one pool are cleaned between leases."""

    enabled: bool = True
    timeout: float = 180.0
    uninstall: bool = True
    # None: the baseline's packages are those the phone had when first seen.
    baseline_packages: tuple[str, ...] | None = None
    keep_packages: tuple[str, ...] = ()
    clear_packages: tuple[str, ...] = ()
    remove_files: bool = True
    file_roots: tuple[str, ...] = DEFAULT_ROOTS
    clear_dirs: tuple[str, ...] = ()
    # name -> value, as written (checked): the named settings and namespace/key ones.
    settings: Mapping[str, str] = field(default_factory=dict)
    commands: tuple[str, ...] = ()
    reboot_every: int = 0


@dataclass(frozen=True)
class Pool:
    """Phones whose labels include `match` (a `serial` key matches the serial)."""

    match: Mapping[str, str]
    profile: CleanProfile

    def takes(self, serial: str, labels: Mapping[str, str]) -> bool:
        have = {**labels, "serial": serial}
        return all(have.get(k) == v for k, v in self.match.items())


@dataclass(frozen=True)
class Profiles:
    """The defaults and the pools of a profile file, in its order."""

    defaults: CleanProfile = field(default_factory=CleanProfile)
    pools: tuple[Pool, ...] = ()
    # Where they were read from (None: built in).
    path: Path | None = None

    def for_device(self, serial: str, labels: Mapping[str, str]) -> CleanProfile:
        """The first pool's profile that takes the phone, else the defaults."""
        for pool in self.pools:
            if pool.takes(serial, labels):
                return pool.profile
        return self.defaults


def load(path: Path) -> Profiles:
    """The profile file at `path`, checked; ProfileError (one line) if it cannot be used."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ProfileError(f"not YAML{where}: {getattr(exc, 'problem', exc)}") from None
    return parse(data if data is not None else {}, path)


def parse(data: object, path: Path | None = None) -> Profiles:
    """A profile from its YAML's data (a mapping of `defaults` and `pools`)."""
    top = _mapping(data, "the profile", ("defaults", "pools"))
    defaults = _profile(top.get("defaults", {}), CleanProfile(), "defaults")
    pools = top.get("pools", [])
    if not isinstance(pools, list):
        raise ProfileError("pools: must be a list")
    made = []
    for i, item in enumerate(pools):
        where = f"pools[{i}]"
        entry = _mapping(item, where, ("match", *_FIELDS))
        if "match" not in entry:
            raise ProfileError(f"{where}.match: required (the labels of the pool's phones)")
        match = _mapping(entry["match"], f"{where}.match", None)
        if not match:
            raise ProfileError(f"{where}.match: names no label")
        labels = {str(k): _scalar(v, f"{where}.match.{k}") for k, v in match.items()}
        rest = {k: v for k, v in entry.items() if k != "match"}
        made.append(Pool(labels, _profile(rest, defaults, where)))
    return Profiles(defaults, tuple(made), path)


_FIELDS = tuple(f.name for f in dataclasses.fields(CleanProfile))


def _profile(data: object, base: CleanProfile, where: str) -> CleanProfile:
    entry = _mapping(data, where, _FIELDS)
    given: dict[str, Any] = {}
    for name, value in entry.items():
        at = f"{where}.{name}"
        if name in ("enabled", "uninstall", "remove_files"):
            given[name] = _flag(value, at)
        elif name == "timeout":
            given[name] = _duration(value, at, positive=True)
        elif name == "reboot_every":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ProfileError(f"{at}: must be a whole number, 0 or more")
            given[name] = value
        elif name in ("baseline_packages", "keep_packages", "clear_packages"):
            given[name] = tuple(_package(p, f"{at}[{i}]") for i, p in enumerate(_list(value, at)))
        elif name in ("file_roots", "clear_dirs"):
            given[name] = tuple(_directory(p, f"{at}[{i}]") for i, p in enumerate(_list(value, at)))
        elif name == "commands":
            given[name] = tuple(_command(c, f"{at}[{i}]") for i, c in enumerate(_list(value, at)))
        else:  # settings, merged over the base's key by key
            given[name] = {**base.settings, **_settings(value, at)}
    return dataclasses.replace(base, **given)


def _mapping(data: object, where: str, known: tuple[str, ...] | None) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: must be a mapping")
    for key in data:
        if known is not None and key not in known:
            raise ProfileError(f"{where}: unknown field {key!r} (known: {', '.join(known)})")
    return {str(k): v for k, v in data.items()}


def _list(value: object, at: str) -> list[Any]:
    if not isinstance(value, list):
        raise ProfileError(f"{at}: must be a list")
    return value


def _scalar(value: object, at: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if not isinstance(value, str | int | float):
        raise ProfileError(f"{at}: must be a string or a number")
    return str(value)


def _flag(value: object, at: str) -> bool:
    if not isinstance(value, bool):
        raise ProfileError(f"{at}: must be true or false")
    return value


def _duration(value: object, at: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ProfileError(f"{at}: must be a duration ({durations.EXAMPLES})")
    try:
        seconds = durations.seconds(str(value))
    except durations.DurationError as exc:
        raise ProfileError(f"{at}: {exc}") from None
    if seconds < 0 or (positive and seconds == 0):
        raise ProfileError(f"{at}: must be {'above 0' if positive else '0 or more'}")
    return seconds


def _package(value: object, at: str) -> str:
    if not isinstance(value, str) or not _PACKAGE.match(value):
        raise ProfileError(f"{at}: {value!r} is not a package name (e.g. com.example.app)")
    return value


def _directory(value: object, at: str) -> str:
    if not isinstance(value, str) or not value.startswith("/") or value.rstrip("/") == "":
        raise ProfileError(f"{at}: {value!r} is not an absolute directory (e.g. /sdcard/)")
    if "\n" in value or "/../" in value + "/" or "'" in value:
        raise ProfileError(f"{at}: {value!r} may not hold a line break, a quote or '..'")
    return value.rstrip("/") + "/"


def _command(value: object, at: str) -> str:
    if not isinstance(value, str) or not value.strip() or "\n" in value:
        raise ProfileError(f"{at}: must be a shell command on one line")
    return value


def _settings(value: object, at: str) -> dict[str, str]:
    entries = _mapping(value, at, None)
    made = {}
    for key, raw in entries.items():
        where = f"{at}.{key}"
        if key == "locale":
            text = _scalar(raw, where)
            if not _LOCALE.match(text):
                raise ProfileError(f"{where}: {text!r} is not a language tag (e.g. en-US)")
        elif key == "font_scale":
            text = _number(raw, where, 0.5, 3.0)
        elif key == "screen_timeout":
            text = str(round(_duration(raw, where, positive=True) * 1000))
        elif key in ("airplane_mode", "animations"):
            if key == "animations" and not isinstance(raw, bool):
                text = _number(raw, where, 0.0, 10.0)
            else:
                text = "1" if _flag(raw, where) else "0"
        elif _RAW_SETTING.match(key):
            text = _scalar(raw, where)
            if not _SETTING_VALUE.match(text):
                raise ProfileError(f"{where}: {text!r}: letters, digits and _.,:+- only")
        else:
            raise ProfileError(
                f"{where}: unknown setting (known: {', '.join(NAMED_SETTINGS)}, "
                "or system/KEY, secure/KEY, global/KEY)"
            )
        made[key] = text
    return made


def _number(value: object, at: str, low: float, high: float) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ProfileError(f"{at}: must be a number from {low:g} to {high:g}")
    return f"{value:g}"
