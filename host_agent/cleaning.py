"""A phone over adb cleaned between leases with shell commands: its steps, as its cleaning
profile (host_agent.clean_profile) asks, against its baseline (host_agent.baselines).

    baseline   (its first clean only) what it has now is its baseline, if it has none:
               `pm list packages -3` and `find ROOTS -mindepth 1`
    uninstall  every third-party package not in the baseline (nor kept): `pm uninstall`
    clear      `pm clear` of the listed packages that are installed
    files      under the file roots, what was not there at the baseline, and everything in
               the listed directories: `rm -rf` (a file of the baseline that was changed
               stays as it is: contents are not compared)
    settings   `settings put` (locale, font scale, screen timeout, animations, any
               namespace/key) and `cmd connectivity airplane-mode`, in one shell call
    commands   the profile's own shell commands, each must exit 0
    reboot     every N-th lease: reboot, and wait for sys.boot_completed

A step returns what it did (one line) or raises CleanFailed (or a DeviceError) saying why
it failed. `ShellCleaner` is what both `AdbSource` and `SimulatedSource` give as their
`Cleaner` (host_agent.devices): a device kind with a better way (an emulator's snapshot)
gives its own steps instead.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Awaitable, Callable, Mapping

from host_agent.baselines import Baseline, Baselines
from host_agent.clean_profile import CleanProfile
from host_agent.devices import CleanFailed, CleanStepRun, Device, DeviceError

# `rm -rf` arguments are sent in commands of at most this many characters.
MAX_COMMAND = 8000
# How often a rebooting phone is asked whether it has booted.
BOOT_POLL = 1.0
ANIMATION_SCALES = (
    "window_animation_scale",
    "transition_animation_scale",
    "animator_duration_scale",
)


def package_names(listing: str) -> set[str]:
    """The packages `pm list packages` printed (`package:NAME` lines)."""
    return {
        line.strip().removeprefix("package:")
        for line in listing.splitlines()
        if line.strip().startswith("package:")
    }


def listed_paths(listing: str) -> set[str]:
    """The paths `find` printed, normalised (no doubled or trailing slashes)."""
    found = set()
    for line in listing.splitlines():
        path = line.strip()
        while "//" in path:
            path = path.replace("//", "/")
        if path.startswith("/"):
            found.add(path.rstrip("/"))
    return found


def to_remove(
    found: set[str], baseline: frozenset[str], roots: tuple[str, ...], emptied: tuple[str, ...]
) -> list[str]:
    """The top-most paths of `found` that were not there at the baseline (under `roots`),
    and every entry of the `emptied` directories: removing them (recursively) removes all
    the rest."""
    tops = {r.rstrip("/") for r in roots}
    cleared = {d.rstrip("/") for d in emptied}
    doomed = []
    for path in sorted(found):
        parent = path.rsplit("/", 1)[0]
        if parent in cleared or (path not in baseline and (parent in baseline or parent in tops)):
            doomed.append(path)
    return doomed


def settings_commands(settings: Mapping[str, str]) -> list[str]:
    """The shell commands that put the profile's settings (values as clean_profile checked
    them: a screen timeout in ms, airplane mode and animations as numbers)."""
    made = []
    for key, value in settings.items():
        if key == "locale":
            made.append(f"settings put system system_locales {value}")
        elif key == "font_scale":
            made.append(f"settings put system font_scale {value}")
        elif key == "screen_timeout":
            made.append(f"settings put system screen_off_timeout {value}")
        elif key == "airplane_mode":
            state = "enable" if value == "1" else "disable"
            made.append(f"cmd connectivity airplane-mode {state}")
        elif key == "animations":
            made += [f"settings put global {name} {value}" for name in ANIMATION_SCALES]
        else:
            namespace, name = key.split("/", 1)
            made.append(f"settings put {namespace} {name} {value}")
    return made


class ShellCleaner:
    """Cleans one phone with shell commands (see the module docstring)."""

    def __init__(
        self,
        device: Device,
        profile: CleanProfile,
        baselines: Baselines,
        reboot: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        self._device = device
        self._profile = profile
        self._baselines = baselines
        self._reboot = reboot

    def steps(self, *, first: bool, reboot: bool) -> list[tuple[str, CleanStepRun]]:
        p = self._profile
        chosen: list[tuple[str, CleanStepRun] | None] = [
            ("baseline", self._record) if first else None,
            ("uninstall", self._uninstall) if p.uninstall else None,
            ("clear", self._clear) if p.clear_packages else None,
            ("files", self._files) if p.remove_files or p.clear_dirs else None,
            ("settings", self._settings) if p.settings else None,
            ("commands", self._commands) if p.commands else None,
            ("reboot", self._reboot_and_wait) if reboot else None,
        ]
        return [step for step in chosen if step is not None]

    async def _shell(self, command: str) -> tuple[int, str]:
        result = await self._device.shell(command, self._profile.timeout)
        return result.exit_code, result.output

    async def _record(self) -> str:
        serial = self._device.serial
        if self._baselines.get(serial) is not None:
            return "kept the one recorded before"
        p = self._profile
        packages: set[str] = set()
        if p.baseline_packages is None:
            packages = package_names((await self._shell("pm list packages -3"))[1])
        files = await self._listing() if p.remove_files else set()
        self._baselines.put(serial, Baseline(frozenset(packages), frozenset(files), p.file_roots))
        named = "named by its profile" if p.baseline_packages is not None else f"{len(packages)}"
        return f"recorded: packages {named}, {len(files)} files and directories"

    def _baseline(self) -> Baseline:
        found = self._baselines.get(self._device.serial)
        if found is None:
            raise CleanFailed("no baseline recorded for this phone")
        return found

    async def _uninstall(self) -> str:
        listed = (self._profile.baseline_packages, self._profile.keep_packages)
        base = set(listed[0]) if listed[0] is not None else set(self._baseline().packages)
        installed = package_names((await self._shell("pm list packages -3"))[1])
        extra = sorted(installed - base - set(listed[1]))
        for package in extra:
            code, out = await self._shell(f"pm uninstall {package}")
            if code != 0 or "Success" not in out:
                raise CleanFailed(f"pm uninstall {package}: {_line(out) or f'exit {code}'}")
        said = f"removed {len(extra)}: {', '.join(extra)}" if extra else "nothing to remove"
        missing = sorted(base - installed)
        return said + (f"; missing from the baseline: {', '.join(missing)}" if missing else "")

    async def _clear(self) -> str:
        installed = package_names((await self._shell("pm list packages"))[1])
        cleared = [p for p in self._profile.clear_packages if p in installed]
        for package in cleared:
            code, out = await self._shell(f"pm clear {package}")
            if code != 0 or "Success" not in out:
                raise CleanFailed(f"pm clear {package}: {_line(out) or f'exit {code}'}")
        return f"cleared {len(cleared)}: {', '.join(cleared)}" if cleared else "none installed"

    async def _listing(self, extra: tuple[str, ...] = ()) -> set[str]:
        """What `find` lists under the roots; a directory it may not read only leaves its
        entries out (exit 1), a `find` the phone does not have fails the step."""
        roots = " ".join(shlex.quote(r) for r in (*self._profile.file_roots, *extra))
        code, out = await self._shell(f"find {roots} -mindepth 1 2>/dev/null")
        if code in (126, 127):
            raise CleanFailed(f"find: {_line(out) or f'exit {code}'}")
        return listed_paths(out)

    async def _files(self) -> str:
        p = self._profile
        baseline = self._baseline()
        roots = tuple(r for r in p.file_roots if r in baseline.roots) if p.remove_files else ()
        found = await self._listing(p.clear_dirs) if roots or p.clear_dirs else set()
        doomed = to_remove(found, baseline.files, roots, p.clear_dirs)
        for chunk in _chunks([shlex.quote(path) for path in doomed]):
            code, out = await self._shell(f"rm -rf -- {chunk}")
            if code != 0:
                raise CleanFailed(f"rm -rf: {_line(out) or f'exit {code}'}")
        unknown = [r for r in p.file_roots if p.remove_files and r not in baseline.roots]
        said = f"removed {len(doomed)}" if doomed else "nothing to remove"
        return said + (f"; no baseline of {', '.join(unknown)}: left as is" if unknown else "")

    async def _settings(self) -> str:
        commands = settings_commands(self._profile.settings)
        code, out = await self._shell(" && ".join(commands))
        if code != 0:
            raise CleanFailed(f"settings: {_line(out) or f'exit {code}'}")
        return f"put {len(self._profile.settings)}: {', '.join(self._profile.settings)}"

    async def _commands(self) -> str:
        for command in self._profile.commands:
            code, out = await self._shell(command)
            if code != 0:
                raise CleanFailed(f"`{command}` exited {code}: {_line(out)}")
        return f"ran {len(self._profile.commands)}"

    async def _reboot_and_wait(self) -> str:
        if self._reboot is None:
            raise CleanFailed("this phone's source cannot reboot it")
        await self._reboot(self._device.serial)
        while True:  # the clean's timeout bounds the wait
            await asyncio.sleep(BOOT_POLL)
            try:
                booted = await self._device.shell("getprop sys.boot_completed", BOOT_POLL * 5)
            except DeviceError:  # it drops off while it restarts
                continue
            if booted.output.strip() == "1":
                return "rebooted"


def _line(text: str) -> str:
    return " ".join(text.split())[:300]


def _chunks(words: list[str]) -> list[str]:
    chunks: list[str] = []
    for word in words:
        if chunks and len(chunks[-1]) + len(word) < MAX_COMMAND:
            chunks[-1] += " " + word
        else:
            chunks.append(word)
    return chunks
