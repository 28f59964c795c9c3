"""amc.v1.Lease: the host agents' side — register, acquire, renew, report, release."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator

import grpc
import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc, task_pb2
from control_plane import metrics, validate
from control_plane.auth import Authenticator, check_host
from control_plane.config import Settings
from control_plane.convert import (
    OUTCOME_FROM_PB,
    assignment_to_pb,
    device_from_pb,
    duration,
    task_to_pb,
)
from control_plane.domain import CancelNotice, LeaseId, Recorded, Renewal, Report, TaskId
from control_plane.errors import InvalidArgument, Unavailable
from control_plane.hub import Hub
from control_plane.lifecycle import Outcome, TaskStatus
from control_plane.rpc import Servicer, check_decoded, principal, rpc
from control_plane.store import Store

log = structlog.get_logger(__name__)
_canonical_uuid = re.compile(
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
).fullmatch
MAX_DEVICES = 1000
CLOSING = lease_pb2.RenewLeasesResponse()  # the sentinel hub.close() puts on each stream


class LeaseService(Servicer, lease_pb2_grpc.LeaseServicer):
    SERVICE = "amc.v1.Lease"

    def __init__(self, auth: Authenticator, store: Store, hub: Hub, settings: Settings) -> None:
        super().__init__(auth)
        self.store = store
        self.hub = hub
        self.settings = settings
        self._pending: set[asyncio.Task[None]] = set()

    def _host(self, host_id: str) -> str:
        validate.identifier(host_id, "host_id")
        check_host(principal(), host_id)
        return host_id

    @rpc
    async def RegisterHost(
        self, request: lease_pb2.RegisterHostRequest, context: grpc.aio.ServicerContext
    ) -> lease_pb2.RegisterHostResponse:
        host_id = self._host(request.host_id)
        labels = validate.string_map(dict(request.labels), "labels")
        if len(request.devices) > MAX_DEVICES:
            raise InvalidArgument("devices", f"more than {MAX_DEVICES} devices")
        for i, d in enumerate(request.devices):
            validate.device(d, f"devices[{i}]")
        if len({d.serial for d in request.devices}) != len(request.devices):
            raise InvalidArgument("devices", "a serial is listed twice")
        devices = [device_from_pb(d, labels) for d in request.devices]
        await self.store.register_host(host_id, labels, devices)
        log.info("host registered", host_id=host_id, devices=[d.serial for d in devices])
        return lease_pb2.RegisterHostResponse(
            lease_ttl=duration(self.settings.lease_ttl),
            renew_interval=duration(self.settings.renew_every),
        )

    @rpc
    async def Acquire(
        self, request: lease_pb2.AcquireRequest, context: grpc.aio.ServicerContext
    ) -> lease_pb2.AcquireResponse:
        host_id = self._host(request.host_id)
        serials = validate.serials(request.idle_serials, "idle_serials")
        if request.wait.seconds < 0 or request.wait.nanos < 0:
            raise InvalidArgument("wait", "must not be negative")
        # Clamped before any conversion: a huge Duration does not fit a timedelta.
        asked = request.wait.seconds + request.wait.nanos / 1e9
        wait = min(asked, self.settings.max_acquire_wait.total_seconds())
        ttl = self.settings.lease_ttl
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + wait
        while True:
            queued = self.hub.queued_signal()
            found = await self.store.acquire(host_id, serials, ttl) if serials else []
            remaining = deadline - loop.time()
            if found or remaining <= 0 or self.hub.closing:
                break
            self.hub.waiting_acquires += 1
            try:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(queued.wait(), remaining)
            finally:
                self.hub.waiting_acquires -= 1
        metrics.ACQUIRE_WAIT.observe(loop.time() - started)
        for a in found:
            self.hub.task_changed(a.task_id, TaskStatus.ASSIGNED)
            metrics.ASSIGNMENT_LATENCY.observe(a.queued_seconds)
            metrics.TRANSITIONS.labels("assign", "assigned").inc()
            log.info(
                "task assigned",
                task_id=str(a.task_id),
                attempt=a.attempt,
                lease_id=str(a.lease_id),
                host_id=host_id,
                device=a.device_serial,
            )
        return lease_pb2.AcquireResponse(assignments=[assignment_to_pb(a, ttl) for a in found])

    @rpc
    async def RenewLeases(
        self,
        request_iterator: AsyncIterator[lease_pb2.RenewLeasesRequest],
        context: grpc.aio.ServicerContext,
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
                    stack.enter_context(
                        self.hub.host_stream(
                            host_id,
                            lambda notice: outbox.put_nowait(self._push(notice)),
                        )
                    )
                    log.info("renewal stream opened", host_id=host_id)
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
        if len(request.lease_ids) > validate.MAX_LEASES_PER_RENEWAL:
            raise InvalidArgument("lease_ids", f"more than {validate.MAX_LEASES_PER_RENEWAL}")
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
        renewals = await self.store.renew(host_id, canonical, ttl) if canonical else []
        by_id: dict[str, Renewal] = {}
        for r in renewals:
            by_id[r.lease_id] = r
            if r.acknowledged:
                self.hub.task_changed(r.task_id, TaskStatus.DISPATCHED)
                metrics.TRANSITIONS.labels("acknowledge", "dispatched").inc()
                log.debug(
                    "task dispatched",
                    task_id=r.task_id,
                    attempt=r.attempt,
                    lease_id=r.lease_id,
                    host_id=host_id,
                )
            if r.delivery_seconds is not None:
                metrics.CANCEL_DELIVERY.labels("renewal").observe(r.delivery_seconds)
        metrics.RENEWAL_BATCH.observe(len(request.lease_ids))
        metrics.RENEWALS.labels("renewed").inc(len(renewals))
        metrics.RENEWALS.labels("conflict").inc(len(request.lease_ids) - len(renewals))
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
                    task_id=renewal.task_id,
                    attempt=renewal.attempt,
                )
        return response

    @rpc
    async def ReportResult(
        self, request: lease_pb2.ReportResultRequest, context: grpc.aio.ServicerContext
    ) -> task_pb2.Task:
        task_id = TaskId(validate.task_id(request.task_id))
        lease_id = LeaseId(validate.lease_id(request.lease_id))
        if request.attempt < 1:
            raise InvalidArgument("attempt", "must be 1 or more")
        if request.outcome not in OUTCOME_FROM_PB:
            raise InvalidArgument(
                "outcome", "must be OUTCOME_DONE, OUTCOME_FAILED or OUTCOME_CANCELLED"
            )
        validate.result(request.result)
        report = Report(
            task_id,
            request.attempt,
            lease_id,
            OUTCOME_FROM_PB[request.outcome],
            request.result.SerializeToString(deterministic=True),
            request.result.error,
        )
        host_id = principal().host_id
        answer = await self.store.report(host_id, report)
        code, task = answer.code, answer.task
        if code == "recorded":
            self.hub.task_changed(task_id, task.status)
            _observe_report(report, answer)
        log.info(
            "result " + code,
            task_id=str(task_id),
            attempt=request.attempt,
            lease_id=str(lease_id),
            host_id=task.host_id,
            outcome=str(report.outcome),
        )
        return task_to_pb(task)

    @rpc
    async def ReleaseLease(
        self, request: lease_pb2.ReleaseLeaseRequest, context: grpc.aio.ServicerContext
    ) -> lease_pb2.ReleaseLeaseResponse:
        lease_id = LeaseId(validate.lease_id(request.lease_id))
        if len(request.reason) > validate.MAX_VALUE or "\x00" in request.reason:
            raise InvalidArgument("reason", f"at most {validate.MAX_VALUE} characters, no NUL")
        ended = await self.store.release(
            principal().host_id, lease_id, request.reason or "released by host"
        )
        if ended:
            self.hub.task_changed(ended.task_id, ended.to_status)
            metrics.EXPIRED.labels(str(ended.to_status)).inc()
            log.info(
                "lease released",
                task_id=str(ended.task_id),
                attempt=ended.attempt,
                lease_id=str(lease_id),
                host_id=ended.host_id,
                to=str(ended.to_status),
            )
        return lease_pb2.ReleaseLeaseResponse()

    def _push(self, notice: CancelNotice | None) -> lease_pb2.RenewLeasesResponse:
        """What hub.close() or a cancel notification puts on a stream's outbox."""
        if notice is None:
            return CLOSING
        metrics.CANCEL_DELIVERY.labels("push").observe(
            max(0.0, time.time() - notice.requested_epoch)
        )
        # Recorded for the delivered -> stopped split; a lost update only costs a metric.
        task = asyncio.create_task(self.store.mark_cancel_delivered(notice.lease_id))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return _push(notice)


def _observe_report(report: Report, answer: Recorded) -> None:
    metrics.TRANSITIONS.labels("report", str(report.outcome)).inc()
    delivered, finished = answer.cancel_delivered_at, answer.task.finished_at
    if report.outcome is Outcome.CANCELLED and delivered and finished:
        metrics.CANCEL_STOP.observe(max(0.0, (finished - delivered).total_seconds()))


def _push(notice: CancelNotice) -> lease_pb2.RenewLeasesResponse:
    state = lease_pb2.LeaseState(
        lease_id=str(notice.lease_id),
        cancel_pending=True,
        task_id=str(notice.task_id),
        attempt=notice.attempt,
    )
    return lease_pb2.RenewLeasesResponse(leases=[state], push=True)
