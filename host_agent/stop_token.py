"""The stop token a running task shares with whoever may stop it.

The lease loop trips it with the reason it saw (a renewal said `cancel_pending`, the lease
was lost, the host is shutting down), and a session when its client left; the runner
checks it at every step boundary and races long waits against it. The first trip wins: a
lease lost after a cancellation was observed still reports as a cancellation, and vice
versa.

Some trips are due at a time rather than on an event: the lease's self-fencing deadline
(`LEASE_LOST`) and the task's run time limit (`DEADLINE`: reported FAILED "deadline
exceeded", never CANCELLED). `trip_at` arms them. A timer trips the token when one falls
due, so waits are interrupted, but a timer is not enough on its own: after the process was
frozen (SIGSTOP, a long GC pause, a blocking call) the runner's continuation can run
before the overdue timer in the same loop turn. So every look at the token (`reason`,
`tripped`, `raise_if_tripped`, `race`) also reads the monotonic clock against what is due,
and a check after the due time always finds the token tripped.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar, assert_never

T = TypeVar("T")


class StopReason(enum.Enum):
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"
    DEADLINE = "deadline"  # the task's run time limit passed
    # A session's client left (vanished, idle too long, or its relay was lost): its running
    # action is interrupted at once, as a cancel interrupts it.
    ABANDONED = "abandoned"
    # The phone was quarantined and does not answer: its task stops before the recovery
    # ladder reconnects or reboots it, and the lease is given back as device_lost.
    QUARANTINED = "quarantined"
    # The phone went away under the task (an emulator's process died): given back as
    # device_lost, whatever the task's kind.
    DEVICE_LOST = "device_lost"

    @property
    def label(self) -> str:
        """Words for error messages: "cancelled", "lease lost", "host shutting down",
        "deadline exceeded", "session abandoned", "device quarantined", "device lost"."""
        match self:
            case StopReason.CANCELLED:
                return "cancelled"
            case StopReason.LEASE_LOST:
                return "lease lost"
            case StopReason.SHUTDOWN:
                return "host shutting down"
            case StopReason.DEADLINE:
                return "deadline exceeded"
            case StopReason.ABANDONED:
                return "session abandoned"
            case StopReason.QUARANTINED:
                return "device quarantined"
            case StopReason.DEVICE_LOST:
                return "device lost"
            case _:
                assert_never(self)


class Stopped(Exception):
    """The work was stopped by its stop token."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(f"stopped: {reason.label}")
        self.reason = reason


@dataclass
class _Due:
    """A trip armed for a time (`time.monotonic()`), with what to do if it is the one."""

    at: float
    announce: Callable[[], None] | None
    timer: asyncio.TimerHandle | None = None


class StopToken:
    """Records once, and for good, why a run must stop. Asyncio only, not thread-safe."""

    def __init__(self) -> None:
        self._reason: StopReason | None = None
        # Futures rather than an Event: `race` must not leave a helper task pending.
        self._waiters: set[asyncio.Future[None]] = set()
        self._due: dict[StopReason, _Due] = {}

    @property
    def reason(self) -> StopReason | None:
        if self._reason is None and self._due:
            self._trip_overdue()
        return self._reason

    @property
    def tripped(self) -> bool:
        return self.reason is not None

    def trip(self, reason: StopReason) -> bool:
        """Stop for `reason`; True if this call tripped it, False if it already was."""
        if self._reason is not None:
            return False
        self._reason = reason
        for due in self._due.values():
            if due.timer is not None:
                due.timer.cancel()
        self._due.clear()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        return True

    def trip_at(
        self, at: float, reason: StopReason, announce: Callable[[], None] | None = None
    ) -> None:
        """Trip for `reason` once `time.monotonic()` reaches `at` (replacing an earlier `at`
        for the same reason); `announce` runs if that trip is the one that counts."""
        if self._reason is not None:
            return
        self.disarm(reason)
        self._arm_timer(reason, self._due.setdefault(reason, _Due(at, announce)))

    def disarm(self, reason: StopReason) -> None:
        """Forget the timed trip for `reason`, if one is armed."""
        due = self._due.pop(reason, None)
        if due is not None and due.timer is not None:
            due.timer.cancel()

    def raise_if_tripped(self) -> None:
        if (reason := self.reason) is not None:
            raise Stopped(reason)

    def _arm_timer(self, reason: StopReason, due: _Due) -> None:
        loop = asyncio.get_running_loop()
        # loop.time() is time.monotonic() on the default loop; count from what is left.
        delay = max(0.0, due.at - time.monotonic())
        due.timer = loop.call_at(loop.time() + delay, self._on_timer, reason)

    def _on_timer(self, reason: StopReason) -> None:
        due = self._due.get(reason)
        if due is None:
            return
        if time.monotonic() < due.at:  # the loop may fire a timer a hair early
            self._arm_timer(reason, due)
            return
        self._trip_overdue()

    def _trip_overdue(self) -> None:
        now = time.monotonic()
        overdue = [(due.at, reason) for reason, due in self._due.items() if due.at <= now]
        if not overdue:
            return
        _, reason = min(overdue, key=lambda pair: pair[0])
        announce = self._due[reason].announce
        if self.trip(reason) and announce is not None:
            announce()

    async def wait(self) -> StopReason:
        """Return the reason once the token trips."""
        while (reason := self.reason) is None:
            waiter = self._new_waiter()
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)
        return reason

    async def race(self, aw: Awaitable[T]) -> T:
        """Await `aw`, but give up as soon as the token trips.

        Raises Stopped, after cancelling `aw` and letting it unwind, when the token trips
        first; exceptions of `aw` propagate. If the token already tripped, `aw` never
        starts. For a deadline as well, wrap the call in `asyncio.timeout`.
        """
        if (reason := self.reason) is not None:
            _discard(aw)
            raise Stopped(reason)
        inner = asyncio.ensure_future(self._unless_tripped(aw))
        waiter = self._new_waiter()
        try:
            await asyncio.wait((inner, waiter), return_when=asyncio.FIRST_COMPLETED)
            finished = inner.done()
        finally:
            self._waiters.discard(waiter)
            waiter.cancel()
            if not inner.done():
                await _cancel_and_wait(inner)
        if finished:
            return inner.result()
        # Whatever `aw` did while unwinding (some drivers raise on a closed connection),
        # the token is why it ended.
        assert self._reason is not None
        raise Stopped(self._reason)

    async def _unless_tripped(self, aw: Awaitable[T]) -> T:
        """`aw`, unless the token tripped after race() scheduled it but before it started:
        callbacks that ran in between (a cancel push read off the stream) come first, and
        the action must then not begin at all."""
        if (reason := self.reason) is not None:
            _discard(aw)
            raise Stopped(reason)
        return await aw

    def _new_waiter(self) -> asyncio.Future[None]:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        return waiter


async def _cancel_and_wait(task: asyncio.Future[T]) -> None:
    """Cancel `task` and let it unwind (the driver closes its connection on the way out)."""
    task.cancel()
    await asyncio.wait((task,))
    if not task.cancelled():
        # It finished or failed while unwinding; nobody wants that result any more, but
        # retrieving it keeps asyncio from logging "exception was never retrieved".
        task.exception()


def _discard(aw: Awaitable[object]) -> None:
    """Close a coroutine we will never await, so Python does not warn about it."""
    if inspect.iscoroutine(aw):
        aw.close()
