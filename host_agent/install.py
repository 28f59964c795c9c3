"""The app library's actions on a phone, as the executor runs them: install_app (the APK
from this host's cache, streamed to the phone), uninstall_app, push_file (a library file
to the phone) and pull_file (a file of the phone, kept by the task).

**Installing.** The app is found in the library (`Library.find_app`: by id, or the newest
of a package) and refused at once when the phone's API level is below the app's minimum.
Its APK comes from the host's cache (host_agent.app_cache: fetched once per host). On
Android 7 (API 24) and later it is streamed to the phone: adb's `exec:` service runs
`cmd package install -S SIZE` with the APK on its stdin, so nothing is written to the
phone's storage first. On older Android, or when that answer is not the package manager's
own (`cmd` missing, the service refused), it is pushed to /data/local/tmp and installed
with `pm install`, then removed. The package manager's own refusal (`Failure
[INSTALL_FAILED_…]`) fails the step as it is: pushing the same APK would be refused too.
`replace` is `-r` (keep the data of an installed copy), `grant_permissions` `-g` (Android
6, API 23, and later; earlier ones grant every permission at install anyway).

Plain domain code: no wire types (an import-linter contract keeps the executor from them);
host_agent.library is the `Library` the agent gives the runner.
"""

from __future__ import annotations

import contextlib
import shlex
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from amc_common.action_table import InstallApp, PushFile
from host_agent.devices import Device, DeviceError
from host_agent.stop_token import StopToken

log = structlog.get_logger(__name__)

# How long the phone may take to install an APK (it copies and verifies it, and an old
# Android compiles it), and to take or give a file.
INSTALL_TIMEOUT = 300.0
TRANSFER_TIMEOUT = 300.0
# `cmd package install` reads the APK from stdin from Android 7.0 on; runtime permissions
# (and `-g`) are Android 6.0's.
STREAMED_SINCE_SDK = 24
GRANT_SINCE_SDK = 23
# Where the APK goes on a phone that installs it from a file, for as long as that takes.
REMOTE_DIR = "/data/local/tmp"
# The most a pull_file keeps: the control plane's default artifact limit.
PULL_LIMIT = 10 * 1024 * 1024


class LibraryError(Exception):
    """The library (or the phone's package manager) refused what a step asked; one line."""


@dataclass(frozen=True)
class LibraryApp:
    """An app of the library, as an install needs it."""

    app_id: str
    package: str
    version_name: str
    version_code: int
    min_sdk: int
    size_bytes: int


class Library(Protocol):
    """The app library as seen from this host (host_agent.library)."""

    async def find_app(self, ref: str) -> LibraryApp:
        """The app `ref` names (its id, or a package: its newest); LibraryError if none."""
        ...

    def file(self, file_id: str) -> AbstractAsyncContextManager[Path]:
        """The bytes of an app or a file on this host's disk, for the block's length."""
        ...


@dataclass(frozen=True)
class Installed:
    app: LibraryApp
    # "streamed" (cmd package install -S) or "pushed" (push, then pm install).
    how: str


async def install_app(
    action: InstallApp, device: Device, token: StopToken, library: Library
) -> Installed:
    app = await token.race(library.find_app(action.app))
    sdk = await token.race(phone_sdk(device))
    if sdk and app.min_sdk > sdk:
        raise LibraryError(
            f"{app.package} {app.version_name} needs Android API {app.min_sdk} or later;"
            f" this phone has API {sdk}"
        )
    flags = ["-r"] if action.replace else []
    if action.grant_permissions and (sdk == 0 or sdk >= GRANT_SINCE_SDK):
        flags.append("-g")
    async with _fetched(library, app.app_id, token) as apk:
        token.raise_if_tripped()
        if sdk == 0 or sdk >= STREAMED_SINCE_SDK:
            command = " ".join(["cmd package install", *flags, "-S", str(app.size_bytes)])
            output = await device.exec_in(command, apk, INSTALL_TIMEOUT)
            if _succeeded(output):
                return Installed(app, "streamed")
            _raise_if_refused(app, output)
            log.info("streamed install not taken; pushing", package=app.package, said=_line(output))
        await _push_and_install(device, apk, app, flags)
    return Installed(app, "pushed")


async def _push_and_install(device: Device, apk: Path, app: LibraryApp, flags: list[str]) -> None:
    remote = f"{REMOTE_DIR}/amc-{app.app_id[:16]}.apk"
    await device.push(apk, remote, TRANSFER_TIMEOUT)
    try:
        result = await device.shell(" ".join(["pm install", *flags, remote]), INSTALL_TIMEOUT)
    finally:
        with contextlib.suppress(DeviceError):
            await device.shell(f"rm -f {remote}", TRANSFER_TIMEOUT)
    if not _succeeded(result.output):
        _raise_if_refused(app, result.output)
        raise LibraryError(f"installing {app.package}: pm install said {_line(result.output)!r}")


async def uninstall_app(package: str, device: Device) -> None:
    result = await device.shell(f"pm uninstall {shlex.quote(package)}", INSTALL_TIMEOUT)
    if not _succeeded(result.output):
        raise LibraryError(f"uninstalling {package}: {_line(result.output) or 'no answer'}")


async def push_file(action: PushFile, device: Device, token: StopToken, library: Library) -> int:
    """The file pushed to the phone; its size."""
    async with _fetched(library, action.file, token) as local:
        token.raise_if_tripped()
        await device.push(local, action.path, TRANSFER_TIMEOUT)
        return local.stat().st_size


async def pull_file(path: str, device: Device, token: StopToken) -> bytes:
    return await token.race(device.pull(path, PULL_LIMIT, TRANSFER_TIMEOUT))


async def phone_sdk(device: Device) -> int:
    """The phone's API level (0 when it does not say)."""
    result = await device.shell("getprop ro.build.version.sdk", TRANSFER_TIMEOUT)
    text = result.output.strip()
    return int(text) if text.isdigit() else 0


@contextlib.asynccontextmanager
async def _fetched(library: Library, file_id: str, token: StopToken) -> AsyncIterator[Path]:
    """The library file on this host's disk; its fetch (if the cache lacks it) stops when
    the token trips."""
    async with AsyncExitStack() as stack:
        yield await token.race(stack.enter_async_context(library.file(file_id)))


def _succeeded(output: str) -> bool:
    """Whether the package manager said `Success` (on a line of its own)."""
    return any(line.strip() == "Success" for line in output.splitlines())


def _raise_if_refused(app: LibraryApp, output: str) -> None:
    """The package manager's own refusal, `Failure [INSTALL_FAILED_…: why]`, as the step's."""
    for line in output.splitlines():
        if line.strip().startswith("Failure ["):
            raise LibraryError(f"installing {app.package} {app.version_name}: {line.strip()}")


def _line(output: str) -> str:
    return " ".join(output.split())[:300]
