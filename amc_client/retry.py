"""Which errors are tried again, and how: transient ones (a replica restarting, a
connection reset) with exponential backoff and jitter, within a time budget."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from amc_client.errors import FarmUnreachable
from amc_common.unreachable import connect_failure

T = TypeVar("T")

# A tuple, not a set: its order is what the API page prints, the same on every run.
TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)


@dataclass(frozen=True)
class Retry:
    """Try again for up to `total` seconds, waiting `first` seconds, then twice as long
    each time up to `most`."""

    total: float = 30.0
    first: float = 0.2
    most: float = 5.0

    async def call(self, attempt: Callable[[], Awaitable[T]], reach: Reach | None = None) -> T:
        """`attempt()`, again after each transient error until the budget is spent; with
        `reach`, a connection refused by an address that never answered raises
        FarmUnreachable at once."""
        until = time.monotonic() + self.total
        pause = self.first
        while True:
            try:
                result = await attempt()
            except grpc.aio.AioRpcError as exc:
                if reach is not None:
                    reach.heard(exc)
                if not transient(exc) or time.monotonic() + pause > until:
                    raise
            else:
                if reach is not None:
                    reach.answered = True
                return result
            await asyncio.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(pause * 2, self.most)


@dataclass
class Reach:
    """Whether the control plane at `address` has answered yet: until it has, a failure to
    connect is a wrong address (or a control plane not started), said at once."""

    address: str
    answered: bool = False

    def heard(self, exc: grpc.aio.AioRpcError) -> None:
        """Note a failed call: FarmUnreachable when it could not connect and nothing here
        ever answered; anything the control plane said itself counts as an answer."""
        why = connect_failure(exc)
        if why is None:
            self.answered = True
        elif not self.answered:
            raise FarmUnreachable(self.address, why) from None


def transient(exc: grpc.aio.AioRpcError) -> bool:
    return exc.code() in TRANSIENT


DEFAULT_RETRY = Retry()
NO_RETRY = Retry(total=0.0)
