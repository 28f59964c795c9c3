"""The auth matrix: every RPC x every kind of caller gives the documented code.

A new RPC without a row here fails `test_every_rpc_has_a_row`."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import pytest

from amc.v1 import (
    adb_pb2,
    admin_pb2,
    lease_pb2,
    library_pb2,
    library_pb2_grpc,
    scheduler_pb2,
    task_pb2,
)
from control_plane.domain import Role
from control_plane.server import ControlPlane, rpc_methods
from tests.support import Clients, Farm, actions_spec, device, seconds

OK = grpc.StatusCode.OK
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
DENIED = grpc.StatusCode.PERMISSION_DENIED
ABORTED = grpc.StatusCode.ABORTED
CONFLICT = "CONFLICT"  # a renewal answered with a per-lease conflict, not an error


@dataclass
class World:
    task_id: str
    a_lease: lease_pb2.Assignment
    b_lease: lease_pb2.Assignment
    token_id: str


async def build_world(farm: Farm) -> World:
    client = await farm.client()
    leases = {}
    for h in ("A", "B"):
        serial = f"{h}-{uuid.uuid4().hex[:8]}"
        host = await farm.host(h, serial)
        await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(
                spec=actions_spec(), selector=task_pb2.DeviceSelector(serial=serial)
            )
        )
        leases[h] = await host.acquire_one(serial)
    task = await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(
            spec=actions_spec(), selector=task_pb2.DeviceSelector(serial="nowhere")
        )
    )
    await farm.host("C", "C-1")  # what the host operations act on
    operator = await farm.operator()
    made = await operator.admin.CreateToken(
        admin_pb2.CreateTokenRequest(role=admin_pb2.ROLE_CLIENT, name="victim")
    )
    return World(task.task_id, leases["A"], leases["B"], made.info.token_id)


Call = Callable[[Clients, World, bool], Awaitable[object]]


def lease_of(w: World, own: bool) -> lease_pb2.Assignment:
    return w.a_lease if own else w.b_lease


async def renew(c: Clients, w: World, own: bool) -> object:
    request = lease_pb2.RenewLeasesRequest(host_id="A", lease_ids=[lease_of(w, own).lease_id])
    responses = [r async for r in c.lease.RenewLeases(iter([request]))]
    return CONFLICT if responses[0].leases[0].result == lease_pb2.RENEWAL_RESULT_CONFLICT else OK


async def report_batch(c: Clients, w: World, own: bool) -> object:
    """The batch call itself succeeds; its one result is refused as ReportResult's would be."""
    answer = await c.lease.ReportResults(
        lease_pb2.ReportResultsRequest(
            results=[
                lease_pb2.ReportResultRequest(
                    task_id=lease_of(w, own).task_id,
                    attempt=1,
                    lease_id=lease_of(w, own).lease_id,
                    outcome=lease_pb2.OUTCOME_FAILED,
                )
            ]
        )
    )
    (result,) = answer.answers
    return ABORTED if result.code == grpc.StatusCode.ABORTED.value[0] else OK


async def watch(c: Clients, w: World, own: bool) -> object:
    call = c.scheduler.WatchTask(scheduler_pb2.WatchTaskRequest(task_id=w.task_id))
    async for _ in call:
        call.cancel()
        return OK
    return OK


async def upload(c: Clients, w: World, own: bool) -> object:
    lease = lease_of(w, own)
    header = lease_pb2.ArtifactHeader(
        task_id=lease.task_id,
        attempt=1,
        lease_id=lease.lease_id,
        kind="ui_dump",
        size_bytes=3,
        sha256=hashlib.sha256(b"<a>").hexdigest(),
    )
    messages = [
        lease_pb2.UploadArtifactRequest(header=header),
        lease_pb2.UploadArtifactRequest(chunk=b"<a>"),
    ]
    return await c.lease.UploadArtifact(iter(messages))


async def get_artifact(c: Clients, w: World, own: bool) -> object:
    """Past authorization the call looks for the artifact: NOT_FOUND means it was let in."""
    request = scheduler_pb2.GetArtifactRequest(task_id=w.task_id, artifact_id=str(uuid.uuid4()))
    try:
        async for _ in c.scheduler.GetArtifact(request):
            pass
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.NOT_FOUND:
            raise
    return OK


async def first_write(call: Any, request: Any) -> None:
    """A stream's first request. A call the server refused at once (a bad token) may have
    ended before it: grpc.aio then raises InvalidStateError, not the refusal; the read
    that follows raises the call's own status."""
    with contextlib.suppress(asyncio.InvalidStateError):
        await call.write(request)


async def open_session(c: Clients, w: World, own: bool) -> object:
    """Let in: the first answer is the queued session task; leaving withdraws it."""
    call = c.scheduler.OpenSession()
    await first_write(
        call,
        scheduler_pb2.OpenSessionRequest(
            open=scheduler_pb2.SessionOpen(
                selector=task_pb2.DeviceSelector(serial="nowhere"), idle_timeout=seconds(5)
            )
        ),
    )
    await call.read()
    call.cancel()
    return OK


async def session_actions(c: Clients, w: World, own: bool) -> object:
    """Past authorization and the lease's owner, the own lease's task is no session:
    FAILED_PRECONDITION means it was let in."""
    lease = lease_of(w, own)
    call = c.lease.SessionActions()
    join = lease_pb2.SessionJoin(task_id=lease.task_id, attempt=1, lease_id=lease.lease_id)
    await first_write(call, lease_pb2.SessionActionsRequest(join=join))
    try:
        await call.read()
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
            raise
    return OK


async def adb_streams(c: Clients, w: World, own: bool) -> object:
    """Past authorization, the world's task is no session: FAILED_PRECONDITION means it
    was let in."""
    call = c.scheduler.AdbStreams()
    opening = adb_pb2.AdbStreamsRequest(open=adb_pb2.AdbDoorOpen(task_id=w.task_id))
    await first_write(call, opening)
    try:
        await call.read()
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
            raise
    return OK


async def host_adb_streams(c: Clients, w: World, own: bool) -> object:
    """As session_actions: past the lease's owner, the own lease's task is no session."""
    lease = lease_of(w, own)
    call = c.lease.AdbStreams()
    join = adb_pb2.AdbDoorJoin(task_id=lease.task_id, attempt=1, lease_id=lease.lease_id)
    await first_write(call, adb_pb2.LeaseAdbStreamsRequest(join=join))
    try:
        await call.read()
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
            raise
    return OK


async def watch_screen(c: Clients, w: World, own: bool) -> object:
    """Let in: past the role's authorization a task's watch is checked (the world's task
    is another client's: PERMISSION_DENIED naming whose screen it is, test_screen_tasks;
    it waits, or its host has no screen call: FAILED_PRECONDITION or UNAVAILABLE), or it
    waits for frames."""
    call = c.scheduler.WatchScreen(scheduler_pb2.WatchScreenRequest(task_id=w.task_id))
    try:
        await asyncio.wait_for(call.read(), 2)
    except TimeoutError:
        pass
    except grpc.aio.AioRpcError as exc:
        theirs = "only its team and operators" in (exc.details() or "")
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED and theirs:
            return OK
        if exc.code() not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE):
            raise
    finally:
        call.cancel()
    return OK


async def screen_frames(c: Clients, w: World, own: bool) -> object:
    """Let in: the first answer is the (empty) set of the host's phones watched."""
    call = c.lease.ScreenFrames()
    await first_write(call, lease_pb2.ScreenFramesRequest(host_id=host_id(own)))
    try:
        await asyncio.wait_for(call.read(), 10)
    finally:
        call.cancel()
    return OK


async def stream_logs(c: Clients, w: World, own: bool) -> object:
    """Let in: past the role's authorization a task's log is checked (the world's task is
    another client's: PERMISSION_DENIED naming whose log it is, test_phone_logs; it has no
    log to read: FAILED_PRECONDITION), or lines come."""
    call = c.scheduler.StreamLogs(scheduler_pb2.StreamLogsRequest(task_id=w.task_id))
    try:
        await asyncio.wait_for(call.read(), 2)
    except TimeoutError:
        pass
    except grpc.aio.AioRpcError as exc:
        theirs = "only its team and operators" in (exc.details() or "")
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED and theirs:
            return OK
        if exc.code() not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE):
            raise
    finally:
        call.cancel()
    return OK


async def log_lines(c: Clients, w: World, own: bool) -> object:
    """Let in: the first answer is the (empty) set of the host's attempts followed."""
    call = c.lease.LogLines()
    await first_write(call, lease_pb2.LogLinesRequest(host_id=host_id(own)))
    try:
        await asyncio.wait_for(call.read(), 10)
    finally:
        call.cancel()
    return OK


def host_id(own: bool) -> str:
    return "A" if own else "B"


async def remove_host(c: Clients, w: World, own: bool) -> object:
    """Host C is connected, so a caller allowed to ask is let through and then refused
    for that (FAILED_PRECONDITION: past authorization, so OK here)."""
    try:
        await c.admin.RemoveHost(admin_pb2.RemoveHostRequest(host_id="C"))
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
            raise
    return OK


async def release_device(c: Clients, w: World, own: bool) -> object:
    """Device C-1 is not quarantined, so a caller allowed to ask is let through and then
    refused for that (FAILED_PRECONDITION: past authorization, so OK here)."""
    try:
        await c.admin.ReleaseDevice(admin_pb2.ReleaseDeviceRequest(host_id="C", serial="C-1"))
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
            raise
    return OK


async def let_in(call: Awaitable[Any] | AsyncIterator[Any], *codes: grpc.StatusCode) -> object:
    """OK when the call answered, or refused with one of `codes`: what it says of a request
    past authorization (no such app, not an APK)."""
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:  # type: ignore[union-attr]
                pass
        else:
            await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        if exc.code() not in codes:
            raise
    return OK


def _library(c: Clients) -> library_pb2_grpc.LibraryStub:
    return library_pb2_grpc.LibraryStub(c.channel)


def _upload(kind: Any) -> list[Any]:
    header = library_pb2.UploadHeader(
        file_name="a.txt", size_bytes=3, sha256=hashlib.sha256(b"abc").hexdigest()
    )
    return [kind(header=header), kind(chunk=b"abc")]


NOT_FOUND = grpc.StatusCode.NOT_FOUND
LIBRARY_CALLS: dict[str, Call] = {
    "/amc.v1.Library/UploadApp": lambda c, w, own: let_in(
        _library(c).UploadApp(iter(_upload(library_pb2.UploadAppRequest))),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    "/amc.v1.Library/UploadFile": lambda c, w, own: _library(c).UploadFile(
        iter(_upload(library_pb2.UploadFileRequest))
    ),
    "/amc.v1.Library/GetApp": lambda c, w, own: let_in(
        _library(c).GetApp(library_pb2.GetAppRequest(app="com.example.none")), NOT_FOUND
    ),
    "/amc.v1.Library/ListApps": lambda c, w, own: _library(c).ListApps(
        library_pb2.ListAppsRequest()
    ),
    "/amc.v1.Library/DeleteApp": lambda c, w, own: let_in(
        _library(c).DeleteApp(library_pb2.DeleteAppRequest(app_id="0" * 64)), NOT_FOUND
    ),
    "/amc.v1.Library/ListFiles": lambda c, w, own: _library(c).ListFiles(
        library_pb2.ListFilesRequest()
    ),
    "/amc.v1.Library/DeleteFile": lambda c, w, own: let_in(
        _library(c).DeleteFile(library_pb2.DeleteFileRequest(file_id="0" * 64)), NOT_FOUND
    ),
    "/amc.v1.Lease/FindApp": lambda c, w, own: let_in(
        c.lease.FindApp(lease_pb2.FindAppRequest(app="com.example.none")), NOT_FOUND
    ),
    "/amc.v1.Lease/FetchFile": lambda c, w, own: let_in(
        c.lease.FetchFile(lease_pb2.FetchFileRequest(file_id="0" * 64)), NOT_FOUND
    ),
}

CALLS: dict[str, Call] = {
    **LIBRARY_CALLS,
    "/amc.v1.Scheduler/SubmitTask": lambda c, w, own: c.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(spec=actions_spec())
    ),
    "/amc.v1.Scheduler/SubmitTasks": lambda c, w, own: c.scheduler.SubmitTasks(
        scheduler_pb2.SubmitTasksRequest(
            tasks=[scheduler_pb2.SubmitTaskRequest(spec=actions_spec())]
        )
    ),
    "/amc.v1.Scheduler/GetTask": lambda c, w, own: c.scheduler.GetTask(
        scheduler_pb2.GetTaskRequest(task_id=w.task_id)
    ),
    "/amc.v1.Scheduler/ListTasks": lambda c, w, own: c.scheduler.ListTasks(
        scheduler_pb2.ListTasksRequest()
    ),
    "/amc.v1.Scheduler/CancelTask": lambda c, w, own: c.scheduler.CancelTask(
        scheduler_pb2.CancelTaskRequest(task_id=w.task_id)
    ),
    "/amc.v1.Scheduler/WatchTask": watch,
    "/amc.v1.Scheduler/ListHosts": lambda c, w, own: c.scheduler.ListHosts(
        scheduler_pb2.ListHostsRequest()
    ),
    "/amc.v1.Scheduler/ListTaskEvents": lambda c, w, own: c.scheduler.ListTaskEvents(
        scheduler_pb2.ListTaskEventsRequest(task_id=w.task_id)
    ),
    "/amc.v1.Scheduler/GetQueue": lambda c, w, own: c.scheduler.GetQueue(
        scheduler_pb2.GetQueueRequest()
    ),
    "/amc.v1.Lease/RegisterHost": lambda c, w, own: c.lease.RegisterHost(
        lease_pb2.RegisterHostRequest(host_id=host_id(own), devices=[device("x1")])
    ),
    "/amc.v1.Lease/ReportDeviceHealth": lambda c, w, own: c.lease.ReportDeviceHealth(
        lease_pb2.ReportDeviceHealthRequest(
            host_id=host_id(own),
            devices=[
                lease_pb2.DeviceHealth(
                    serial="A-s1", condition=scheduler_pb2.DEVICE_CONDITION_TOO_HOT
                )
            ],
        )
    ),
    "/amc.v1.Lease/Acquire": lambda c, w, own: c.lease.Acquire(
        lease_pb2.AcquireRequest(host_id=host_id(own), idle_serials=["A-s1"])
    ),
    "/amc.v1.Lease/RenewLeases": renew,
    "/amc.v1.Lease/ReportResult": lambda c, w, own: c.lease.ReportResult(
        lease_pb2.ReportResultRequest(
            task_id=lease_of(w, own).task_id,
            attempt=1,
            lease_id=lease_of(w, own).lease_id,
            outcome=lease_pb2.OUTCOME_FAILED,
        )
    ),
    "/amc.v1.Lease/ReportResults": lambda c, w, own: report_batch(c, w, own),
    "/amc.v1.Lease/ReleaseLease": lambda c, w, own: c.lease.ReleaseLease(
        lease_pb2.ReleaseLeaseRequest(lease_id=lease_of(w, own).lease_id)
    ),
    "/amc.v1.Admin/CreateToken": lambda c, w, own: c.admin.CreateToken(
        admin_pb2.CreateTokenRequest(role=admin_pb2.ROLE_CLIENT)
    ),
    "/amc.v1.Admin/RevokeToken": lambda c, w, own: c.admin.RevokeToken(
        admin_pb2.RevokeTokenRequest(token_id=w.token_id)
    ),
    "/amc.v1.Admin/ListTokens": lambda c, w, own: c.admin.ListTokens(admin_pb2.ListTokensRequest()),
    "/amc.v1.Lease/UploadArtifact": upload,
    "/amc.v1.Scheduler/ListArtifacts": lambda c, w, own: c.scheduler.ListArtifacts(
        scheduler_pb2.ListArtifactsRequest(task_id=w.task_id)
    ),
    "/amc.v1.Scheduler/GetArtifact": get_artifact,
    "/amc.v1.Scheduler/OpenSession": open_session,
    "/amc.v1.Lease/SessionActions": session_actions,
    "/amc.v1.Scheduler/AdbStreams": adb_streams,
    "/amc.v1.Lease/AdbStreams": host_adb_streams,
    "/amc.v1.Scheduler/WatchScreen": watch_screen,
    "/amc.v1.Lease/ScreenFrames": screen_frames,
    "/amc.v1.Scheduler/StreamLogs": stream_logs,
    "/amc.v1.Lease/LogLines": log_lines,
    "/amc.v1.Admin/CordonHost": lambda c, w, own: c.admin.CordonHost(
        admin_pb2.CordonHostRequest(host_id="C")
    ),
    "/amc.v1.Admin/UncordonHost": lambda c, w, own: c.admin.UncordonHost(
        admin_pb2.UncordonHostRequest(host_id="C")
    ),
    "/amc.v1.Admin/CordonDevice": lambda c, w, own: c.admin.CordonDevice(
        admin_pb2.CordonDeviceRequest(host_id="C", serial="C-1")
    ),
    "/amc.v1.Admin/UncordonDevice": lambda c, w, own: c.admin.UncordonDevice(
        admin_pb2.UncordonDeviceRequest(host_id="C", serial="C-1")
    ),
    "/amc.v1.Admin/ReleaseDevice": release_device,
    "/amc.v1.Admin/DrainHost": lambda c, w, own: c.admin.DrainHost(
        admin_pb2.DrainHostRequest(host_id="C")
    ),
    "/amc.v1.Admin/RemoveHost": remove_host,
    "/amc.v1.Admin/GetHost": lambda c, w, own: c.admin.GetHost(
        admin_pb2.GetHostRequest(host_id="C")
    ),
    "/amc.v1.Admin/SetFairShare": lambda c, w, own: c.admin.SetFairShare(
        admin_pb2.SetFairShareRequest(fairness_key="default", weight=2)
    ),
    "/amc.v1.Admin/ListFairShares": lambda c, w, own: c.admin.ListFairShares(
        admin_pb2.ListFairSharesRequest()
    ),
    "/amc.v1.Admin/GetFairShare": lambda c, w, own: c.admin.GetFairShare(
        admin_pb2.GetFairShareRequest(fairness_key="default")
    ),
}

CALLERS = ["none", "malformed", "revoked", "client", "operator", "host_own", "host_foreign"]


def expected(method: str, caller: str) -> object:
    service = method.split("/")[1]
    if caller in ("none", "malformed", "revoked"):
        return UNAUTH
    allowed = {
        "client": service == "amc.v1.Library"
        or (service == "amc.v1.Scheduler" and not method.endswith(("ListHosts", "GetQueue"))),
        "operator": service in ("amc.v1.Scheduler", "amc.v1.Admin", "amc.v1.Library"),
        "host_own": service == "amc.v1.Lease",
        "host_foreign": service == "amc.v1.Lease",
    }[caller]
    if not allowed:
        return DENIED
    if caller == "host_foreign":
        name = method.rsplit("/", 1)[1]
        return {
            "RegisterHost": DENIED,
            "ReportDeviceHealth": DENIED,
            "Acquire": DENIED,
            "RenewLeases": CONFLICT,
            "ReportResult": ABORTED,
            "ReportResults": ABORTED,
            "ReleaseLease": ABORTED,
            "UploadArtifact": DENIED,
            "SessionActions": DENIED,
            "AdbStreams": DENIED,
            "ScreenFrames": DENIED,
            "LogLines": DENIED,
            # Any host may find an app and fetch library bytes: they are no host's own.
            "FindApp": OK,
            "FetchFile": OK,
        }[name]
    return OK


async def caller_clients(farm: Farm, caller: str) -> Clients:
    if caller == "none":
        return farm.clients(None)
    if caller == "malformed":
        return farm.clients("amc_not-a-token")
    if caller == "revoked":
        token = await farm.token(Role.CLIENT)
        token_id = token.split("_")[1]
        operator = await farm.operator()
        await operator.admin.RevokeToken(
            admin_pb2.RevokeTokenRequest(token_id=str(uuid.UUID(hex=token_id)))
        )
        return farm.clients(token)
    if caller in ("host_own", "host_foreign"):
        return farm.clients(await farm.token(Role.HOST, "A"))
    return farm.clients(await farm.token(Role(caller)))


def test_every_rpc_has_a_row() -> None:
    assert sorted(CALLS) == sorted(rpc_methods())


# What grpc.aio's client reports, in place of the status the server sent, when a stream's
# write fails because the server has just ended the call (grpc/grpc#36066, open in
# grpcio 1.85): a refusal at once (a malformed token needs no database) races the client's
# first request. About 1 call in 3,000 on a loaded machine; the server said
# UNAUTHENTICATED. The server's own INTERNAL reads "internal error" (rpc._fail).
GRPC_CLIENT_INTERNAL = "Internal error from Core"


async def judged(farm: Farm, call: Call, caller: str) -> object:
    """The code a call gives `caller` in a world of its own; "grpc's own INTERNAL" when the
    client library put its INTERNAL in place of the server's status (the caller asks again)."""
    world = await build_world(farm)
    clients = await caller_clients(farm, caller)
    try:
        outcome = await call(clients, world, caller != "host_foreign")
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.INTERNAL and exc.details() == GRPC_CLIENT_INTERNAL:
            return "grpc's own INTERNAL"
        return exc.code()
    return outcome if outcome in (OK, CONFLICT, ABORTED) else OK


@pytest.mark.parametrize("caller", CALLERS)
async def test_auth_matrix(farm: Farm, caller: str) -> None:
    failures = []
    for method, call in CALLS.items():
        got = await judged(farm, call, caller)
        if got == "grpc's own INTERNAL":
            got = await judged(farm, call, caller)  # once more: see judged
        want = expected(method, caller)
        if got != want:
            failures.append(f"{method} as {caller}: got {got}, want {want}")
    assert not failures, "\n".join(failures)


async def test_a_stream_refused_before_its_first_request_is_judged_by_its_status(
    farm: Farm,
) -> None:
    """THEN a stream the server refused (a malformed token) before the client wrote shows
    UNAUTHENTICATED to the matrix's calls, not grpc.aio's InvalidStateError (the race the
    matrix lost now and then on a busy machine)."""
    call = farm.clients("not-a-token").lease.ScreenFrames()
    assert await call.code() == grpc.StatusCode.UNAUTHENTICATED  # ended before any write
    with pytest.raises(asyncio.InvalidStateError):
        await call.write(lease_pb2.ScreenFramesRequest(host_id="A"))
    await first_write(call, lease_pb2.ScreenFramesRequest(host_id="A"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call.read()
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_insecure_is_refused_on_a_non_loopback_listener(database_url: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        ControlPlane(database_url, listen="0.0.0.0:0", insecure=True)


async def test_only_the_token_hash_is_stored(farm: Farm) -> None:
    token = await farm.token(Role.CLIENT)
    assert farm.db is not None
    stored = await farm.db.fetch("SELECT * FROM tokens")
    secret = token.split("_", 2)[2]
    assert all(secret.encode() not in bytes(r["secret_hash"]) for r in stored)
    assert all(secret not in str(dict(r)) for r in stored)
