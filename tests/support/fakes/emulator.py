"""A stand-in for the Android emulator program at its real interfaces: its command line,
its console (tests.support.fakes.emulator_console), and the device it registers with the
adb server. Run as `python -m tests.support.fakes.emulator -avd NAME ...`;
amc_testing.emulators writes an `emulator` launcher for it (`install_double`) for a test or
a harness to put on PATH, and the AVDs it runs (`make_avd`).

From the emulator's documentation (developer.android.com/studio/run/emulator-commandline,
and `emulator -help`): `-avd NAME` (also `@NAME`); `-port N` (an even number from 5554 to
5682: the console on N, adb on N+1) or `-ports CONSOLE,ADB`; `-read-only` (more than one
instance of the AVD at once; no snapshot is saved); `-no-window`; `-snapshot NAME` (the
snapshot it starts from); `-no-snapshot-save`, `-no-snapshot-load`, `-no-snapshot`;
`-no-audio`, `-no-boot-anim`, `-memory MB`, `-cores N`, `-gpu MODE`, `-accel MODE`,
`-netdelay`, `-netspeed`, `-wipe-data`, `-verbose`. Anything else is refused, as the
emulator refuses an unknown option, so the host agent cannot pass a flag the emulator does
not have. An AVD is `$ANDROID_AVD_HOME/NAME.avd` (else `~/.android/avd/NAME.avd`): its
`config.ini` (`image.sysdir.1=system-images/android-34/…` gives the API level) and its
snapshots, one directory each under `snapshots/`. Without `-read-only` a second instance
of one AVD is refused, as the emulator refuses it.

How it registers, as adb's own documentation and tests say (SERVICES.TXT `host:emulator:
<port>`, adb's test_adb.py `test_emulator_connect`): it sends `host:emulator:<adb port>`
to the adb server (127.0.0.1, $ANDROID_ADB_SERVER_PORT or 5037), which then connects to
the adb port and names the device `emulator-<console port>`; the device side of adb there
is tests.support.fakes.adbd's, over a FakePhone whose files and packages are what its
snapshots keep (a load puts back the snapshot's, a save keeps the phone's).

Its own knobs, in the environment (none of them the emulator's):
    AMC_FAKE_EMULATOR_LOAD_SECONDS   how long a snapshot load takes (0.6)
    AMC_FAKE_EMULATOR_BOOT_SECONDS   from start to its registration with adb (0.2)
    AMC_FAKE_EMULATOR_FAULTS         a JSON file read at each load and at its start:
                                     {"<console port>" or "*": {"die_in_load": true} |
                                     {"load_fails": "why"} | {"hang_load": true} |
                                     {"boot_fails": "why"} (exits 1 at its start)};
                                     with "only": "NAME" beside them, the load faults
                                     hit only the loads of snapshot NAME
    AMC_FAKE_EMULATOR_EVENTS         a file it appends one JSON line to per event (started,
                                     registered, loading, loaded, load_failed, hung, died,
                                     killed, refused: a start it refused; console: a console
                                     connection accepted), with time.time()
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.fakes.adbd import FakeAdbd
from tests.support.fakes.emulator_console import ConsoleServer
from tests.support.fakes.phone import FakePhone

# Flags that take a value, and those that do not (see the module docstring).
VALUED = {"-avd", "-port", "-ports", "-snapshot", "-memory", "-cores", "-gpu", "-accel"}
VALUED |= {"-netdelay", "-netspeed"}
FLAGS = {"-read-only", "-no-window", "-no-snapshot-save", "-no-snapshot-load", "-no-snapshot"}
FLAGS |= {"-no-audio", "-no-boot-anim", "-wipe-data", "-verbose"}
PORTS = range(5554, 5683)


class Refused(Exception):
    """The command line or the AVD cannot be used (printed, exit 1)."""


@dataclass
class Options:
    avd: str
    console: int = 5554
    adb: int = 5555
    read_only: bool = False
    snapshot: str = "default_boot"
    load_snapshot: bool = True
    save_snapshot: bool = True
    flags: list[str] = field(default_factory=list)


def parse(argv: list[str]) -> Options:
    values: dict[str, str] = {}
    flags: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word.startswith("@") and len(word) > 1:
            values["-avd"] = word[1:]
        elif word in VALUED:
            if i + 1 >= len(argv):
                raise Refused(f"option {word} needs a value")
            values[word] = argv[i + 1]
            i += 1
        elif word in FLAGS:
            flags.append(word)
        else:
            raise Refused(f"unknown option: {word}")
        i += 1
    if "-avd" not in values:
        raise Refused("no AVD given: use -avd NAME")
    options = Options(values["-avd"], flags=flags, read_only="-read-only" in flags)
    if "-ports" in values:
        console, _, adb = values["-ports"].partition(",")
        options.console, options.adb = _port(console), _port(adb)
    elif "-port" in values:
        port = _port(values["-port"])
        if port % 2 or port not in PORTS:
            raise Refused(f"-port {port}: must be an even number from 5554 to 5682")
        options.console, options.adb = port, port + 1
    options.snapshot = values.get("-snapshot", options.snapshot)
    options.load_snapshot = not ({"-no-snapshot-load", "-no-snapshot"} & set(flags))
    options.save_snapshot = not ({"-no-snapshot-save", "-no-snapshot"} & set(flags))
    return options


def _port(text: str) -> int:
    if not text.isdigit():
        raise Refused(f"not a port number: {text!r}")
    return int(text)


def avd_home() -> Path:
    home = os.environ.get("ANDROID_AVD_HOME")
    return Path(home) if home else Path.home() / ".android" / "avd"


@dataclass
class Avd:
    name: str
    path: Path
    api: int

    @classmethod
    def find(cls, name: str) -> Avd:
        path = avd_home() / f"{name}.avd"
        if not (path / "config.ini").is_file():
            raise Refused(f"Unknown AVD name [{name}], use -list-avds to see valid list.")
        api = 0
        for line in (path / "config.ini").read_text().splitlines():
            key, _, value = line.partition("=")
            found = re.search(r"android-(\d+)", value)
            if key.strip() == "image.sysdir.1" and found:
                api = int(found[1])
        return cls(name, path, api)

    def snapshots(self) -> list[str]:
        found = self.path / "snapshots"
        return sorted(p.name for p in found.iterdir() if p.is_dir()) if found.is_dir() else []


@dataclass
class Kept:
    """What a snapshot keeps of the fake phone: its files and packages."""

    files: dict[str, bytes] = field(default_factory=dict)
    packages: dict[str, object] = field(default_factory=dict)


class FakeEmulator:
    """One instance: its phone, its console and its adbd, until killed."""

    def __init__(self, options: Options, avd: Avd) -> None:
        self.options = options
        self.avd = avd
        self.serial = f"emulator-{options.console}"
        self.load_seconds = float(os.environ.get("AMC_FAKE_EMULATOR_LOAD_SECONDS", "0.6"))
        self.boot_seconds = float(os.environ.get("AMC_FAKE_EMULATOR_BOOT_SECONDS", "0.2"))
        self.kept: dict[str, Kept] = {name: Kept() for name in avd.snapshots()}
        self.adbd = FakeAdbd(self._phone(Kept()), port=options.adb)
        self.console = ConsoleServer(self, options.console)
        self.ended = asyncio.Event()
        self.loading = asyncio.Lock()

    def _phone(self, kept: Kept) -> FakePhone:
        phone = FakePhone(self.serial)
        phone.props.update(
            {
                "ro.product.model": "sdk_gphone64_x86_64",
                "ro.product.manufacturer": "Google",
                "ro.build.version.sdk": str(self.avd.api or 34),
                "ro.kernel.qemu": "1",
                "ro.boot.qemu.avd_name": self.avd.name,
                "ro.product.cpu.abi": "x86_64",
            }
        )
        phone.__post_init__()
        phone.files.update(kept.files)
        phone.apps.packages.update(kept.packages)  # type: ignore[arg-type]
        return phone

    async def run(self) -> None:
        if self.options.load_snapshot and self.options.snapshot not in self.kept:
            raise Refused(f"snapshot {self.options.snapshot!r} not found in {self.avd.path}")
        await self.console.start()
        await self.adbd.start()
        event("started", self)
        await asyncio.sleep(self.boot_seconds)
        asyncio.get_running_loop().create_task(self._register())
        await self.ended.wait()

    async def _register(self) -> None:
        """`host:emulator:<adb port>` to the adb server, until one was there to hear it."""
        port = int(os.environ.get("ANDROID_ADB_SERVER_PORT", "5037"))
        while not self.ended.is_set():
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                await asyncio.sleep(1.0)
                continue
            request = f"host:emulator:{self.options.adb}".encode()
            writer.write(b"%04x" % len(request) + request)
            await writer.drain()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            event("registered", self, adb_server=port)
            return

    # -- what the console asks --------------------------------------------------------------

    async def load(self, name: str) -> str | None:
        """Loads snapshot `name`: None when done, else why not (the console's KO)."""
        if name not in self.kept:
            return f"snapshot '{name}' does not exist"
        fault = _fault(self.options.console)
        if fault.get("only", name) != name:
            fault = {}
        async with self.loading:
            event("loading", self, snapshot=name)
            if fault.get("hang_load"):
                event("hung", self, snapshot=name)
                await asyncio.Event().wait()
            if fault.get("die_in_load"):
                await asyncio.sleep(self.load_seconds / 2)
                event("died", self, during=f"avd snapshot load {name}", snapshot=name)
                os._exit(1)
            await asyncio.sleep(self.load_seconds)
            if fault.get("load_fails"):
                event("load_failed", self, snapshot=name, why=str(fault["load_fails"]))
                return str(fault["load_fails"])
            self.adbd.phone = self._phone(self.kept[name])
        event("loaded", self, snapshot=name)
        return None

    def save(self, name: str) -> str | None:
        if self.options.read_only:
            return "snapshot save is not allowed: the emulator runs with -read-only"
        phone = self.adbd.phone
        self.kept[name] = Kept(dict(phone.files), dict(phone.apps.packages))
        (self.avd.path / "snapshots" / name).mkdir(parents=True, exist_ok=True)
        return None

    def kill(self) -> None:
        event("killed", self)
        self.ended.set()

    def note(self, kind: str) -> None:
        event(kind, self)


def _fault(console: int) -> dict[str, object]:
    path = os.environ.get("AMC_FAKE_EMULATOR_FAULTS")
    if not path:
        return {}
    try:
        faults = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    found = faults.get(str(console)) or faults.get("*") or {}
    return found if isinstance(found, dict) else {}


def event(kind: str, emulator: FakeEmulator | str, **more: object) -> None:
    path = os.environ.get("AMC_FAKE_EMULATOR_EVENTS")
    if not path:
        return
    serial = emulator if isinstance(emulator, str) else emulator.serial
    line = {"at": time.time(), "event": kind, "serial": serial, "pid": os.getpid()}
    with open(path, "a") as out:
        out.write(json.dumps({**line, **more}) + "\n")


def _claim(avd: Avd, options: Options) -> None:
    """The lock that keeps a second writable instance off one AVD, and the ports free."""
    for port in (options.console, options.adb):
        with socket.socket() as probe:
            # As a listening socket binds: a closed connection's TIME_WAIT does not count.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                raise Refused(f"port {port} is already in use") from None
    if options.read_only:
        return
    lock = avd.path / "multiinstance.lock"
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        raise Refused(
            "Running multiple emulators with the same AVD is an experimental feature. "
            "Please use -read-only flag to enable this feature."
        ) from None
    os.close(fd)


async def _main(argv: list[str]) -> int:
    options = parse(argv)
    avd = Avd.find(options.avd)
    if why := _fault(options.console).get("boot_fails"):
        event("refused", f"emulator-{options.console}", why=str(why))
        raise Refused(f"{why}")
    _claim(avd, options)
    emulator = FakeEmulator(options, avd)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, emulator.kill)
    try:
        await emulator.run()
    finally:
        if not options.read_only:
            (avd.path / "multiinstance.lock").unlink(missing_ok=True)
        await emulator.console.stop()
        await emulator.adbd.stop()
    return 0


def main(argv: list[str]) -> int:
    try:
        return asyncio.run(_main(argv))
    except Refused as exc:
        print(f"ERROR | {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
