"""The queue at farm scale (issue 20): an Acquire reads only the queue groups its devices
can match, so what nobody can take costs it nothing; fairness keys of equal priority take
turns by weight, a key at its cap of phones gets no more, priority still comes first, and
with one key the queue stays first come, first served."""

from __future__ import annotations

from datetime import timedelta

import asyncpg
import pytest

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from tests.support import Clients, Farm, HostClient, actions_spec

S = scheduler_pb2


def _task(
    *, key: str = "", priority: int = 0, serial: str = "", **labels: str
) -> S.SubmitTaskRequest:
    return S.SubmitTaskRequest(
        spec=actions_spec(),
        selector=task_pb2.DeviceSelector(serial=serial, labels=labels),
        priority=priority,
        fairness_key=key,
    )


async def _submit(client: Clients, *tasks: S.SubmitTaskRequest) -> list[str]:
    ids: list[str] = []
    for start in range(0, len(tasks), 500):
        answer = await client.scheduler.SubmitTasks(
            S.SubmitTasksRequest(tasks=list(tasks[start : start + 500]))
        )
        ids += [t.task_id for t in answer.tasks]
    return ids


async def _run_one_at_a_time(host: HostClient, serial: str, count: int) -> list[str]:
    """Take and finish `count` tasks on one phone; the ids in the order they were taken."""
    order: list[str] = []
    for _ in range(count):
        a = await host.acquire_one(serial, wait=5)
        order.append(a.task_id)
        await host.report(a, lease_pb2.OUTCOME_DONE)
    return order


async def _rows_one_acquire_reads(db: asyncpg.Connection, host_id: str, serial: str) -> int:
    """Rows of `tasks` one Acquire of `host_id` that takes one task reads: the entries its
    index scans return and the rows sequential scans return, counted by PostgreSQL for its
    transaction, which is rolled back: it changes nothing."""
    tx = db.transaction()
    await tx.start()
    try:
        await db.fetch("SELECT * FROM amc_acquire($1, $2, '1 minute')", host_id, [serial])
        read = await db.fetchval(
            "SELECT sum(pg_stat_get_xact_tuples_returned(c.oid)) FROM pg_class c"
            " WHERE c.oid = 'tasks'::regclass"
            "    OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'tasks'::regclass)"
        )
        taken = await db.fetchval(
            "SELECT count(*) FROM tasks WHERE host_id = $1 AND status = 'assigned'", host_id
        )
    finally:
        await tx.rollback()
    assert taken == 1
    return int(read)


async def test_an_acquire_reads_no_task_its_devices_cannot_take(farm: Farm) -> None:
    """THEN with 3,000 tasks queued for racks no host has, and a long history of finished
    tasks, an Acquire reads no more task rows than with none (its plans made on statistics
    that know the backlog): the groups it cannot match are never read."""
    client = await farm.client()
    await farm.host("h1", "s1", rack="r1")
    await farm.host("h2", "s2", rack="r2")
    await _submit(client, _task(rack="r1"), _task(rack="r2"))
    assert farm.db is not None
    await farm.db.execute("ANALYZE tasks")
    empty = await _rows_one_acquire_reads(farm.db, "h1", "s1")
    await _submit(client, *[_task(rack=f"nowhere-{i % 50}") for i in range(3000)])
    await farm.db.execute(
        "INSERT INTO tasks (task_id, caller, status, spec, max_attempts, finished_at,"
        " selector_labels) SELECT gen_random_uuid(), 'history', 'done', '', 1, now(),"
        " jsonb_build_object('rack', 'r2') FROM generate_series(1, 3000)"
    )
    await farm.db.execute("ANALYZE tasks")  # plans made on statistics that know the backlog
    # Another host, whose group and task no earlier (rolled back) Acquire touched.
    deep = await _rows_one_acquire_reads(farm.db, "h2", "s2")
    # No more than with no backlog (the first Acquire of the session also planned its
    # statements, which reads a few index entries); reading the backlog would be thousands.
    assert deep <= empty, (empty, deep)


async def test_a_flood_of_one_key_delays_another_keys_task_by_about_one_task(farm: Farm) -> None:
    """THEN a task of key B submitted after 300 of key A for the same phone runs second:
    behind the task A has at the head, not behind A's flood."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    flood = await _submit(client, *[_task(key="team-a") for _ in range(300)])
    first = await _run_one_at_a_time(host, "s1", 1)
    (b,) = await _submit(client, _task(key="team-b"))
    order = first + await _run_one_at_a_time(host, "s1", 3)
    assert order[:1] == flood[:1]
    assert b in order[1:3], (b, order)


async def test_keys_of_equal_priority_take_turns_in_proportion_to_their_weights(
    farm: Farm,
) -> None:
    """THEN with weights 1 and 3 and both keys flooded, of 40 tasks run 10 are the first
    key's and 30 the second's, each key's in the order submitted."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    assert farm.db is not None
    await farm.db.execute(
        "INSERT INTO fair_shares (fairness_key, weight) VALUES ('light', 1), ('heavy', 3)"
    )
    light = await _submit(client, *[_task(key="light") for _ in range(60)])
    heavy = await _submit(client, *[_task(key="heavy") for _ in range(60)])
    order = await _run_one_at_a_time(host, "s1", 40)
    ran_light = [t for t in order if t in light]
    ran_heavy = [t for t in order if t in heavy]
    assert (len(ran_light), len(ran_heavy)) == (10, 30)
    assert ran_light == light[:10] and ran_heavy == heavy[:30]


async def test_a_key_at_its_cap_takes_no_more_phones_and_other_keys_take_them(
    farm: Farm,
) -> None:
    """THEN key capped at 2 phones holds 2 of 4 idle phones while it has tasks queued, the
    other 2 go to another key's later tasks, and its next task starts once one of its own
    ends."""
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2", "s3", "s4")
    assert farm.db is not None
    await farm.db.execute("INSERT INTO fair_shares (fairness_key, max_devices) VALUES ('qa', 2)")
    qa = await _submit(client, *[_task(key="qa") for _ in range(5)])
    other = await _submit(client, *[_task(key="ci") for _ in range(5)])
    taken = await host.acquire("s1", "s2", "s3", "s4")
    by_key = sorted("qa" if a.task_id in qa else "ci" for a in taken)
    assert by_key == ["ci", "ci", "qa", "qa"]
    running = await farm.db.fetchval(
        "SELECT count(*) FROM tasks WHERE fairness_key = 'qa' AND status = 'assigned'"
    )
    assert running == 2
    # One of qa's ends: its phone goes to qa's next task, not beyond the cap.
    done = next(a for a in taken if a.task_id in qa)
    await host.report(done, lease_pb2.OUTCOME_DONE)
    (again,) = await host.acquire(done.device_serial)
    assert again.task_id == qa[2]
    assert other[:2] == sorted((a.task_id for a in taken if a.task_id in other), key=other.index)


async def test_priority_comes_before_fair_shares(farm: Farm) -> None:
    """THEN a higher-priority task goes first whatever its key's turn."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    await _submit(client, *[_task(key="a") for _ in range(5)])
    await _submit(client, *[_task(key="b") for _ in range(5)])
    (urgent,) = await _submit(client, _task(key="a", priority=5))
    assert (await _run_one_at_a_time(host, "s1", 1)) == [urgent]


async def test_with_one_key_the_queue_is_first_come_first_served_across_selectors(
    farm: Farm,
) -> None:
    """THEN tasks of one key for different selectors that a phone matches run in the order
    they were submitted, a requeued one first again."""
    client = await farm.client()
    host = await farm.host("h1", "s1", rack="r1", os="14")
    ids = await _submit(
        client,
        _task(rack="r1"),
        _task(os="14"),
        _task(),
        _task(serial="s1"),
        _task(rack="r1", os="14"),
    )
    first = await host.acquire_one("s1")
    assert first.task_id == ids[0]
    await host.release(first.lease_id, "given back")
    assert await _run_one_at_a_time(host, "s1", 5) == ids


async def test_a_group_with_nothing_queued_or_running_is_forgotten_and_made_again(
    farm: Farm,
) -> None:
    """THEN the queue's groups hold only what waits or runs (after they sat empty): a group
    whose tasks all ended is forgotten, one with a task running is kept, and a later submit
    for the forgotten selector makes its group again and runs."""
    client = await farm.client()
    host = await farm.host("h1", "s1", "s2", rack="r1")
    assert farm.db is not None
    await _submit(client, _task(rack="r1"), _task(rack="r1", os="any"))
    (a,) = await host.acquire("s1")
    await host.report(a, lease_pb2.OUTCOME_DONE)
    await _submit(client, _task(serial="s2"))
    (running,) = await host.acquire("s2")
    assert farm.plane is not None
    forgotten = await farm.plane.store.forget_queue_groups(timedelta(0), 100)
    assert forgotten == 1
    kept = await farm.db.fetch("SELECT selector_serial, selector_labels FROM queue_groups")
    assert sorted((r["selector_serial"], r["selector_labels"]) for r in kept) == [
        ("", {"os": "any", "rack": "r1"}),
        ("s2", {}),
    ]
    (again,) = await _submit(client, _task(rack="r1"))
    await host.report(running, lease_pb2.OUTCOME_DONE)
    assert (await host.acquire_one("s1")).task_id == again


@pytest.mark.parametrize("bad", ["has space", "x" * 200, "é"])
async def test_a_bad_fairness_key_is_refused_naming_the_field(farm: Farm, bad: str) -> None:
    client = await farm.client()
    with pytest.raises(Exception) as refused:
        await client.scheduler.SubmitTask(_task(key=bad))
    assert "fairness_key" in str(refused.value)
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 0
