"""Deadlines and queue timeouts through the real API, the real host agent (simulated
phones) and the real sweep: a task not assigned within its queue timeout fails "queue
timeout" (a cancel that came first wins); a run past its deadline stops at the next step
boundary and fails "deadline exceeded" (stop reason DEADLINE, never cancelled); an attempt
that overruns its deadline by more than a lease TTL without a report is ended by the
control plane, and its host's late report is refused as stale."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import timedelta

import grpc
import pytest
from google.protobuf import duration_pb2

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_common.statuses import Outcome
from control_plane import metrics
from control_plane.config import Settings
from control_plane.domain import Role
from control_plane.store import Store
from host_agent.simulated import SimulatedSource
from host_agent.stop_token import StopReason
from tests.support import Farm, HostClient, actions_spec, eventually, seconds, tap, wait_action
from tests.support.agent import (
    SHORT_TTL,
    finished,
    running_agent,
    short_ttl_farm,
    status_is,
    submit,
)
from tests.test_cli import TAP, Cli

A = scheduler_pb2


def _request(**fields: object) -> A.SubmitTaskRequest:
    return A.SubmitTaskRequest(spec=actions_spec(tap()), **fields)  # type: ignore[arg-type]


def _duration(s: int, nanos: int = 0) -> duration_pb2.Duration:
    return duration_pb2.Duration(seconds=s, nanos=nanos)


async def _kinds(farm: Farm, task_id: str) -> list[tuple[str, str | None, str | None]]:
    return [(e["kind"], e["from_status"], e["to_status"]) for e in await farm.events(task_id)]


async def _sweeps_after(farm: Farm, moment_sql: str, task_id: str) -> None:
    """Wait until the database clock is past `moment_sql` (a column of the task) and two
    sweeps have run since: whatever they were going to do to the task, they did."""
    assert farm.db is not None
    db = farm.db

    async def past() -> bool:
        return bool(
            await db.fetchval(
                f"SELECT now() > {moment_sql} FROM tasks WHERE task_id = $1::uuid", task_id
            )
        )

    await eventually(past, timeout=10, what=f"the database clock past {moment_sql}")
    start = metrics.SWEEPS._value.get()
    await eventually(lambda: metrics.SWEEPS._value.get() >= start + 2, what="two more sweeps")


# -- the API ---------------------------------------------------------------------------------


async def test_submit_records_both_limits_and_get_returns_them(farm: Farm) -> None:
    """THEN the task carries queue_timeout and deadline as given; the row holds them and
    when its stay in the queue ends."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(
        _request(queue_timeout=seconds(300), deadline=_duration(30, 500_000_000))
    )
    got = await client.scheduler.GetTask(A.GetTaskRequest(task_id=task.task_id))
    assert got.queue_timeout.ToTimedelta() == timedelta(minutes=5)
    assert got.deadline.ToTimedelta() == timedelta(seconds=30.5)
    row = await farm.task_row(task.task_id)
    assert (row["queue_timeout"], row["deadline"]) == (
        timedelta(minutes=5),
        timedelta(seconds=30.5),
    )
    assert row["queue_deadline"] == row["created_at"] + timedelta(minutes=5)


async def test_a_task_without_limits_has_none(farm: Farm) -> None:
    """THEN neither field is set, and the row has no queue deadline."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(_request())
    assert not task.HasField("queue_timeout") and not task.HasField("deadline")
    row = await farm.task_row(task.task_id)
    assert (row["queue_timeout"], row["deadline"], row["queue_deadline"]) == (None, None, None)


@pytest.mark.parametrize("field", ["queue_timeout", "deadline"])
@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (_duration(0), "between 1s and"),
        (_duration(0, 500_000_000), "between 1s and"),
        (_duration(-5), "positive"),
        (_duration(0, -1), "positive"),
        (_duration(31 * 86400), "between 1s and"),
        (_duration(10**15), "between 1s and"),
    ],
    ids=["zero", "half-a-second", "negative", "negative-nanos", "31-days", "huge"],
)
async def test_a_limit_out_of_bounds_is_refused_naming_the_field(
    farm: Farm, field: str, value: duration_pb2.Duration, problem: str
) -> None:
    """THEN INVALID_ARGUMENT names the field and its bounds, and nothing is stored."""
    client = await farm.client()
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.scheduler.SubmitTask(_request(**{field: value}))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = caught.value.details() or ""
    assert details.startswith(field) and problem in details, details
    with pytest.raises(grpc.aio.AioRpcError) as batch:
        await client.scheduler.SubmitTasks(
            A.SubmitTasksRequest(tasks=[_request(), _request(**{field: value})])
        )
    assert batch.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (batch.value.details() or "").startswith(f"tasks[1].{field}")
    assert await farm.snapshot() == before


async def test_the_deadline_bound_is_seven_days_and_the_queue_timeout_bound_thirty(
    farm: Farm,
) -> None:
    """THEN 7 days of deadline and 30 days of queue timeout are taken, 8 days of deadline
    is refused."""
    client = await farm.client()
    await client.scheduler.SubmitTask(
        _request(queue_timeout=_duration(30 * 86400), deadline=_duration(7 * 86400))
    )
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.scheduler.SubmitTask(_request(deadline=_duration(8 * 86400)))
    assert "between 1s and 7 days" in (caught.value.details() or "")


# -- queue timeout ---------------------------------------------------------------------------


async def test_a_task_no_device_takes_fails_with_queue_timeout(farm: Farm) -> None:
    """THEN once its queue timeout runs out the sweep fails it with "queue timeout", in a
    queue_timeout event, and no attempt was ever made."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(
        _request(
            selector=task_pb2.DeviceSelector(labels={"model": "Pixel9"}), queue_timeout=seconds(1)
        )
    )
    await status_is(farm, task.task_id, "failed", within=10)
    got = await client.scheduler.GetTask(A.GetTaskRequest(task_id=task.task_id))
    assert got.status == task_pb2.TASK_STATUS_FAILED
    assert got.result.error == "queue timeout"
    assert got.HasField("finished_at")
    row = await farm.task_row(task.task_id)
    assert row["error"] == "queue timeout" and row["attempt"] == 0
    assert row["finished_at"] - row["created_at"] >= timedelta(seconds=1)
    assert await _kinds(farm, task.task_id) == [
        ("submit", None, "queued"),
        ("queue_timeout", "queued", "failed"),
    ]
    (event,) = [e for e in await farm.events(task.task_id) if e["kind"] == "queue_timeout"]
    assert event["detail"] == "queued longer than 00:00:01"
    assert await farm.attempts(task.task_id) == []


async def test_a_cancel_before_the_queue_timeout_wins(farm: Farm) -> None:
    """THEN the task stays cancelled after its queue timeout passes: no queue_timeout
    event, its error untouched."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(
        _request(selector=task_pb2.DeviceSelector(serial="nowhere"), queue_timeout=seconds(1))
    )
    await client.scheduler.CancelTask(A.CancelTaskRequest(task_id=task.task_id, reason="no"))
    await _sweeps_after(farm, "queue_deadline", task.task_id)
    row = await farm.task_row(task.task_id)
    assert (row["status"], row["error"]) == ("cancelled", "")
    assert [k for k, _, _ in await _kinds(farm, task.task_id)] == ["submit", "cancel"]


async def test_a_task_assigned_in_time_does_not_time_out(farm: Farm) -> None:
    """THEN a task running when its queue timeout would have passed goes on and is done."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(_request(queue_timeout=seconds(1)))
    host = await farm.host("h1", "s1")
    a = await host.acquire_one("s1")
    await host.renew(a.lease_id)
    await _sweeps_after(farm, "queue_deadline", task.task_id)
    assert await farm.status(task.task_id) == "dispatched"
    await host.report(a, lease_pb2.OUTCOME_DONE)
    assert await farm.status(task.task_id) == "done"


async def test_a_requeued_task_gets_its_whole_queue_timeout_again(farm: Farm) -> None:
    """THEN a task whose lease expired after its first stay's timeout had passed is
    queued again with a new queue deadline, not failed at once."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(_request(queue_timeout=seconds(2)))
    host = await farm.host("h1", "s1")
    a = await host.acquire_one("s1")
    await host.renew(a.lease_id)
    first = (await farm.task_row(task.task_id))["queue_deadline"]
    await _sweeps_after(farm, "queue_deadline", task.task_id)
    await farm.expire_now(a.lease_id)
    await status_is(farm, task.task_id, "queued")
    row = await farm.task_row(task.task_id)
    assert row["queue_deadline"] > first + timedelta(seconds=2)
    await status_is(farm, task.task_id, "failed", within=10)
    assert [k for k, _, _ in await _kinds(farm, task.task_id)][-2:] == [
        "expired",
        "queue_timeout",
    ]


async def test_replicas_sweeping_at_once_end_each_timed_out_task_once(
    database_url: str,
) -> None:
    """THEN three sweepers racing over the same due tasks fail each exactly once."""
    settings = Settings(sweep_interval=timedelta(hours=1))  # only the racers below sweep
    farm = Farm(database_url, settings)
    await farm.start()
    stores = [await Store.open(database_url, min_size=1, max_size=1) for _ in range(3)]
    try:
        client = await farm.client()
        answer = await client.scheduler.SubmitTasks(
            A.SubmitTasksRequest(
                tasks=[
                    _request(
                        selector=task_pb2.DeviceSelector(serial="nowhere"),
                        queue_timeout=seconds(1),
                    )
                    for _ in range(300)
                ]
            )
        )
        ids = {t.task_id for t in answer.tasks}
        await _sweeps_after_clock(farm, next(iter(ids)))

        async def sweeper(store: Store) -> list[str]:
            ended: list[str] = []
            while batch := await store.tasks.time_out_queued(20):
                ended += [str(t.task_id) for t in batch]
            return ended

        results = await asyncio.gather(*(sweeper(s) for s in stores))
        every = [task_id for ended in results for task_id in ended]
        assert sorted(every) == sorted(ids)  # each once, none twice
        assert farm.db is not None
        counts = await farm.db.fetch(
            "SELECT task_id::text, count(*) AS n FROM task_events"
            " WHERE kind = 'queue_timeout' GROUP BY task_id"
        )
        assert {r["task_id"] for r in counts} == ids and {r["n"] for r in counts} == {1}
    finally:
        for store in stores:
            await store.close()
        await farm.stop()


async def _sweeps_after_clock(farm: Farm, task_id: str) -> None:
    """Wait until the database clock is past the task's queue deadline (no sweep runs)."""
    assert farm.db is not None
    db = farm.db

    async def past() -> bool:
        return bool(
            await db.fetchval(
                "SELECT now() > queue_deadline FROM tasks WHERE task_id = $1::uuid", task_id
            )
        )

    await eventually(past, timeout=10, what="the queue deadline to pass")


# -- deadline: the host agent ----------------------------------------------------------------


def _wait_for_nothing() -> task_pb2.Action:
    return task_pb2.Action(
        wait_for=task_pb2.WaitFor(
            selector=task_pb2.UiSelector(text="never on screen"), timeout=seconds(60)
        )
    )


def _long_shell() -> task_pb2.Action:
    return task_pb2.Action(shell=task_pb2.Shell(command="sleep 60", timeout=seconds(120)))


@pytest.mark.parametrize(
    ("action", "phone_delay"),
    [(wait_action(60), 0.01), (_wait_for_nothing(), 0.01), (_long_shell(), 60.0)],
    ids=["wait", "wait_for", "shell"],
)
async def test_a_run_past_its_deadline_stops_and_fails_with_deadline_exceeded(
    farm: Farm, action: task_pb2.Action, phone_delay: float
) -> None:
    """THEN a 60 s step under a 1 s deadline is interrupted within seconds, the stop reason
    is DEADLINE (not CANCELLED), the report is FAILED "deadline exceeded", the later steps
    never run and the task is not retried."""
    source = SimulatedSource(1, delay=phone_delay)
    client = await farm.client()
    async with running_agent(farm, source) as agent:
        started = time.monotonic()
        task_id = await submit(
            client, actions_spec(action, tap(7, 7)), deadline=seconds(1), max_attempts=3
        )
        await status_is(farm, task_id, "failed", within=10)
        took = time.monotonic() - started
        record = await finished(agent, task_id)
    assert 1 <= took < 6, took
    assert record.lease.token.reason is StopReason.DEADLINE
    assert record.result is not None and record.result.outcome is Outcome.FAILED
    assert record.result.stop_reason is StopReason.DEADLINE
    assert record.result.error.startswith("deadline exceeded"), record.result.error
    assert [a.action for a in source.actions if a.action == "tap"] == []  # step 2 never ran
    row = await farm.task_row(task_id)
    assert (row["status"], row["attempt"]) == ("failed", 1)
    assert str(row["error"]).startswith("deadline exceeded")
    result = task_pb2.TaskResult.FromString(row["result"])
    assert [s.status for s in result.steps] == [
        task_pb2.STEP_STATUS_FAILED,
        task_pb2.STEP_STATUS_SKIPPED,
    ]
    assert result.steps[0].error == "interrupted: deadline exceeded"
    assert [k for k, _, _ in await _kinds(farm, task_id)] == [
        "submit",
        "assign",
        "acknowledge",
        "report",
    ]
    (attempt,) = await farm.attempts(task_id)
    assert (attempt["state"], attempt["outcome"]) == ("failed", "failed")
    assert attempt["deadline_at"] == attempt["acknowledged_at"] + timedelta(seconds=1)
    assert await farm.device_holder("host-1", "sim-0") is None


async def test_a_run_within_its_deadline_is_done(farm: Farm) -> None:
    """THEN a short run under a generous deadline ends done, untouched by it."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source) as agent:
        task_id = await submit(client, actions_spec(tap(), wait_action(0.1)), deadline=seconds(30))
        await status_is(farm, task_id, "done")
        record = await finished(agent, task_id)
    assert record.result is not None and record.result.stop_reason is None


async def test_a_run_done_in_time_whose_uploads_are_slow_still_ends_done(
    database_url: str,
) -> None:
    """The deadline covers the run; its kept files and its report get one lease TTL after
    it, the grace the control plane's sweep gives. THEN a run that ends just before its
    deadline, whose screenshot's upload is refused "busy" again and again, is reported and
    recorded DONE (the file not kept, and why), not ended "deadline exceeded" by the sweep
    while its host retries the upload."""
    settings = replace(SHORT_TTL, max_upload_memory=1)  # every upload: UNAVAILABLE, busy
    async with short_ttl_farm(database_url, settings) as farm:
        source = SimulatedSource(1, delay=0.01)
        client = await farm.client()
        async with running_agent(farm, source, upload_timeout=30.0) as agent:
            # As an older control plane's registration says: no file goes with a report,
            # so the screenshot is uploaded (and refused busy) however small it is.
            agent.keeper.timing = replace(agent.keeper.timing, kept_max_bytes=0)
            spec = actions_spec(wait_action(1.5), task_pb2.Action(screenshot=task_pb2.Screenshot()))
            task_id = await submit(client, spec, deadline=seconds(2))
            await status_is(farm, task_id, "done", "failed", within=20)
            row = await farm.task_row(task_id)
            assert (row["status"], row["error"]) == ("done", ""), dict(row)
            record = await finished(agent, task_id)
        assert record.result is not None and record.result.outcome is Outcome.DONE
        assert record.result.stop_reason is None
        shot = record.result.steps[1]
        assert shot.artifacts == ()
        assert shot.data["artifact_error"].startswith("screenshot not kept: "), shot.data
        assert [k for k, _, _ in await _kinds(farm, task_id)][-1] == "report"


# -- deadline: the control plane ends an overrun ---------------------------------------------


async def _overrunning(
    farm: Farm, **fields: object
) -> tuple[str, lease_pb2.Assignment, HostClient]:
    """A task with a 1 s deadline held by a fake host (the real Lease API) that keeps its
    lease renewed but never reports; returns the task id, its assignment and the host."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(_request(deadline=seconds(1), **fields))
    host = await farm.host("h1", "s1")
    a = await host.acquire_one("s1")
    assert a.deadline.ToTimedelta() == timedelta(seconds=1)
    await host.renew(a.lease_id)
    return task.task_id, a, host


async def test_the_control_plane_ends_an_attempt_that_overruns_its_deadline(
    database_url: str,
) -> None:
    """THEN once deadline + one lease TTL passed without a report, the task fails
    "deadline exceeded" (not requeued, attempts left or not), the lease ends, the device is
    freed, the host's renewals are conflicts and its late report is refused as stale."""
    async with short_ttl_farm(database_url) as farm:
        task_id, a, host = await _overrunning(farm, max_attempts=3)
        assert farm.db is not None
        renewed: list[bool] = []

        async def keep_renewing() -> bool:
            (state,) = await host.renew(a.lease_id)
            renewed.append(state.result == lease_pb2.RENEWAL_RESULT_RENEWED)
            return await farm.status(task_id) == "failed"

        started = time.monotonic()
        await eventually(keep_renewing, timeout=15, interval=0.5, what="the overrun to end")
        took = time.monotonic() - started
        assert 3.5 <= took < 10, took  # 1 s deadline + a 3 s TTL, then the next sweep
        assert all(renewed[:-1])  # the lease was live all along: not an expiry

        row = await farm.task_row(task_id)
        assert (row["status"], row["error"], row["attempt"]) == (
            "failed",
            "deadline exceeded",
            1,
        )
        (attempt,) = await farm.attempts(task_id)
        assert attempt["state"] == "expired" and attempt["ended_at"] is not None
        assert attempt["lease_expires_at"] <= attempt["ended_at"]
        assert await _kinds(farm, task_id) == [
            ("submit", None, "queued"),
            ("assign", "queued", "assigned"),
            ("acknowledge", "assigned", "dispatched"),
            ("deadline_exceeded", "dispatched", "failed"),
        ]
        assert await farm.device_holder("h1", "s1") is None

        (state,) = await host.renew(a.lease_id)
        assert state.result == lease_pb2.RENEWAL_RESULT_CONFLICT
        with pytest.raises(grpc.aio.AioRpcError) as late:
            await host.report(a, lease_pb2.OUTCOME_FAILED, "deadline exceeded")
        assert late.value.code() == grpc.StatusCode.ABORTED
        assert (await farm.task_row(task_id))["status"] == "failed"
        client = await farm.client()
        got = await client.scheduler.GetTask(A.GetTaskRequest(task_id=task_id))
        assert got.result.error == "deadline exceeded"
        history = await client.scheduler.ListTaskEvents(A.ListTaskEventsRequest(task_id=task_id))
        assert history.attempts[0].state == A.ATTEMPT_STATE_EXPIRED


async def test_an_overrun_with_a_cancel_pending_ends_cancelled(database_url: str) -> None:
    """THEN a cancel requested before the overrun wins: the task ends cancelled."""
    async with short_ttl_farm(database_url) as farm:
        task_id, a, host = await _overrunning(farm)
        client = await farm.client()
        await client.scheduler.CancelTask(A.CancelTaskRequest(task_id=task_id, reason="stop"))

        async def keep_renewing() -> bool:
            await host.renew(a.lease_id)
            return await farm.status(task_id) == "cancelled"

        await eventually(keep_renewing, timeout=15, interval=0.5, what="the overrun to end")
        kinds = await _kinds(farm, task_id)
        assert kinds[-1] == ("deadline_exceeded", "dispatched", "cancelled")
        assert (await farm.task_row(task_id))["error"] == ""


# -- the CLI ---------------------------------------------------------------------------------


async def test_amc_submit_takes_both_limits_from_the_file_and_the_flags(farm: Farm) -> None:
    """THEN the spec file's queue_timeout and deadline are sent, flags win over them, and
    `amc get` shows both (table and JSON)."""
    amc = Cli(farm.address, await farm.token(Role.OPERATOR))
    spec = "queue_timeout: 5m\ndeadline: 1m30s\nactions:\n  - tap: [1, 2]\n"
    task = await amc.submit("-", stdin=spec)
    assert (task["queue_timeout"], task["deadline"]) == ("300s", "90s")
    row = await farm.task_row(task["task_id"])
    assert (row["queue_timeout"], row["deadline"]) == (timedelta(minutes=5), timedelta(seconds=90))

    flagged = await amc.submit("-", "--queue-timeout", "2h", "--deadline", "45s", stdin=spec)
    assert (flagged["queue_timeout"], flagged["deadline"]) == ("7200s", "45s")

    table = await amc("get", flagged["task_id"])
    assert table.code == 0
    lines = {" ".join(line.split()) for line in table.out.splitlines()}
    assert "queue timeout 2h" in lines and "deadline 45s per attempt" in lines
    doc = (await amc("get", flagged["task_id"], "-o", "json")).json()
    assert (doc["queue_timeout"], doc["deadline"]) == ("7200s", "45s")


async def test_amc_shows_why_a_task_failed_on_its_queue_timeout(farm: Farm) -> None:
    """THEN `amc submit --wait` exits 8 (failed) and `amc get` shows the error and event."""
    amc = Cli(farm.address, await farm.token(Role.OPERATOR))
    run = await amc(
        "submit", "-", "--serial", "nowhere", "--queue-timeout", "1s", "--wait", stdin=TAP
    )
    assert run.code == 8, run.err
    task_id = run.out.split()[2]
    table = await amc("get", task_id)
    assert "queue timeout" in table.out
    doc = (await amc("get", task_id, "-o", "json")).json()
    assert doc["result"]["error"] == "queue timeout"
    assert [e["kind"] for e in doc["events"]] == ["submit", "queue_timeout"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--deadline", "soon"], "--deadline: 'soon' is not a duration"),
        (["--queue-timeout", "-5s"], "--queue-timeout:"),
        (["--deadline", "0s"], "deadline: must be between 1s and 7 days"),
        (["--queue-timeout", "90d"], "queue_timeout: must be between 1s and 30 days"),
        (["--queue-timeout", "1000h"], "queue_timeout: must be between 1s and 30 days"),
    ],
)
async def test_amc_refuses_a_bad_limit_in_one_line(
    farm: Farm, flags: list[str], message: str
) -> None:
    """THEN a nonzero exit, one line naming the flag or field, and nothing queued."""
    amc = Cli(farm.address, await farm.token(Role.OPERATOR))
    before = await farm.snapshot()
    run = await amc("submit", "-", *flags, stdin=TAP)
    assert run.code != 0
    assert len(run.err.strip().splitlines()) == 1, run.err
    assert message in run.err, run.err
    assert await farm.snapshot() == before


async def test_a_spec_file_limit_that_is_not_a_duration_names_its_line(farm: Farm) -> None:
    """THEN the file, the line and the key are named."""
    amc = Cli(farm.address, await farm.token(Role.OPERATOR))
    run = await amc("submit", "-", stdin="deadline: forever\n" + TAP)
    assert run.code != 0
    assert "<stdin>:1: deadline: 'forever' is not a duration" in run.err, run.err
