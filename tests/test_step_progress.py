"""A running task's steps as they end (issue 27.8): its host sends each step's result with a
renewal of the attempt's lease (Lease.RenewLeases), fenced by the lease as every report is;
the control plane keeps them on the attempt and GetTask and WatchTask show the steps done,
the step running and since when. The terminal report stays the record: once it is in,
progress is neither kept nor shown."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import grpc
import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane.progress import write_once
from tests.support import Farm, HostClient, eventually, tap, wait_action, workflow_spec

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def step(index: int, name: str, status: int = task_pb2.STEP_STATUS_OK, took: float = 1.5):
    """A step that started at T0 + 10 s per index and took `took` seconds."""
    started = timestamp_pb2.Timestamp()
    started.FromDatetime(T0 + timedelta(seconds=10 * index))
    d = duration_pb2.Duration()
    d.FromTimedelta(timedelta(seconds=took))
    return task_pb2.StepResult(
        index=index, name=name, status=status, started_at=started, duration=d, output=f"{name} ok"
    )


async def renew_with(
    host: HostClient, lease_ids: list[str], steps: list[lease_pb2.StepProgress]
) -> lease_pb2.RenewLeasesResponse:
    """One renewal carrying `steps`, on a short-lived stream."""
    host.seq += 1
    request = lease_pb2.RenewLeasesRequest(
        host_id=host.host_id, lease_ids=lease_ids, seq=host.seq, steps=steps
    )
    call = host.c.lease.RenewLeases(iter([request]))
    (answer,) = [r async for r in call if not r.push]
    return answer


def progress(lease_id: str, *steps: task_pb2.StepResult) -> list[lease_pb2.StepProgress]:
    return [lease_pb2.StepProgress(lease_id=lease_id, step=s) for s in steps]


async def running_workflow(farm: Farm) -> tuple[HostClient, task_pb2.Task, lease_pb2.Assignment]:
    """A three-step workflow acknowledged on h1/s1."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    spec = workflow_spec(login=[tap()], search=[wait_action(1)], pay=[tap()])
    task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec))
    a = await host.acquire_one("s1")
    await host.renew(a.lease_id)
    return host, task, a


async def get(farm: Farm, task_id: str) -> task_pb2.Task:
    client = await farm.client()
    return await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))


async def written(farm: Farm) -> None:
    """The replica's bulk write of the step progress it was sent, now: everything sent
    before it is written (or refused) when it returns."""
    assert farm.plane is not None
    await write_once(farm.plane.store, farm.plane.hub)


async def kept_steps(farm: Farm, task_id: str) -> list[tuple[int, int]]:
    """The steps the database keeps for the task, once what the replica was sent is
    written."""
    await written(farm)
    assert farm.db is not None
    rows = await farm.db.fetch(
        "SELECT attempt, step_index FROM attempt_steps WHERE task_id = $1::uuid"
        " ORDER BY attempt, step_index",
        task_id,
    )
    return [(r["attempt"], r["step_index"]) for r in rows]


async def test_get_task_shows_the_steps_done_and_the_step_running_since_the_last_ended(
    farm: Farm,
) -> None:
    host, task, a = await running_workflow(farm)
    got = await get(farm, task.task_id)
    # Acknowledged, nothing ended yet: the first step runs since the acknowledgement.
    p = got.progress
    assert (list(p.steps), p.step_count, p.running_index, p.running_name) == ([], 3, 0, "login")
    acknowledged = (await farm.attempts(task.task_id))[0]["acknowledged_at"]
    assert p.running_since.ToDatetime(UTC) == acknowledged

    answer = await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))

    assert answer.leases[0].result == lease_pb2.RENEWAL_RESULT_RENEWED
    assert await kept_steps(farm, task.task_id) == [(1, 0)]
    p = (await get(farm, task.task_id)).progress
    assert [(s.index, s.name, s.output) for s in p.steps] == [(0, "login", "login ok")]
    assert (p.running_index, p.running_name) == (1, "search")
    assert p.running_since.ToDatetime(UTC) == T0 + timedelta(seconds=1.5)
    # The task's own fields are as they were: progress is beside them.
    got = await get(farm, task.task_id)
    assert got.status == task_pb2.TASK_STATUS_DISPATCHED and not got.HasField("result")


async def test_a_step_sent_again_is_kept_once_and_a_failed_step_ends_the_running_one(
    farm: Farm,
) -> None:
    host, task, a = await running_workflow(farm)
    await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))
    failed = step(1, "search", task_pb2.STEP_STATUS_FAILED)
    await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login"), failed))
    assert await kept_steps(farm, task.task_id) == [(1, 0), (1, 1)]
    p = (await get(farm, task.task_id)).progress
    assert [s.status for s in p.steps] == [task_pb2.STEP_STATUS_OK, task_pb2.STEP_STATUS_FAILED]
    # A failed step (not continue_on_error) ends the run: no step runs after it.
    assert not p.HasField("running_since") and p.running_name == ""


async def test_a_stale_attempts_steps_are_refused(farm: Farm) -> None:
    host, task, a = await running_workflow(farm)
    await farm.expire_now(a.lease_id)
    await eventually(
        lambda: _is(farm, task.task_id, "queued"), what="the task requeued by the sweep"
    )
    answer = await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))
    assert answer.leases[0].result == lease_pb2.RENEWAL_RESULT_CONFLICT
    assert await kept_steps(farm, task.task_id) == []
    got = await get(farm, task.task_id)
    assert got.status == task_pb2.TASK_STATUS_QUEUED and not got.HasField("progress")


async def _is(farm: Farm, task_id: str, status: str) -> bool:
    return await farm.status(task_id) == status


async def test_steps_of_a_lease_the_renewal_does_not_renew_are_refused(farm: Farm) -> None:
    host, task, a = await running_workflow(farm)
    other = await farm.host("h2", "s2")
    # Another host's renewal naming nothing of its own: the step is not kept.
    await renew_with(other, [], progress(a.lease_id, step(0, "login")))
    # This host's renewal that does not name the lease: not kept either.
    await renew_with(host, [], progress(a.lease_id, step(0, "login")))
    assert await kept_steps(farm, task.task_id) == []


async def test_a_late_step_after_the_terminal_report_changes_nothing(farm: Farm) -> None:
    host, task, a = await running_workflow(farm)
    await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))
    assert await kept_steps(farm, task.task_id) == [(1, 0)]
    await host.c.lease.ReportResult(
        lease_pb2.ReportResultRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            outcome=lease_pb2.OUTCOME_DONE,
            result=task_pb2.TaskResult(steps=[step(0, "login"), step(1, "search"), step(2, "pay")]),
        )
    )
    before = await get(farm, task.task_id)

    answer = await renew_with(
        host, [a.lease_id], progress(a.lease_id, step(1, "search", task_pb2.STEP_STATUS_FAILED))
    )

    assert answer.leases[0].result == lease_pb2.RENEWAL_RESULT_CONFLICT
    assert await kept_steps(farm, task.task_id) == [(1, 0)]
    after = await get(farm, task.task_id)
    assert after == before
    assert after.status == task_pb2.TASK_STATUS_DONE and not after.HasField("progress")
    assert [s.status for s in after.result.steps] == [task_pb2.STEP_STATUS_OK] * 3


async def test_watch_task_streams_each_step_as_it_is_kept(farm: Farm) -> None:
    host, task, a = await running_workflow(farm)
    client = await farm.client()
    seen: list[task_pb2.Task] = []

    async def watch() -> None:
        async for update in client.scheduler.WatchTask(
            scheduler_pb2.WatchTaskRequest(task_id=task.task_id)
        ):
            seen.append(update)

    watcher = asyncio.create_task(watch())
    try:
        await eventually(lambda: seen, what="the current state first")
        assert seen[0].progress.running_name == "login"
        await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))
        await eventually(
            lambda: any(t.progress.running_name == "search" for t in seen), what="step 0 kept"
        )
        await renew_with(host, [a.lease_id], progress(a.lease_id, step(1, "search")))
        await eventually(
            lambda: any(t.progress.running_name == "pay" for t in seen), what="step 1 kept"
        )
        await host.report(a, lease_pb2.OUTCOME_DONE)
        await asyncio.wait_for(watcher, 10)
    finally:
        watcher.cancel()
    assert [len(t.progress.steps) for t in seen[:3]] == [0, 1, 2]
    assert seen[-1].status == task_pb2.TASK_STATUS_DONE and not seen[-1].HasField("progress")


@pytest.mark.parametrize(
    ("steps", "field"),
    [
        (lambda lease: progress("not-a-uuid", step(0, "login")), "steps[0].lease_id"),
        (lambda lease: progress(lease, step(-1, "login")), "steps[0].step.index"),
        (
            lambda lease: progress(lease, task_pb2.StepResult(index=0, error="\x00")),
            "steps[0].step.error",
        ),
        (lambda lease: progress(lease, *[step(0, "x")] * 1001), "steps"),
    ],
)
async def test_bad_steps_are_invalid_argument_and_change_nothing(
    farm: Farm, steps, field: str
) -> None:  # type: ignore[no-untyped-def]
    host, task, a = await running_workflow(farm)
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await renew_with(host, [a.lease_id], steps(a.lease_id))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field)
    assert await kept_steps(farm, task.task_id) == []
    assert await farm.snapshot() == before
