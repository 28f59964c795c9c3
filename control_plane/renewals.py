"""A host's `Lease.RenewLeases` stream: its renewals answered in order, and what the
replica pushes onto it between them (a cancellation, a drain or its end, a released
device, a viewer waiting for the host's screen feed or a reader for its log feed, the
replica closing; and what those
notices would have pushed, read from the database as the stream opens and after its
replica's LISTEN connection reconnected: a StreamState)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import structlog

from amc.v1 import lease_pb2
from control_plane import metrics, validate, validate_lease
from control_plane.auth import check_host
from control_plane.convert import duration, steps_from_pb
from control_plane.domain import (
    CancelNotice,
    DrainNotice,
    LogsNotice,
    Notice,
    ReleaseNotice,
    ScreenNotice,
    StreamState,
)
from control_plane.errors import DatabaseUnavailable, InvalidArgument, Unavailable
from control_plane.rpc import TaskServicer, check_decoded, principal
from control_plane.store import Store

log = structlog.get_logger(__name__)
_canonical_uuid = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
).fullmatch
CLOSING = lease_pb2.RenewLeasesResponse()  # the sentinel hub.close() puts on each stream
# A stream's drain read that failed (the database away) is tried again after this long,
# doubling up to the second figure, while the stream lasts.
DRAIN_READ_RETRY = (0.2, 5.0)
# Cancellations' delivery being recorded, run past the push that caused them.
_background: set[asyncio.Task[None]] = set()

Outbox = asyncio.Queue[lease_pb2.RenewLeasesResponse | None]


class RenewalStream:
    """One RenewLeases call: bound to the host of its first request."""

    def __init__(self, service: TaskServicer) -> None:
        self.service = service
        self.store = service.store
        # A screen_wanted push waits in the outbox: however many viewers ask meanwhile,
        # one is enough (the outbox stays bounded while the host reads slowly).
        self._screen_pending = False
        self._logs_pending = False

    async def run(
        self, requests: AsyncIterator[lease_pb2.RenewLeasesRequest]
    ) -> AsyncIterator[lease_pb2.RenewLeasesResponse]:
        outbox: Outbox = asyncio.Queue()
        with contextlib.ExitStack() as stack:
            reader = asyncio.create_task(self._read(requests, outbox, stack))
            try:
                while (response := await outbox.get()) is not None:
                    if response is CLOSING:
                        raise Unavailable("control plane shutting down; reconnect")
                    if response.screen_wanted:
                        self._screen_pending = False
                    if response.logs_wanted:
                        self._logs_pending = False
                    yield response
                await reader
            finally:
                reader.cancel()

    async def _read(
        self,
        requests: AsyncIterator[lease_pb2.RenewLeasesRequest],
        outbox: Outbox,
        stack: contextlib.ExitStack,
    ) -> None:
        bound: str | None = None
        try:
            async for request in requests:
                check_decoded(request)
                host_id = validate.identifier(request.host_id, "host_id")
                check_host(principal(), host_id)
                if bound is None:
                    bound = host_id
                    drain = StreamDrain(
                        self.store, host_id, lambda d: outbox.put_nowait(_drain_push(d))
                    )
                    stack.callback(drain.close)
                    # Subscribed before the first read: no change falls between them.
                    stack.enter_context(
                        self.service.hub.host_stream(
                            host_id, functools.partial(self._on_notice, outbox=outbox, drain=drain)
                        )
                    )
                    log.info("renewal stream opened", host_id=host_id)
                    # What notices would have pushed before it opened (on another replica,
                    # or on none while the host moved): the drain, then the releases. Not
                    # the cancels: the answer to this first request carries them
                    # (cancel_pending), as it would to a host that heard no push.
                    state = await drain.opened(
                        functools.partial(self.store.hosts.stream_state, host_id)
                    )
                    self._pending(state, outbox, drain, cancels=False)
                    if self.service.hub.screens.wanted(host_id):  # a viewer waits here
                        self._want_screen(outbox, drain)
                    if self.service.hub.tails.wanted(host_id):  # a reader follows here
                        self._want_logs(outbox, drain)
                elif host_id != bound:
                    raise InvalidArgument("host_id", f"this stream belongs to host '{bound}'")
                if request.pools:  # the host's emulator pools: told what waits for them
                    push = functools.partial(_wanted_push, outbox=outbox, drain=drain)
                    told = self.service.hub.pools.told(
                        host_id, validate_lease.pools(request.pools), push
                    )
                    stack.enter_context(told)
                outbox.put_nowait(await self._answer(host_id, request))
        finally:
            outbox.put_nowait(None)
            if bound:
                log.info("renewal stream closed", host_id=bound)

    async def _answer(
        self, host_id: str, request: lease_pb2.RenewLeasesRequest
    ) -> lease_pb2.RenewLeasesResponse:
        """The renewal's answer. With the database away, one that renews nothing (no
        leases, no valid_for): each lease's deadline stands, the host sends the steps again
        with its next renewal, and the stream stays open. Ending it would have every host
        that renews during a database fault reconnect (and authenticate) at once as the
        database comes back, and allocate its stream anew each time."""
        try:
            return await self._renew(host_id, request)
        except DatabaseUnavailable:
            metrics.RENEWALS.labels("unanswered").inc(len(request.lease_ids))
            return lease_pb2.RenewLeasesResponse(seq=request.seq)

    async def _renew(
        self, host_id: str, request: lease_pb2.RenewLeasesRequest
    ) -> lease_pb2.RenewLeasesResponse:
        validate_lease.lease_ids(request.lease_ids)
        validate_lease.step_progress(request.steps)
        # Lease ids as the database spells them (what hosts send); any other spelling
        # uuid.UUID accepts is mapped to it, and what is not a UUID is a conflict.
        canonical: list[str] = []
        spelled: dict[str, str] = {}
        for raw in request.lease_ids:
            if _canonical_uuid(raw):
                canonical.append(raw)
                continue
            try:
                spelled[raw] = str(uuid.UUID(raw))
            except ValueError:
                continue
            canonical.append(spelled[raw])
        ttl = self.service.settings.lease_ttl
        renewals = (
            await self.store.leases.renew_grouped(host_id, canonical, ttl) if canonical else []
        )
        self.service.effects.renewed(host_id, len(request.lease_ids), renewals)
        if request.steps:  # those of the leases renewed wait for the replica's bulk write
            self.service.hub.progress.add(renewals, steps_from_pb(request.steps))
        by_id = {str(r.lease_id): r for r in renewals}
        response = lease_pb2.RenewLeasesResponse(seq=request.seq, valid_for=duration(ttl))
        add = response.leases.add
        for raw in request.lease_ids:
            renewal = by_id.get(spelled.get(raw, raw) if spelled else raw)
            if renewal is None:
                add(lease_id=raw, result=lease_pb2.RENEWAL_RESULT_CONFLICT)
            else:
                add(
                    lease_id=raw,
                    result=lease_pb2.RENEWAL_RESULT_RENEWED,
                    cancel_pending=renewal.cancel_pending,
                    task_id=str(renewal.task_id),
                    attempt=renewal.attempt,
                )
        return response

    def _on_notice(
        self,
        notice: Notice | None,
        outbox: Outbox,
        drain: StreamDrain,
    ) -> None:
        """What hub.close() (None), a cancel, a drain, a release, a screen or logs wanted
        or a stream's state read again does to a stream: a drain notice has the stream
        read the host's drain again (StreamDrain), the others go on its outbox (a release
        or a screen or logs wanted with the drain the agent was last told, so that an agent
        reading any push without leases as its drain state reads it right)."""
        if notice is None:
            outbox.put_nowait(CLOSING)
        elif isinstance(notice, DrainNotice):
            drain.changed()
        elif isinstance(notice, ScreenNotice):
            self._want_screen(outbox, drain)
        elif isinstance(notice, LogsNotice):
            self._want_logs(outbox, drain)
        elif isinstance(notice, ReleaseNotice):
            outbox.put_nowait(_release_push(notice.serial, drain.told))
        elif isinstance(notice, StreamState):
            # Read after notices may have been lost: a drain the agent was told otherwise
            # is read again (the one read that decides, see StreamDrain), and the rest is
            # pushed (an agent takes a release or a cancel it had already as a no-op).
            if notice.draining != drain.told:
                drain.changed()
            self._pending(notice, outbox, drain)
        else:
            self._cancel(notice, outbox)

    def _pending(
        self, state: StreamState, outbox: Outbox, drain: StreamDrain, *, cancels: bool = True
    ) -> None:
        """The releases (and `cancels`: the cancels) a read of the stream's state found."""
        for serial in state.released:
            outbox.put_nowait(_release_push(serial, drain.told))
        for cancel in state.cancels if cancels else ():
            self._cancel(cancel, outbox)

    def _cancel(self, notice: CancelNotice, outbox: Outbox) -> None:
        metrics.CANCEL_DELIVERY.labels("push").observe(
            max(0.0, time.time() - notice.requested_epoch)
        )
        # Recorded for the delivered -> stopped split; a lost update only costs a metric.
        task = asyncio.create_task(self.store.leases.mark_cancel_delivered(notice.lease_id))
        _background.add(task)
        task.add_done_callback(_background.discard)
        outbox.put_nowait(_cancel_push(notice))

    def _want_screen(self, outbox: Outbox, drain: StreamDrain) -> None:
        """Ask the host for its screen feed, unless an ask waits in the outbox already."""
        if not self._screen_pending:
            self._screen_pending = True
            outbox.put_nowait(_screen_push(drain.told))

    def _want_logs(self, outbox: Outbox, drain: StreamDrain) -> None:
        """Ask the host for its log feed, unless an ask waits in the outbox already."""
        if not self._logs_pending:
            self._logs_pending = True
            outbox.put_nowait(
                lease_pb2.RenewLeasesResponse(push=True, drain=drain.told, logs_wanted=True)
            )


class StreamDrain:
    """What one renewal stream's agent is told of its host's drain: the database's state,
    whatever order the notices come in (issue 21).

    A notice (a drain, or the uncordon that ends one) only says "look again": the state
    pushed is read from the database after the notice came, one read at a time, and a read
    that a newer notice overtook is read again before anything is pushed. So the later
    state wins, whether the notices are this replica's own, the database's echo of them or
    another replica's, and however a read and a commit interleave. The stream subscribes
    before its first read. An agent takes a stream that opens as not drained, so only a
    change from what it was last told is pushed. Drains are operator actions: a read per
    notice per stream of the host, never on the renewal path. After the replica's LISTEN
    connection reconnected (a drain's notice may be lost), its one read of every stream's
    state has a stream look again only where the agent was told otherwise."""

    def __init__(self, store: Store, host_id: str, push: Callable[[bool], None]) -> None:
        self._store = store
        self._host_id = host_id
        self._push = push
        self._told = False
        self._stale = False
        self._looking: asyncio.Task[None] | None = None

    async def opened(self, read: Callable[[], Awaitable[StreamState]]) -> StreamState:
        """The first look, as the stream opens, with `read` (the host's whole state, of
        which it keeps the drain); its failure is the stream's. The state it last read."""
        state = StreamState(self._host_id)

        async def draining() -> bool:
            nonlocal state
            state = await read()
            return state.draining

        self._stale = True
        self._looking = asyncio.create_task(self._look(draining, retry=False))
        await self._looking
        return state

    @property
    def told(self) -> bool:
        """The drain state the agent was last told."""
        return self._told

    def changed(self) -> None:
        """A drain notice for the host: look again (a read under way may predate it)."""
        self._stale = True
        if self._looking is None or self._looking.done():
            read = functools.partial(self._store.hosts.host_draining, self._host_id)
            self._looking = asyncio.create_task(self._look(read, retry=True))

    def close(self) -> None:
        if self._looking is not None:
            self._looking.cancel()

    async def _look(self, read: Callable[[], Awaitable[bool]], *, retry: bool) -> None:
        pause = DRAIN_READ_RETRY[0]
        while self._stale:
            self._stale = False
            try:
                draining = await read()
            except Exception as error:
                if not retry:
                    raise
                log.warning(
                    "host drain not read; retrying", host_id=self._host_id, error=str(error)
                )
                self._stale = True
                await asyncio.sleep(pause)
                pause = min(pause * 2, DRAIN_READ_RETRY[1])
                continue
            if self._stale:
                continue  # a change committed during the read: this answer may predate it
            if draining != self._told:
                self._told = draining
                self._push(draining)


def _cancel_push(notice: CancelNotice) -> lease_pb2.RenewLeasesResponse:
    """The pushed message (no renewal asked for it) that tells the host to cancel."""
    state = lease_pb2.LeaseState(
        lease_id=str(notice.lease_id),
        cancel_pending=True,
        task_id=str(notice.task_id),
        attempt=notice.attempt,
    )
    return lease_pb2.RenewLeasesResponse(leases=[state], push=True)


def _release_push(serial: str, drain: bool) -> lease_pb2.RenewLeasesResponse:
    """The pushed message (no leases) that tells the host an operator released `serial`."""
    return lease_pb2.RenewLeasesResponse(push=True, drain=drain, release_serials=[serial])


def _screen_push(drain: bool) -> lease_pb2.RenewLeasesResponse:
    """The pushed message (no leases) that asks the host to open its ScreenFrames call."""
    return lease_pb2.RenewLeasesResponse(push=True, drain=drain, screen_wanted=True)


def _wanted_push(wanted: dict[str, int], outbox: Outbox, drain: StreamDrain) -> None:
    """Tells the host how many tasks wait for each of its emulator pools (a push, no leases)."""
    counts = [lease_pb2.PoolWanted(pool=p, tasks=n) for p, n in sorted(wanted.items())]
    outbox.put_nowait(lease_pb2.RenewLeasesResponse(push=True, drain=drain.told, wanted=counts))


def _drain_push(drain: bool) -> lease_pb2.RenewLeasesResponse:
    """The pushed message (no leases) that tells the host to drain, or to take work again."""
    return lease_pb2.RenewLeasesResponse(push=True, drain=drain)
