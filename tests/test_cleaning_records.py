"""What the control plane records of a host's cleans between leases (issue 38, part 2): a
lease that ends with `cleans` leaves its device `cleaning` in the same transaction (so
Acquire, which takes only `ready` devices, cannot give it out before its host says the
clean passed), each step a host reports is a `cleaning` host event, and malformed steps are
refused, recording nothing. The control plane played to by a host over the real gRPC API."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import grpc
import pytest
from google.protobuf import duration_pb2

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane.domain import DeviceMatch
from control_plane.pending import explain
from control_plane.retention import retain
from tests.support import Farm, HostClient, actions_spec, seconds
from tests.support.agent import submit
from tests.test_device_health import condition_of
from tests.test_host_operations import host_events

CLEANING = scheduler_pb2.DEVICE_CONDITION_CLEANING
READY = scheduler_pb2.DEVICE_CONDITION_READY


async def leased(farm: Farm) -> tuple[HostClient, lease_pb2.Assignment]:
    host = await farm.host("h1", "s1")
    await submit(await farm.client(), actions_spec())
    a = await host.acquire_one("s1")
    await host.renew(a.lease_id)
    return host, a


def step(name: str, detail: str, took: float, ok: bool = True) -> lease_pb2.CleanStep:
    return lease_pb2.CleanStep(name=name, detail=detail, took=seconds(took), ok=ok)


def health(condition: int, *steps: lease_pb2.CleanStep, reason: str = "") -> lease_pb2.DeviceHealth:
    return lease_pb2.DeviceHealth(serial="s1", condition=condition, reason=reason, cleaned=steps)


async def report_health(host: HostClient, *devices: lease_pb2.DeviceHealth) -> None:
    request = lease_pb2.ReportDeviceHealthRequest(host_id=host.host_id, devices=devices)
    await host.c.lease.ReportDeviceHealth(request)


@pytest.mark.parametrize("cleans", [True, False])
async def test_a_report_that_says_the_host_cleans_leaves_the_device_cleaning(
    farm: Farm, cleans: bool
) -> None:
    """THEN with `cleans` the task is done and its device `cleaning` (after that task) in one
    transaction, and an Acquire offering it gets nothing until the host reports it ready;
    without, the device is ready and free at once, as before."""
    host, a = await leased(farm)
    request = lease_pb2.ReportResultRequest(
        task_id=a.task_id,
        attempt=a.attempt,
        lease_id=a.lease_id,
        outcome=lease_pb2.OUTCOME_DONE,
        result=task_pb2.TaskResult(),
        cleans=cleans,
    )
    await host.c.lease.ReportResult(request)
    assert farm.db is not None
    row = await farm.db.fetchrow(
        "SELECT d.condition, d.condition_reason, d.task_id FROM devices d WHERE d.serial = 's1'"
    )
    assert row["task_id"] is None
    if not cleans:
        assert row["condition"] == "ready"
        return
    assert (row["condition"], row["condition_reason"]) == ("cleaning", f"after task {a.task_id}")
    nxt = await submit(await farm.client(), actions_spec())
    assert await host.acquire("s1") == []
    await report_health(host, health(READY, step("uninstall", "nothing to remove", 0.2)))
    assert (await host.acquire_one("s1")).task_id == nxt


async def test_a_lease_given_back_with_cleans_leaves_the_device_cleaning(farm: Farm) -> None:
    """THEN a release (device_lost or not) with `cleans` leaves the device `cleaning`; one
    of a lease already over changes nothing."""
    host, a = await leased(farm)
    await host.c.lease.ReleaseLease(
        lease_pb2.ReleaseLeaseRequest(
            lease_id=a.lease_id, reason="phone lost", device_lost=True, cleans=True
        )
    )
    assert await condition_of(farm, "s1") == "cleaning"
    await report_health(host, health(READY))
    assert await condition_of(farm, "s1") == "ready"
    await host.c.lease.ReleaseLease(
        lease_pb2.ReleaseLeaseRequest(lease_id=a.lease_id, reason="again", cleans=True)
    )
    assert await condition_of(farm, "s1") == "ready"  # its attempt had ended: nothing


async def test_each_clean_step_a_host_reports_is_a_cleaning_event_before_its_quarantine(
    farm: Farm,
) -> None:
    """THEN one `cleaning` host event per step, in order, saying its duration and what it
    did, the host its actor; a clean that failed and quarantined the phone is followed by
    its `recovery` event."""
    host = await farm.host("h1", "s1")
    await report_health(
        host,
        health(
            scheduler_pb2.DEVICE_CONDITION_QUARANTINED,
            step("uninstall", "removed 1: com.a", 0.3104),
            step("files", "removed 2", 0.0004),
            step("settings", "settings: exit 255: Bad arguments", 12.5, ok=False),
            reason="clean failed: settings: exit 255: Bad arguments",
        ),
    )
    events = [(e["kind"], e["actor"], e["reason"]) for e in await host_events(farm, "h1")]
    assert events == [
        ("cleaning", "h1", "uninstall (310 ms): removed 1: com.a"),
        ("cleaning", "h1", "files (0 ms): removed 2"),
        ("cleaning", "h1", "settings failed (12.5 s): settings: exit 255: Bad arguments"),
        ("recovery", "h1", "quarantined: clean failed: settings: exit 255: Bad arguments"),
    ]


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        (step("", "no name", 1), "devices[0].cleaned[1].name"),
        (step("x" * 65, "", 1), "devices[0].cleaned[1].name"),
        (step("files", "two\nlines", 1), "devices[0].cleaned[1].detail"),
        (step("files", "d" * 1025, 1), "devices[0].cleaned[1].detail"),
        (
            lease_pb2.CleanStep(name="files", took=duration_pb2.Duration(seconds=-1)),
            "devices[0].cleaned[1].took",
        ),
    ],
    ids=["no-name", "long-name", "two-lines", "long-detail", "negative-duration"],
)
async def test_a_malformed_clean_step_is_refused_and_records_nothing(
    farm: Farm, bad: lease_pb2.CleanStep, field: str
) -> None:
    """THEN INVALID_ARGUMENT naming the step's field; no event, no condition changed."""
    host = await farm.host("h1", "s1")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await report_health(host, health(CLEANING, step("uninstall", "ok", 0.1), bad))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (refused.value.details() or "").startswith(field)
    assert await host_events(farm, "h1") == []
    assert await condition_of(farm, "s1") == "ready"


async def test_more_steps_than_a_clean_has_are_refused(farm: Farm) -> None:
    """THEN a report of 21 steps for one device is refused, naming the field."""
    host = await farm.host("h1", "s1")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await report_health(host, health(READY, *[step("files", "", 0)] * 21))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "devices[0].cleaned: more than 20 steps"


def test_a_cleaning_phone_is_named_in_a_waiting_tasks_reason() -> None:
    """THEN alone it reads as held (cleaning between leases); beside busy phones it is
    named, not lumped with the held ones."""
    only = DeviceMatch(held_by=(("cleaning", 1),))
    assert explain("s1", {}, only) == "1 matching phone held: 1 cleaning (between leases)"
    busy = DeviceMatch(busy=2, held_by=(("cleaning", 1), ("too_hot", 1)))
    assert explain(None, {}, busy) == "2 matching devices, all busy (1 cleaning, 1 held)"


async def test_cleaning_events_older_than_the_task_retention_are_deleted_the_rest_kept(
    farm: Farm,
) -> None:
    """THEN retention deletes the `cleaning` events recorded before --task-retention (a
    host writes some for every lease) and keeps the newer ones and every other kind."""
    host = await farm.host("h1", "s1")
    await report_health(host, health(READY, step("uninstall", "old", 0.1)))
    await report_health(
        host,
        health(scheduler_pb2.DEVICE_CONDITION_QUARANTINED, step("files", "old", 0.1), reason="x"),
    )
    assert farm.db is not None and farm.plane is not None
    await farm.db.execute("UPDATE host_events SET at = now() - interval '2 days'")
    await report_health(host, health(READY, step("uninstall", "new", 0.1)))
    settings = replace(farm.settings, task_retention=timedelta(days=1))
    removed = await retain(farm.plane.store, settings)
    assert removed.cleaning_events == 2
    left = [(e["kind"], e["reason"]) for e in await host_events(farm, "h1")]
    assert left == [
        ("recovery", "quarantined: x"),
        ("cleaning", "uninstall (100 ms): new"),
        ("recovery", "ready"),
    ]
