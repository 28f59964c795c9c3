"""The warnings of a run's phone log, each on the step it happened in (host_agent.logcat's
`Capture` keeps one): a line that flags (amc_common.logcat.warning_of: `FATAL EXCEPTION`,
`ANR in`) belongs to the step whose beginning last came before the line's time on the
phone's clock (a line after a step's end and before the next one's beginning is still that
step's: an app that crashes a moment after a tap; one before the first step, the first
step's); when the phone's clock is not known, to the step begun last when it is read. A
crash's warning is completed by the line after it, which names the app. At most
MAX_WARNINGS a step, then how many more."""

from __future__ import annotations

import bisect

from amc_common import logcat
from host_agent.log_clock import PhoneClock

MAX_WARNINGS = 10


class StepWarnings:
    def __init__(self, clock: PhoneClock) -> None:
        self._clock = clock
        # The steps begun, on the phone's clock (seconds, logcat.seconds' scale): the
        # lines stamped from one on are its, until the next.
        self._starts: list[float] = []
        self._indexes: list[int] = []
        self._step: int | None = None
        self._early: list[str] = []
        self._found: dict[int, list[str]] = {}
        self._more: dict[int, int] = {}
        # The last crash flagged (its pid, its list, its place): the next line names its app.
        self.last_crash: tuple[int, list[str], int] | None = None

    def began(self, index: int, at: float | None) -> None:
        """Step `index` began, at `at` on the phone's clock (None: not known)."""
        self._step = index
        if at is not None:
            self._starts.append(at)
            self._indexes.append(index)
        for early in self._early:  # read before any step began: the first one's
            self._flag(index, early)
        self._early = []

    def of(self, index: int) -> tuple[str, ...]:
        """Step `index`'s warnings, and how many more when there were too many."""
        found = self._found.get(index, [])
        more = self._more.get(index, 0)
        return (*found, f"… and {more} more") if more else tuple(found)

    def heed(self, entry: logcat.Entry) -> None:
        """A line read (not one of the agent's marks): a warning on its step, if it flags."""
        crash, self.last_crash = self.last_crash, None
        if crash is not None and entry.pid == crash[0] and entry.message.startswith("Process: "):
            found, at = crash[1], crash[2]  # which app it was: the next line says
            found[at] = f"{found[at]} ({entry.message})"[: logcat.WARNING_CHARS]
        warning = logcat.warning_of(entry)
        if warning is None:
            return
        step = self._owner(entry)
        found = self._early if step is None else self._found.setdefault(step, [])
        if step is not None and len(found) >= MAX_WARNINGS:
            self._more[step] = self._more.get(step, 0) + 1
            return
        found.append(warning)
        if "FATAL EXCEPTION" in warning:
            self.last_crash = (entry.pid, found, len(found) - 1)

    def _owner(self, entry: logcat.Entry) -> int | None:
        """The step a line is of: the one begun last before its time on the phone's clock
        (before any: the first); by when it is read when that clock is not known."""
        at = self._clock.stamp(entry.when) if self._starts else None
        if at is None:
            return self._step
        found = bisect.bisect_right(self._starts, at)
        return self._indexes[max(found - 1, 0)]

    def _flag(self, index: int, warning: str) -> None:
        found = self._found.setdefault(index, [])
        if len(found) < MAX_WARNINGS:
            found.append(warning)
        else:
            self._more[index] = self._more.get(index, 0) + 1
