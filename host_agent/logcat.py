"""A run's phone log (logcat), kept for its attempt: cleared as the run starts, read as the
phone writes it (`logcat -v threadtime -v usec`, streamed), marked where each step begins
and ends, the lines that flag a step kept as that step's warnings, bounded and compressed
(host_agent.log_store), and kept as the attempt's artifact of kind "logcat" with its last
step (a gzip file, uploaded with the run's other files before the report). Its recent
lines go to the live tail while someone follows the attempt (host_agent.log_feed).

Steps are marked by the phone's clock, with nothing written on the phone per step: as the
run starts the agent writes one line into the phone's log (`log -p i -t amc 'run began'`)
and reads it back, which tells the phone's clock against its own (the line's time less the
midpoint of the write's round trip; up to CLOCK_TRIES lines when the round trip is slow,
the quickest one's: the run waits for the first only, the others are written while it goes
on, and make the clock finer from then on). A phone behind adb empties its log, writes that
line and starts the stream in one command (host_agent.adb_logcat: one round trip where
three were), the line's write then bounded by the stream's start and the line's reading. A
step's beginning and end are then times on the phone's clock, and their marks (`step 2
'tap' began`, `… ended: ok in 0.31s`, pid 0) go into the kept log before the first line
stamped after them (or after MARK_FLUSH when none comes). The lines that flag a step are
its warnings (host_agent.log_warnings: which step a line is of); when the phone took no
first line (it is gone or hung: MARK_TIMEOUT, SETTLE), lines go to the step begun last when
they are read, and marks in as they are made. A step's progress, and a session's answer,
carry the warnings read by its end (no step waits for the stream); the report carries
every one on its own step, once the stream has read back a last line written as the run
ends (SETTLE at most).

A phone that has no log to give (a device without `PhoneLogs`) or --logcat-max-bytes 0:
nothing is captured. A run with no step keeps no log (nothing to keep it with).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

import structlog

from amc_common import logcat
from host_agent import metrics
from host_agent.devices import DeviceError, PhoneLogs
from host_agent.log_clock import PhoneClock
from host_agent.log_store import LogStore
from host_agent.log_warnings import StepWarnings
from host_agent.results import Kept, RunResult, StepResult

log = structlog.get_logger(__name__)

KIND = "logcat"
# The run's log is kept with its last step at an action index no action reaches (the
# screen recording has 999).
ACTION_INDEX = 998
MARK_TIMEOUT = 2.0
CLEAR_TIMEOUT = 5.0
# How long the run's start and its end wait for the stream to read back their mark.
SETTLE = 2.0
# A step's mark no line stamped later has followed goes into the log after this long.
MARK_FLUSH = 1.0
# The phone's clock is read from up to this many lines written, the one whose write was
# answered soonest (a write answered within CLOCK_GOOD seconds ends the tries).
CLOCK_TRIES = 3
CLOCK_GOOD = 0.002
# The run's first line, and the one a phone writes before it when its log was not emptied.
FIRST = "run began"
NOT_CLEARED = "the log was not cleared"
# Lines kept in memory for a live tail's start.
RECENT = 1000
# A line longer than this (bytes) is cut there, the rest a line of its own: logd's own
# lines are at most about 4 KB, and what a phone sends with no newline is held within it.
MAX_LINE = 8 * 1024
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
        # The phone's clock, learnt as the run starts; not known when the phone took no
        # line then (lines then go to the step begun last when they are read).
        self.clock = PhoneClock()
        # Marks not in the log yet (phone time, agent time, line): each goes in before the
        # first line stamped after it, or after MARK_FLUSH.
        self._marks: deque[tuple[float, float, str]] = deque()
        self._flush: asyncio.TimerHandle | None = None
        self._warnings = StepWarnings(self.clock)
        self._reader: asyncio.Task[None] | None = None
        # The clock's further lines, written while the run goes on (start()).
        self._refining: asyncio.Task[None] | None = None
        # The latest mark's time: marks stay in order when the clock is made finer.
        self._last_mark = -math.inf
        # A line written on the phone, waited for until the reader reads it (its entry).
        self._awaited: dict[str, asyncio.Future[logcat.Entry | None]] = {}
        self.cleared = True
        self.closed = asyncio.Event()

    async def start(self) -> None:
        """The phone's log emptied (what came before is another run's), then read; one
        mark written on the phone and read back tells its clock against the agent's. A
        phone that can (`follow_fresh_log`: adb's) does the three in one command."""
        fresh = getattr(self._device, "follow_fresh_log", None)
        if fresh is not None:
            slow = await self._start_fresh(fresh(logcat.MARK_TAG, FIRST, NOT_CLEARED))
        else:
            try:
                await self._device.clear_log(CLEAR_TIMEOUT)
            except DeviceError as exc:
                self.cleared = False
                log.info("phone log not cleared", device=self._serial, error=str(exc))
            self._reader = self._reading(self._device.follow_log())
            slow = not await self._clock_read(FIRST)
        if slow:
            # The clock is known roughly, and made finer while the run goes on (no action
            # waits for a second line's round trip).
            self._refining = asyncio.get_running_loop().create_task(
                self._refine(), name=f"logcat clock {self._serial}"
            )

    async def _start_fresh(self, stream: AsyncIterator[bytes]) -> bool:
        """Read from a stream that empties the log and writes FIRST into it as it starts:
        the line read back (SETTLE at most) tells the clock, its write bounded by the
        stream's start and the line's reading. Whether the clock wants finer lines."""
        waiter = self._awaited[FIRST] = asyncio.get_running_loop().create_future()
        before = time.monotonic()
        self._reader = self._reading(stream)
        try:
            entry = await asyncio.wait_for(asyncio.shield(waiter), SETTLE)
        except TimeoutError:
            entry = None
        finally:
            self._awaited.pop(FIRST, None)
        if entry is None:  # written into the kept log by the agent instead, with pid 0
            self._take([logcat.line(time.time(), 0, 0, "I", logcat.MARK_TAG, FIRST)])
            return False
        return not self._learnt(before, time.monotonic(), entry)

    def _reading(self, stream: AsyncIterator[bytes]) -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(
            self._read(stream), name=f"logcat {self._serial}"
        )

    async def _clock_read(self, message: str) -> bool:
        """One line written and read back, the phone's clock learnt from it; whether no
        further line is worth writing (its write was quick, or the phone took none)."""
        before = time.monotonic()
        entry, after = await self._written(message)
        return entry is None or self._learnt(before, after, entry)

    def _learnt(self, before: float, after: float, entry: logcat.Entry) -> bool:
        """The clock learnt from a line written between `before` and `after`; whether it is
        as good as it gets (the write was quick, or the line had no time)."""
        if (phone := self.clock.stamp(entry.when)) is None:
            return True
        self.clock.learn(before, after, phone)
        return after - before <= CLOCK_GOOD

    async def _refine(self) -> None:
        for i in range(1, CLOCK_TRIES):
            if await self._clock_read(f"clock {i + 1}"):
                return

    # -- marks (host_agent.runner's Marks) ------------------------------------------------

    async def began(self, index: int, name: str) -> None:
        """From now on (the phone's clock) the lines are step `index`'s; its mark is put
        into the log, nothing is written on the phone."""
        self._warnings.began(index, self._mark(logcat.began(index, name)))

    async def ended(self, step: StepResult) -> StepResult:
        """The step with the warnings read by now (its progress, and a session's answer,
        say those; a line read later is on the step in the report)."""
        seconds = step.duration.total_seconds()
        self._mark(logcat.ended(step.index, step.name, step.status.value, seconds))
        found = self.warnings(step.index)
        return dataclasses.replace(step, warnings=found) if found else step

    def _mark(self, message: str) -> float | None:
        """A mark at this moment, put into the log at its place on the phone's clock (its
        time; None when the phone's clock is not known: then at once, on the agent's)."""
        now, at = time.monotonic(), self.clock.now()
        if at is None or self._reader is None or self._reader.done():
            self._take([logcat.line(time.time(), 0, 0, "I", logcat.MARK_TAG, message)])
            return None
        at = self._last_mark = max(at, self._last_mark)
        line = logcat.line(at, 0, 0, "I", logcat.MARK_TAG, message, usec=True, local=False)
        self._marks.append((at, now, line))
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_later(MARK_FLUSH, self._flush_due)
        return at

    def _flush_due(self) -> None:
        """The marks no later line has followed for MARK_FLUSH go into the log."""
        self._flush = None
        due, out = time.monotonic() - MARK_FLUSH, []
        while self._marks and self._marks[0][1] <= due:
            out.append(self._marks.popleft()[2])
        self._put(out)
        if self._marks:
            self._flush = asyncio.get_running_loop().call_later(MARK_FLUSH, self._flush_due)

    def _marks_until(self, at: float = math.inf) -> list[str]:
        """The marks waiting up to `at` on the phone's clock (all of them), taken."""
        out = []
        while self._marks and self._marks[0][0] <= at:
            out.append(self._marks.popleft()[2])
        return out

    async def _written(
        self, message: str, settle: float = SETTLE
    ) -> tuple[logcat.Entry | None, float]:
        """A line written into the phone's log and read back from its stream (`settle` at
        most): its entry (None when the phone did not take it in time: then it is written
        into the kept log by the agent instead, with pid 0), and when the write was
        answered (time.monotonic)."""
        if self._reader is not None and not self._reader.done():
            waiter = self._awaited[message] = asyncio.get_running_loop().create_future()
            try:
                await self._device.mark_log(logcat.MARK_TAG, message, MARK_TIMEOUT)
                answered = time.monotonic()
                with contextlib.suppress(TimeoutError):
                    return await asyncio.wait_for(asyncio.shield(waiter), settle), answered
                return None, answered
            except DeviceError as exc:
                log.info("mark not written on the phone", device=self._serial, error=str(exc))
            finally:
                self._awaited.pop(message, None)
        line = logcat.line(time.time(), 0, 0, "I", logcat.MARK_TAG, message)
        self._take([*self._marks_until(), line])  # the marks came before
        return None, time.monotonic()

    def warnings(self, index: int) -> tuple[str, ...]:
        return self._warnings.of(index)

    # -- reading --------------------------------------------------------------------------

    async def _read(self, stream: AsyncIterator[bytes]) -> None:
        partial = b""
        try:
            async for chunk in stream:
                lines = (partial + chunk).split(b"\n")
                partial = lines.pop()
                if len(partial) >= MAX_LINE:
                    lines.append(partial)
                    partial = b""
                self._put([_text(cut) for x in lines for cut in _cut(x)])
        except DeviceError as exc:
            log.info("phone log ended", device=self._serial, error=str(exc))
        except Exception:
            log.exception("phone log reader failed", device=self._serial)
        if partial:
            self._put([_text(partial)])
        self._take(self._marks_until())  # no line will follow them now
        for waiter in self._awaited.values():
            if not waiter.done():
                waiter.set_result(None)

    def _put(self, lines: list[str]) -> None:
        """Lines read from the phone, each after the marks stamped before it."""
        if not self._marks:
            self._take(lines)
            return
        out: list[str] = []
        for text in lines:
            at = self.clock.stamp(text) if self._marks else None
            if at is not None:
                out += self._marks_until(at)
            out.append(text)
        self._take(out)

    def _take(self, lines: list[str]) -> None:
        if not lines:
            return
        first = self.seq + 1
        for text in lines:
            self.seq += 1
            self.store.add(text)
            self.recent.append(text)
            if self._awaited or self._warnings.last_crash or _flags(text):  # else nothing to heed
                entry = logcat.parse(text)
                if entry is not None:
                    self._heed(entry)
        metrics.LOGCAT_LINES.inc(len(lines))
        for listener in list(self.listeners):
            listener(first, lines)

    def _heed(self, entry: logcat.Entry) -> None:
        if entry.tag != logcat.MARK_TAG:
            self._warnings.heed(entry)
            return
        if entry.message == NOT_CLEARED:
            self.cleared = False
        waiter = self._awaited.pop(entry.message, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(entry)

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
        """Until the reader has read a last mark written now (SETTLE at most); the marks
        still waiting go in before it (or after it when it did not come)."""
        self._stop_refining()
        if self._reader is not None and not self._reader.done():
            await self._written(f"run ended ({self.seq} lines read)", SETTLE)
        self._take(self._marks_until())

    def _stop_refining(self) -> None:
        if self._refining is not None:
            self._refining.cancel()
            self._refining = None

    def close(self) -> None:
        """Stop reading (the phone's logcat ends with its connection)."""
        self._stop_refining()
        if self._reader is not None:
            self._reader.cancel()
        if self._flush is not None:
            self._flush.cancel()
            self._flush = None
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


def _flags(text: str) -> bool:
    """Whether a line may flag a step (logcat.warning_of), looked at cheaply."""
    return "FATAL EXCEPTION" in text or "ANR in " in text


def _text(line: bytes) -> str:
    return line.rstrip(b"\r").decode("utf-8", "replace")
