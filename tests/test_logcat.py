"""The parts of a run's phone log, each on its own: a threadtime line and its filters
(amc_common.logcat), a simulated phone's log (host_agent.simulated_logcat), the bounded
gzip store (host_agent.log_store), an attempt's capture with its marks and warnings
(host_agent.logcat) on a simulated phone, and a followed attempt's tail on the control
plane (control_plane.log_tails)."""

from __future__ import annotations

import asyncio
import gzip
import random
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any, cast

import pytest

from amc_common import logcat
from amc_common.statuses import Outcome
from control_plane.log_hosts import Gunzip
from control_plane.log_tails import RING_CHARS, Tails
from host_agent.devices import DeviceLost
from host_agent.log_feed import MAX_PENDING_CHARS, LogFeed
from host_agent.log_store import BLOCK, LogStore
from host_agent.log_warnings import MAX_WARNINGS
from host_agent.logcat import (
    CLOCK_GOOD,
    CLOCK_TRIES,
    MAX_LINE,
    SETTLE,
    Capture,
    capture_for,
)
from host_agent.results import RunResult, StepResult, StepStatus
from host_agent.simulated import SimulatedSource
from host_agent.simulated_logcat import PhoneLog
from tests.support import eventually
from tests.support.runner_fakes import FakeDevice

LINE = "12-04 23:03:01.123  4242  4250 E AndroidRuntime: FATAL EXCEPTION: main"


def test_a_threadtime_line_is_read_into_its_parts() -> None:
    """THEN time, pid, priority, tag (its padding gone) and message are read; a divider
    or a cut line is no entry."""
    entry = logcat.parse(LINE)
    assert entry == logcat.Entry(
        "12-04 23:03:01.123", 4242, "E", "AndroidRuntime", "FATAL EXCEPTION: main"
    )
    made = logcat.line(0.5, 7, 8, "I", "amc", "step 1 'tap' began")
    assert logcat.parse(made) == logcat.Entry(made[:18], 7, "I", "amc", "step 1 'tap' began")
    assert logcat.parse("--------- beginning of main") is None
    assert logcat.parse("12-04 23:03") is None


def test_priorities_and_tags_are_read_as_a_filter_names_them() -> None:
    """THEN letters and words of any case are priorities, anything else is refused
    naming them; tags are 1 to 128 printable characters without ':', at most 20."""
    assert [logcat.level(x) for x in ("", "e", "E", "error", "Warn", "fatal", "v")] == [
        "",
        "E",
        "E",
        "E",
        "W",
        "F",
        "V",
    ]
    with pytest.raises(ValueError, match="not a log priority"):
        logcat.level("loud")
    assert logcat.tags([" ActivityManager "]) == {"ActivityManager"}
    for bad in (["a:b"], [""], ["x" * 129], ["\x00"]):
        with pytest.raises(ValueError, match="not a log tag"):
            logcat.tags(bad)
    with pytest.raises(ValueError, match="at most 20"):
        logcat.tags([f"t{i}" for i in range(21)])


def test_a_filter_keeps_its_priorities_and_tags_and_always_the_marks() -> None:
    lines = [
        logcat.line(0, 1, 1, "D", "Wifi", "scan"),
        logcat.line(0, 1, 1, "W", "Wifi", "weak"),
        logcat.line(0, 1, 1, "E", "AndroidRuntime", "FATAL EXCEPTION: main"),
        logcat.line(0, 1, 1, "I", "amc", "step 1 'tap' began"),
        "--------- beginning of crash",
    ]
    assert logcat.Filter().apply(lines) == lines
    assert logcat.Filter("W").apply(lines) == lines[1:]
    assert logcat.Filter("", frozenset({"Wifi"})).apply(lines) == [*lines[:2], *lines[3:]]
    assert logcat.Filter("E", frozenset({"Wifi"})).apply(lines) == lines[3:]


def test_a_crash_and_an_anr_are_flagged_and_nothing_else() -> None:
    flagged = [
        logcat.line(0, 9, 9, "E", "AndroidRuntime", "FATAL EXCEPTION: main"),
        logcat.line(0, 9, 9, "E", "ActivityManager", "ANR in com.example (x)"),
    ]
    quiet = [
        logcat.line(0, 9, 9, "I", "AndroidRuntime", "FATAL EXCEPTION: in an info line"),
        logcat.line(0, 9, 9, "E", "amc", "FATAL EXCEPTION: a mark's words"),
        logcat.line(0, 9, 9, "E", "Foo", "said ANR in passing"),
    ]
    assert all(logcat.warning_of(e) for x in flagged if (e := logcat.parse(x)))
    assert not any(logcat.warning_of(e) for x in quiet if (e := logcat.parse(x)))


def test_a_mark_says_its_step_from_1_and_is_read_back_0_based() -> None:
    began = logcat.began(0, "tap\non 'OK'")
    assert began == "step 1 'tap on 'OK'' began"
    entry = logcat.parse(logcat.line(0, 1, 1, "I", "amc", began))
    assert entry is not None and logcat.mark_of(entry) == (0, True)
    ended = logcat.ended(11, "wait", "ok", 0.304)
    assert ended == "step 12 'wait' ended: ok in 0.30s"
    entry = logcat.parse(logcat.line(0, 1, 1, "I", "amc", ended))
    assert entry is not None and logcat.mark_of(entry) == (11, False)


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_simulated_phones_log_chatters_and_logs_what_is_done_on_it() -> None:
    """THEN an idle phone's log grows by a few system lines a second of several tags and
    priorities; a launch, taps, a stop and `am crash` are logged as Android logs them;
    `logcat -c` empties it and `log` writes a line."""
    clock = Clock()
    phone = PhoneLog("sim-0", clock=clock)
    clock.now += 60
    chatter = [e for x in phone.dump().splitlines() if (e := logcat.parse(x))]
    assert 120 <= len(chatter) <= 200
    assert len({e.tag for e in chatter}) >= 8 and len({e.level for e in chatter}) >= 3
    assert phone.answer("logcat -c") == (0, "")
    assert phone.dump() == ""
    phone.saw("launch_app", {"package": "com.example.shop", "activity": ""})
    phone.saw("tap", {"x": 5, "y": 6})
    assert phone.answer("am crash com.example.shop") == (0, "")
    assert phone.answer("log -p w -t Mine 'hello there'") == (0, "")
    text = phone.dump()
    assert "cmp=com.example.shop/.MainActivity" in text and "Displayed com.example.shop" in text
    assert "Delivering touch ACTION_DOWN (x=5.0, y=6.0)" in text
    assert "E AndroidRuntime: FATAL EXCEPTION: main" in text
    assert "Process: com.example.shop, PID: " in text and "has died" in text
    assert " W Mine    : hello there" in text
    assert phone.answer("log") == (1, "usage: log [-p priorityChar] [-t tag] message\n")
    assert phone.answer("ls") is None


async def test_a_follow_of_a_simulated_phones_log_gets_what_is_written_and_ends_unplugged() -> None:
    phone = PhoneLog("sim-0", chatter=0)
    phone.write("I", "First", "before")
    gone = asyncio.Event()
    got: list[bytes] = []

    async def follow() -> None:
        async for chunk in phone.follow(gone):
            got.append(chunk)

    reader = asyncio.create_task(follow())
    await eventually(lambda: got, what="what the log held")
    phone.write("I", "Second", "after")
    await eventually(lambda: b"Second" in b"".join(got), what="the new line")
    gone.set()
    await asyncio.wait_for(reader, 5)
    assert b"".join(got).count(b"\n") == 2


def test_the_store_keeps_the_start_and_the_end_within_its_bound() -> None:
    """THEN a log past the bound keeps its first lines and its last ones, says how many
    were left out between them, and its gzip file (several members) is within the bound
    and reads back whole in order."""
    rnd = random.Random(1)
    store = LogStore(200_000)
    lines = [f"line {i} {rnd.getrandbits(256):x}" for i in range(60_000)]
    for text in lines:
        store.add(text)
    data = store.gzip()
    assert len(data) <= 200_000 and store.left_out > 0
    kept = gzip.decompress(data).decode().splitlines()
    assert kept[0] == "line 0 " + lines[0].split(" ", 2)[2] and kept[-1] == lines[-1]
    (note,) = [i for i, x in enumerate(kept) if x.startswith("--------- amc:")]
    assert f"{store.left_out} lines left out here" in kept[note]
    assert kept[:note] == lines[:note]
    assert kept[note + 1 :] == lines[-(len(kept) - note - 1) :]
    assert len(kept) - 1 + store.left_out == len(lines)


def test_a_small_log_is_kept_whole() -> None:
    store = LogStore(1 << 20)
    for i in range(BLOCK // 10):
        store.add(f"line {i}")
    assert gzip.decompress(store.gzip()).decode().splitlines() == [
        f"line {i}" for i in range(BLOCK // 10)
    ]
    assert store.left_out == 0


def step(index: int, name: str = "tap") -> StepResult:
    return StepResult(index, name, StepStatus.OK, duration=timedelta(seconds=0.1))


async def beyond_the_clocks_reach(capture: Capture) -> None:
    """Until more time passed than the phone's clock is known to (the round trip of the write
    it was learnt from): a line written next is, on the phone's clock, on the far side of a
    mark made before this (lines microseconds apart may fall on either side: a run under
    load put an ANR written 10 us after a step began into the step before)."""
    until = time.monotonic() + (capture.clock.spread or 0.0) + 0.001
    await eventually(lambda: time.monotonic() >= until, interval=0.001, what="the clock's reach")


async def test_lines_belong_to_the_step_begun_last_and_early_ones_to_the_first() -> None:
    """THEN a crash before any step is the first step's, one after a step's end and
    before the next began is still that step's, and a step keeps at most MAX_WARNINGS
    and says how many more; the kept log is attached to the last step."""
    source = SimulatedSource(1)
    device = source.device("sim-0")
    capture = capture_for(device, "sim-0", 1 << 20)
    assert capture is not None
    log = source.logs["sim-0"]
    await capture.start()
    log.crash("com.early")
    await capture.began(0, "tap")
    first = await capture.ended(step(0))
    log.crash("com.after_end")  # after step 1 ended, before step 2 began
    await beyond_the_clocks_reach(capture)
    await capture.began(1, "shell")
    await beyond_the_clocks_reach(capture)
    for _ in range(MAX_WARNINGS + 2):
        log.write("E", "ActivityManager", "ANR in com.slow")
    second = await capture.ended(step(1, "shell"))

    result = await capture.finish(RunResult(Outcome.DONE, "", (first, second)))
    warned = [list(s.warnings) for s in result.steps]
    assert len(warned[0]) == 2 and "com.early" in warned[0][0] and "com.after_end" in warned[0][1]
    assert len(warned[1]) == MAX_WARNINGS + 1 and warned[1][-1] == "… and 2 more"
    assert [k.kind for k in result.steps[1].kept] == ["logcat"]
    text = gzip.decompress(result.steps[1].kept[0].data).decode()
    assert "run ended" in text and text.index("step 2 'shell' began") < text.index("ANR in")


async def test_a_phone_that_goes_mid_run_still_gets_its_marks_and_its_run_ends_at_once() -> None:
    """THEN once the phone is unplugged (its stream ends) the step's marks still go into
    the kept log, written by the agent (pid 0), and the run's end does not wait on it."""
    source = SimulatedSource(1)
    capture = capture_for(source.device("sim-0"), "sim-0", 1 << 20)
    assert capture is not None
    await capture.start()
    await capture.began(0, "tap")
    source.unplug("sim-0")
    ended = await capture.ended(step(0))
    started = time.monotonic()
    result = await capture.finish(RunResult(Outcome.DONE, "", (ended,)))
    assert time.monotonic() - started < SETTLE
    text = gzip.decompress(result.steps[0].kept[0].data).decode()
    marks = [e for x in text.splitlines() if (e := logcat.parse(x)) and e.tag == "amc"]
    assert [m.message for m in marks][:3] == [
        "run began",
        "step 1 'tap' began",
        "step 1 'tap' ended: ok in 0.10s",
    ]
    assert [m.pid for m in marks[1:]] == [0] * (len(marks) - 1)
    with pytest.raises(DeviceLost):
        await source.device("sim-0").mark_log("amc", "x", 1.0)


class EndlessLine:
    """A phone whose log sends bytes with no newline in 1 KB chunks, then one short line."""

    def __init__(self, size: int) -> None:
        self.size = size

    async def clear_log(self, timeout: float) -> None:
        pass

    async def follow_log(self) -> AsyncIterator[bytes]:
        for _ in range(self.size // 1024):
            yield b"x" * 1024
        yield b"\nshort\n"

    async def mark_log(self, tag: str, message: str, timeout: float) -> None:
        raise DeviceLost("no marks here")


async def test_a_line_with_no_end_is_cut_so_the_reader_holds_at_most_max_line() -> None:
    """THEN 100 KB with no newline is read as lines of MAX_LINE bytes at most, nothing of
    it lost, and the line after it is read as it is."""
    capture = capture_for(EndlessLine(100 * 1024), "endless", 1 << 20)
    assert capture is not None
    await capture.start()
    await eventually(lambda: capture.recent and capture.recent[-1] == "short", what="the end")
    cut = [x for x in capture.recent if x.startswith("x")]  # not the agent's "run began"
    assert max(len(x) for x in cut) <= MAX_LINE
    assert sum(len(x) for x in cut) == 100 * 1024
    capture.close()


class SlowMarks:
    """A phone whose log writes are each answered after the next of `delays` seconds (its
    own slowness, not a wait of the test's); its lines are read back as written."""

    def __init__(self, delays: list[float]) -> None:
        self.delays = delays
        self.written: list[str] = []
        self._lines: asyncio.Queue[bytes] = asyncio.Queue()

    async def clear_log(self, timeout: float) -> None:
        pass

    async def follow_log(self) -> AsyncIterator[bytes]:
        while True:
            yield await self._lines.get()

    async def mark_log(self, tag: str, message: str, timeout: float) -> None:
        await asyncio.sleep(self.delays.pop(0) if self.delays else 0.0)
        self.written.append(message)
        line = logcat.line(time.time(), 1, 1, "I", tag, message, usec=True)
        self._lines.put_nowait(line.encode() + b"\n")


async def test_a_slow_first_clock_line_alone_holds_the_run_and_the_rest_go_on_beside() -> None:
    """THEN a phone whose log writes are slow (over CLOCK_GOOD) holds the run's start for
    the first line only; the clock's further lines are written while the run goes on, the
    quicker one's reading kept, and the marks made meanwhile stay in order."""
    phone = SlowMarks([0.05, 0.02, 0.01])
    capture = capture_for(phone, "slow", 1 << 20)
    assert capture is not None
    await capture.start()
    assert phone.written == ["run began"]  # returned without waiting for another line
    first = capture.clock.spread
    assert first is not None and first > CLOCK_GOOD
    await capture.began(0, "tap")
    await eventually(lambda: len(phone.written) == CLOCK_TRIES, what="the clock's lines")
    assert phone.written[1:] == [f"clock {i + 1}" for i in range(1, CLOCK_TRIES)]
    assert capture.clock.spread is not None and capture.clock.spread < first
    await capture.began(1, "tap")
    result = await capture.finish(RunResult(Outcome.DONE, "", (step(0), step(1))))
    text = gzip.decompress(result.steps[-1].kept[0].data).decode()
    marks = [e.message for x in text.splitlines() if (e := logcat.parse(x)) and e.tag == "amc"]
    began = [m for m in marks if m.endswith("began") and m.startswith("step")]
    assert began == ["step 1 'tap' began", "step 2 'tap' began"], marks


def test_a_device_without_a_log_or_a_bound_of_0_is_not_captured() -> None:
    source = SimulatedSource(1)
    assert capture_for(FakeDevice(), "x", 1 << 20) is None
    assert capture_for(source.device("sim-0"), "sim-0", 0) is None
    assert isinstance(capture_for(source.device("sim-0"), "sim-0", 1), Capture)


def test_a_tail_numbers_its_lines_drops_repeats_and_says_gaps() -> None:
    """THEN a host's batches are taken in order; lines sent again are dropped; a gap is
    said; a reader that fell a ring behind is told how many lines it missed."""
    tails = Tails()
    with tails.follow("h", ("t", 1)) as (tail, ready):
        tail.put(5, ["e", "f"], caught_up=True)
        assert ready.is_set() and tail.caught_up
        lines, cursor = tail.read(tail.first)
        assert lines[0].endswith("4 earlier lines are in the log kept when the attempt ends")
        assert lines[1:] == ["e", "f"]
        tail.put(5, ["e", "f", "g"])  # a new call's backlog again
        tail.put(10, ["j"])
        lines, cursor = tail.read(cursor)
        assert lines[0] == "g" and "2 lines left out here" in lines[1] and lines[2] == "j"
        for i in range(6000):
            tail.put(0, [f"x{i}"])
        lines, _ = tail.read(cursor)
        assert "lines skipped: this reader fell behind" in lines[0] and lines[-1] == "x5999"
        assert tails.followed("h") == [("t", 1)]
    assert tails.followed("h") == []


def test_a_tails_ring_holds_at_most_its_characters_whatever_its_lines_length() -> None:
    """THEN 1,000 lines of 16 K characters (what a host's batch may carry) leave the
    ring within RING_CHARS, its newest lines kept, and a reader from the start is told
    how many it missed."""
    tails = Tails()
    with tails.follow("h", ("t", 1)) as (tail, _):
        start = tail.first
        for i in range(1000):
            tail.put(0, [f"{i:04d}" + "x" * (16 * 1024 - 4)])
        assert sum(len(x) for x in tail.lines) <= RING_CHARS
        assert tail.lines[-1].startswith("0999") and len(tail.lines) < 1000
        lines, _ = tail.read(start)
        assert f"{1000 - len(tail.lines)} lines skipped" in lines[0]


def test_a_kept_log_of_several_members_reads_back_line_by_line_in_chunks() -> None:
    text = "".join(f"{logcat.line(0, 1, 1, 'IE'[i % 2], 'T', str(i))}\n" for i in range(5000))
    data = gzip.compress(text[:100_000].encode()) + gzip.compress(text[100_000:].encode())
    unpacked, lines = Gunzip(), []
    for at in range(0, len(data), 777):
        lines += unpacked.lines(data[at : at + 777], logcat.Filter())
    lines += unpacked.rest()
    assert lines == text.splitlines()
    errors = Gunzip().lines(data, logcat.Filter("E"))
    assert len(errors) == 2500


async def test_a_followed_attempts_lines_waiting_on_the_host_stay_within_their_characters() -> None:
    """GIVEN an attempt followed while its lines cannot go up (no call open) WHEN its phone
    logs 1,000 lines of 8,000 characters THEN the lines waiting for it stay within
    MAX_PENDING_CHARS, the newest kept, numbered from where the oldest left out end."""
    source = SimulatedSource(1)
    capture = capture_for(source.device("sim-0"), "sim-0", 1 << 20)
    assert capture is not None
    feed = LogFeed(cast(Any, None), "host-1")
    key = ("t", 1)
    feed._set_followed({key})
    with feed.attach(*key, capture):
        await capture.start()
        for i in range(1000):
            source.logs["sim-0"].write("I", "Big", f"{i:04d}" + "x" * 7996)
        last = "0999" + "x" * 7996
        await eventually(lambda: bool(capture.recent) and capture.recent[-1].endswith(last))
        waiting = feed._outbox[key]
        assert sum(len(x) for x in waiting.lines) == waiting.chars <= MAX_PENDING_CHARS
        assert waiting.lines[-1].endswith(last)
        assert waiting.first_seq == capture.seq - len(waiting.lines) + 1 > 1
        capture.close()
