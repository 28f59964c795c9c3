"""The stop token a running task shares with whoever may stop it.

The lease loop trips it with the reason it saw (a renewal said `cancel_pending`, the lease
was lost, the host is shutting down), the worker's timer when the task's deadline passes
(`DEADLINE`: reported FAILED "deadline exceeded", never CANCELLED); the runner checks it
at every step boundary and
races long waits against it. The first trip wins: a lease lost after a cancellation was
observed still reports as a cancellation, and vice versa.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
from collections.abc import Awaitable
from typing import TypeVar, assert_never

T = TypeVar("T")


class StopReason(enum.Enum):
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"
    DEADLINE = "deadline"  # the task's run time limit passed

    @property
    def label(self) -> str:
        """Words for error messages: "cancelled", "lease lost", "host shutting down",
        "deadline exceeded"."""
        match self:
            case StopReason.CANCELLED:
                return "cancelled"
            case StopReason.LEASE_LOST:
                return "lease lost"
            case StopReason.SHUTDOWN:
                return "host shutting down"
            case StopReason.DEADLINE:
                return "deadline exceeded"
            case _:
                assert_never(self)


class Stopped(Exception):
    """The work was stopped by its stop token."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(f"stopped: {reason.label}")
        self.reason = reason


class StopToken:
    """Records once, and for good, why a run must stop. Asyncio only, not thread-safe."""

    def __init__(self) -> None:
        self._reason: StopReason | None = None
        # Futures rather than an Event: `race` must not leave a helper task pending.
        self._waiters: set[asyncio.Future[None]] = set()

    @property
    def reason(self) -> StopReason | None:
        return self._reason

    @property
    def tripped(self) -> bool:
        return self._reason is not None

    def trip(self, reason: StopReason) -> bool:
        """Stop for `reason`; True if this call tripped it, False if it already was."""
        if self._reason is not None:
            return False
        self._reason = reason
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        return True

    def raise_if_tripped(self) -> None:
        if self._reason is not None:
            raise Stopped(self._reason)

    async def wait(self) -> StopReason:
        """Return the reason once the token trips."""
        while self._reason is None:
            waiter = self._new_waiter()
            try:
                await waiter
            finally:
                self._waiters.discard(waiter)
        return self._reason

    async def race(self, aw: Awaitable[T]) -> T:
        """Await `aw`, but give up as soon as the token trips.

        Raises Stopped, after cancelling `aw` and letting it unwind, when the token trips
        first; exceptions of `aw` propagate. If the token already tripped, `aw` never
        starts. For a deadline as well, wrap the call in `asyncio.timeout`.
        """
        if self._reason is not None:
            _discard(aw)
            raise Stopped(self._reason)
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
        if self._reason is not None:
            _discard(aw)
            raise Stopped(self._reason)
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
