"""Emulators that are not there, for the tests and the harnesses: the test double of the
`emulator` program (tests/support/fakes/emulator.py: its command line, its console, the
device it registers with the adb server) behind an `emulator` launcher to put on PATH
(`install_double`), the AVDs it runs (`make_avd`, in an $ANDROID_AVD_HOME), and a private
adb server for them to register with (`AdbServer`: the adb of the `adbutils` wheel, as
tests/support/fakes/real_adb.py finds it).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOUBLE = "tests.support.fakes.emulator"
API = 34


def install_double(directory: Path) -> Path:
    """An `emulator` launcher in `directory` that runs the double with this Python."""
    directory.mkdir(parents=True, exist_ok=True)
    launcher = directory / "emulator"
    launcher.write_text(
        f'#!/bin/sh\nPYTHONPATH="{ROOT}${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'exec "{sys.executable}" -m {DOUBLE} "$@"\n'
    )
    launcher.chmod(0o755)
    return launcher


def make_avd(
    home: Path, name: str, api: int = API, snapshots: Sequence[str] = ("default_boot",)
) -> Path:
    """An AVD as avdmanager lays one out (config.ini, one directory per snapshot)."""
    avd = home / f"{name}.avd"
    for snapshot in snapshots:
        (avd / "snapshots" / snapshot).mkdir(parents=True, exist_ok=True)
    (avd / "config.ini").write_text(
        f"avd.ini.encoding=UTF-8\nabi.type=x86_64\nhw.device.name=pixel_8\n"
        f"image.sysdir.1=system-images/android-{api}/google_apis/x86_64/\n"
    )
    (home / f"{name}.ini").write_text(f"avd.ini.encoding=UTF-8\npath={avd}\ntarget=android-{api}\n")
    return avd


def adb_binary() -> Path:
    """adb on PATH, else the `adbutils` wheel's (a dev dependency)."""
    spec = importlib.util.find_spec("adbutils")
    if spec is not None and spec.origin is not None:
        wheel = Path(spec.origin).parent / "binaries" / "adb"
        if wheel.is_file():
            wheel.chmod(wheel.stat().st_mode | 0o111)
            return wheel
    raise FileNotFoundError("no adb: `make setup` installs the adbutils wheel, which has one")


class AdbServer:
    """A foreground adb server on a free loopback port, its keys under `home`."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = 0
        self._process: asyncio.subprocess.Process | None = None

    async def start(self, within: float = 15.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANDROID_")}
        env.update(HOME=str(self.home), ANDROID_USER_HOME=str(self.home / ".android"))
        log = (self.home / "adb-server.log").open("ab")
        self._process = await asyncio.create_subprocess_exec(
            str(adb_binary()), "-P", str(self.port), "server", "nodaemon",
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log, env=env,
        )  # fmt: skip
        log.close()
        async with asyncio.timeout(within):
            while True:  # polled: adb says nothing when it is ready
                if await self._answers():
                    return
                await asyncio.sleep(0.05)

    async def _answers(self) -> bool:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        with contextlib.closing(writer):
            writer.write(b"000chost:version")
            return await reader.read(4) == b"OKAY"

    async def stop(self) -> None:
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._process.wait(), 5)
            if self._process.returncode is None:
                self._process.kill()
                await self._process.wait()

    def kill(self) -> None:
        """SIGKILL, without waiting (a harness on its way out)."""
        if self._process is not None and self._process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
