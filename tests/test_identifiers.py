"""Identifiers and labels over real gRPC: a line break or control character anywhere in
one, a trailing newline included, is INVALID_ARGUMENT naming the field, and stores
nothing (issue 11.3: `re.match` with `$` let "h1\\n" through)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
import pytest

from amc.v1 import admin_pb2, lease_pb2, lease_pb2_grpc, scheduler_pb2, task_pb2
from control_plane.domain import Role
from tests.support import Farm, actions_spec, device, tap

# Everything str.splitlines() breaks on, tab, and other control characters (NUL, DEL).
BREAKS = ["\n", "\r\n", "\r", "\t", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85"]
BREAKS += ["\u2028", "\u2029", "\x00", "\x7f"]

# Makes what the call needs (tokens: rows of their own), then returns the call, unsent.
Send = Callable[[Farm, str], Awaitable[Awaitable[object]]]


async def _lease_as(farm: Farm, host_id: str) -> lease_pb2_grpc.LeaseStub:
    """A host token bound to `host_id` itself, so that only validation can refuse it (but
    to "h1" for a NUL, which PostgreSQL cannot store)."""
    bound = "h1" if "\x00" in host_id else host_id
    return farm.clients(await farm.token(Role.HOST, bound)).lease


def _register(**kw: object) -> Send:
    """RegisterHost as host "h1" (or as the host it names, with a token bound to it)."""

    async def send(farm: Farm, bad: str) -> Awaitable[object]:
        request = lease_pb2.RegisterHostRequest(host_id="h1", devices=[device("s1")])
        for name, make in kw.items():
            value = make(bad)  # type: ignore[operator]
            if name == "devices":
                request.ClearField("devices")
                request.devices.extend(value)
            elif name == "labels":
                request.labels.update(value)
            else:
                setattr(request, name, value)
        lease = await _lease_as(farm, request.host_id)
        return lease.RegisterHost(request)

    return send


def _submit(**kw: object) -> Send:
    async def send(farm: Farm, bad: str) -> Awaitable[object]:
        client = await farm.client()
        fields = {name: make(bad) for name, make in kw.items()}  # type: ignore[operator]
        return client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap()), **fields)
        )

    return send


async def _submit_batch(farm: Farm, bad: str) -> Awaitable[object]:
    client = await farm.client()
    ok = scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap()), request_id="r0")
    odd = scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap()), request_id=f"r1{bad}")
    return client.scheduler.SubmitTasks(scheduler_pb2.SubmitTasksRequest(tasks=[ok, odd]))


async def _acquire(farm: Farm, bad: str) -> Awaitable[object]:
    host = await farm.host("h1", "s1")
    request = lease_pb2.AcquireRequest(host_id="h1", idle_serials=[f"s1{bad}"])
    return host.c.lease.Acquire(request)


async def _renew(farm: Farm, bad: str) -> Awaitable[object]:
    lease = await _lease_as(farm, f"h1{bad}")

    async def call() -> object:
        stream = lease.RenewLeases(timeout=10)
        await stream.write(lease_pb2.RenewLeasesRequest(host_id=f"h1{bad}", seq=1))
        answer = await stream.read()
        stream.cancel()
        return answer

    return call()


async def _list_tasks(farm: Farm, bad: str) -> Awaitable[object]:
    client = await farm.client()
    return client.scheduler.ListTasks(scheduler_pb2.ListTasksRequest(host_id=f"h1{bad}"))


def _create_token(**fields: Callable[[str], str]) -> Send:
    async def send(farm: Farm, bad: str) -> Awaitable[object]:
        operator = await farm.operator()
        request = admin_pb2.CreateTokenRequest(role=admin_pb2.ROLE_HOST, host_id="h1", name="agent")
        for name, make in fields.items():
            setattr(request, name, make(bad))
        return operator.admin.CreateToken(request)

    return send


CASES: dict[str, tuple[Send, str]] = {
    "RegisterHost.host_id": (_register(host_id=lambda b: f"h1{b}"), "host_id"),
    "RegisterHost.labels key": (_register(labels=lambda b: {f"rack{b}": "a"}), "labels"),
    "RegisterHost.labels value": (_register(labels=lambda b: {"rack": f"a{b}"}), "labels[rack]"),
    "RegisterHost.devices.serial": (
        _register(devices=lambda b: [device(f"s1{b}")]),
        "devices[0].serial",
    ),
    "RegisterHost.devices.labels key": (
        _register(devices=lambda b: [device("s1", **{f"k{b}": "v"})]),
        "devices[0].labels",
    ),
    "RegisterHost.devices.labels value": (
        _register(devices=lambda b: [device("s1", k=f"v{b}")]),
        "devices[0].labels[k]",
    ),
    "RegisterHost.devices.model": (
        _register(devices=lambda b: [lease_pb2.DeviceInfo(serial="s1", model=f"Pixel 7{b}")]),
        "devices[0].model",
    ),
    "Acquire.idle_serials": (_acquire, "idle_serials[0]"),
    "RenewLeases.host_id": (_renew, "host_id"),
    "SubmitTask.request_id": (_submit(request_id=lambda b: f"r1{b}"), "request_id"),
    "SubmitTask.selector.serial": (
        _submit(selector=lambda b: task_pb2.DeviceSelector(serial=f"s1{b}")),
        "selector.serial",
    ),
    "SubmitTask.selector.labels key": (
        _submit(selector=lambda b: task_pb2.DeviceSelector(labels={f"rack{b}": "a"})),
        "selector.labels",
    ),
    "SubmitTask.selector.labels value": (
        _submit(selector=lambda b: task_pb2.DeviceSelector(labels={"rack": f"a{b}"})),
        "selector.labels[rack]",
    ),
    "SubmitTasks.request_id": (_submit_batch, "tasks[1].request_id"),
    "ListTasks.host_id": (_list_tasks, "host_id"),
    "CreateToken.host_id": (_create_token(host_id=lambda b: f"h1{b}"), "host_id"),
    "CreateToken.name": (_create_token(name=lambda b: f"agent{b}"), "name"),
}


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_line_break_or_control_character_is_invalid_argument_and_stores_nothing(
    farm: Farm, case: str
) -> None:
    send, field = CASES[case]
    for bad in BREAKS:
        for where in ("trailing", "inside"):
            call = await send(farm, bad if where == "trailing" else f"{bad}x")
            shown = f"{case} with {where} {bad!r}"
            before = await farm.snapshot()
            try:
                await call
            except grpc.aio.AioRpcError as exc:
                code, details = exc.code(), exc.details() or ""
            else:
                code, details = grpc.StatusCode.OK, ""
            after = await farm.snapshot()
            assert code == grpc.StatusCode.INVALID_ARGUMENT, f"{shown}: {code} {details!r}"
            assert details.startswith(f"{field}:"), f"{shown}: {details!r}"
            assert after == before, f"{shown} changed the database"


async def test_a_host_id_with_a_trailing_newline_is_not_registered(farm: Farm) -> None:
    """The issue's own example: RegisterHost(host_id="h1\\n") was stored."""
    lease = farm.clients(await farm.token(Role.HOST, "h1\n")).lease
    request = lease_pb2.RegisterHostRequest(host_id="h1\n", devices=[device("s1")])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await lease.RegisterHost(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("host_id:")
    operator = await farm.operator()
    hosts = await operator.scheduler.ListHosts(scheduler_pb2.ListHostsRequest())
    assert list(hosts.hosts) == []
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM hosts") == 0
    assert await farm.db.fetchval("SELECT count(*) FROM devices") == 0


async def test_the_same_identifiers_without_the_break_are_accepted(farm: Farm) -> None:
    """The refusals above are about the break alone: without it every call succeeds."""
    for case, (send, _) in sorted(CASES.items()):
        call = await send(farm, "")
        try:
            await call
        except grpc.aio.AioRpcError as exc:
            pytest.fail(f"{case}: {exc.code()} {exc.details()}")
