"""SubmitTask calls arriving together on a replica are written by one statement (a group
commit): each caller answered with its own task, or its own error, after the commit."""

import asyncio

import asyncpg
import grpc

from amc.v1 import scheduler_pb2, task_pb2
from control_plane.domain import NewTask
from tests.support import Farm, actions_spec


def submit_request(**kw) -> scheduler_pb2.SubmitTaskRequest:  # type: ignore[no-untyped-def]
    kw.setdefault("spec", actions_spec())
    return scheduler_pb2.SubmitTaskRequest(**kw)


async def next_xid(db: asyncpg.Connection) -> int:
    """The transaction id PostgreSQL gives next (asking takes none): how many writing
    transactions committed or rolled back since another reading, counted exactly."""
    return int(await db.fetchval("SELECT pg_snapshot_xmax(pg_current_snapshot())::text"))


async def test_concurrent_submits_each_get_their_own_task(farm: Farm) -> None:
    client = await farm.client()
    answers = await asyncio.gather(
        *(client.scheduler.SubmitTask(submit_request(metadata={"n": str(i)})) for i in range(50))
    )
    assert [a.metadata["n"] for a in answers] == [str(i) for i in range(50)]
    assert len({a.task_id for a in answers}) == 50
    assert {a.status for a in answers} == {task_pb2.TASK_STATUS_QUEUED}
    assert farm.db is not None
    rows = await farm.db.fetch("SELECT task_id::text, metadata, status FROM tasks")
    assert {(r["task_id"], r["metadata"]["n"], r["status"]) for r in rows} == {
        (a.task_id, a.metadata["n"], "queued") for a in answers
    }
    events = await farm.db.fetch("SELECT task_id::text FROM task_events WHERE kind = 'submit'")
    assert sorted(e["task_id"] for e in events) == sorted(a.task_id for a in answers)


async def test_fifty_concurrent_submits_take_far_fewer_than_fifty_commits(farm: Farm) -> None:
    client = await farm.client()
    await client.scheduler.SubmitTask(submit_request())  # the statement prepared, the token known
    assert farm.db is not None
    before = await next_xid(farm.db)
    answers = await asyncio.gather(
        *(client.scheduler.SubmitTask(submit_request()) for _ in range(50))
    )
    writes = await next_xid(farm.db) - before
    assert len({a.task_id for a in answers}) == 50
    # One commit per group (the first call's, then those that arrived meanwhile: 6 to 8
    # groups here), and the notification of each group's tasks to the other replicas (its
    # own short transaction, in batches). One commit per task would be 50 and more.
    assert writes <= 25, f"{writes} write transactions for 50 submits"


async def test_concurrent_retries_of_a_request_id_all_get_its_first_task(farm: Farm) -> None:
    client = await farm.client()
    first = await client.scheduler.SubmitTask(submit_request(request_id="before"))
    answers = await asyncio.gather(
        *(client.scheduler.SubmitTask(submit_request(request_id="before")) for _ in range(10)),
        *(client.scheduler.SubmitTask(submit_request(request_id="new")) for _ in range(10)),
        *(client.scheduler.SubmitTask(submit_request(metadata={"n": str(i)})) for i in range(10)),
    )
    assert {a.task_id for a in answers[:10]} == {first.task_id}
    assert len({a.task_id for a in answers[10:20]}) == 1
    assert answers[10].request_id == "new"
    assert len({a.task_id for a in answers[20:]}) == 10
    assert farm.db is not None
    counts = await farm.db.fetch(
        "SELECT request_id, count(*) FROM tasks GROUP BY request_id ORDER BY request_id"
    )
    assert [(r["request_id"], r["count"]) for r in counts] == [
        ("before", 1),
        ("new", 1),
        (None, 10),
    ]
    assert await farm.db.fetchval("SELECT count(*) FROM task_events") == 12


async def test_submits_of_several_callers_written_together_keep_each_callers_task(
    farm: Farm,
) -> None:
    """Two callers may use the same request id: each has its own task of that id."""
    a, b = await farm.client(), await farm.operator()
    answers = await asyncio.gather(
        *(
            c.scheduler.SubmitTask(submit_request(request_id=f"r{i % 5}"))
            for i in range(20)
            for c in (a, b)
        )
    )
    assert len({t.task_id for t in answers}) == 10
    assert farm.db is not None
    rows = await farm.db.fetch("SELECT task_id::text, caller, request_id FROM tasks")
    by_id = {r["task_id"]: (r["caller"], r["request_id"]) for r in rows}
    callers = [by_id[t.task_id][0] for t in answers]
    assert len(set(callers[0::2])) == 1 and len(set(callers[1::2])) == 1
    assert callers[0] != callers[1]
    assert [by_id[t.task_id][1] for t in answers] == [f"r{i % 5}" for i in range(20) for _ in "ab"]


async def test_a_task_the_database_refuses_fails_only_its_own_call(farm: Farm) -> None:
    """A row PostgreSQL refuses fails the statement of its group: the group is written
    again one call a statement, so only that call fails."""
    assert farm.plane is not None
    tasks = farm.plane.store.tasks
    spec = actions_spec().SerializeToString()
    # max_attempts 0 passes no validation (the servicer's would refuse it) but the table's CHECK.
    news = [
        NewTask(spec=spec, max_attempts=0 if i == 3 else 2, metadata={"n": str(i)})
        for i in range(8)
    ]
    answers = await asyncio.gather(
        *(tasks.submit_grouped("caller", new) for new in news), return_exceptions=True
    )
    assert isinstance(answers[3], asyncpg.CheckViolationError)
    good = [a for i, a in enumerate(answers) if i != 3]
    assert [t.metadata["n"] for t, created in good if created] == [
        str(i) for i in range(8) if i != 3
    ]
    assert farm.db is not None
    rows = await farm.db.fetch("SELECT task_id, max_attempts FROM tasks")
    assert {r["task_id"] for r in rows} == {t.task_id for t, _ in good}
    assert {r["max_attempts"] for r in rows} == {2}


async def test_a_call_refused_before_its_write_does_not_fail_the_others(farm: Farm) -> None:
    """A spec naming an app the library lacks is NOT_FOUND for its caller alone; the
    calls arriving with it are queued."""
    client = await farm.client()
    missing = task_pb2.TaskSpec(
        apps=[task_pb2.InstallApp(app="no.such.app")], actions=actions_spec().actions
    )
    answers = await asyncio.gather(
        *(
            client.scheduler.SubmitTask(submit_request(spec=missing if i == 4 else actions_spec()))
            for i in range(10)
        ),
        return_exceptions=True,
    )
    failed = [i for i, a in enumerate(answers) if isinstance(a, grpc.aio.AioRpcError)]
    assert failed == [4]
    assert answers[4].code() == grpc.StatusCode.NOT_FOUND  # type: ignore[union-attr]
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 9
