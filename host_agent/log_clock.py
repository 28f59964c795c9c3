"""A phone's clock against the host agent's, for a run's phone log (host_agent.logcat): what
it is, learnt from a line written on the phone and read back, and the time of a logcat line
on it, as seconds (amc_common.logcat.seconds' scale: the phone's local time read as UTC)."""

from __future__ import annotations

import calendar
import time

from amc_common import logcat

# Seconds of the log ("MM-DD HH:MM:SS") whose reading is kept: lines come many a second.
BASES = 64


class PhoneClock:
    """One phone's clock, for one run."""

    def __init__(self) -> None:
        # The phone's clock less the agent's (time.monotonic); None until learnt.
        self.offset: float | None = None
        # How long the write it was learnt from took to be answered.
        self.spread: float | None = None
        self._bases: dict[str, float] = {}

    def learn(self, before: float, after: float, phone: float) -> None:
        """A line the phone stamped `phone` was written between `before` and `after` (the
        write's answer, on the agent's clock): the offset is taken at their midpoint, and
        kept from the write answered soonest."""
        if self.spread is None or after - before < self.spread:
            self.spread, self.offset = after - before, phone - (before + after) / 2

    def now(self) -> float | None:
        """The phone's clock now (None: not known)."""
        return time.monotonic() + self.offset if self.offset is not None else None

    def stamp(self, text: str) -> float | None:
        """The time of a logcat line (or an entry's `when`) on the phone's clock; None for
        a line with none. Each second's reading is made once."""
        if len(text) < 18 or text[2] != "-" or text[14] != ".":
            return None
        end = text.find(" ", 15)
        fraction = text[15:] if end < 0 else text[15:end]
        if not fraction.isdigit():
            return None
        whole = text[:14]
        base = self._bases.get(whole)
        if base is None:
            found = logcat.seconds(f"{whole}.0", self.now() or _local_now())
            if found is None:
                return None
            if len(self._bases) >= BASES:
                self._bases.clear()
            base = self._bases[whole] = found
        return base + int(fraction) / 10.0 ** len(fraction)


def _local_now() -> float:
    """This machine's clock now on that scale (its local time read as UTC): the year a
    line's time is read in before the phone's clock is known."""
    now = time.time()
    return calendar.timegm(time.localtime(now)) + now % 1
