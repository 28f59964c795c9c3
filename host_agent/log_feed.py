"""The live tail of the runs' phone logs on the host: lines go up only while someone
follows them (Scheduler.StreamLogs).

The agent opens its `Lease.LogLines` call only when the control plane asks (`want()`: a push
with `logs_wanted` on the renewal stream, when a reader follows one of its attempts), keeps
it while any attempt is followed (opened again after a pause if it breaks meanwhile), and
closes it once none has been followed for `linger` (LOG_LINGER, 30 s); an idle host holds
no call. The control plane sends the set of this host's attempts followed; for each newly
followed one the agent sends what its capture holds in memory (host_agent.logcat: the
RECENT last lines), the batch that ends them `caught_up`, then each line as it is read,
and `ended` once the attempt's capture closes (at once for an attempt it does not run).
Lines wait in one outbox per followed attempt and are written one batch at a time (at most
BATCH_LINES lines or BATCH_BYTES bytes); past MAX_PENDING lines or MAX_PENDING_CHARS
characters waiting the oldest go (the next batch's `first_seq` says how many: the control
plane notes the gap). Nothing is sent,
or held, for an attempt nobody follows: following costs the host a call and the lines, not
following costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import grpc
import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc
from amc_common.logcat import divider
from host_agent import metrics
from host_agent.logcat import Capture
from host_agent.on_demand_call import Call, OnDemandCall

log = structlog.get_logger(__name__)

LOG_LINGER = 30.0
BATCH_LINES = 1000
BATCH_BYTES = 256 * 1024
MAX_PENDING = 20_000
MAX_PENDING_CHARS = 4 << 20
# An attempt: (task id, attempt number).
Key = tuple[str, int]


@dataclass
class _Pending:
    """A followed attempt's lines not sent yet, from line `first_seq` on."""

    first_seq: int
    lines: list[str] = field(default_factory=list)
    # Of `lines`, how many are the backlog (sent as the attempt was followed); the batch
    # that sends its last one says `caught_up`.
    backlog: int = 0
    catching_up: bool = True
    ended: bool = False
    # The characters of `lines`.
    chars: int = 0

    def __post_init__(self) -> None:
        self.chars = sum(len(x) for x in self.lines)


class LogFeed(OnDemandCall):
    """The host's LogLines call and the outboxes of its followed attempts."""

    ABSENT = "the control plane has no live logs; not sending any"
    ENDED = "log call ended"
    LINGERED = "no log followed for the linger: log call closed"

    def __init__(
        self,
        stub: lease_pb2_grpc.LeaseStub,
        host_id: str,
        linger: float = LOG_LINGER,
        running: Mapping[str, Key] | None = None,
    ) -> None:
        super().__init__(linger)
        self._stub = stub
        self._host_id = host_id
        # The attempt each busy phone runs (serial -> key): an attempt there may not have
        # its capture attached yet.
        self._running: Mapping[str, Key] = running if running is not None else {}
        self._captures: dict[Key, Capture | None] = {}
        self._followed: set[Key] = set()
        self._outbox: dict[Key, _Pending] = {}
        self._ready = asyncio.Event()

    @property
    def followed(self) -> frozenset[Key]:
        return frozenset(self._followed)

    @contextlib.contextmanager
    def attach(self, task_id: str, attempt: int, capture: Capture | None) -> Iterator[None]:
        """The attempt's capture (None: its log is not kept), for followers, while it
        runs; `ended` to them after."""
        key = (task_id, attempt)

        def heard(first: int, lines: list[str]) -> None:
            self._lines(key, first, lines)

        self._captures[key] = capture
        if capture is not None:
            capture.listeners.add(heard)
        if key in self._followed:
            self._start(key)
        try:
            yield
        finally:
            self._captures.pop(key, None)
            if capture is not None:
                capture.listeners.discard(heard)
            if key in self._followed:
                after = capture.seq + 1 if capture is not None else 1
                pending = self._outbox.setdefault(key, _Pending(after, catching_up=False))
                pending.ended = True
                self._ready.set()

    # -- the outboxes ---------------------------------------------------------------------

    def _start(self, key: Key) -> None:
        """A newly followed attempt: what its capture holds, then its lines as they come;
        nothing yet for one about to start (its lines come once it does); `ended` for one
        not run here, or whose log is not kept."""
        capture = self._captures.get(key)
        if capture is not None:
            recent = list(capture.recent)
            first = capture.seq - len(recent) + 1
            self._outbox[key] = _Pending(first, recent, backlog=len(recent))
        elif key in self._captures:
            note = divider(
                "this host keeps no log of this phone (--logcat-max-bytes 0, or none to read)"
            )
            self._outbox[key] = _Pending(1, [note], backlog=1, ended=True)
        elif key in self._running.values():
            self._outbox[key] = _Pending(1)
        else:
            self._outbox[key] = _Pending(1, ended=True)
        self._ready.set()

    def _lines(self, key: Key, first: int, lines: list[str]) -> None:
        if key not in self._followed:
            return
        pending = self._outbox.get(key)
        if pending is None:
            pending = self._outbox[key] = _Pending(first, catching_up=False)
        pending.lines += lines
        pending.chars += sum(len(x) for x in lines)
        drop = max(0, len(pending.lines) - MAX_PENDING)
        pending.chars -= sum(len(x) for x in pending.lines[:drop])
        while pending.chars > MAX_PENDING_CHARS and drop < len(pending.lines) - 1:
            pending.chars -= len(pending.lines[drop])
            drop += 1
        if drop:
            del pending.lines[:drop]
            pending.first_seq += drop
            pending.backlog = max(0, pending.backlog - drop)
        self._ready.set()

    def _set_followed(self, followed: set[Key]) -> None:
        if followed != self._followed:
            log.info("logs followed", attempts=len(followed))
        new = followed - self._followed
        self._followed = followed
        for key in [k for k in self._outbox if k not in followed]:
            del self._outbox[key]
        for key in new:
            self._start(key)

    def _batch(self, key: Key, pending: _Pending) -> lease_pb2.LogBatch:
        """The next batch of `pending` (taken off it; the outbox entry goes once empty)."""
        count, size = 0, 0
        for text in pending.lines[:BATCH_LINES]:
            size += len(text) + 16
            if count and size > BATCH_BYTES:
                break
            count += 1
        lines, pending.lines = pending.lines[:count], pending.lines[count:]
        pending.chars -= sum(len(x) for x in lines)
        batch = lease_pb2.LogBatch(
            task_id=key[0], attempt=key[1], first_seq=pending.first_seq, lines=lines
        )
        pending.first_seq += count
        pending.backlog -= count
        if pending.catching_up and pending.backlog <= 0:
            batch.caught_up, pending.catching_up = True, False
        if not pending.lines:
            batch.ended = pending.ended
            del self._outbox[key]
        else:  # the other attempts' lines go next
            self._outbox[key] = self._outbox.pop(key)
        return batch

    # -- the call -------------------------------------------------------------------------

    async def run(self) -> None:
        """The LogLines call, for the agent's life, whenever it is wanted."""
        await self._keep()

    def _open(self) -> Call:
        call: Call = self._stub.LogLines()
        return call

    def _hello(self) -> lease_pb2.LogLinesRequest:
        return lease_pb2.LogLinesRequest(host_id=self._host_id)

    def _in_use(self) -> bool:
        return bool(self._followed)

    def _heard(self, message: lease_pb2.LogLinesResponse) -> None:
        self._set_followed({(f.task_id, f.attempt) for f in message.followed})

    def _forget(self) -> None:
        self._set_followed(set())

    async def _send(self, call: Call) -> None:
        """The outboxes' batches, one write at a time, until a write fails (the call is
        over; its read says why)."""
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._outbox:
                key = next(iter(self._outbox))
                batch = self._batch(key, self._outbox[key])
                try:
                    await call.write(lease_pb2.LogLinesRequest(batch=batch))
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                    return
                metrics.LOG_LINES_SENT.inc(len(batch.lines))
