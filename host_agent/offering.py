"""The host's idle phones offered to the control plane: Acquire long polls, parked, that
together cover every phone able to take work, and the assignments they bring back.

    Offering.run()     until the host drains: every phone the session calls idle and not
     │                 withheld is in one parked Acquire (a phone that becomes idle while
     │                 others' Acquire is parked gets one of its own at once, not when that
     │                 one returns)
     ├─ withdraw       a phone withheld (quarantined) while its Acquire is parked: that call
     │                 is cancelled and its other phones offered again at once, so from then
     │                 on no Acquire offers it, whatever the control plane has heard
     └─ on_answer()    each answer's assignments, with when it came (the session starts
                       their workers, and gives back any for a withheld phone)

Cancelling a parked call is safe but for a sliver: an answer already here when it is
cancelled is read and used (`grpc.aio` keeps a finished call's response); one the control
plane had committed but not yet sent is lost to the host and its lease runs out (the task
is requeued by expiry). So calls are cancelled only to withdraw a phone, which is rare.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from typing import Any

import grpc

from amc.v1 import lease_pb2_grpc
from host_agent.config import AgentSettings
from host_agent.registration import CALL_TIMEOUT, Registration
from host_agent.retry import Logger, retrying
from host_agent.wire import HeldAssignment, acquire_request, assignment_from_proto

Answer = tuple[float, list[HeldAssignment]]


class Poll:
    """One parked Acquire (tried again after a transport error) for a set of phones."""

    def __init__(self, serials: frozenset[str]) -> None:
        self.serials = serials
        self.call: Any = None  # the grpc.aio call in flight
        self.withdrawn = False
        self.task: asyncio.Future[Answer] | None = None

    def withdraw(self) -> None:
        """Stop offering these phones: the call in flight is cancelled (an answer already
        here is still read)."""
        self.withdrawn = True
        if self.call is not None:
            self.call.cancel()


class Offering:
    """Keeps the host's idle phones offered in parked Acquires; see the module docstring."""

    def __init__(
        self,
        settings: AgentSettings,
        stub: lease_pb2_grpc.LeaseStub,
        registration: Registration,
        changed: asyncio.Event,
        log: Logger,
    ) -> None:
        self._settings = settings
        self._stub = stub
        self._registration = registration
        # Set by the session when a phone may have become idle, busy or withheld.
        self._changed = changed
        self._log = log

    async def run(
        self,
        idle: Callable[[], list[str]],
        withheld: Callable[[], Collection[str]],
        on_answer: Callable[[float, list[HeldAssignment]], None],
        draining: Callable[[], bool],
    ) -> None:
        """Until `draining()`: every phone in `idle()` not in `withheld()` offered."""
        polls: list[Poll] = []
        try:
            while not draining():
                self._changed.clear()
                held = set(withheld())
                for poll in polls:
                    if not poll.withdrawn and poll.serials & held:
                        self._log.info("withdrawing phones from the control plane's offer")
                        poll.withdraw()
                offered = frozenset().union(*(p.serials for p in polls if not p.withdrawn))
                new = [s for s in idle() if s not in offered and s not in held]
                if new:
                    poll = Poll(frozenset(new))
                    poll.task = asyncio.ensure_future(self._ask(poll, new))
                    polls.append(poll)
                changed: asyncio.Future[Any] = asyncio.ensure_future(self._changed.wait())
                try:
                    await asyncio.wait(
                        [changed, *(p.task for p in polls if p.task is not None)],
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    changed.cancel()
                for poll in [p for p in polls if p.task is not None and p.task.done()]:
                    polls.remove(poll)
                    assert poll.task is not None
                    on_answer(*poll.task.result())
        finally:
            # Draining (or failing): the parked Acquires are abandoned.
            tasks = [p.task for p in polls if p.task is not None]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _ask(self, poll: Poll, idle: list[str]) -> Answer:
        """When the answer came (time.monotonic()), and the assignments in it; none when
        the poll was withdrawn before an answer came."""
        request = acquire_request(self._settings.host_id, idle, self._settings.acquire_wait)
        async for attempt in retrying("acquire", self._log):
            with attempt:
                if poll.withdrawn:
                    return time.monotonic(), []
                poll.call = self._stub.Acquire(
                    request, timeout=self._settings.acquire_wait + CALL_TIMEOUT
                )
                try:
                    response = await poll.call
                except asyncio.CancelledError:
                    task = asyncio.current_task()
                    if poll.withdrawn and task is not None and not task.cancelling():
                        return time.monotonic(), []
                    raise
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:
                        await self._registration.again(exc)
                    raise
                # Taken before the conversion, so the leases' deadlines err early, never late.
                received_at = time.monotonic()
                return received_at, [assignment_from_proto(a) for a in response.assignments]
        raise AssertionError("unreachable: AsyncRetrying retries until it returns or raises")
