"""A task's history through the real API: ListTaskEvents answers every attempt (where it
ran, its lease, how it ended) and the task's events, paged; `amc get` shows both."""

from __future__ import annotations

import grpc
import pytest

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane.domain import Role
from tests.support import Farm, actions_spec, eventually, tap
from tests.test_cli import Cli

A = scheduler_pb2


async def _history(farm: Farm) -> tuple[str, list[str]]:
    """A task whose first attempt expired on h1/s1 and whose second ran done on h2/s2;
    returns its id and the two lease ids."""
    operator = await farm.operator()
    task = await operator.scheduler.SubmitTask(
        A.SubmitTaskRequest(spec=actions_spec(tap()), max_attempts=3)
    )
    h1 = await farm.host("h1", "s1")
    first = await h1.acquire_one("s1")
    await h1.renew(first.lease_id)
    await farm.expire_now(first.lease_id)
    await eventually(lambda: _status_is(farm, task.task_id, "queued"), what="requeue")
    h2 = await farm.host("h2", "s2")
    second = await h2.acquire_one("s2")
    await h2.renew(second.lease_id)
    await h2.report(second, lease_pb2.OUTCOME_DONE)
    return task.task_id, [first.lease_id, second.lease_id]


async def _status_is(farm: Farm, task_id: str, status: str) -> bool:
    return await farm.status(task_id) == status


async def test_task_history_lists_each_attempt_and_every_event(farm: Farm) -> None:
    """The attempts carry host, device, lease, times and ending; the events match the
    task_events rows in order."""
    task_id, leases = await _history(farm)
    client = await farm.client()
    answer = await client.scheduler.ListTaskEvents(A.ListTaskEventsRequest(task_id=task_id))

    first, second = answer.attempts
    assert (first.attempt, first.host_id, first.device_serial, first.lease_id) == (
        1,
        "h1",
        "s1",
        leases[0],
    )
    assert first.state == A.ATTEMPT_STATE_EXPIRED
    assert (second.host_id, second.device_serial, second.lease_id) == ("h2", "s2", leases[1])
    assert second.state == A.ATTEMPT_STATE_DONE
    for attempt in (first, second):
        assert attempt.HasField("created_at") and attempt.HasField("acknowledged_at")
        assert attempt.HasField("ended_at")
        assert attempt.created_at.ToDatetime() <= attempt.ended_at.ToDatetime()

    rows = await farm.events(task_id)
    assert [(e.event_id, e.kind, e.attempt) for e in answer.events] == [
        (r["event_id"], r["kind"], r["attempt"]) for r in rows
    ]
    assert [e.kind for e in answer.events] == [
        "submit",
        "assign",
        "acknowledge",
        "expired",
        "assign",
        "acknowledge",
        "report",
    ]
    expired = answer.events[3]
    assert (expired.from_status, expired.to_status) == (
        task_pb2.TASK_STATUS_DISPATCHED,
        task_pb2.TASK_STATUS_QUEUED,
    )
    assert answer.events[0].from_status == task_pb2.TASK_STATUS_UNSPECIFIED
    assert answer.events[-1].to_status == task_pb2.TASK_STATUS_DONE
    assert answer.next_page_token == ""


async def test_task_events_are_paged_oldest_first(farm: Farm) -> None:
    """Pages of 3 give every event once, in order; each page repeats the attempts; the
    last page has no next token."""
    task_id, _ = await _history(farm)
    client = await farm.client()
    seen: list[int] = []
    token, pages = "", 0
    while True:
        page = await client.scheduler.ListTaskEvents(
            A.ListTaskEventsRequest(task_id=task_id, page_size=3, page_token=token)
        )
        pages += 1
        assert len(page.attempts) == 2
        assert len(page.events) <= 3
        seen += [e.event_id for e in page.events]
        token = page.next_page_token
        if not token:
            break
    assert pages == 3
    assert seen == [r["event_id"] for r in await farm.events(task_id)]


async def test_task_history_of_a_queued_task_has_no_attempts(farm: Farm) -> None:
    """Never assigned: no attempts, the one submit event."""
    client = await farm.client()
    task = await client.scheduler.SubmitTask(A.SubmitTaskRequest(spec=actions_spec(tap())))
    answer = await client.scheduler.ListTaskEvents(A.ListTaskEventsRequest(task_id=task.task_id))
    assert list(answer.attempts) == []
    assert [(e.kind, e.to_status) for e in answer.events] == [
        ("submit", task_pb2.TASK_STATUS_QUEUED)
    ]


@pytest.mark.parametrize(
    ("request_fields", "code", "words"),
    [
        ({"task_id": "00000000-0000-4000-8000-000000000000"}, "NOT_FOUND", "no task"),
        ({"task_id": "nope"}, "INVALID_ARGUMENT", "task_id"),
        (
            {"task_id": "00000000-0000-4000-8000-000000000000", "page_size": -1},
            "INVALID_ARGUMENT",
            "page_size",
        ),
        (
            {"task_id": "00000000-0000-4000-8000-000000000000", "page_token": "zz!"},
            "INVALID_ARGUMENT",
            "page_token",
        ),
    ],
)
async def test_task_history_refuses_bad_requests_clearly(
    farm: Farm, request_fields: dict[str, object], code: str, words: str
) -> None:
    """Unknown task: NOT_FOUND; malformed id, size or token: INVALID_ARGUMENT naming it."""
    client = await farm.client()
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await client.scheduler.ListTaskEvents(A.ListTaskEventsRequest(**request_fields))  # type: ignore[arg-type]
    assert failure.value.code().name == code
    assert words in (failure.value.details() or "")


async def test_task_history_needs_a_client_role(farm: Farm) -> None:
    """A host token may not read task histories."""
    host = farm.clients(await farm.token(Role.HOST, "h1"))
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await host.scheduler.ListTaskEvents(
            A.ListTaskEventsRequest(task_id="00000000-0000-4000-8000-000000000000")
        )
    assert failure.value.code() == grpc.StatusCode.PERMISSION_DENIED


async def test_amc_get_shows_attempts_and_events(farm: Farm) -> None:
    """`amc get -o json` has attempts and events arrays; the table shows both sections."""
    task_id, leases = await _history(farm)
    amc = Cli(farm.address, await farm.token(Role.CLIENT))
    run = await amc("get", task_id, "-o", "json")
    assert run.code == 0, run.err
    doc = run.json()
    assert doc["status"] == "TASK_STATUS_DONE"
    assert [a["lease_id"] for a in doc["attempts"]] == leases
    assert [a["state"] for a in doc["attempts"]] == ["ATTEMPT_STATE_EXPIRED", "ATTEMPT_STATE_DONE"]
    assert [e["kind"] for e in doc["events"]][:2] == ["submit", "assign"]
    assert len(doc["events"]) == len(await farm.events(task_id))

    table = await amc("get", task_id)
    assert table.code == 0, table.err
    assert "attempts" in table.out and "events" in table.out
    assert leases[0] in table.out and "expired" in table.out
