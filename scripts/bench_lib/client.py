"""The benchmark's side of the wire: stubs on one channel, the task specs the workloads
submit, and the clock that relates the database's timestamps to time.monotonic()."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import grpc

from amc.v1 import lease_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, task_pb2
from amc_common.channel import aio_channel

T = TypeVar("T")

# KEYCODE_UNKNOWN: an input action that does nothing; with --sim-delay 0s it takes no time.
NOOP_KEY = 0


@dataclass
class Client:
    channel: grpc.aio.Channel
    scheduler: scheduler_pb2_grpc.SchedulerStub
    lease: lease_pb2_grpc.LeaseStub

    @classmethod
    def connect(cls, address: str) -> Client:
        channel = aio_channel(address)  # the control plane runs --insecure: no token
        return cls(
            channel,
            scheduler_pb2_grpc.SchedulerStub(channel),
            lease_pb2_grpc.LeaseStub(channel),
        )

    async def close(self) -> None:
        await self.channel.close()


def key_actions(count: int) -> task_pb2.TaskSpec:
    """`count` no-op key presses: each lasts the agent's --sim-delay and cannot be
    interrupted, so a cancellation is honoured at the next action boundary."""
    action = task_pb2.Action(key=task_pb2.Key(keycode=NOOP_KEY))
    return task_pb2.TaskSpec(actions=task_pb2.ActionList(actions=[action] * count))


def submit_request(spec: task_pb2.TaskSpec, pool: str) -> scheduler_pb2.SubmitTaskRequest:
    """A task for the devices labelled pool=`pool` (each workload has its own agents)."""
    return scheduler_pb2.SubmitTaskRequest(
        spec=spec, selector=task_pb2.DeviceSelector(labels={"pool": pool}), max_attempts=1
    )


async def bounded(calls: Iterable[Callable[[], Awaitable[T]]], concurrency: int) -> list[T]:
    """Run the calls with at most `concurrency` in flight; results in call order."""
    items = list(calls)
    results: list[T | None] = [None] * len(items)
    index = iter(range(len(items)))

    async def worker() -> None:
        for i in index:
            results[i] = await items[i]()

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(items)) or 1)))
    return results  # type: ignore[return-value]


class Clock:
    """time.monotonic() is one clock for every process on this machine (CLOCK_MONOTONIC),
    so the agents' action logs compare directly. PostgreSQL's timestamps are wall-clock
    time of the same machine: this offset turns them into monotonic seconds."""

    def __init__(self) -> None:
        samples = []
        for _ in range(5):
            m0 = time.monotonic()
            w = time.time()
            m1 = time.monotonic()
            samples.append((m1 - m0, w - (m0 + m1) / 2))
        self.offset = min(samples)[1]

    def mono(self, at: datetime) -> float:
        return at.timestamp() - self.offset
