"""What a simulated phone's `logcat` prints (and the tests' fake phones'): a believable log
in logcat's default `threadtime` format, kept per phone (`PhoneLog`), from a few lines of
its boot on. While someone follows it, the system writes a line now and then (a battery
level, a network check, a wake lock), as a quiet phone does.

    MM-DD HH:MM:SS.mmm   PID   TID L TAG     : message

`logcat_args` reads what the command asks: `-d` (print the log and exit), `-c` (clear it),
`-t N` (the last N lines, then exit); other options are taken and ignored.
"""

from __future__ import annotations

import itertools
import random
import shlex
import time
from collections import deque
from dataclasses import dataclass, field

# Lines a phone's log keeps (logcat's ring buffer, counted in lines).
KEPT = 5000
# Seconds between the lines a quiet phone writes while followed.
TICK = 1.0
_SYSTEM_PID = 612
_BOOT = (
    ("I", "SystemServer", "Entered the Android system server!"),
    ("I", "ActivityManager", "System now ready"),
    ("I", "WindowManager", "Screen frozen for +153ms due to Window{a1b2c3 u0 StatusBar}"),
    ("D", "ConnectivityService", "NetworkAgentInfo [WIFI () - 100] validation passed"),
    ("I", "PackageManager", "Finished scanning system apps"),
    (
        "I",
        "ActivityTaskManager",
        "START u0 {act=android.intent.action.MAIN"
        " cat=[android.intent.category.HOME] cmp=com.android.launcher3/.Launcher} from uid 0",
    ),
    ("I", "BootReceiver", "Copying audit failures to DropBox"),
)
_TICKS = (
    ("D", "BatteryService", "level:{level} scale:100 status:2 health:2 present:true"),
    ("I", "wpa_supplicant", "wlan0: CTRL-EVENT-SIGNAL-CHANGE above=1 signal=-52 noise=9999"),
    ("D", "ConnectivityService", "requestNetwork for uid/pid:1000/{pid} activeRequest: null"),
    ("W", "ActivityManager", "Slow operation: 53ms so far, now at startProcess: done"),
    ("I", "PowerManagerService", "Waking up from Dozing (uid=1000 reason=WAKE_REASON)"),
    ("D", "WifiNetworkFactory", "Received a scan result, 14 access points"),
)


def line(when: float, pid: int, tid: int, level: str, tag: str, message: str) -> str:
    """One line as `logcat -v threadtime` prints it."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(when))
    millis = int((when % 1) * 1000)
    return f"{stamp}.{millis:03d} {pid:5d} {tid:5d} {level} {tag:<8}: {message}\n"


@dataclass
class PhoneLog:
    """One phone's log: its lines in order, numbered from 0 (`written` counts them all)."""

    serial: str
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=KEPT))
    written: int = 0

    def __post_init__(self) -> None:
        self._random = random.Random(self.serial)
        booted = time.time() - 60
        for i, (level, tag, message) in enumerate(_BOOT):
            self.write(level, tag, message, when=booted + i * 0.7)

    def write(
        self, level: str, tag: str, message: str, pid: int = _SYSTEM_PID, when: float = 0.0
    ) -> None:
        tid = pid + self._random.randint(0, 40)
        self.lines.append(line(when or time.time(), pid, tid, level, tag, message))
        self.written += 1

    def tick(self) -> None:
        """A line a quiet phone writes now and then."""
        level, tag, message = self._random.choice(_TICKS)
        fields = {"level": self._random.randint(40, 100), "pid": self._random.randint(900, 9000)}
        self.write(level, tag, message.format(**fields))

    def since(self, seen: int) -> tuple[list[str], int]:
        """The lines written after the first `seen` (those still kept), and how many were
        written in all."""
        fresh = min(self.written - seen, len(self.lines))
        return list(itertools.islice(self.lines, len(self.lines) - fresh, None)), self.written

    def clear(self) -> None:
        self.lines.clear()


@dataclass(frozen=True)
class LogcatArgs:
    dump: bool = False  # print what there is, then exit
    clear: bool = False
    tail: int | None = None  # only the last N lines (then exit)


def logcat_args(argv: list[str]) -> LogcatArgs:
    """What `logcat ARGS` asks (argv without `logcat`)."""
    dump = clear = False
    tail = None
    words = iter(argv)
    for word in words:
        if word == "-d":
            dump = True
        elif word == "-c":
            clear = True
        elif word in ("-t", "-T"):
            value = next(words, "")
            tail = int(value) if value.isdigit() else None
        elif word.startswith("-t") and word[2:].isdigit():
            tail = int(word[2:])
    return LogcatArgs(dump, clear, tail)


def logcat_command(command: str) -> list[str] | None:
    """The arguments of a shell command line that runs logcat as the adb client sends it
    (`export ANDROID_LOG_TAGS="''"; exec logcat -d`), or None when it runs something else."""
    try:
        last = shlex.split(command.split(";")[-1])
    except ValueError:
        return None
    if last[:1] == ["exec"]:
        last = last[1:]
    if last[:1] in (["logcat"], ["/system/bin/logcat"]):
        return last[1:]
    return None
