"""A run's phone log (logcat), kept for its attempt: cleared as the run starts, read as the
phone writes it (`logcat -v threadtime`, streamed), marked where each step begins and ends,
the lines that flag a step kept as that step's warnings, bounded and compressed
(host_agent.log_store), and kept as the attempt's artifact of kind "logcat" with its last
step (a gzip file, uploaded with the run's other files before the report). Its recent
lines go to the live tail while someone follows the attempt (host_agent.log_feed).

Step marks are written into the phone's own log (`log -p i -t amc 'step 2 'tap' began'`)
before a step's first action and after its last one, so they sit among the app's lines in
the order the phone logged them, whatever the stream's delay: a line belongs to the step
whose beginning last came before it (a line after a step's end and before the next one's
beginning is still that step's: an app that crashes a moment after a tap). A mark the phone
did not take (a phone gone, a hung one: each mark waits MARK_TIMEOUT at most) is written
into the kept log by the agent instead, with pid 0. Warnings (amc_common.logcat.warning_of:
`FATAL EXCEPTION`, `ANR in`) are said on their step's result: a step's end waits (up to
STEP_SETTLE) until the stream has read its end mark back, so its progress, and a session's
answer, carry what was logged during it; the report has all of them (the run's end waits
up to SETTLE for a last mark). At most MAX_WARNINGS per step, then how many more.

A phone that has no log to give (a device without `PhoneLogs`) or --logcat-max-bytes 0:
nothing is captured. A run with no step keeps no log (nothing to keep it with).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import Callable

import structlog

from amc_common import logcat
from host_agent import metrics
from host_agent.devices import DeviceError, PhoneLogs
from host_agent.log_store import LogStore
from host_agent.results import Kept, RunResult, StepResult

log = structlog.get_logger(__name__)

KIND = "logcat"
# The run's log is kept with its last step at an action index no action reaches (the
# screen recording has 999).
ACTION_INDEX = 998
MARK_TIMEOUT = 2.0
CLEAR_TIMEOUT = 5.0
# How long a step's end, and the run's, wait for the stream to read back their mark.
STEP_SETTLE = 1.0
SETTLE = 2.0
# Lines kept in memory for a live tail's start.
RECENT = 1000
# A line longer than this (bytes) is cut there, the rest a line of its own: logd's own
# lines are at most about 4 KB, and what a phone sends with no newline is held within it.
MAX_LINE = 8 * 1024
MAX_WARNINGS = 10
# Told of the lines read: the number of the first (lines count from 1) and the lines.
Listener = Callable[[int, list[str]], None]


class Capture:
    """One attempt's log. `start()`, marks as the steps go, then `finish()` (or `close()`
    alone, when the run keeps nothing)."""

    def __init__(self, device: PhoneLogs, serial: str, max_bytes: int) -> None:
        self._device = device
        self._serial = serial
        self.store = LogStore(max_bytes)
        self.recent: deque[str] = deque(maxlen=RECENT)
        # The number of the last line read (0: none yet).
        self.seq = 0
        self.listeners: set[Listener] = set()
        # The step the lines read now belong to (the last one begun), and the warnings of
        # each step; those read before any step began go to the first one.
        self._step: int | None = None
        self._early: list[str] = []
        self._warnings: dict[int, list[str]] = {}
        self._more: dict[int, int] = {}
        # The last crash flagged (its pid, its list, its place): the next line names its app.
        self._last_crash: tuple[int, list[str], int] | None = None
        self._reader: asyncio.Task[None] | None = None
        # A mark written, waited for until the reader reads it.
        self._awaited: dict[str, asyncio.Future[None]] = {}
        self.cleared = True
        self.closed = asyncio.Event()

    async def start(self) -> None:
        """The phone's log emptied (what came before is another run's), then read."""
        try:
            await self._device.clear_log(CLEAR_TIMEOUT)
        except DeviceError as exc:
            self.cleared = False
            log.info("phone log not cleared", device=self._serial, error=str(exc))
        self._reader = asyncio.get_running_loop().create_task(
            self._read(), name=f"logcat {self._serial}"
        )

    # -- marks (host_agent.runner's Marks) ------------------------------------------------

    async def began(self, index: int, name: str) -> None:
        await self._mark(logcat.began(index, name))

    async def ended(self, step: StepResult) -> StepResult:
        """The step with its warnings, once the stream has caught up with its end mark
        (STEP_SETTLE at most: its progress, and a session's answer, say what was read by
        then; the report has all)."""
        seconds = step.duration.total_seconds()
        message = logcat.ended(step.index, step.name, step.status.value, seconds)
        await self._mark(message, STEP_SETTLE)
        return dataclasses.replace(step, warnings=self.warnings(step.index))

    async def _mark(self, message: str, settle: float = 0.0) -> None:
        """A mark written into the phone's log (and, with `settle`, read back from its
        stream, that long at most); into the kept log by the agent if the phone took none."""
        if self._reader is not None and not self._reader.done():
            waiter = self._awaited[message] = asyncio.get_running_loop().create_future()
            try:
                await self._device.mark_log(logcat.MARK_TAG, message, MARK_TIMEOUT)
                if settle:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(asyncio.shield(waiter), settle)
                return
            except DeviceError as exc:
                log.info("step mark not written on the phone", device=self._serial, error=str(exc))
            finally:
                self._awaited.pop(message, None)
        # Written here instead: the phone's own order is not known, the agent's is.
        self._take([logcat.line(time.time(), 0, 0, "I", logcat.MARK_TAG, message)])

    def warnings(self, index: int) -> tuple[str, ...]:
        found = self._warnings.get(index, [])
        more = self._more.get(index, 0)
        return (*found, f"… and {more} more") if more else tuple(found)

    # -- reading --------------------------------------------------------------------------

    async def _read(self) -> None:
        partial = b""
        try:
            async for chunk in self._device.follow_log():
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                if len(partial) >= MAX_LINE:
                    lines.append(partial)
                    partial = b""
                self._take([_text(cut) for x in lines for cut in _cut(x)])
        except DeviceError as exc:
            log.info("phone log ended", device=self._serial, error=str(exc))
        except Exception:
            log.exception("phone log reader failed", device=self._serial)
        if partial:
            self._take([_text(partial)])
        for waiter in self._awaited.values():
            if not waiter.done():
                waiter.set_result(None)

    def _take(self, lines: list[str]) -> None:
        if not lines:
            return
        first = self.seq + 1
        for text in lines:
            self.seq += 1
            self.store.add(text)
            self.recent.append(text)
            entry = logcat.parse(text)
            if entry is not None:
                self._heed(entry)
        metrics.LOGCAT_LINES.inc(len(lines))
        for listener in list(self.listeners):
            listener(first, lines)

    def _heed(self, entry: logcat.Entry) -> None:
        if entry.tag == logcat.MARK_TAG:
            waiter = self._awaited.pop(entry.message, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        mark = logcat.mark_of(entry)
        if mark is not None:
            index, began = mark
            if began and (self._step is None or index >= self._step):
                if self._step is None:
                    for early in self._early:
                        self._flag(index, early)
                self._step = index
            return
        crash, self._last_crash = self._last_crash, None
        if crash is not None and entry.pid == crash[0] and entry.message.startswith("Process: "):
            found, at = crash[1], crash[2]  # which app it was: the next line says
            found[at] = f"{found[at]} ({entry.message})"[: logcat.WARNING_CHARS]
        warning = logcat.warning_of(entry)
        if warning is None:
            return
        found = self._early if self._step is None else self._warnings.setdefault(self._step, [])
        if self._step is not None and len(found) >= MAX_WARNINGS:
            self._more[self._step] = self._more.get(self._step, 0) + 1
            return
        found.append(warning)
        if "FATAL EXCEPTION" in warning:
            self._last_crash = (entry.pid, found, len(found) - 1)

    def _flag(self, index: int, warning: str) -> None:
        found = self._warnings.setdefault(index, [])
        if len(found) < MAX_WARNINGS:
            found.append(warning)
        else:
            self._more[index] = self._more.get(index, 0) + 1

    # -- the end --------------------------------------------------------------------------

    async def finish(self, result: RunResult) -> RunResult:
        """The run's result with each step's warnings and the log kept with its last step
        (to be uploaded with its files), once the stream has caught up with a last mark."""
        await self._settle()
        self.close()
        if not result.steps:
            return result
        steps = [dataclasses.replace(s, warnings=self.warnings(s.index)) for s in result.steps]
        data = self.store.gzip()
        metrics.LOGCAT_BYTES_KEPT.inc(len(data))
        # Said only when the log is not all it might be.
        said = [f"{self.store.left_out} of its lines left out"] if self.store.left_out else []
        said += [] if self.cleared else ["the phone's log could not be cleared first"]
        facts = {"logcat": "; ".join(said)} if said else {}
        last = steps[-1]
        steps[-1] = dataclasses.replace(
            last,
            kept=(*last.kept, Kept(KIND, data, ACTION_INDEX)),
            data={**last.data, **facts},
        )
        return dataclasses.replace(result, steps=tuple(steps))

    async def _settle(self) -> None:
        """Until the reader has read a last mark written now (SETTLE at most)."""
        if self._reader is not None and not self._reader.done():
            await self._mark(f"run ended ({self.seq} lines read)", SETTLE)

    def close(self) -> None:
        """Stop reading (the phone's logcat ends with its connection)."""
        if self._reader is not None:
            self._reader.cancel()
        self.closed.set()


def capture_for(device: object, serial: str, max_bytes: int) -> Capture | None:
    """A capture of `device`'s log, or None when it has none to give or the agent keeps
    none (max_bytes 0)."""
    if max_bytes <= 0 or not isinstance(device, PhoneLogs):
        return None
    return Capture(device, serial, max_bytes)


def _cut(line: bytes) -> list[bytes]:
    """A line read, in pieces of MAX_LINE bytes at most."""
    if len(line) <= MAX_LINE:
        return [line]
    return [line[i : i + MAX_LINE] for i in range(0, len(line), MAX_LINE)]


def _text(line: bytes) -> str:
    return line.rstrip(b"\r").decode("utf-8", "replace")
