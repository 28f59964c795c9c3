"""A simulated phone's log (what logd holds): believable `logcat -v threadtime` lines for
a simulated phone (host_agent.simulated, and `adb logcat` through its door:
host_agent.simulated_door) and the tests' fake phone behind the adb wire, one log per
phone whoever reads it.

It begins with a few lines of the phone's boot; then the system chatters (a few lines a
second from ActivityManager, BatteryService, Wi-Fi, SurfaceFlinger, … at several
priorities, made up when the log is next read or written, so an idle phone costs nothing
until then; a log made with `chatter=0` has no system lines at all, its boot's neither);
what is done on the phone is logged as Android logs it: a launch (`START u0 {…}`, `Start
proc`, `Displayed`), a stop (`Force stopping`), taps, swipes, keys and typed text as input
events. A crash on demand: `am crash PACKAGE` (Android's own command) writes
AndroidRuntime's `FATAL EXCEPTION` block and the process's death; `log -p e -t
ActivityManager 'ANR in …'` writes an ANR line, as `log` writes any line on a phone.

Commands answered (`answer`): `logcat -c` (clear), `logcat -d` and `logcat -t N` (the log
so far, its last N lines; `-v usec`: times to the microsecond, as the agent reads them),
`log [-p P] [-t TAG] MESSAGE`, `am crash PACKAGE`; `follow()` is `logcat` without -d, -c
or -t: what the log holds, then each line as it is written,
until the phone is unplugged. `logcat_command` finds logcat in a command line as the adb
client sends it (`export ANDROID_LOG_TAGS="''"; exec logcat -d`), `logcat_args` reads its
options (others are taken and ignored).
"""

from __future__ import annotations

import asyncio
import random
import shlex
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import islice

from amc_common.logcat import LEVELS
from amc_common.logcat import line as threadtime

# Lines logd keeps (the oldest go), and the chatter of an idle system, lines a second.
CAPACITY = 5000
CHATTER_PER_SECOND = 3.0
# After a long quiet spell, at most this many chatter lines are made up at once.
MOST_CHATTER = 200
_SYSTEM_PID = 1402
# The phone booted this long before its log was made.
_UP = 60.0
# (tag, priority, message): the boot's lines, 0.7 s apart.
_BOOT: tuple[tuple[str, str, str], ...] = (
    ("SystemServer", "I", "Entered the Android system server!"),
    ("ActivityManager", "I", "System now ready"),
    ("WindowManager", "I", "Screen frozen for +153ms due to Window{a1b2c3 u0 StatusBar}"),
    ("ConnectivityService", "D", "NetworkAgentInfo [WIFI () - 100] validation passed"),
    ("PackageManager", "I", "Finished scanning system apps"),
    (
        "ActivityTaskManager",
        "I",
        "START u0 {act=android.intent.action.MAIN"
        " cat=[android.intent.category.HOME] cmp=com.android.launcher3/.Launcher} from uid 0",
    ),
    ("BootReceiver", "I", "Copying audit failures to DropBox"),
)

# (tag, priority, message): the system's own lines, picked at random.
CHATTER: tuple[tuple[str, str, str], ...] = (
    (
        "ActivityManager",
        "I",
        "Start proc {pid}:com.google.android.gms.persistent/u0a{uid} for service",
    ),
    ("BatteryService", "D", "Processing new values: level={level}, temperature=301, voltage=4312"),
    ("ConnectivityService", "D", "NetworkAgentInfo [WIFI () - 100] validation passed"),
    ("WifiHAL", "D", "Received link layer stats, rssi={rssi}"),
    ("SurfaceFlinger", "D", "Display 0 HWC layers: 4 frames={frames}"),
    ("PowerManagerService", "D", "userActivityNoUpdateLocked: eventTime={frames}"),
    ("AlarmManager", "D", "Triggering alarm #{uid}: *job.delay*"),
    ("JobScheduler", "I", "Running job {uid} com.android.vending/.VendingJobService"),
    ("chatty", "I", "uid=1000(system) Binder:{pid}_3 identical 4 lines"),
    ("NetworkController", "D", "onSignalStrengthsChanged level=4"),
    ("ActivityTaskManager", "W", "Slow operation: 52ms so far, now at startProcess"),
    ("GnssLocationProvider", "D", "reportLocation: lat=48.85, lon=2.35, accuracy=12.0"),
    ("audit", "W", 'avc: denied {{ read }} for name="stat" dev="proc" scontext=u:r:app'),
    ("Zygote", "I", "Process {pid} exited cleanly (0)"),
    ("DropBoxManagerService", "E", "Failed to read dropbox entry: No such file"),
)
_CRASH_TRACE = (
    "android.app.RemoteServiceException$CrashedByAdbException: shell-induced crash",
    "\tat android.app.ActivityThread.throwRemoteServiceException(ActivityThread.java:2013)",
    "\tat android.app.ActivityThread$H.handleMessage(ActivityThread.java:2279)",
    "\tat android.os.Handler.dispatchMessage(Handler.java:106)",
    "\tat android.os.Looper.loopOnce(Looper.java:205)",
    "\tat android.os.Looper.loop(Looper.java:294)",
    "\tat android.app.ActivityThread.main(ActivityThread.java:8177)",
)
_KEYS = {3: "HOME", 4: "BACK", 24: "VOLUME_UP", 25: "VOLUME_DOWN", 26: "POWER", 66: "ENTER"}


# A line logd holds: its time (seconds since the epoch), pid (= tid), priority, tag, message.
_Entry = tuple[float, int, str, str, str]


def _text(entries: Iterable[_Entry], usec: bool) -> str:
    """Entries as `logcat -v threadtime` prints them (`usec`: with `-v usec`)."""
    return "".join(f"{threadtime(t, p, p, v, g, m, usec=usec)}\n" for t, p, v, g, m in entries)


class PhoneLog:
    """One phone's log buffer. `clock` is the phone's wall clock (time.time)."""

    def __init__(
        self,
        serial: str,
        clock: Callable[[], float] = time.time,
        chatter: float = CHATTER_PER_SECOND,
    ) -> None:
        self._clock = clock
        self._chatter = chatter
        self._random = random.Random(serial)
        self._lines: deque[_Entry] = deque(maxlen=CAPACITY)
        # The number of the next line written (lines count from 0 since the phone began).
        self._next = 0
        self._changed = asyncio.Event()
        self._chatted_at = clock()
        # Running apps: package -> pid.
        self.running: dict[str, int] = {}
        if chatter > 0:
            booted = self._chatted_at - _UP
            for i, (tag, priority, text) in enumerate(_BOOT):
                self._add(booted + i * 0.7, _SYSTEM_PID, priority, tag, text)

    # -- writing ------------------------------------------------------------------------

    def write(self, priority: str, tag: str, message: str, pid: int = _SYSTEM_PID) -> None:
        self._chat()
        self._add(self._clock(), pid, priority, tag, message)

    def _add(self, when: float, pid: int, priority: str, tag: str, message: str) -> None:
        self._lines.append((when, pid, priority, tag, message))
        self._next += 1
        self._changed.set()

    def _chat(self) -> None:
        """The system's lines since the last look, spread over the time that passed."""
        now = self._clock()
        due = int((now - self._chatted_at) * self._chatter)
        if due <= 0:
            return
        start = self._chatted_at
        # The fraction of a line not due yet stays for the next look.
        self._chatted_at = now if due > MOST_CHATTER else start + due / self._chatter
        for i in range(min(due, MOST_CHATTER)):
            tag, priority, text = self._random.choice(CHATTER)
            facts = {
                "pid": self._random.randint(2000, 30000),
                "uid": self._random.randint(10, 300),
                "level": self._random.randint(40, 100),
                "rssi": -self._random.randint(40, 80),
                "frames": self._random.randint(1000, 99999),
            }
            when = start + (self._chatted_at - start) * (i + 1) / min(due, MOST_CHATTER)
            pid = _SYSTEM_PID if tag != "chatty" else facts["pid"]
            self._add(when, pid, priority, tag, text.format(**facts))

    def clear(self) -> None:
        self._chat()
        self._lines.clear()

    # -- reading ------------------------------------------------------------------------

    def dump(self, last: int | None = None, usec: bool = False) -> str:
        """`logcat -d`: what the log holds now (`logcat -t N`: its `last` lines; `usec`:
        `-v usec`, times to the microsecond)."""
        self._chat()
        kept = len(self._lines) if last is None else min(max(last, 0), len(self._lines))
        return _text(islice(self._lines, len(self._lines) - kept, None), usec)

    async def follow(
        self, gone: asyncio.Event | None = None, usec: bool = False
    ) -> AsyncIterator[bytes]:
        """`logcat`: what the log holds, then each line as it is written, until `gone`
        (the phone unplugged) is set (`usec`: `-v usec`, times to the microsecond)."""
        self._chat()
        cursor = self._next - len(self._lines)
        while gone is None or not gone.is_set():
            first = self._next - len(self._lines)
            cursor = max(cursor, first)  # lines cleared or pushed out meanwhile
            if cursor < self._next:
                fresh = list(islice(reversed(self._lines), self._next - cursor))[::-1]
                cursor = self._next
                yield _text(fresh, usec).encode()
                continue
            self._changed.clear()
            wait = asyncio.ensure_future(self._changed.wait())
            stop = asyncio.ensure_future(gone.wait()) if gone is not None else None
            try:
                await asyncio.wait(
                    [w for w in (wait, stop) if w is not None],
                    timeout=1.0 / max(self._chatter, 0.1),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                wait.cancel()
                if stop is not None:
                    stop.cancel()
            self._chat()

    # -- what is done on the phone -------------------------------------------------------

    def saw(self, action: str, args: Mapping[str, object]) -> None:
        """What an action done on the phone writes into its log."""
        if action == "tap":
            self._touch(("ACTION_DOWN", "ACTION_UP"), args.get("x"), args.get("y"))
        elif action == "swipe":
            self._touch(("ACTION_DOWN",), args.get("x1"), args.get("y1"))
            self._touch(("ACTION_MOVE", "ACTION_UP"), args.get("x2"), args.get("y2"))
        elif action == "key":
            code = int(str(args.get("keycode", 0)))
            name = _KEYS.get(code, str(code))
            for edge in ("ACTION_DOWN", "ACTION_UP"):
                self.write("D", "InputDispatcher", f"Delivering key KEYCODE_{name} ({edge})")
        elif action == "input_text":
            size = len(str(args.get("text", "")))
            self.write("D", "InputConnectionAdaptor", f"commitText length={size}")
        elif action == "launch_app":
            self.launched(str(args.get("package", "")), str(args.get("activity", "")))
        elif action == "stop_app":
            self.stopped(str(args.get("package", "")))
        elif action == "screenshot":
            self.write("D", "SurfaceFlinger", "captureDisplay: screencap -p")
        elif action == "ui_dump":
            self.write("I", "UiAutomation", "Dumped the window hierarchy")

    def _touch(self, edges: tuple[str, ...], x: object, y: object) -> None:
        for edge in edges:
            self.write("D", "InputDispatcher", f"Delivering touch {edge} (x={x}.0, y={y}.0)")

    def launched(self, package: str, activity: str) -> None:
        component = f"{package}/{activity or '.MainActivity'}"
        self.write(
            "I",
            "ActivityTaskManager",
            "START u0 {act=android.intent.action.MAIN cat=[android.intent.category.LAUNCHER]"
            f" flg=0x10000000 cmp={component}}} from uid 2000",
        )
        if package not in self.running:
            pid = self.running[package] = self._random.randint(5000, 32000)
            self.write(
                "I", "ActivityManager", f"Start proc {pid}:{package}/u0a123 for top-activity"
            )
            self.write("I", package.rsplit(".", 1)[-1], "onCreate", pid=pid)
        took = self._random.randint(120, 900)
        self.write("I", "ActivityTaskManager", f"Displayed {component}: +{took}ms")

    def stopped(self, package: str) -> None:
        self.write(
            "I", "ActivityManager", f"Force stopping {package} appid=10123 user=0: from pid 2000"
        )
        pid = self.running.pop(package, None)
        if pid is not None:
            self.write(
                "I", "ActivityManager", f"Killing {pid}:{package}/u0a123 (adj 0): stop {package}"
            )

    def crash(self, package: str) -> None:
        """`am crash PACKAGE`: the app dies with AndroidRuntime's FATAL EXCEPTION block."""
        pid = self.running.pop(package, None) or self._random.randint(5000, 32000)
        self.write("E", "AndroidRuntime", "FATAL EXCEPTION: main", pid=pid)
        self.write("E", "AndroidRuntime", f"Process: {package}, PID: {pid}", pid=pid)
        for text in _CRASH_TRACE:
            self.write("E", "AndroidRuntime", text, pid=pid)
        self.write("I", "Process", f"Sending signal. PID: {pid} SIG: 9", pid=pid)
        self.write("I", "ActivityManager", f"Process {package} (pid {pid}) has died: fg  TOP")

    # -- shell commands -----------------------------------------------------------------

    def answer(self, command: str) -> tuple[int, str] | None:
        """The log's commands (`logcat -c`, `logcat -d`, `log …`, `am crash …`): (exit code,
        output); None for any other command."""
        try:
            argv = shlex.split(command)
        except ValueError:
            return None
        if argv[:1] == ["logcat"]:
            asked = logcat_args(argv[1:])
            if asked.clear:
                self.clear()
                return 0, ""
            return 0, self.dump(asked.tail, asked.usec)
        if argv[:1] == ["log"]:
            return self._log(argv[1:])
        if argv[:2] == ["am", "crash"] and len(argv) == 3:
            self.crash(argv[2])
            return 0, ""
        return None

    def _log(self, args: list[str]) -> tuple[int, str]:
        """`log [-p PRIORITY] [-t TAG] MESSAGE…`, as Android's log command."""
        priority, tag = "I", "log"
        while len(args) >= 2 and args[0] in ("-p", "-t"):
            if args[0] == "-p":
                priority = args[1][:1].upper()
            else:
                tag = args[1]
            args = args[2:]
        if len(priority) != 1 or priority not in LEVELS or not args:
            return 1, "usage: log [-p priorityChar] [-t tag] message\n"
        self.write(priority, tag, " ".join(args), pid=_SYSTEM_PID + 3000)
        return 0, ""


@dataclass(frozen=True)
class LogcatArgs:
    dump: bool = False  # print what there is, then exit
    clear: bool = False
    tail: int | None = None  # only the last N lines (then exit)
    usec: bool = False  # `-v usec`: times to the microsecond

    @property
    def follows(self) -> bool:
        """Whether it follows the log until stopped (no -d, -c or -t)."""
        return not (self.dump or self.clear or self.tail is not None)


def logcat_args(argv: list[str]) -> LogcatArgs:
    """What `logcat ARGS` asks (argv without `logcat`)."""
    dump = clear = usec = False
    tail = None
    words = iter(argv)
    for word in words:
        if word == "-v":
            usec = usec or next(words, "") == "usec"
        elif word == "-d":
            dump = True
        elif word == "-c":
            clear = True
        elif word in ("-t", "-T"):
            value = next(words, "")
            tail = int(value) if value.isdigit() else None
        elif word.startswith("-t") and word[2:].isdigit():
            tail = int(word[2:])
    return LogcatArgs(dump, clear, tail, usec)


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
