"""Where a task's phone log comes from, for control_plane.logs: a host's `Lease.LogLines`
call (the attempts followed here down, their lines up), the relay of a running attempt's
lines from the replica holding its host's call, and a kept log's gzip file read back.

A host's batch is checked (its attempt, at most MAX_BATCH_LINES lines of at most
MAX_LINE_CHARS characters each) and handed to the attempt's tail here; a batch for an
attempt nobody here follows is dropped. A relay is a StreamLogs call made as this replica
(`authorization: Replica <secret>`, RELAYED_BY: never relayed on), unfiltered, since every
reader of the attempt here reads the one tail it feeds.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from amc.v1 import lease_pb2, scheduler_pb2
from amc_common import logcat
from control_plane import metrics, validate
from control_plane.errors import InvalidArgument
from control_plane.log_tails import Tail
from control_plane.rpc import TaskServicer, calling_host

log = structlog.get_logger(__name__)

RELAYED_BY = "amc-logs-relayed-by"
MAX_BATCH_LINES = 1000
MAX_LINE_CHARS = 16 * 1024
# Text a kept log may unpack to at most (its gzip file is within the artifact limit; this
# bounds what a damaged or hostile one could make the replica do).
MAX_UNPACKED = 1 << 30
# Bytes unpacked per step.
STEP = 4 << 20


class HostLogs:
    """A host's LogLines call: the attempts followed here down, their lines up."""

    def __init__(self, service: TaskServicer) -> None:
        self._svc = service

    def run(self, requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
        feeds = self._svc.hub.tails
        return feeds.serve(requests, calling_host, self._lines, metrics.LOG_FEEDS, _followed)

    async def _lines(self, host_id: str, requests: AsyncIterator[Any]) -> None:
        tails = self._svc.hub.tails
        with contextlib.suppress(Exception):  # the host left: its call ends here
            async for request in requests:
                if request.WhichOneof("part") != "batch":
                    return
                b = request.batch
                try:
                    key = _checked(b)
                except InvalidArgument as exc:
                    log.warning("log batch refused", host_id=host_id, error=exc.message)
                    continue
                lines = list(b.lines)
                if tails.deliver(host_id, key, b.first_seq, lines, b.caught_up, b.ended):
                    metrics.LOG_LINES.labels("received").inc(len(lines))
                else:
                    metrics.LOG_LINES.labels("unfollowed").inc(len(lines))


def _followed(followed: list[tuple[str, int]], _feed: object) -> lease_pb2.LogLinesResponse:
    return lease_pb2.LogLinesResponse(
        followed=[lease_pb2.LogFollow(task_id=t, attempt=a) for t, a in followed]
    )


def _checked(b: lease_pb2.LogBatch) -> tuple[str, int]:
    task_id = validate.task_id(b.task_id, "batch.task_id")
    if b.attempt < 1:
        raise InvalidArgument("batch.attempt", "must be 1 or more")
    if len(b.lines) > MAX_BATCH_LINES:
        raise InvalidArgument("batch.lines", f"more than {MAX_BATCH_LINES}")
    if any(len(x) > MAX_LINE_CHARS for x in b.lines):
        raise InvalidArgument("batch.lines", f"a line longer than {MAX_LINE_CHARS} characters")
    return str(task_id), b.attempt


async def relay(service: TaskServicer, tail: Tail, address: str) -> None:
    """The attempt's lines from the replica holding its host's call, into `tail`: a follow
    as this replica (its proof, not a reader's credentials)."""
    metadata = [
        ("authorization", service.auth.replica_proof()),
        (RELAYED_BY, service.hub.replica),
    ]
    task_id, attempt = tail.key
    request = scheduler_pb2.StreamLogsRequest(task_id=task_id, attempt=attempt, follow=True)
    call = service.peers.scheduler(address).StreamLogs(request, metadata=metadata)
    log.info("log relayed", task_id=task_id, attempt=attempt, to=address)
    try:
        async for message in call:
            metrics.LOG_LINES.labels("relayed").inc(len(message.lines))
            tail.put(0, list(message.lines), message.caught_up)
        tail.put(0, [], ended=True)
    except grpc.aio.AioRpcError as exc:
        tail.fail(
            f"log relay lost: the replica holding its host ({address}) answered "
            f"{exc.code().name}: {exc.details()}"
        )
    finally:
        call.cancel()


class Gunzip:
    """A kept log's gzip file (one or more members) unpacked as its chunks come: its whole
    lines, filtered; `rest()` the last one."""

    def __init__(self) -> None:
        self._unpacker = zlib.decompressobj(31)
        self._partial = b""
        self._unpacked = 0

    def lines(self, chunk: bytes, keep: logcat.Filter) -> list[str]:
        found: list[str] = []
        data = chunk
        while self._unpacked < MAX_UNPACKED:
            try:
                out = self._unpacker.decompress(data, STEP)
            except zlib.error as exc:
                found.append(logcat.divider(f"the kept log is damaged here: {exc}"))
                self._unpacked = MAX_UNPACKED
                break
            self._unpacked += len(out)
            found += self._split(out)
            if self._unpacker.eof:  # the next member, if any
                data = self._unpacker.unused_data
                self._unpacker = zlib.decompressobj(31)
                if not data:
                    break
                continue
            data = self._unpacker.unconsumed_tail
            if not data and len(out) < STEP:
                break
        return keep.apply(found)

    def _split(self, out: bytes) -> list[str]:
        *whole, self._partial = (self._partial + out).split(b"\n")
        return [x.decode("utf-8", "replace") for x in whole]

    def rest(self) -> list[str]:
        partial, self._partial = self._partial, b""
        return [partial.decode("utf-8", "replace")] if partial else []
