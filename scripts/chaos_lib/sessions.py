"""Interactive sessions in the chaos run (issue 23): a few clients that keep a session
open on the agents' phones (label pool=agents), act on it, and end it one of three ways:
close it (expected done), cancel it with CancelTask while an action waits (expected
cancelled), or vanish (expected failed, "session abandoned"). Each session's client
reaches the replicas through gRPC's round-robin over their addresses, and its host
through its own proxy over them, so most sessions are relayed between two replicas, and
a replica kill, an agent kill or a freeze may end one another way. What each client did
and saw is kept for invariant 9 (`Checks._sessions_end_as_specified`): a session ends as
the spec says.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import duration_pb2

from amc.v1 import scheduler_pb2, task_pb2
from chaos_lib.clients import ClientLoad

ENDINGS = {"close": 0.6, "cancel": 0.2, "abandon": 0.2}
# The endings a session may have for other reasons than its plan (the spec's rule: failed
# for every stop that is not a cancellation), by the start of the task's error.
OTHER_FAILURES = (
    "session abandoned",  # its client left or went idle (or its stream broke: a replica kill)
    "session relay",  # lost or ended: a replica between the client and the host died
    "lease ",  # lost (the host fenced itself), expired or released (the sweep)
    "host shutting down",
    "deadline exceeded",
    "device lost",
    "device quarantined",  # its phone stopped answering; stopped before its recovery
    "queue timeout",
)
IDLE_TIMEOUT = 5.0
MAX_DURATION = 60.0
SELECTOR = task_pb2.DeviceSelector(labels={"pool": "agents"})


def _seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(value * 1e9))
    return d


@dataclass
class SessionRecord:
    """One session as its client lived it."""

    plan: str  # close, cancel or abandon
    task_id: str = ""
    opened_at: float = 0.0
    dispatched: bool = False
    actions: int = 0  # answered steps
    # What the client did at the end: closed, cancel_sent, cancel_acked, abandoned, or
    # broken (its stream failed first: `code`).
    did: str = ""
    code: str = ""
    detail: str = ""  # the error's details, when its stream failed
    final: str = ""  # the status of the last response, when one came
    cancel_acked_at: float | None = None  # wall clock when CancelTask answered


class SessionLoad(ClientLoad[SessionRecord]):
    FAILURES = (grpc.aio.AioRpcError, TimeoutError)
    PAUSE = (0.1, 0.5)

    def __init__(
        self,
        addresses: list[str],
        token: str | None,
        rng: random.Random,
        concurrent: int = 3,
        selector: task_pb2.DeviceSelector = SELECTOR,
        snapshots: tuple[str, ...] = (),
    ) -> None:
        super().__init__(addresses, token, rng, concurrent)
        # Where the sessions run, and the snapshots they start from (one drawn per session;
        # none: no start snapshot): the emulator pool's sessions (chaos_lib/emulators.py).
        self.selector, self.snapshots = selector, snapshots

    def errors(self) -> dict[str, int]:
        """How the sessions' streams failed, by code and details."""
        out: dict[str, int] = {}
        for r in self.records:
            if r.code:
                key = f"{r.code}: {r.detail[:100]}"
                out[key] = out.get(key, 0) + 1
        return dict(sorted(out.items()))

    def _ending(self, record: SessionRecord) -> str:
        return super()._ending(record) + (f" {record.code}" if record.code else "")

    def _record(self) -> SessionRecord:
        return SessionRecord(self.plan(ENDINGS))

    def _broke(self, record: SessionRecord, exc: BaseException) -> None:
        record.did = record.did or "broken"
        if isinstance(exc, grpc.aio.AioRpcError):
            record.code = exc.code().name
            record.detail = exc.details() or ""
        else:
            record.code = "client timeout"

    async def _one(self, record: SessionRecord) -> None:
        call: Any = self._stub.OpenSession()
        try:
            opening = scheduler_pb2.SessionOpen(
                selector=self.selector,
                start_snapshot=self.rng.choice(self.snapshots) if self.snapshots else "",
                idle_timeout=_seconds(IDLE_TIMEOUT),
                max_duration=_seconds(MAX_DURATION),
                metadata={"chaos": "1", "session": record.plan},
            )
            await call.write(scheduler_pb2.OpenSessionRequest(open=opening))
            record.opened_at = time.time()
            async with asyncio.timeout(90):
                while True:
                    response = await call.read()
                    if response is grpc.aio.EOF:
                        record.did = "broken"
                        record.code = "EOF"
                        return
                    record.task_id = response.task.task_id
                    if response.task.status == task_pb2.TASK_STATUS_DISPATCHED:
                        break
                    if response.task.status in (
                        task_pb2.TASK_STATUS_DONE,
                        task_pb2.TASK_STATUS_FAILED,
                        task_pb2.TASK_STATUS_CANCELLED,
                    ):
                        record.final = _status(response.task.status)
                        record.did = "ended before it started"
                        return
                record.dispatched = True
                await self._act_then_end(call, record)
        finally:
            call.cancel()

    async def _act_then_end(self, call: Any, record: SessionRecord) -> None:
        for _ in range(self.rng.randint(2, 10)):
            action = self._action()
            await call.write(scheduler_pb2.OpenSessionRequest(action=action))
            if not await self._answered(call, record):
                return
            await asyncio.sleep(self.rng.uniform(0.0, 0.3))
        if record.plan == "abandon":
            record.did = "abandoned"
            return  # the `finally` cancels the call: the client vanished
        if record.plan == "cancel":
            wait = task_pb2.Action(wait=task_pb2.Wait(duration=_seconds(20)))
            await call.write(
                scheduler_pb2.OpenSessionRequest(action=task_pb2.SessionAction(action=wait))
            )
            await asyncio.sleep(self.rng.uniform(0.05, 0.5))
            record.did = "cancel_sent"
            await self._stub.CancelTask(
                scheduler_pb2.CancelTaskRequest(task_id=record.task_id, reason="chaos: session"),
                timeout=10,
            )
            record.did, record.cancel_acked_at = "cancel_acked", time.time()
        else:
            await call.done_writing()
            record.did = "closed"
        while (response := await call.read()) is not grpc.aio.EOF:
            if response.HasField("task"):
                record.final = _status(response.task.status)
                await call.done_writing()  # the stream ends once our side is closed too

    async def _answered(self, call: Any, record: SessionRecord) -> bool:
        """The action's step came back (True), or the session's end did (False)."""
        response = await call.read()
        if response is grpc.aio.EOF:
            record.did, record.code = "broken", "EOF"
            return False
        if response.HasField("task"):
            record.final = _status(response.task.status)
            record.did = "ended by the farm"
            with contextlib.suppress(grpc.aio.AioRpcError):
                await call.done_writing()  # the stream ends once our side is closed too
                while await call.read() is not grpc.aio.EOF:
                    pass
            return False
        record.actions += 1
        return True

    def _action(self) -> task_pb2.SessionAction:
        roll = self.rng.random()
        if roll < 0.5:
            action = task_pb2.Action(tap=task_pb2.Tap(x=self.rng.randint(0, 1079), y=500))
        elif roll < 0.7:
            action = task_pb2.Action(wait=task_pb2.Wait(duration=_seconds(0.2)))
        else:
            action = task_pb2.Action(key=task_pb2.Key(keycode=4))
        observe = task_pb2.Observe(screenshot=self.rng.random() < 0.3)
        return task_pb2.SessionAction(action=action, observe=observe)


def _status(value: int) -> str:
    return task_pb2.TaskStatus.Name(value).removeprefix("TASK_STATUS_").lower()
