"""A phone's package manager and files, simulated: what a simulated phone
(host_agent.simulated) and the tests' fake phone answer to an install from stdin (`cmd
package install [-r] [-g] -S SIZE`), from a file (`pm install [-r] [-g] PATH`), to `pm list
packages [FILTER]`, `pm uninstall PACKAGE`, `pm path PACKAGE`, `rm -f PATH`, and to a push,
a pull and its stat. An APK is read with amc_common.apk, as the control plane's library
reads it, so the package installed is the one its manifest names, and its answers are
Android's own (`Success`, `Failure [INSTALL_FAILED_OLDER_SDK: …]`, `package:NAME`).

As Android does it: from Android 7 (API 24, where `cmd package` reads stdin) an installed
package is replaced with or without `-r`; before, it is refused without `-r`
(INSTALL_FAILED_ALREADY_EXISTS). An older version code over a newer one is refused
(INSTALL_FAILED_VERSION_DOWNGRADE), an APK needing a newer API too.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from amc_common.apk import ApkFacts, NotAnApk, read_apk

STREAMED_SINCE_SDK = 24


@dataclass
class Installed:
    facts: ApkFacts
    # Whether its runtime permissions were granted at install (-g).
    granted: bool
    path: str


@dataclass
class PhoneApps:
    """One phone's packages (installed by the tests' installs; the system's are not
    listed) and files (pushed, or made by its commands)."""

    sdk: int = 34
    packages: dict[str, Installed] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    # Every install asked: (how: "stream" or "file", its flags).
    installs: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)

    def install(self, apk: bytes, flags: list[str], how: str) -> str:
        """The package manager's answer to installing `apk`."""
        self.installs.append((how, tuple(flags)))
        try:
            facts = read_apk(apk)
        except NotAnApk as exc:
            return f"Failure [INSTALL_PARSE_FAILED_NOT_APK: {exc}]\n"
        if facts.min_sdk > self.sdk:
            return (
                "Failure [INSTALL_FAILED_OLDER_SDK: Requires newer sdk version"
                f" #{facts.min_sdk} (current version is #{self.sdk})]\n"
            )
        old = self.packages.get(facts.package)
        if old is not None:
            if "-r" not in flags and self.sdk < STREAMED_SINCE_SDK:
                return (
                    f"Failure [INSTALL_FAILED_ALREADY_EXISTS: Attempt to re-install"
                    f" {facts.package} without first uninstalling.]\n"
                )
            if old.facts.version_code > facts.version_code and "-d" not in flags:
                return (
                    "Failure [INSTALL_FAILED_VERSION_DOWNGRADE: Downgrade detected: Update"
                    f" version code {facts.version_code} is older than current"
                    f" {old.facts.version_code}]\n"
                )
        path = f"/data/app/{facts.package}-1/base.apk"
        self.packages[facts.package] = Installed(facts, "-g" in flags, path)
        return "Success\n"

    def stdin_command(self, command: str, data: bytes) -> str | None:
        """The answer to an `exec:` command reading `data` from stdin; None: not one."""
        argv = shlex.split(command)
        if argv[:3] != ["cmd", "package", "install"]:
            return None
        if self.sdk < STREAMED_SINCE_SDK:
            return "cmd: Can't find service: package\n"
        flags, size = _flags_and_size(argv[3:])
        if size is None or size != len(data):
            return f"Error: -S {size} is not the {len(data)} bytes sent\n"
        return self.install(data, flags, "stream")

    def shell(self, argv: list[str]) -> tuple[int, str] | None:
        """(exit code, output) of a `pm` or `rm -f` command; None: not one of those."""
        if argv[:2] == ["pm", "list"] and argv[2:3] == ["packages"]:
            wanted = [a for a in argv[3:] if not a.startswith("-")]
            names = sorted(p for p in self.packages if not wanted or wanted[0] in p)
            return 0, "".join(f"package:{name}\n" for name in names)
        if argv[:2] == ["pm", "uninstall"] and len(argv) >= 3:
            if self.packages.pop(argv[-1], None) is None:
                return 1, "Failure [DELETE_FAILED_INTERNAL_ERROR]\n"
            return 0, "Success\n"
        if argv[:2] == ["pm", "path"] and len(argv) >= 3:
            found = self.packages.get(argv[-1])
            return (0, f"package:{found.path}\n") if found else (1, "")
        if argv[:2] == ["pm", "install"] and len(argv) >= 3:
            flags, _ = _flags_and_size(argv[2:-1])
            data = self.files.get(argv[-1])
            if data is None:
                return 1, f"Error: Unable to open file: {argv[-1]}\n"
            answer = self.install(data, flags, "file")
            return (0 if answer == "Success\n" else 1), answer
        if argv[:2] == ["rm", "-f"]:
            for path in argv[2:]:
                self.files.pop(path, None)
            return 0, ""
        return None

    def answer(self, command: str) -> tuple[int, str] | None:
        """As `shell`, for a whole command line (None for one that is not a simple one)."""
        try:
            argv = shlex.split(command)
        except ValueError:
            return None
        return self.shell(argv)


def _flags_and_size(args: list[str]) -> tuple[list[str], int | None]:
    flags, size = [], None
    words = iter(args)
    for word in words:
        if word == "-S":
            value = next(words, "")
            size = int(value) if value.isdigit() else None
        elif word.startswith("-"):
            flags.append(word)
    return flags, size
