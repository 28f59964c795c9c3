"""A lease this host holds, and its self-fencing: the host stops acting for a lease before
the control plane can hand its task to another host.

Each `HeldLease`'s StopToken is armed to trip LEASE_LOST when its deadline passes (a loop
tick early, FENCE_LEAD), whether or not the renewal stream is up. The deadline counts from
when the renewing request was sent (host_agent.leases), less a margin (`fencing_margin`)
for what the host cannot interrupt once it passes. `Timing` is what RegisterHost said.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

import structlog

from host_agent import metrics
from host_agent.stop_token import StopReason, StopToken

log = structlog.get_logger(__name__)

# The margin covers what the agent cannot interrupt once the deadline passes (an input
# action already sent to the phone) plus scheduling delays of this process.
MIN_MARGIN = 1.0
MARGIN_FRACTION = 0.2
# The timer trips the token this much before the deadline: a runner already woken in the
# loop iteration where the deadline passes must still find the token tripped, so that no
# action *starts* after the deadline even on a busy event loop.
FENCE_LEAD = 0.05


def fencing_margin(ttl: float) -> float:
    """max(1 s, 20 % of the TTL), but never more than half of it."""
    return min(max(MIN_MARGIN, MARGIN_FRACTION * ttl), ttl / 2)


@dataclass(frozen=True)
class Timing:
    """What RegisterHost said: how long a lease lives and how often to renew it."""

    ttl: float
    interval: float
    # What the small files a report carries may hold in all (ReportResultRequest.kept; 0:
    # none, every kept file is uploaded first).
    kept_max_bytes: int = 0

    @property
    def margin(self) -> float:
        return fencing_margin(self.ttl)


class RenewalResult(enum.Enum):
    RENEWED = "renewed"
    CONFLICT = "conflict"


@dataclass(frozen=True)
class LeaseAnswer:
    """The control plane's answer about one lease in one renewal response."""

    result: RenewalResult
    valid_for: float
    cancel_pending: bool


@dataclass(eq=False)
class HeldLease:
    """One lease this host holds, and the stop token of the run it guards."""

    lease_id: str
    task_id: str
    attempt: int
    # time.monotonic() after which the host must not act for this lease any more.
    deadline: float
    token: StopToken = field(default_factory=StopToken)
    # How a cancellation request reached us ("renewal" or "push") and when (monotonic).
    cancel_seen_via: str | None = None
    cancel_seen_at: float | None = None
    # Set by a CONFLICT: the lease is dead; renewing it again is pointless.
    conflicted: bool = False
    # time.monotonic() when the acknowledging renewal was sent: the control plane counts
    # the task's deadline from its acknowledgement, which cannot come before this.
    acknowledged_at: float | None = None
    _first_answer: asyncio.Future[LeaseAnswer] | None = None

    @property
    def unanswered(self) -> bool:
        """No answer yet: the control plane has not seen this lease's acknowledgement."""
        return self._first_answer is None or not self._first_answer.done()

    def extend(self, deadline: float) -> None:
        """Fence the lease at `deadline` instead, if that is later: answers arrive in order
        on one stream, but an old one never shortens the lease."""
        if deadline > self.deadline:
            self.deadline = deadline
            self.arm()

    def arm(self) -> None:
        """Trip the token LEASE_LOST when the deadline passes (FENCE_LEAD early)."""
        self.token.trip_at(self.deadline - FENCE_LEAD, StopReason.LEASE_LOST, self._fenced)

    def stop(self, reason: StopReason, event: str, **fields: object) -> None:
        """Trip the token and log `event` if this trip is the one that counts (the first
        wins); a lost lease is a warning, a cancellation is routine."""
        if self.token.trip(reason):
            emit = log.info if reason is StopReason.CANCELLED else log.warning
            emit(event, **self._names(), **fields)

    def _fenced(self) -> None:
        metrics.DEADLINE_MISSES.inc()
        log.warning("lease deadline passed without renewal: stop acting", **self._names())

    def _names(self) -> dict[str, object]:
        return {"lease_id": self.lease_id, "task_id": self.task_id, "attempt": self.attempt}
