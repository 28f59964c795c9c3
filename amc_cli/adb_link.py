"""An adb door's link to its phone: the session's `Scheduler.AdbStreams` call, whose first
answer is the phone (what the door's CNXN banner says) and which then carries the door's
streams (amc_common.adb_carriage), numbered here. The call ends when the session does
(its lease ended, was cancelled or expired): `run` returns then, saying how.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

import grpc

from amc.v1 import adb_pb2, scheduler_pb2_grpc
from amc_common.adb_carriage import Carriage, Carried


class DoorLink:
    """One door's call: `open` it, then `stream` per adb stream while `run` reads."""

    def __init__(self, stub: scheduler_pb2_grpc.SchedulerStub, task_id: str) -> None:
        self._stub, self.task_id = stub, task_id
        self._call: Any = None
        self._outgoing: asyncio.Queue[adb_pb2.AdbStreamsRequest | None] = asyncio.Queue()
        self._carriage = Carriage(self._outgoing.put_nowait, adb_pb2.AdbStreamsRequest)
        self._numbers = itertools.count(1)
        self._writer: asyncio.Task[None] | None = None
        self.ended = asyncio.Event()
        self.why = ""

    async def open(self) -> adb_pb2.AdbPhone:
        """The phone, once its host joined the door; raises the call's AioRpcError."""
        self._call = self._stub.AdbStreams()
        opening = adb_pb2.AdbStreamsRequest(open=adb_pb2.AdbDoorOpen(task_id=self.task_id))
        await self._call.write(opening)
        first = await self._call.read()
        if first is grpc.aio.EOF:
            raise ConnectionError("the control plane ended the door before it opened")
        self._writer = asyncio.create_task(self._write())
        phone: adb_pb2.AdbPhone = first.phone
        return phone

    def stream(self, service: str) -> Carried:
        """A new stream asking the phone for `service`."""
        carried = self._carriage.stream(next(self._numbers))
        if self.ended.is_set():
            carried.ended(self.why)
            return carried
        self._carriage.frame(carried.number, open=service)
        return carried

    async def run(self) -> str:
        """Read the call until it ends; why it ended."""
        why = "the session is over"
        try:
            while (response := await self._call.read()) is not grpc.aio.EOF:
                self._carriage.deliver(response.frame)
        except grpc.aio.AioRpcError as exc:
            why = f"the door's call ended: {exc.code().name}: {exc.details()}"
        finally:
            self._end(why)
        return why

    async def close(self) -> None:
        """End the door from this side: its call is hung up."""
        self._end("the door closed")
        if self._writer is not None:
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer
        if self._call is not None:
            self._call.cancel()

    def _end(self, why: str) -> None:
        if not self.ended.is_set():
            self.why = why
            self.ended.set()
            self._carriage.end(why)
            self._outgoing.put_nowait(None)

    async def _write(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            while (message := await self._outgoing.get()) is not None:
                await self._call.write(message)
