"""A run's log lines kept compressed within a bound (--logcat-max-bytes): its beginning
and its end, what lies between them left out once the bound is reached.

Lines are gathered into blocks of BLOCK bytes, each compressed on its own as a gzip member
as it fills (one `zlib` call a block: a phone writing 20 KB a second costs a block every
few seconds); the kept file is the members one after the other, which is one gzip file
(RFC 1952: a file is a series of members; `gzip -d`, `zcat` and Python read it whole). The
first blocks, up to HEAD_SHARE of the bound, are kept as they are: how the run began (the
app's start). After them, the newest blocks: when the whole is past the bound, the oldest
block after the head goes, and the kept file says where lines were left out and how many
(a divider line). So a crash at the end of a long run is kept, and so is how it started.
Memory is the bound plus one open block.
"""

from __future__ import annotations

import zlib
from collections import deque

from amc_common.logcat import divider

# Uncompressed bytes gathered before a block is compressed.
BLOCK = 64 * 1024
# Of the bound, what the beginning of the run may take.
HEAD_SHARE = 0.25
# The smallest bound that makes sense (a few blocks).
MIN_BYTES = 64 * 1024
LEVEL = 6


def _member(data: bytes) -> bytes:
    """`data` as one gzip member (no name, no time: the same bytes give the same member)."""
    packer = zlib.compressobj(LEVEL, zlib.DEFLATED, 31)
    return packer.compress(data) + packer.flush()


class LogStore:
    """The lines of one run, bounded by `limit` compressed bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, MIN_BYTES)
        self._head: list[bytes] = []
        self._head_bytes = 0
        self._head_full = False
        # (member, its line count), oldest first.
        self._tail: deque[tuple[bytes, int]] = deque()
        self._tail_bytes = 0
        self._open = bytearray()
        self._open_lines = 0
        # Lines taken in all, and those left out (from the middle).
        self.lines = 0
        self.left_out = 0
        # Uncompressed bytes taken in all.
        self.raw_bytes = 0

    def add(self, line: str) -> None:
        data = line.encode("utf-8", errors="replace") + b"\n"
        self._open += data
        self._open_lines += 1
        self.lines += 1
        self.raw_bytes += len(data)
        if len(self._open) >= BLOCK:
            self._seal()

    @property
    def kept_bytes(self) -> int:
        return self._head_bytes + self._tail_bytes

    def _seal(self) -> None:
        if not self._open:
            return
        member = _member(bytes(self._open))
        lines, self._open, self._open_lines = self._open_lines, bytearray(), 0
        if not self._head_full and self._head_bytes + len(member) <= self.limit * HEAD_SHARE:
            self._head.append(member)
            self._head_bytes += len(member)
            return
        self._head_full = True
        self._tail.append((member, lines))
        self._tail_bytes += len(member)
        self._trim(self.limit)

    def _trim(self, room: int) -> None:
        """The oldest blocks after the head out until the whole fits in `room`."""
        while self.kept_bytes > room and len(self._tail) > 1:
            member, lines = self._tail.popleft()
            self._tail_bytes -= len(member)
            self.left_out += lines

    def gzip(self) -> bytes:
        """Everything kept, as one gzip file (within the bound)."""
        self._seal()
        note = b""
        if self.left_out:
            # The note's own bytes count in the bound; a few lines may go for it.
            self._trim(self.limit - 256)
            text = (
                f"{self.left_out} lines left out here: the log kept its first and its last"
                f" {self.limit} bytes (compressed; the host's --logcat-max-bytes)"
            )
            note = _member(f"{divider(text)}\n".encode())
        return b"".join([*self._head, note, *(m for m, _ in self._tail)])
