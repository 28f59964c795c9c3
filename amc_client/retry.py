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

T = TypeVar("T")

TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED})


@dataclass(frozen=True)
class Retry:
    """Try again for up to `total` seconds, waiting `first` seconds, then twice as long
    each time up to `most`."""

    total: float = 30.0
    first: float = 0.2
    most: float = 5.0

    async def call(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """`attempt()`, again after each transient error until the budget is spent."""
        until = time.monotonic() + self.total
        pause = self.first
        while True:
            try:
                return await attempt()
            except grpc.aio.AioRpcError as exc:
                if not transient(exc) or time.monotonic() + pause > until:
                    raise
            await asyncio.sleep(pause * random.uniform(0.5, 1.0))
            pause = min(pause * 2, self.most)


def transient(exc: grpc.aio.AioRpcError) -> bool:
    return exc.code() in TRANSIENT


DEFAULT_RETRY = Retry()
NO_RETRY = Retry(total=0.0)
