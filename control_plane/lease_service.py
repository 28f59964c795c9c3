"""amc.v1.Lease: the host agents' side — register, acquire, renew, report, release."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from datetime import timedelta

import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc, task_pb2
from control_plane import errors, metrics, validate
from control_plane.artifacts import UploadMemory, receive
from control_plane.auth import Authenticator, check_host
from control_plane.config import Settings
from control_plane.convert import (
    artifact_from_pb,
    artifact_to_pb,
    assignment_to_pb,
    device_from_pb,
    duration,
    health_from_pb,
    report_from_pb,
    steps_from_pb,
    task_to_pb,
)
from control_plane.dispatch import Waiter
from control_plane.domain import Assignment, CancelNotice, DrainNotice, LeaseId, ReleaseNotice
from control_plane.effects import Effects
from control_plane.errors import AmcError, HostNotRegistered, InvalidArgument, Unavailable
from control_plane.lifecycle import Event
from control_plane.rpc import Context, TaskServicer, check_decoded, code_for, principal, rpc
from control_plane.screens import HostFeed
from control_plane.sessions import HostSession, Peers
from control_plane.store import Store

log = structlog.get_logger(__name__)
# Jitter from a generator of its own: drawing from the global one would change the state
# that other code in the process (tests, libraries) relies on.
_RANDOM = random.Random()
_canonical_uuid = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
).fullmatch
# Up to this share of an Acquire's wait is cut, at random (see Acquire).
REPOLL_SPREAD = 0.4
CLOSING = lease_pb2.RenewLeasesResponse()  # the sentinel hub.close() puts on each stream
# An Acquire whose offered task was locked when it looked (it could take it) looks again
# after this long, doubling up to the second figure, while the task stays queued.
LOCKED_RETRY = (0.05, 1.0)
# How often a parked Acquire whose database went away looks again (if not woken sooner).
OUTAGE_RETRY = 1.0


class LeaseService(TaskServicer, lease_pb2_grpc.LeaseServicer):
    SERVICE = "amc.v1.Lease"

    def __init__(
        self,
        auth: Authenticator,
        store: Store,
        effects: Effects,
        settings: Settings,
        peers: Peers | None = None,
    ) -> None:
        super().__init__(auth, store, effects, settings)
        # Channels to the other replicas, for sessions whose client is on one of them.
        self.peers = peers or Peers(None)
        self._pending: set[asyncio.Task[None]] = set()
        self._upload_memory = UploadMemory(settings.max_upload_memory)

    def _host(self, host_id: str) -> str:
        validate.identifier(host_id, "host_id")
        check_host(principal(), host_id)
        return host_id

    @rpc
    async def RegisterHost(
        self, request: lease_pb2.RegisterHostRequest, context: Context
    ) -> lease_pb2.RegisterHostResponse:
        host_id = self._host(request.host_id)
        labels = validate.string_map(dict(request.labels), "labels")
        validate.devices(request.devices)
        devices = [device_from_pb(d, labels) for d in request.devices]
        await self.store.register_host(host_id, labels, devices)
        # Its devices' labels or states may have changed: its parked Acquires look again.
        self.hub.host_registered(host_id)
        log.info("host registered", host_id=host_id, devices=[d.serial for d in devices])
        return lease_pb2.RegisterHostResponse(
            lease_ttl=duration(self.settings.lease_ttl),
            renew_interval=duration(self.settings.renew_every),
        )

    @rpc
    async def ReportDeviceHealth(
        self, request: lease_pb2.ReportDeviceHealthRequest, context: Context
    ) -> lease_pb2.ReportDeviceHealthResponse:
        host_id = self._host(request.host_id)
        validate.device_health(request.devices)
        health = [health_from_pb(h) for h in request.devices]
        if health and await self.store.set_device_health(host_id, health):
            # A device turned ready: the host's parked Acquires look again, as after a
            # registration (a held device is simply not idle to the next query).
            self.hub.host_registered(host_id)
        log.info(
            "device conditions",
            host_id=host_id,
            conditions={h.serial: h.condition for h in health},
        )
        return lease_pb2.ReportDeviceHealthResponse()

    @rpc
    async def Acquire(
        self, request: lease_pb2.AcquireRequest, context: Context
    ) -> lease_pb2.AcquireResponse:
        host_id = self._host(request.host_id)
        serials = validate.serials(request.idle_serials, "idle_serials")
        validate.wait(request.wait)
        # Clamped before any conversion: a huge Duration does not fit a timedelta.
        asked = request.wait.seconds + request.wait.nanos / 1e9
        # Shortened by a random share: hosts that connected together (as all do after a
        # restart or a failover) and ask the same wait would otherwise come back together,
        # every period, each with a query. Spread, their returns cost the database a
        # steady trickle instead of bursts.
        wait = min(asked, self.settings.max_acquire_wait.total_seconds())
        wait *= 1.0 - _RANDOM.uniform(0.0, REPOLL_SPREAD)
        ttl = self.settings.lease_ttl
        loop = asyncio.get_running_loop()
        started = loop.time()
        found = await self._acquire(host_id, serials, ttl, started + wait) if serials else []
        if not serials:  # nothing to offer work to: just hold the call as asked
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.hub.closed.wait(), wait)
        metrics.ACQUIRE_WAIT.observe(loop.time() - started)
        self.effects.assigned(host_id, found)
        return lease_pb2.AcquireResponse(assignments=[assignment_to_pb(a, ttl) for a in found])

    async def _acquire(
        self, host_id: str, serials: list[str], ttl: timedelta, deadline: float
    ) -> list[Assignment]:
        """Ask the database; if nothing is there, park (indexed by the idle devices' labels)
        until an offer fits or the deadline passes, and ask again. See control_plane.dispatch."""
        dispatcher = self.hub.dispatcher
        waiter = Waiter(host_id)
        loop = asyncio.get_running_loop()
        taken: set[str] = set()
        pause = LOCKED_RETRY[0]
        parked = False
        dispatcher.enter(waiter)
        try:
            while True:
                mark = dispatcher.offered
                looked_for, waiter.offers = waiter.offers, {}
                waiter.woken.clear()
                waiter.everything = False
                metrics.ACQUIRE_QUERIES.inc()
                try:
                    acquired = await self.store.acquire(host_id, serials, ttl, list(looked_for))
                except errors.DatabaseUnavailable:
                    # A parked call woken while the database fails over stays parked (its
                    # host would only ask again): it looks again when the database is back
                    # (every Acquire is woken then) or soon, until its wait ends.
                    remaining = deadline - loop.time()
                    if not parked or remaining <= 0 or self.hub.closing:
                        raise
                    waiter.offers.update(looked_for)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(waiter.woken.wait(), min(remaining, OUTAGE_RETRY))
                    continue
                parked = True
                taken = {str(a.task_id) for a in acquired.assignments}
                dispatcher.park(waiter, acquired.idle)
                missed = [o for o in looked_for.values() if o.task_id not in taken]
                # Offers it had no room for go on to another host.
                dispatcher.offer_again([o for o in missed if not waiter.can_take(o)], skip=waiter)
                # One an idle device here fits was not there to take: gone (another host
                # has it, or it was cancelled) unless still queued, i.e. locked by another
                # transaction when the query passed it (a scan that may leave it). That one
                # it keeps, and looks again soon, until it takes it or it is gone. (An offer
                # without its labels, too big to send, may only seem to fit: not kept.)
                locked = [
                    o
                    for o in missed
                    if o.labels is not None and waiter.can_take(o) and o.task_id in acquired.queued
                ]
                for o in locked:
                    waiter.offers.setdefault(o.task_id, o)
                if acquired.assignments:
                    return acquired.assignments
                if not acquired.idle and not await self.store.host_registered(host_id):
                    # Forgotten (retention, `amc hosts remove`) while it was away: it takes
                    # no work until it registers its devices again, which the agent does.
                    raise HostNotRegistered(
                        f"host '{host_id}' is not registered (forgotten after a long "
                        "disconnection, or removed): register it again"
                    )
                remaining = deadline - loop.time()
                if remaining <= 0 or self.hub.closing:
                    return []
                dispatcher.missed_since(mark, waiter)
                if locked:
                    remaining = min(remaining, pause)
                    pause = min(pause * 2, LOCKED_RETRY[1])
                else:
                    pause = LOCKED_RETRY[0]
                try:
                    await asyncio.wait_for(waiter.woken.wait(), remaining)
                except TimeoutError:
                    if loop.time() >= deadline and not waiter.offers:
                        # Its wait ran out with nothing offered that fits: nothing to ask
                        # the database. The host asks again at once, and that Acquire's
                        # first query looks (so a re-poll costs one query, not two).
                        return []
                if self.hub.closing:
                    return []
        finally:
            dispatcher.leave(waiter, ended=True)
            # Offers that came after its last look: someone else may take them.
            dispatcher.offer_again(
                [o for o in waiter.offers.values() if o.task_id not in taken], skip=waiter
            )

    @rpc
    async def RenewLeases(
        self,
        request_iterator: AsyncIterator[lease_pb2.RenewLeasesRequest],
        context: Context,
    ) -> AsyncIterator[lease_pb2.RenewLeasesResponse]:
        outbox: asyncio.Queue[lease_pb2.RenewLeasesResponse | None] = asyncio.Queue()
        with contextlib.ExitStack() as stack:
            reader = asyncio.create_task(self._read_renewals(request_iterator, outbox, stack))
            try:
                while (response := await outbox.get()) is not None:
                    if response is CLOSING:
                        raise Unavailable("control plane shutting down; reconnect")
                    yield response
                await reader
            finally:
                reader.cancel()

    async def _read_renewals(
        self,
        requests: AsyncIterator[lease_pb2.RenewLeasesRequest],
        outbox: asyncio.Queue[lease_pb2.RenewLeasesResponse | None],
        stack: contextlib.ExitStack,
    ) -> None:
        bound: str | None = None
        try:
            async for request in requests:
                check_decoded(request)
                host_id = self._host(request.host_id)
                if bound is None:
                    bound = host_id
                    drain = StreamDrain(
                        self.store, host_id, lambda d: outbox.put_nowait(_drain_push(d))
                    )
                    stack.callback(drain.close)
                    # Subscribed before the first read: no change falls between them.
                    stack.enter_context(
                        self.hub.host_stream(
                            host_id, functools.partial(self._on_notice, outbox=outbox, drain=drain)
                        )
                    )
                    log.info("renewal stream opened", host_id=host_id)
                    await drain.opened()
                elif host_id != bound:
                    raise InvalidArgument("host_id", f"this stream belongs to host '{bound}'")
                outbox.put_nowait(await self._renew(host_id, request))
        finally:
            outbox.put_nowait(None)
            if bound:
                log.info("renewal stream closed", host_id=bound)

    async def _renew(
        self, host_id: str, request: lease_pb2.RenewLeasesRequest
    ) -> lease_pb2.RenewLeasesResponse:
        validate.lease_ids(request.lease_ids)
        validate.step_progress(request.steps)
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
        ttl = self.settings.lease_ttl
        steps = steps_from_pb(request.steps)
        renewals = await self.store.renew(host_id, canonical, ttl, steps) if canonical else []
        self.effects.renewed(host_id, len(request.lease_ids), renewals, steps)
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

    @rpc
    async def ReportResult(
        self, request: lease_pb2.ReportResultRequest, context: Context
    ) -> task_pb2.Task:
        validate.report(request)
        report = report_from_pb(request)
        host_id = principal().host_id
        answer = await self.store.report(host_id, report)
        self.effects.reported(host_id, report, answer)
        return task_to_pb(answer.task)

    @rpc
    async def ReportResults(
        self, request: lease_pb2.ReportResultsRequest, context: Context
    ) -> lease_pb2.ReportResultsResponse:
        validate.reports(request.results)
        reports = [report_from_pb(r) for r in request.results]
        host_id = principal().host_id
        answers = await self.store.report_many(host_id, reports) if reports else []
        response = lease_pb2.ReportResultsResponse()
        for report, answer in zip(reports, answers, strict=True):
            if isinstance(answer, AmcError):
                self.effects.refused(host_id, report, answer)
                response.answers.add(code=code_for(answer).value[0], message=answer.message)
            else:
                self.effects.reported(host_id, report, answer)
                response.answers.add(code=0, task=task_to_pb(answer.task))
        return response

    @rpc
    async def ReleaseLease(
        self, request: lease_pb2.ReleaseLeaseRequest, context: Context
    ) -> lease_pb2.ReleaseLeaseResponse:
        lease_id = LeaseId(validate.lease_id(request.lease_id))
        validate.reason(request.reason)
        if request.device_lost:
            ended = await self.store.device_lost(
                principal().host_id, lease_id, request.reason, self.settings.infra_retries
            )
            if ended:
                self.effects.ended(Event.DEVICE_LOST, [ended])
            return lease_pb2.ReleaseLeaseResponse()
        ended = await self.store.release(
            principal().host_id, lease_id, request.reason or "released by host"
        )
        if ended:
            self.effects.ended(Event.RELEASED, [ended])
        return lease_pb2.ReleaseLeaseResponse()

    @rpc
    async def UploadArtifact(
        self,
        request_iterator: AsyncIterator[lease_pb2.UploadArtifactRequest],
        context: Context,
    ) -> task_pb2.Artifact:
        received = 0
        try:
            first = await anext(aiter(request_iterator), None)
            if first is None:
                raise InvalidArgument("header", "required: the first message is the header")
            check_decoded(first)
            if first.WhichOneof("part") != "header":
                raise InvalidArgument("header", "required: the first message is the header")
            validate.artifact_header(first.header, self.settings.max_artifact_bytes)
            new = artifact_from_pb(first.header)
            with self._upload_memory.reserve(new.size_bytes):
                data = await receive(new, _chunks(request_iterator))
                received = len(data)
                artifact, stored = await self.artifacts.put(principal().host_id, new, data)
        except AmcError as exc:
            refusal = next((r for c, r in _UPLOAD_REFUSALS.items() if isinstance(exc, c)), None)
            if refusal is not None:
                _count_upload(refusal, received)
            await _drain(request_iterator)
            raise
        _count_upload("stored" if stored else "repeated", received if stored else 0)
        log.info(
            "artifact stored" if stored else "artifact already stored",
            task_id=str(new.task_id),
            attempt=new.attempt,
            step=new.step_index,
            kind=new.kind,
            size=new.size_bytes,
        )
        return artifact_to_pb(artifact)

    @rpc
    async def SessionActions(
        self,
        request_iterator: AsyncIterator[lease_pb2.SessionActionsRequest],
        context: Context,
    ) -> AsyncIterator[lease_pb2.SessionActionsResponse]:
        metadata = [(key, value) for key, value in context.invocation_metadata() or ()]
        session = HostSession(self, self.peers, metadata)
        async for response in session.run(request_iterator):
            yield response

    @rpc
    async def ScreenFrames(
        self,
        request_iterator: AsyncIterator[lease_pb2.ScreenFramesRequest],
        context: Context,
    ) -> AsyncIterator[lease_pb2.ScreenFramesResponse]:
        async for response in HostFeed(self).run(request_iterator):
            yield response

    def _on_notice(
        self,
        notice: CancelNotice | DrainNotice | ReleaseNotice | None,
        outbox: asyncio.Queue[lease_pb2.RenewLeasesResponse | None],
        drain: StreamDrain,
    ) -> None:
        """What hub.close() (None), a cancel, a drain or a release notification does to a
        stream: a drain notice has the stream read the host's drain again (StreamDrain),
        the others go on its outbox (a release with the drain the agent was last told, so
        that an agent reading any push without leases as its drain state reads it right)."""
        if notice is None:
            outbox.put_nowait(CLOSING)
            return
        if isinstance(notice, DrainNotice):
            drain.changed()
            return
        if isinstance(notice, ReleaseNotice):
            outbox.put_nowait(
                lease_pb2.RenewLeasesResponse(
                    push=True, drain=drain.told, release_serials=[notice.serial]
                )
            )
            return
        metrics.CANCEL_DELIVERY.labels("push").observe(
            max(0.0, time.time() - notice.requested_epoch)
        )
        # Recorded for the delivered -> stopped split; a lost update only costs a metric.
        task = asyncio.create_task(self.store.mark_cancel_delivered(notice.lease_id))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        outbox.put_nowait(_cancel_push(notice))


# A stream's drain read that failed (the database away) is tried again after this long,
# doubling up to the second figure, while the stream lasts.
DRAIN_READ_RETRY = (0.2, 5.0)


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
    notice per stream of the host, never on the renewal path."""

    def __init__(self, store: Store, host_id: str, push: Callable[[bool], None]) -> None:
        self._store = store
        self._host_id = host_id
        self._push = push
        self._told = False
        self._stale = False
        self._looking: asyncio.Task[None] | None = None

    async def opened(self) -> None:
        """The first look, as the stream opens; its failure is the stream's."""
        self._stale = True
        self._looking = asyncio.create_task(self._look(retry=False))
        await self._looking

    @property
    def told(self) -> bool:
        """The drain state the agent was last told."""
        return self._told

    def changed(self) -> None:
        """A drain notice for the host: look again (a read under way may predate it)."""
        self._stale = True
        if self._looking is None or self._looking.done():
            self._looking = asyncio.create_task(self._look(retry=True))

    def close(self) -> None:
        if self._looking is not None:
            self._looking.cancel()

    async def _look(self, *, retry: bool) -> None:
        pause = DRAIN_READ_RETRY[0]
        while self._stale:
            self._stale = False
            try:
                draining = await self._store.host_draining(self._host_id)
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


async def _chunks(
    requests: AsyncIterator[lease_pb2.UploadArtifactRequest],
) -> AsyncIterator[bytes]:
    """The bytes of an upload after its header."""
    index = 0
    async for request in requests:
        index += 1
        check_decoded(request)
        if request.WhichOneof("part") != "chunk":
            raise InvalidArgument(f"message {index}", "only the first message is a header")
        if len(request.chunk) > validate.MAX_ARTIFACT_CHUNK:
            raise InvalidArgument(
                f"message {index}.chunk", f"larger than {validate.MAX_ARTIFACT_CHUNK} bytes"
            )
        yield request.chunk


# How long a refused upload's remaining messages are read and dropped before the answer.
DRAIN_SECONDS = 2.0


async def _drain(requests: AsyncIterator[lease_pb2.UploadArtifactRequest]) -> None:
    """Read what the host is still sending (for a short while), so that it reads our
    refusal as its call's status; a client whose writes the server cut off sees only
    gRPC's "Internal error from Core"."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(DRAIN_SECONDS):
            async for _ in requests:
                pass


# A refused upload's error (by its branch of the error tree) -> how the metrics count it.
_UPLOAD_REFUSALS: dict[type[AmcError], str] = {
    errors.ResourceExhausted: "too_large",
    errors.DataLoss: "damaged",
    errors.FailedPrecondition: "refused",
    errors.PermissionDenied: "refused",
    errors.InvalidArgument: "invalid",
    errors.UploadsBusy: "busy",
}


def _count_upload(result: str, size: int) -> None:
    metrics.ARTIFACT_UPLOADS.labels(result).inc()
    if size:
        metrics.ARTIFACT_BYTES.labels("stored" if result == "stored" else "refused").inc(size)


def _cancel_push(notice: CancelNotice) -> lease_pb2.RenewLeasesResponse:
    """The pushed message (no renewal asked for it) that tells the host to cancel."""
    state = lease_pb2.LeaseState(
        lease_id=str(notice.lease_id),
        cancel_pending=True,
        task_id=str(notice.task_id),
        attempt=notice.attempt,
    )
    return lease_pb2.RenewLeasesResponse(leases=[state], push=True)


def _drain_push(drain: bool) -> lease_pb2.RenewLeasesResponse:
    """The pushed message (no leases) that tells the host to drain, or to take work again."""
    return lease_pb2.RenewLeasesResponse(push=True, drain=drain)
