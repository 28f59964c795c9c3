"""What a simulated phone keeps between leases, and the shell commands that change or read
it: third-party packages (and their data), files under the storage a task may write to,
settings and airplane mode. A task's shell actions change it as they would a phone; the
host's clean between leases (host_agent.cleaning) reads and restores it with the same
commands.

Commands answered, as Android's `pm`, `settings`, `cmd connectivity` and toybox answer
them: `pm list packages [-3]`, `pm install [-r] [-g] PATH` (a simulated phone has no APK
parser: it installs the package its file is named after, `/data/local/tmp/com.a.apk`
installs `com.a`), `pm uninstall [-k] [--user N] PKG`, `pm clear PKG`, `settings get|put
NAMESPACE KEY [VALUE]`, `cmd connectivity airplane-mode [enable|disable]`, `touch`,
`mkdir -p`, `rm -rf`, `ls DIR`, `find DIR... -mindepth 1`, and commands joined by ` && `.
`/storage/emulated/0` is `/sdcard`, as on a phone. Anything else is not this module's.

A fault (SimulatedSource.apply_faults' `uninstall: "fail"`) makes every `pm uninstall`
answer `Failure [DELETE_FAILED_INTERNAL_ERROR]`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

SYSTEM_PACKAGES = ("android", "com.android.settings", "com.android.systemui")
# What a fresh simulated phone's storage holds.
FRESH_FILES = frozenset(
    ("/sdcard", "/sdcard/Android", "/sdcard/DCIM", "/sdcard/Download", "/sdcard/Pictures")
) | {"/data/local/tmp"}
_ALIASES = (("/storage/emulated/0", "/sdcard"), ("/storage/self/primary", "/sdcard"))

Answer = tuple[int, str]


def _path(text: str) -> str:
    for alias, real in _ALIASES:
        if text == alias or text.startswith(alias + "/"):
            text = real + text[len(alias) :]
    while "//" in text:
        text = text.replace("//", "/")
    return text.rstrip("/") or "/"


@dataclass
class PhoneState:
    """One simulated phone's packages, files and settings."""

    # Third-party package -> whether it holds app data (`pm clear` empties it).
    packages: dict[str, bool] = field(default_factory=dict)
    files: set[str] = field(default_factory=lambda: set(FRESH_FILES))
    settings: dict[tuple[str, str], str] = field(default_factory=dict)
    airplane: bool = False
    uninstall_fails: bool = False

    def answer(self, command: str) -> Answer | None:
        """(exit code, output) of `command`, or None when it is not one of this module's."""
        parts = command.split(" && ")
        answers: list[Answer] = []
        for part in parts:
            try:
                argv = shlex.split(part.replace("2>/dev/null", ""))
            except ValueError:
                return None
            one = self._one(argv)
            if one is None:
                if len(parts) == 1:
                    return None
                one = (0, "")
            answers.append(one)
            if one[0] != 0:
                break
        return answers[-1][0], "".join(out for _, out in answers)

    def _one(self, argv: list[str]) -> Answer | None:
        if not argv:
            return None
        if argv[0] == "pm" and len(argv) > 1:
            return self._pm(argv[1], argv[2:])
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
        return self._files(argv[0], argv[1:])

    def _pm(self, verb: str, args: list[str]) -> Answer | None:
        named = [a for a in args if not a.startswith("-") and not a.isdigit()]
        if verb == "list" and named[:1] == ["packages"]:
            names = sorted(self.packages)
            if "-3" not in args:
                names = sorted([*names, *SYSTEM_PACKAGES])
            return 0, "".join(f"package:{n}\n" for n in names)
        if verb == "install" and named:
            path = _path(named[-1])
            if path not in self.files:
                return 1, f"Error: Unable to open file: {named[-1]}\n"
            package = path.rsplit("/", 1)[-1].removesuffix(".apk")
            self.packages[package] = False
            return 0, "Success\n"
        if verb == "uninstall" and named:
            if self.uninstall_fails or named[-1] not in self.packages:
                return 1, "Failure [DELETE_FAILED_INTERNAL_ERROR]\n"
            del self.packages[named[-1]]
            self.files = {f for f in self.files if f"/Android/data/{named[-1]}" not in f}
            return 0, "Success\n"
        if verb == "clear" and named:
            if named[-1] not in self.packages:
                return 1, "Failed\n"
            self.packages[named[-1]] = False
            return 0, "Success\n"
        return None

    def _files(self, verb: str, args: list[str]) -> Answer | None:
        paths = [_path(a) for a in args if not a.startswith("-")]
        if verb in ("touch", "mkdir"):
            for path in paths:
                self._add(path)
            return 0, ""
        if verb == "rm":
            for path in paths:
                self.files = {f for f in self.files if f != path and not f.startswith(path + "/")}
            return 0, ""
        if verb == "ls" and len(paths) == 1:
            if paths[0] not in self.files:
                return 1, f"ls: {args[-1]}: No such file or directory\n"
            prefix = paths[0] + "/"
            below = [f[len(prefix) :] for f in self.files if f.startswith(prefix)]
            return 0, "".join(f"{n}\n" for n in sorted(below) if "/" not in n)
        if verb == "find":
            roots = [p for p in paths if p.startswith("/")]
            found = sorted(f for root in roots for f in self.files if f.startswith(root + "/"))
            return 0, "".join(f"{f}\n" for f in found)
        return None

    def _add(self, path: str) -> None:
        parts = path.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            self.files.add("/" + "/".join(parts[:i]))
