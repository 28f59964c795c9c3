"""amc.v1.Lease: the host agents' side — register, acquire, renew, report, release.
An Acquire waits in the wake-up protocol (control_plane.dispatch); the renewal stream is
control_plane.renewals, an upload control_plane.uploads, a session's host side
control_plane.sessions, a screen feed control_plane.screens, a log feed
control_plane.log_hosts, and a library app's bytes
control_plane.library."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import AsyncIterator
from datetime import timedelta

import structlog

from amc.v1 import lease_pb2, lease_pb2_grpc, library_pb2, task_pb2
from control_plane import metrics, report_files, validate, validate_lease, validate_library
from control_plane.adb_door_hosts import HostDoor
from control_plane.artifacts import UploadMemory
from control_plane.auth import check_host
from control_plane.convert import (
    assignment_to_pb,
    device_from_pb,
    duration,
    health_from_pb,
    held_to_pb,
    task_to_pb,
)
from control_plane.domain import Acquired, Assignment, LeaseId
from control_plane.errors import AmcError, HostNotRegistered
from control_plane.library import fetch
from control_plane.library_service import app_to_pb
from control_plane.lifecycle import Event
from control_plane.log_hosts import HostLogs
from control_plane.renewals import RenewalStream
from control_plane.report_files import report_from_pb
from control_plane.rpc import Context, TaskServicer, code_for, conversation, principal, rpc
from control_plane.screen_feed import HostFeed
from control_plane.session_hosts import HostSession
from control_plane.uploads import upload

log = structlog.get_logger(__name__)
# Jitter from a generator of its own: drawing from the global one would change the state
# that other code in the process (tests, libraries) relies on.
_RANDOM = random.Random()
# Up to this share of an Acquire's wait is cut, at random (see Acquire).
REPOLL_SPREAD = 0.4


class LeaseService(TaskServicer, lease_pb2_grpc.LeaseServicer):
    # The streams a host holds, each served by a conversation made for the call.
    @conversation
    def RenewLeases(self, context: Context) -> RenewalStream:
        """Its leases' renewals: one stream per host for all of them."""
        return RenewalStream(self)

    @conversation
    def SessionActions(self, context: Context) -> HostSession:
        """A session's actions, relayed to the host from the session's client."""
        return HostSession(self, context)

    @conversation
    def AdbStreams(self, context: Context) -> HostDoor:
        """A session's adb door: the streams its client opens, on the host's phone."""
        return HostDoor(self, context)

    @conversation
    def ScreenFrames(self, context: Context) -> HostFeed:
        """Its phones' live screens: which to capture down, their frames up."""
        return HostFeed(self)

    @conversation
    def LogLines(self, context: Context) -> HostLogs:
        """Its followed attempts' log lines: which attempts down, their lines up."""
        return HostLogs(self)

    @functools.cached_property
    def _upload_memory(self) -> UploadMemory:
        return UploadMemory(self.settings.max_upload_memory)

    @functools.cached_property
    def _kept_max(self) -> int:
        """What the files a report carries may hold in all here."""
        return report_files.kept_max_bytes(self.settings.max_artifact_bytes)

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
        validate_lease.devices(request.devices)
        devices = [device_from_pb(d, host_id, labels) for d in request.devices]
        held = await self.store.hosts.register_host(host_id, labels, devices)
        # Its devices' labels or states may have changed: its parked Acquires look again.
        self.hub.host_registered(host_id)
        log.info("host registered", host_id=host_id, devices=[d.serial for d in devices])
        return lease_pb2.RegisterHostResponse(
            lease_ttl=duration(self.settings.lease_ttl),
            renew_interval=duration(self.settings.renew_every),
            quarantined=[held_to_pb(h) for h in held],
            kept_max_bytes=self._kept_max,
        )

    @rpc
    async def ReportDeviceHealth(
        self, request: lease_pb2.ReportDeviceHealthRequest, context: Context
    ) -> lease_pb2.ReportDeviceHealthResponse:
        host_id = self._host(request.host_id)
        validate_lease.device_health(request.devices)
        health = [health_from_pb(h) for h in request.devices]
        if health and await self.store.hosts.set_device_health(host_id, health):
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
        serials = validate_lease.serials(request.idle_serials, "idle_serials")
        validate_lease.wait(request.wait)
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
                async with asyncio.timeout(wait):
                    await self.hub.closed.wait()
        metrics.ACQUIRE_WAIT.observe(loop.time() - started)
        self.effects.assigned(host_id, found)
        return lease_pb2.AcquireResponse(assignments=[assignment_to_pb(a, ttl) for a in found])

    async def _acquire(
        self, host_id: str, serials: list[str], ttl: timedelta, deadline: float
    ) -> list[Assignment]:
        """The wake-up protocol's wait (control_plane.dispatch), each look one query."""

        async def ask(offered: list[str]) -> Acquired:
            acquired = await self.store.leases.acquire(host_id, serials, ttl, offered)
            if (
                not acquired.assignments
                and not acquired.idle
                and not await self.store.hosts.host_registered(host_id)
            ):
                # Forgotten (retention, `amc hosts remove`) while it was away: it takes
                # no work until it registers its devices again, which the agent does.
                raise HostNotRegistered(
                    f"host '{host_id}' is not registered (forgotten after a long "
                    "disconnection, or removed): register it again"
                )
            return acquired

        return await self.hub.dispatcher.wait_for_work(host_id, ask, deadline)

    @rpc
    async def ReportResult(
        self, request: lease_pb2.ReportResultRequest, context: Context
    ) -> task_pb2.Task:
        validate_lease.report(request, self._kept_max)
        report = report_from_pb(request)
        host_id = principal().host_id
        answer = await self.store.leases.report(host_id, report)
        self.effects.reported(host_id, report, answer)
        return task_to_pb(answer.task)

    @rpc
    async def ReportResults(
        self, request: lease_pb2.ReportResultsRequest, context: Context
    ) -> lease_pb2.ReportResultsResponse:
        validate_lease.reports(request.results, self._kept_max)
        reports = [report_from_pb(r) for r in request.results]
        host_id = principal().host_id
        answers = await self.store.leases.report_many(host_id, reports) if reports else []
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
            ended = await self.store.leases.device_lost(
                principal().host_id,
                lease_id,
                request.reason,
                self.settings.infra_retries,
                request.cleans,
            )
            if ended:
                self.effects.ended(Event.DEVICE_LOST, [ended])
            return lease_pb2.ReleaseLeaseResponse()
        ended = await self.store.leases.release(
            principal().host_id, lease_id, request.reason or "released by host", request.cleans
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
        return await upload(
            request_iterator,
            principal().host_id,
            self.artifacts,
            self._upload_memory,
            self.settings.max_artifact_bytes,
        )

    @rpc
    async def FindApp(self, request: lease_pb2.FindAppRequest, context: Context) -> library_pb2.App:
        sha256, package = validate_library.app_ref(request.app)
        return app_to_pb(await self.store.library.app(sha256, package))

    @rpc
    async def FetchFile(
        self, request: lease_pb2.FetchFileRequest, context: Context
    ) -> AsyncIterator[lease_pb2.FetchFileResponse]:
        sha256 = validate_library.digest(request.file_id, "file_id")
        assert self.library is not None, "the replica gives its servicers the library"
        async for response in fetch(self.store, self.library, sha256):
            yield response
