"""The run's clients of the farm: their channel to the replicas (`replicas`: gRPC's round
robin over the replicas' addresses, so the calls are spread over them, without retries),
and `ClientLoad`, a few clients of one kind at once (interactive sessions, adb doors,
WebDriver sessions), each opening one after another until stopped, with the end it planned
for each drawn at random, every one's record kept and its end counted.
"""

from __future__ import annotations

import asyncio
import random
from typing import Generic, Protocol, TypeVar

import grpc

from amc.v1 import scheduler_pb2_grpc
from amc_common.channel import with_token


def replicas(
    addresses: list[str], token: str | None
) -> tuple[grpc.aio.Channel, scheduler_pb2_grpc.SchedulerStub]:
    """A channel to the replicas (round robin, no retries: a client sees every failure)
    and the Scheduler on it."""
    target = "ipv4:" + ",".join(addresses)
    options = [("grpc.lb_policy_name", "round_robin"), ("grpc.enable_retries", 0)]
    channel = with_token(grpc.aio.insecure_channel(target, options=options), token)
    return channel, scheduler_pb2_grpc.SchedulerStub(channel)


class Record(Protocol):
    """One client's use of the farm as it lived it."""

    plan: str
    # What it did at its end ('' while it had not come to it), or "broken" (`detail` says how).
    did: str
    detail: str


R = TypeVar("R", bound=Record)


class ClientLoad(Generic[R]):
    """`n` clients at once, each opening one after another (`_one`, on a record of its own:
    `_record`) until `stop`; one whose use fails with one of `FAILURES` is recorded broken."""

    FAILURES: tuple[type[BaseException], ...] = (OSError, TimeoutError, grpc.aio.AioRpcError)
    # The seconds a client waits between two uses: drawn from this range.
    PAUSE = (0.2, 1.0)

    def __init__(self, addresses: list[str], token: str | None, rng: random.Random, n: int):
        self.addresses, self.token, self.rng, self.concurrent = addresses, token, rng, n
        self.records: list[R] = []
        # Set by stop(): no client opens another. (Cancelling run_forever's task alone did
        # not stop them: two quick chaos runs saw 79 sessions opened after it, and never
        # settled.)
        self._stopping = asyncio.Event()
        self._channel, self._stub = replicas(addresses, token)

    async def run_forever(self) -> None:
        await asyncio.gather(*(self._client() for _ in range(self.concurrent)))

    def stop(self) -> None:
        """No new uses from now on; the open ones go on to their planned end, or are
        abandoned when run_forever's task is cancelled."""
        self._stopping.set()

    async def close(self) -> None:
        await self._channel.close()

    def counts(self) -> dict[str, int]:
        """How many ended each way (`_ending`)."""
        out: dict[str, int] = {}
        for r in self.records:
            key = self._ending(r)
            out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    def plan(self, endings: dict[str, float]) -> str:
        """An end drawn at random, by the endings' weights."""
        return self.rng.choices(list(endings), weights=list(endings.values()))[0]

    def _ending(self, record: R) -> str:
        """How a use ended, as counted: its plan and what it did."""
        return f"{record.plan}: {record.did or 'unfinished'}"

    def _record(self) -> R:
        raise NotImplementedError

    async def _one(self, record: R) -> None:
        raise NotImplementedError

    async def _client(self) -> None:
        while not self._stopping.is_set():
            record = self._record()
            self.records.append(record)
            try:
                await self._one(record)
            except self.FAILURES as exc:
                self._broke(record, exc)
            await asyncio.sleep(self.rng.uniform(*self.PAUSE))

    def _broke(self, record: R, exc: BaseException) -> None:
        """A use failed (one of `FAILURES`): it is broken, and how is said."""
        record.did = record.did or "broken"
        record.detail = record.detail or f"{type(exc).__name__}: {exc}"[:200]
