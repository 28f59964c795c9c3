"""What a simulated phone keeps between leases besides its packages and files (those are
host_agent.simulated_apps' `PhoneApps`): its directories, settings and airplane mode; and
the shell commands that change or read all of it, as a task's shell actions and the host's
clean between leases (host_agent.cleaning) send them.

Answered here, as Android's `pm`, `settings`, `cmd connectivity` and toybox answer them:
`pm list packages [-3] [FILTER]` (a simulated phone has no system packages: what is
installed is third-party), `pm clear PKG`, `pm uninstall [-k] [--user N] PKG` (its app data
directory under /sdcard/Android/data goes with it), `pm install [-r] [-g] PATH` of a file
that is not an APK (a simulated phone's stand-in for an app it cannot build: it installs
the package the file is named after, `/data/local/tmp/com.a.apk` installing `com.a`; a
real APK is PhoneApps' to install, from its manifest), `settings get|put NAMESPACE KEY
[VALUE]`, `cmd connectivity airplane-mode [enable|disable]`, `touch`, `mkdir -p`,
`rm [-rf] [--] PATH…`, `ls DIR`, `find DIR… -mindepth 1`, and commands joined by ` && `
(run in turn until one fails). `/storage/emulated/0` is `/sdcard`, as on a phone. The
other commands go to PhoneApps (`pm path`, an APK's `pm install`, …).

A fault (host_agent.simulated_faults' `uninstall: "fail"`) makes every `pm uninstall`
answer `Failure [DELETE_FAILED_INTERNAL_ERROR]`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from amc_common.apk import ApkFacts, NotAnApk, read_apk
from host_agent.simulated_apps import Installed, PhoneApps

# What a fresh simulated phone's storage holds.
FRESH_DIRS = frozenset(
    ("/sdcard", "/sdcard/Android", "/sdcard/DCIM", "/sdcard/Download", "/sdcard/Pictures")
) | {"/data/local/tmp"}
_ALIASES = (("/storage/emulated/0", "/sdcard"), ("/storage/self/primary", "/sdcard"))
FAILED_DELETE = "Failure [DELETE_FAILED_INTERNAL_ERROR]\n"

Answer = tuple[int, str]


def path_of(text: str) -> str:
    """A phone's path as one spelling: aliases of /sdcard resolved, no doubled or trailing
    slashes."""
    for alias, real in _ALIASES:
        if text == alias or text.startswith(alias + "/"):
            text = real + text[len(alias) :]
    while "//" in text:
        text = text.replace("//", "/")
    return text.rstrip("/") or "/"


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top + "/")


@dataclass
class PhoneState:
    """One simulated phone: its packages and files (`apps`), and the rest it keeps."""

    apps: PhoneApps
    dirs: set[str] = field(default_factory=lambda: set(FRESH_DIRS))
    settings: dict[tuple[str, str], str] = field(default_factory=dict)
    airplane: bool = False
    uninstall_fails: bool = False

    @property
    def packages(self) -> dict[str, Installed]:
        return self.apps.packages

    def preinstall(self, package: str) -> None:
        """`package` installed before anything runs (as the phone came)."""
        facts = ApkFacts(package, "1", 1, 1, self.apps.sdk)
        self.apps.packages[package] = Installed(facts, False, f"/data/app/{package}-1/base.apk")

    def paths(self) -> set[str]:
        """Every directory and file, as one spelling each, with the files' directories."""
        found = set(self.dirs)
        for name in self.apps.files:
            path = path_of(name)
            found.add(path)
            parts = path.strip("/").split("/")
            found.update("/" + "/".join(parts[:i]) for i in range(1, len(parts)))
        return found

    def answer(self, command: str) -> Answer | None:
        """(exit code, output) of `command`, or None when nothing here or in PhoneApps
        answers it."""
        parts = command.split(" && ")
        answers: list[Answer] = []
        for part in parts:
            one = self._one(part)
            if one is None:
                if len(parts) == 1:
                    return None
                one = (0, "")
            answers.append(one)
            if one[0] != 0:
                break
        return answers[-1][0], "".join(out for _, out in answers)

    def _one(self, command: str) -> Answer | None:
        try:
            argv = shlex.split(command.replace("2>/dev/null", ""))
        except ValueError:
            return None
        if not argv:
            return None
        if argv[0] == "pm" and len(argv) > 1:
            answered = self._pm(argv[1], argv[2:])
        elif argv[0] == "settings" or argv[:2] == ["cmd", "connectivity"]:
            answered = self._setting(argv)
        else:
            answered = self._files(argv[0], argv[1:])
        return answered if answered is not None else self.apps.answer(command)

    def _pm(self, verb: str, args: list[str]) -> Answer | None:
        named = [a for a in args if not a.startswith("-") and not a.isdigit()]
        if verb == "list" and named[:1] == ["packages"]:
            wanted = named[1] if len(named) > 1 else ""
            return 0, "".join(f"package:{n}\n" for n in sorted(self.packages) if wanted in n)
        if verb == "clear" and named:
            return (0, "Success\n") if named[-1] in self.packages else (1, "Failed\n")
        if verb == "uninstall" and named:
            if self.uninstall_fails or named[-1] not in self.packages:
                return 1, FAILED_DELETE
            del self.packages[named[-1]]
            self._remove(f"/sdcard/Android/data/{named[-1]}")
            return 0, "Success\n"
        if verb == "install" and named:
            data = self.apps.files.get(named[-1])
            if data is None:
                return None  # PhoneApps says it cannot open it
            try:
                read_apk(data)
            except NotAnApk:
                package = path_of(named[-1]).rsplit("/", 1)[-1].removesuffix(".apk")
                self.preinstall(package)
                return 0, "Success\n"
        return None

    def _setting(self, argv: list[str]) -> Answer | None:
        if argv[0] == "settings" and len(argv) >= 4 and argv[1] in ("get", "put"):
            key = (argv[2], argv[3])
            if argv[1] == "get":
                return 0, self.settings.get(key, "null") + "\n"
            if len(argv) < 5:
                return 255, "Bad arguments\n"
            self.settings[key] = argv[4]
            return 0, ""
        if argv[:3] == ["cmd", "connectivity", "airplane-mode"]:
            if len(argv) == 3:
                return 0, ("enabled" if self.airplane else "disabled") + "\n"
            self.airplane = argv[3] == "enable"
            return 0, ""
        return None

    def _files(self, verb: str, args: list[str]) -> Answer | None:
        paths = [a for a in args if not a.startswith("-")]
        if verb == "touch":
            for path in paths:
                self.apps.files.setdefault(path, b"")
            return 0, ""
        if verb == "mkdir":
            for path in map(path_of, paths):
                parts = path.strip("/").split("/")
                self.dirs.update("/" + "/".join(parts[:i]) for i in range(1, len(parts) + 1))
            return 0, ""
        if verb == "rm" and any(a.startswith("-") and "r" in a for a in args):
            for path in paths:
                self._remove(path_of(path))
            return 0, ""
        if verb == "ls" and len(paths) == 1:
            top, found = path_of(paths[0]), self.paths()
            if top not in found:
                return 1, f"ls: {paths[0]}: No such file or directory\n"
            below = [p[len(top) + 1 :] for p in found if p.startswith(top + "/")]
            return 0, "".join(f"{n}\n" for n in sorted(below) if "/" not in n)
        if verb == "find":
            roots = [path_of(p) for p in paths if p.startswith("/")]
            listed = sorted(p for p in self.paths() if any(p.startswith(r + "/") for r in roots))
            return 0, "".join(f"{p}\n" for p in listed)
        return None

    def _remove(self, top: str) -> None:
        self.dirs = {d for d in self.dirs if not _under(d, top)}
        for name in [n for n in self.apps.files if _under(path_of(n), top)]:
            del self.apps.files[name]
