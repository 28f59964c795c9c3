"""Attempts' logs followed on this replica and the hosts' log feeds here, wire-free (the hub
holds one `Tails`; control_plane.logs puts it on the wire).

Each attempt followed here has one `Tail` for all its readers: its recent lines in a ring
(RING lines and RING_CHARS characters at most), numbered as its host numbers them, fed by
the host's LogLines call here (`deliver`) or by a relay from the replica holding the host's
call; each reader keeps its own place in the ring and is woken when lines come. A reader
that falls more than a ring behind is told how many lines it missed; a repeat (the host
sends what a new call's followers need again) is dropped, a gap is said. Nothing is held
for an attempt nobody follows here.

A host opens its feed only when asked (`ask`, control_plane.host_feeds, which the hub pushes
onto the host's renewal streams here as `logs_wanted`): when a reader here follows one of its
attempts with no feed here, and again when its feed ends while one still does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from itertools import islice

from amc_common.logcat import divider
from control_plane.host_feeds import Feed, HostFeeds

# Lines kept per followed attempt, and characters: the ring holds at most both (a host's
# lines are at most 16 K characters each, control_plane.log_hosts).
RING = 5000
RING_CHARS = 4 << 20
# An attempt: (task id, attempt number).
Key = tuple[str, int]


class Tail:
    """One attempt's log followed on this replica."""

    def __init__(self, host_id: str, key: Key) -> None:
        self.host_id = host_id
        self.key = key
        self.lines: deque[str] = deque()
        self._chars = 0
        # The number of the next line here (the ring's last is `next - 1`; notes count),
        # and of the host's next line (its numbering: a gap or a repeat is told by it).
        self.next = 1
        self._host_next = 1
        self.caught_up = False
        self.ended = False
        # Why no line will come any more (the relay was lost).
        self.lost: str | None = None
        self.readers: set[asyncio.Event] = set()
        # The relay from the replica holding the host's feed, when that is another one.
        self.source: asyncio.Task[None] | None = None

    @property
    def first(self) -> int:
        """The number of the ring's first line."""
        return self.next - len(self.lines)

    def put(
        self, first_seq: int, lines: list[str], caught_up: bool = False, ended: bool = False
    ) -> None:
        """Lines from the host's line `first_seq` on (0: next in order, a relay's)."""
        first_seq = first_seq or self._host_next
        if first_seq > self._host_next:
            missed = first_seq - self._host_next
            if self._host_next == 1:
                note = f"{missed} earlier lines are in the log kept when the attempt ends"
            else:
                note = f"{missed} lines left out here (the host's link was slow)"
            self._add([divider(note)])
            self._host_next = first_seq
        fresh = lines[self._host_next - first_seq :]
        self._add(fresh)
        self._host_next += len(fresh)
        self.caught_up = self.caught_up or caught_up or ended
        self.ended = self.ended or ended
        self._wake()

    def _add(self, lines: list[str]) -> None:
        self.lines.extend(lines)
        self._chars += sum(len(x) for x in lines)
        self.next += len(lines)
        while len(self.lines) > RING or (self._chars > RING_CHARS and len(self.lines) > 1):
            self._chars -= len(self.lines.popleft())

    def fail(self, why: str) -> None:
        self.lost = why
        self._wake()

    def read(self, cursor: int) -> tuple[list[str], int]:
        """The lines from `cursor` on (a note first for those it missed) and the next cursor."""
        if cursor >= self.next:
            return [], cursor
        missed = self.first - cursor
        start = max(cursor, self.first)
        lines = list(islice(self.lines, start - self.first, None))
        if missed > 0:
            lines.insert(0, divider(f"{missed} lines skipped: this reader fell behind"))
        return lines, self.next

    def _wake(self) -> None:
        for reader in self.readers:
            reader.set()


class Tails(HostFeeds[Feed]):
    """This replica's followed attempts and the hosts' log feeds (their LogLines calls);
    wire-free."""

    def __init__(self, want: Callable[[str], None] = lambda _host_id: None) -> None:
        super().__init__(Feed, want)
        self._tails: dict[Key, Tail] = {}

    def readers(self) -> int:
        return sum(len(t.readers) for t in self._tails.values())

    def followed(self, host_id: str) -> list[Key]:
        """The host's attempts followed here (not through a relay), in order."""
        return sorted(
            k for k, t in self._tails.items() if t.host_id == host_id and t.source is None
        )

    def wants(self, host_id: str) -> list[Key]:
        """What this replica wants of the host's feed: its attempts followed here."""
        return self.followed(host_id)

    @contextlib.contextmanager
    def follow(self, host_id: str, key: Key) -> Iterator[tuple[Tail, asyncio.Event]]:
        """A reader of the attempt's log here: its tail and the event set as lines come."""
        tail = self._tails.get(key)
        if tail is None or tail.host_id != host_id:
            tail = self._tails[key] = Tail(host_id, key)
        reader = asyncio.Event()
        tail.readers.add(reader)
        self._tell(host_id)
        try:
            yield tail, reader
        finally:
            tail.readers.discard(reader)
            if not tail.readers and self._tails.get(key) is tail:
                del self._tails[key]
                if tail.source is not None:
                    tail.source.cancel()
            self._tell(host_id)

    def relaying(self, tail: Tail, source: asyncio.Task[None]) -> None:
        """The tail's lines come from `source` (a relay), not from a feed here."""
        tail.source = source
        self._tell(tail.host_id)

    def deliver(
        self, host_id: str, key: Key, first_seq: int, lines: list[str], caught_up: bool, ended: bool
    ) -> bool:
        """A host's lines to their attempt's readers here; False when nobody here follows it."""
        tail = self._tails.get(key)
        if tail is None or tail.source is not None or tail.host_id != host_id:
            return False
        tail.put(first_seq, lines, caught_up, ended)
        return True

    def close(self) -> None:
        super().close()
        for tail in self._tails.values():
            tail._wake()
