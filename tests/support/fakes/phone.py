"""A fake phone: what adbd's `sh` would print for the commands the host agent sends.

`FakePhone` understands just enough of the Android shell for the driver:

* ``getprop`` (whole ``[key]: [value]`` listing) and ``getprop <key>``; ``getprop
  sys.boot_completed`` says ``1`` unless the phone is booting (`reboot()`)
* the health probe's reads: ``dumpsys battery`` (from `battery_level`,
  `battery_temperature`, `charging`) and ``df /data``
* ``input ...``, ``am ...``, ``monkey ...`` (no output, exit 0)
* ``uiautomator dump <path>`` (writes `ui_xml` to a fake file) and ``cat <path>``
* ``screencap -p`` (the PNG, after `screencap_prefix` so drivers must trim; with `screen`
  set, a live frame showing where the last ``input tap`` landed)
* ``echo ...`` with ``$?`` expanded, ``true``, ``false``, ``exit N``, ``sleep N``,
  ``export …`` (nothing) and ``exec CMD`` (runs CMD)
* compound commands joined by ``;``, ``&&`` and ``||`` (tokenised with `shlex`, so
  quoting and backslash escapes behave as in ``sh``)
* its package manager (`apps`, host_agent.simulated_apps, sharing `files`): ``pm list
  packages``, ``pm install PATH``, ``pm uninstall``, ``pm path``, ``rm -f``, and an install
  from stdin (``cmd package install -S SIZE``, `stdin_command`) of an APK whose manifest
  it reads; pushes and pulls land in `files` (the servers' ``sync:``)
* its log (`log`, host_agent.simulated_logcat, as a simulated phone's): ``logcat -c``,
  ``logcat -d``, ``logcat -t N``, ``logcat`` streamed (`stream_shell`: until the stream
  is closed), also as the adb client's ``adb logcat`` sends it (``export
  ANDROID_LOG_TAGS="''"; exec logcat …``); ``log [-p P] [-t TAG] MESSAGE``, ``am crash
  PACKAGE`` (a FATAL EXCEPTION block); ``input``, ``am start``, ``monkey -p`` and ``am
  force-stop`` are logged as Android logs them

Anything else prints ``/system/bin/sh: <cmd>: inaccessible or not found`` and exits 127.
`failures` lets a test make a command fail: a key is matched as a prefix of the
simple command (e.g. ``"am start"``) and maps to ``(exit_code, output)``.

Three ways to run a command, all recording it in `commands`:

* ``handle_shell(cmd) -> bytes``: synchronous; ``sleep N`` is recorded but not waited.
* ``await run_shell(cmd) -> bytes``: ``sleep N`` really sleeps (cancellable).
* ``async for chunk in stream_shell(cmd)``: like `run_shell`, but yields output as it is
  produced, so a server can send what came before a ``sleep`` before sleeping.

And `sh(readline)`: ``sh`` reading command lines from a connection (adbd's ``shell:sh``,
the agent's kept shell), each line with its output, for both fake servers to serve.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

# One PNG writer for the simulator and the fakes; re-exported for tests.
from host_agent.screen import PNG_SIGNATURE
from host_agent.simulated_apps import PhoneApps
from host_agent.simulated_door import split_commands
from host_agent.simulated_logcat import PhoneLog, logcat_args, logcat_command
from host_agent.simulated_screen import LiveScreen, live_frame, make_png

__all__ = ["PNG_SIGNATURE", "FakePhone", "Sleep", "make_png"]

DEFAULT_PROPS: dict[str, str] = {
    "ro.product.model": "Pixel Fake",
    "ro.product.manufacturer": "AMC",
    "ro.build.version.sdk": "34",
    "ro.product.cpu.abi": "arm64-v8a",
    "ro.build.version.release": "14",
    "ro.product.name": "fake_phone",
    "ro.product.device": "fake",
}

DEFAULT_UI_XML = (
    "<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>"
    '<hierarchy rotation="0">'
    '<node index="0" text="" resource-id="" class="android.widget.FrameLayout" '
    'package="com.example" content-desc="" clickable="false" bounds="[0,0][1080,2400]">'
    '<node index="0" text="Hello" resource-id="com.example:id/title" '
    'class="android.widget.TextView" package="com.example" content-desc="" '
    'clickable="false" bounds="[40,100][1040,180]" />'
    '<node index="1" text="OK" resource-id="android:id/button1" '
    'class="android.widget.Button" package="com.example" content-desc="confirm" '
    'clickable="true" bounds="[100,200][300,260]" />'
    "</node></hierarchy>"
)


@dataclass(frozen=True)
class Sleep:
    """A pause the shell asks for; the runner of the steps decides whether to wait."""

    seconds: float


@dataclass
class FakePhone:
    serial: str
    props: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_PROPS))
    ui_xml: str = DEFAULT_UI_XML
    png: bytes = field(default_factory=make_png)
    # Some devices print a warning before the PNG (e.g. multi-display notices).
    screencap_prefix: bytes = b""
    failures: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    # (time.monotonic(), full command line) for every command asked.
    commands: list[tuple[float, str]] = field(default_factory=list)
    # (time.monotonic(), argv) for every simple command actually executed.
    executed: list[tuple[float, list[str]]] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)
    battery_level: int = 80
    battery_temperature: float = 30.0
    charging: bool = True
    # A reboot (the `reboot:` service, or `reboot()`) boots it for `boot_time` seconds.
    boot_time: float = 1.0
    booting_until: float = 0.0
    reboots: int = 0
    # Set: `screencap` draws a live frame, as a simulated phone does (a red square where the
    # last `input tap` landed, the text typed), instead of `png`.
    screen: LiveScreen | None = None
    # Set: `sh` answers as over a pty, as adbd's `shell:` did before Android 7: each line
    # written comes back echoed, and every "\n" of the output as "\r\n".
    sh_pty: bool = False

    def reboot(self) -> None:
        self.reboots += 1
        self.booting_until = time.monotonic() + self.boot_time

    def __post_init__(self) -> None:
        self.props.setdefault("ro.serialno", self.serial)
        sdk = self.props.get("ro.build.version.sdk", "34")
        self.apps = PhoneApps(int(sdk) if sdk.isdigit() else 34, files=self.files)
        self.log = PhoneLog(self.serial)

    def stdin_command(self, command: str, data: bytes) -> bytes:
        """What `command` (adb's exec:) prints when given `data` on stdin."""
        self.commands.append((time.monotonic(), command))
        for prefix, (_, output) in self.failures.items():
            if command.startswith(prefix):
                return output
        answer = self.apps.stdin_command(command, data)
        return (answer if answer is not None else f"{command}: inaccessible\n").encode()

    # -- entry points -------------------------------------------------------------------

    def handle_shell(self, command: str) -> bytes:
        return b"".join(s for s in self.iter_shell(command) if isinstance(s, bytes))

    async def run_shell(self, command: str) -> bytes:
        return b"".join([chunk async for chunk in self.stream_shell(command)])

    async def stream_shell(self, command: str) -> AsyncIterator[bytes]:
        argv = logcat_command(command)
        if argv is not None and (asked := logcat_args(argv)).follows:
            self.commands.append((time.monotonic(), command))
            head, _, _ = command.rpartition(";")  # what runs before it (`logcat -c; …`)
            for step in self._steps(head):
                if isinstance(step, bytes) and step:
                    yield step
            async for chunk in self.log.follow(usec=asked.usec):
                yield chunk
            return
        for step in self.iter_shell(command):
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
            elif step:
                yield step

    async def sh(
        self, readline: Callable[[], Awaitable[bytes]]
    ) -> AsyncGenerator[tuple[str, AsyncGenerator[bytes, None]], None]:
        """``sh`` reading its command lines from a connection: each line as it is read,
        with its output (`stream_shell`'s, produced as the caller iterates it; a caller
        that never does leaves the line unrun), until `readline` gives b"" (the
        connection closed). The next line is read once the caller asks for it."""
        while line := await readline():
            command = line.decode(errors="replace").rstrip("\r\n")
            yield command, self._sh_output(line, command)

    async def _sh_output(self, line: bytes, command: str) -> AsyncGenerator[bytes, None]:
        if self.sh_pty:
            yield line.rstrip(b"\r\n") + b"\r\n"
        async for chunk in self.stream_shell(command):
            yield chunk.replace(b"\n", b"\r\n") if self.sh_pty else chunk

    def iter_shell(self, command: str) -> Iterator[bytes | Sleep]:
        """Run `command` lazily: output chunks and pauses, in order."""
        self.commands.append((time.monotonic(), command))
        return self._steps(command)

    def _steps(self, command: str) -> Iterator[bytes | Sleep]:
        status = 0
        for operator, argv in split_commands(command):
            if (operator == "&&" and status != 0) or (operator == "||" and status == 0):
                continue
            if argv[:1] == ["exit"]:
                return
            self.executed.append((time.monotonic(), argv))
            if argv[:1] == ["exec"]:
                argv = argv[1:]  # the shell becomes the command: the same, for a fake
            if argv[:1] == ["sleep"]:
                yield Sleep(float(argv[1]) if len(argv) > 1 else 0.0)
                status = 0
                continue
            status, output = self._run_simple(argv, status)
            yield output

    def shell_commands(self) -> list[str]:
        """Just the command lines, in order (handy for assertions)."""
        return [command for _, command in self.commands]

    # -- simple commands ----------------------------------------------------------------

    def _run_simple(self, argv: list[str], last_status: int) -> tuple[int, bytes]:
        line = " ".join(argv)
        for prefix, result in self.failures.items():
            if line.startswith(prefix):
                return result
        managed = self.apps.shell(argv)
        if managed is not None:
            return managed[0], managed[1].encode()
        logged = self.log.answer(shlex.join(argv))
        if logged is not None:
            return logged[0], logged[1].encode()
        self._logged(argv)
        return self._run_builtin(argv, last_status)

    def _logged(self, argv: list[str]) -> None:
        """What a command done on the phone writes into its log."""
        args = argv[1:]
        if argv[0] == "input" and args[:1] == ["tap"] and len(args) >= 3:
            self.log.saw("tap", {"x": args[1], "y": args[2]})
        elif argv[0] == "input" and args[:1] == ["swipe"] and len(args) >= 5:
            self.log.saw("swipe", dict(zip(("x1", "y1", "x2", "y2"), args[1:5], strict=True)))
        elif argv[0] == "input" and args[:1] == ["keyevent"] and args[1:2] and args[1].isdigit():
            self.log.saw("key", {"keycode": args[1]})
        elif argv[0] == "input" and args[:1] == ["text"]:
            self.log.saw("input_text", {"text": " ".join(args[1:])})
        elif argv[:2] == ["am", "start"] and "-n" in args:
            package, _, activity = args[args.index("-n") + 1].partition("/")
            self.log.launched(package, activity)
        elif argv[0] == "monkey" and "-p" in args:
            self.log.launched(args[args.index("-p") + 1], "")
        elif argv[:2] == ["am", "force-stop"] and len(args) == 2:
            self.log.stopped(args[1])

    def _run_builtin(self, argv: list[str], last_status: int) -> tuple[int, bytes]:
        name = argv[0]
        if name == "echo":
            words = [w.replace("$?", str(last_status)) for w in argv[1:]]
            return 0, (" ".join(words) + "\n").encode()
        if name == "input" and self.screen is not None:
            self._input(argv[1:])
        if name in ("true", "input", "am", "monkey", "export"):
            return 0, b""
        if name == "false":
            return 1, b""
        if name == "getprop":
            if argv[1:] == ["sys.boot_completed"]:
                return 0, b"\n" if time.monotonic() < self.booting_until else b"1\n"
            return 0, self._getprop(argv[1:])
        if argv[:2] == ["dumpsys", "battery"]:
            return 0, self._battery()
        if name == "df":
            return 0, (
                b"Filesystem      1K-blocks    Used Available Use% Mounted on\n"
                b"/dev/block/dm-5  16000000 8000000   8000000  50% /data\n"
            )
        if name == "uiautomator":
            return self._uiautomator(argv[1:])
        if name == "cat":
            return self._cat(argv[1:])
        if name in ("screencap", "/system/bin/screencap"):
            if self.screen is not None:
                return 0, self.screencap_prefix + live_frame(self.serial, self.screen)
            return 0, self.screencap_prefix + self.png
        return 127, f"/system/bin/sh: {name}: inaccessible or not found\n".encode()

    def _input(self, args: list[str]) -> None:
        """What an `input` command does to the live screen."""
        assert self.screen is not None
        if args[:1] == ["tap"] and len(args) >= 3:
            self.screen.saw("tap", {"x": args[1], "y": args[2]})
        elif args[:1] == ["swipe"] and len(args) >= 5:
            self.screen.saw("swipe", {"x2": args[3], "y2": args[4]})
        elif args[:1] == ["text"] and len(args) >= 2:
            self.screen.saw("input_text", {"text": " ".join(args[1:]).replace("%s", " ")})
        elif args[:1] == ["keyevent"] and len(args) >= 2 and args[1].isdigit():
            self.screen.saw("key", {"keycode": args[1]})

    def _battery(self) -> bytes:
        return (
            "Current Battery Service state:\n"
            f"  AC powered: false\n  USB powered: {str(self.charging).lower()}\n"
            f"  status: {2 if self.charging else 3}\n  level: {self.battery_level}\n"
            f"  scale: 100\n  temperature: {round(self.battery_temperature * 10)}\n"
        ).encode()

    def _getprop(self, args: list[str]) -> bytes:
        if args:
            return (self.props.get(args[0], "") + "\n").encode()
        lines = [f"[{key}]: [{value}]\n" for key, value in sorted(self.props.items())]
        return "".join(lines).encode()

    def _uiautomator(self, args: list[str]) -> tuple[int, bytes]:
        if args[:1] != ["dump"]:
            return 1, b"Usage: uiautomator <subcommand> [options]\n"
        path = args[1] if len(args) > 1 else "/sdcard/window_dump.xml"
        self.files[path] = self.ui_xml.encode()
        # Android's own spelling.
        return 0, f"UI hierchary dumped to: {path}\n".encode()

    def _cat(self, paths: list[str]) -> tuple[int, bytes]:
        out, status = b"", 0
        for path in paths:
            if path in self.files:
                out += self.files[path]
            else:
                out += f"cat: {path}: No such file or directory\n".encode()
                status = 1
        return status, out
