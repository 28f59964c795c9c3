"""A task's phone log for its readers: `Scheduler.StreamLogs`.

An attempt that ended is read from the log its host kept (its artifact of kind "logcat": a
gzip file, decompressed here, off the event loop, a chunk at a time). The running attempt is
read live from its host (control_plane.log_hosts):

    host agent ──Lease.LogLines──▶ replica B ──Scheduler.StreamLogs (relayed)──▶ replica A
                                    │                                            │
                               readers on B                                 readers on A

The host sends lines up only while someone follows: a reader here of an attempt whose host
holds its renewal stream here has `logs_wanted` pushed onto it (control_plane.log_tails'
`ask`), and the host's LogLines call here feeds the attempt's `Tail`, which every reader of
it here shares. A reader whose host is on another replica is fed by a relay: a StreamLogs
call to that replica, made as this replica (control_plane.auth's replica proof; the reader
was authorized here), one per attempt followed here. A reader gets the tail's lines from
its start (the host's recent lines, up to its RECENT) and, with `follow`, the new ones as
they come, until the host says the attempt's log ended or the task says the attempt is over
(the hub's `Following`, shared with the screens': one read per change of the task). A
follow that got no line of the attempt from its host before the attempt ended (it ended
before the host's call here opened: the host then says `ended` with none) is served the
log the attempt kept, once the task says it is over. No
database work per line: one read when a call starts, the task's reads while it is followed.
Filters are applied here, to each reader's lines (step marks and notes always pass).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from amc.v1 import scheduler_pb2
from amc_common import logcat
from control_plane import log_hosts, metrics, screen_tasks, validate
from control_plane.domain import TaskId
from control_plane.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    TaskMoved,
    TaskNotFound,
    Unavailable,
)
from control_plane.log_tails import Tail
from control_plane.rpc import TaskServicer, check_decoded, principal
from control_plane.screen_tasks import RUNNING, Attempt, Followed

log = structlog.get_logger(__name__)

KIND = "logcat"
# Lines and bytes a message carries at most.
BATCH_LINES = 1000
BATCH_BYTES = 256 * 1024
# How long a reader of a running attempt waits for the lines its host holds, and how long
# for the host's last lines once the task says the attempt is over.
CATCH_UP = 10.0
ENDING = 2.0
# How long a follow whose host had no line of the attempt waits for the task to say the
# attempt is over, to serve the log it kept instead.
KEPT_WAIT = 30.0
# Seconds with no feed here and no relay (the host left this replica) before a reader is
# told to follow again.
STALE = 10.0
READ = "read its phone's log"


@dataclass(frozen=True)
class Ask:
    task_id: uuid.UUID
    attempt: int
    follow: bool
    filter: logcat.Filter


def ask(request: scheduler_pb2.StreamLogsRequest) -> Ask:
    """What a StreamLogs asks for, checked."""
    task_id = validate.task_id(request.task_id)
    if request.attempt < 0:
        raise InvalidArgument("attempt", "must be 0 (the latest) or more")
    try:
        level = logcat.level(request.min_level)
    except ValueError as exc:
        raise InvalidArgument("min_level", str(exc)) from None
    try:
        tags = logcat.tags(request.tags)
    except ValueError as exc:
        raise InvalidArgument("tags", str(exc)) from None
    return Ask(task_id, request.attempt, request.follow, logcat.Filter(level, tags))


def batches(lines: list[str], attempt: int) -> Iterator[scheduler_pb2.StreamLogsResponse]:
    """`lines` in messages of at most BATCH_LINES lines and BATCH_BYTES bytes."""
    start, size = 0, 0
    for i, text in enumerate(lines):
        size += len(text) + 8
        if i > start and (i - start >= BATCH_LINES or size > BATCH_BYTES):
            yield scheduler_pb2.StreamLogsResponse(lines=lines[start:i], attempt=attempt)
            start, size = i, len(text) + 8
    if start < len(lines):
        yield scheduler_pb2.StreamLogsResponse(lines=lines[start:], attempt=attempt)


class LogRead:
    """One StreamLogs call."""

    def __init__(self, service: TaskServicer) -> None:
        self._svc = service
        # A line of the running attempt's came from its host (before any filter).
        self._heard = False

    async def run(
        self, request: Any, context: Any
    ) -> AsyncIterator[scheduler_pb2.StreamLogsResponse]:
        check_decoded(request)
        want = ask(request)
        source = await self.authorize(want.task_id)
        if want.attempt > max(source["attempt"], 0):
            raise NotFound(f"task {want.task_id} has no attempt {want.attempt}")
        while want.follow and not want.attempt and source["task_status"] == "queued":
            source = await self._queued(want.task_id)
        attempt = want.attempt or source["attempt"]
        if not attempt:
            raise FailedPrecondition(
                f"task {want.task_id} has not run yet ({source['task_status']}): it has no"
                " log; follow it to read the log as it runs"
            )
        live = source["task_status"] in RUNNING and attempt == source["attempt"]
        if live and source["host_id"] is not None:
            lines = self._live(want, Attempt(attempt, source["host_id"], source["serial"]), source)
        else:
            lines = self._kept(want, attempt)
        metrics.LOG_READERS.inc()
        try:
            await context.send_initial_metadata(())
            async for message in lines:
                yield message
        finally:
            metrics.LOG_READERS.dec()

    async def authorize(self, task_id: uuid.UUID) -> dict[str, Any]:
        """The task's source row, once the caller may read its log (as its screen: its
        submitter's team and operators; a relayed call's reader was authorized on its own
        replica)."""
        source = await self._source(task_id)
        who = principal()
        if not who.replica:
            screen_tasks.authorize(who, task_id, source, READ)
        return source

    async def _source(self, task_id: uuid.UUID) -> dict[str, Any]:
        ttl = self._svc.settings.lease_ttl
        source = await self._svc.store.replicas.screen_source(task_id, "", "", ttl)
        if source is None or not source["task_found"]:
            raise TaskNotFound(f"task {task_id} not found")
        return source

    async def _queued(self, task_id: uuid.UUID) -> dict[str, Any]:
        """The task read again once it changed (or after `watch_refresh`)."""
        every = self._svc.settings.watch_refresh.total_seconds()
        with self._svc.hub.watch(task_id) as changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every):
                    await changed.wait()
        return await self._source(task_id)

    # -- a log kept -----------------------------------------------------------------------

    async def _kept(
        self, want: Ask, attempt: int
    ) -> AsyncIterator[scheduler_pb2.StreamLogsResponse]:
        kept = [
            a
            for a in await self._svc.artifacts.list(TaskId(want.task_id))
            if a.kind == KIND and a.attempt == attempt
        ]
        if not kept:
            raise FailedPrecondition(
                f"attempt {attempt} of task {want.task_id} kept no log (its host keeps none,"
                " its phone gave none, or the attempt was given back unfinished)"
            )
        unpacked = log_hosts.Gunzip()
        async for chunk in self._svc.artifacts.read(kept[-1]):
            lines = await asyncio.to_thread(unpacked.lines, chunk, want.filter)
            for message in batches(lines, attempt):
                yield message
        last = want.filter.apply(unpacked.rest())
        yield scheduler_pb2.StreamLogsResponse(lines=last, attempt=attempt, caught_up=True)

    # -- the running attempt's --------------------------------------------------------------

    async def _live(
        self, want: Ask, bound: Attempt, source: dict[str, Any]
    ) -> AsyncIterator[scheduler_pb2.StreamLogsResponse]:
        svc, hub = self._svc, self._svc.hub
        tails, relayed = hub.tails, principal().replica
        host_id = str(bound.host_id)
        here = tails.has_feed(host_id) or hub.connected(host_id)
        elsewhere = (
            source["replica_id"] not in (None, hub.replica)
            and source["alive"]
            and bool(source["address"])
        )
        if not here and (relayed or not elsewhere):
            if relayed:
                raise Unavailable(f"host {host_id} is not connected to this replica")
            raise FailedPrecondition(
                f"host {host_id} is not connected: the attempt's log is kept when it ends"
            )
        with contextlib.ExitStack() as stack:
            followed: Followed | None = None
            if not relayed:
                every = svc.settings.watch_refresh.total_seconds()
                read = svc.store.replicas.screen_attempt
                followed = stack.enter_context(hub.following.follow(want.task_id, read, every))
                followed.join(bound)
            key = (str(want.task_id), bound.attempt)
            tail, reader = stack.enter_context(tails.follow(host_id, key))
            if followed is not None:
                stack.enter_context(followed.waking(reader))  # a read of the task wakes it
            if not here and tail.source is None:
                relay = log_hosts.relay(svc, tail, str(source["address"]))
                tails.relaying(tail, asyncio.get_running_loop().create_task(relay))
            tails.ask(host_id)
            log.info("log followed", task_id=key[0], attempt=key[1], relayed=relayed)
            async for message in self._tail(want, tail, reader, followed, bound):
                yield message
            if followed is None or self._heard or not (tail.ended or _over(followed, bound)):
                return
            # The attempt ended before its host's call here could send a line of it (the
            # host says `ended` with none, or said nothing): what it kept is the log.
            if await _settled_over(followed, bound):
                with contextlib.suppress(FailedPrecondition):
                    async for message in self._kept(want, bound.attempt):
                        yield message

    async def _tail(
        self,
        want: Ask,
        tail: Tail,
        reader: asyncio.Event,
        followed: Followed | None,
        bound: Attempt,
    ) -> AsyncIterator[scheduler_pb2.StreamLogsResponse]:
        """The tail's lines from its start; with `follow`, then the new ones until the
        attempt's log ends."""
        loop = asyncio.get_running_loop()
        tails = self._svc.hub.tails
        cursor, caught, over_at, missing_since = tail.first, False, None, None
        quiet_since = loop.time()
        while True:
            if tails.closing:
                raise Unavailable("control plane shutting down; follow the log again")
            if tail.lost is not None:
                raise Unavailable(tail.lost)
            reader.clear()
            lines, cursor = tail.read(cursor) if tail.caught_up else ([], cursor)
            self._heard = self._heard or bool(lines)
            if lines or (tail.caught_up and not caught):
                for message in batches(want.filter.apply(lines), bound.attempt):
                    yield message
                if not caught and tail.caught_up:
                    caught = True
                    yield scheduler_pb2.StreamLogsResponse(attempt=bound.attempt, caught_up=True)
                    if not want.follow:
                        return
                quiet_since = loop.time()
            if tail.ended and cursor >= tail.next:
                return
            if followed is not None and _over(followed, bound):
                over_at = over_at or loop.time()
                if loop.time() - over_at > ENDING:
                    return
            elif not caught and loop.time() - quiet_since > CATCH_UP:
                raise Unavailable(f"host {tail.host_id} sent none of the attempt's log in time")
            if tail.source is None and not tails.has_feed(tail.host_id):
                missing_since = missing_since or loop.time()
                if loop.time() - missing_since > STALE:  # gone, or back on another replica
                    raise Unavailable(f"host {tail.host_id} is not connected here: follow again")
            else:
                missing_since = None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(ENDING if over_at else 1.0):
                    await reader.wait()  # new lines, or the task read again


def _over(followed: Followed, bound: Attempt) -> bool:
    """The task says the attempt is no longer running (finished, or moved on)."""
    try:
        return followed.check(bound) == screen_tasks.FINISHED
    except TaskMoved:
        return True


async def _settled_over(followed: Followed, bound: Attempt) -> bool:
    """Whether the task says the attempt is over, waiting up to KEPT_WAIT for it to say so
    (its host uploads the kept log before it reports the end)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(KEPT_WAIT):
            while not _over(followed, bound):
                await followed.settled.wait()
            return True
    return False
