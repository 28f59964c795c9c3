"""The group commit's own rules (store/grouped.py), with a write that records its groups."""

import asyncio
from collections.abc import Sequence

import pytest

from control_plane import errors
from control_plane.store.grouped import GroupCommit


async def in_turn(group: GroupCommit[object, object], items: object) -> list[object]:
    """The first item's call, then (its write in flight) the others'."""
    first, *rest = items  # type: ignore[misc]
    calls = [asyncio.ensure_future(group(first))]
    await asyncio.sleep(0.002)
    calls += [asyncio.ensure_future(group(i)) for i in rest]
    return await asyncio.gather(*calls, return_exceptions=True)


class Writes:
    """A write that takes a loop turn, records each group and answers each item doubled
    (an item < 0 is refused: its own error; 'all' fails the whole statement)."""

    def __init__(self, fail_all: BaseException | None = None) -> None:
        self.groups: list[list[object]] = []
        self.fail_all = fail_all

    async def __call__(self, items: Sequence[object]) -> list[object]:
        self.groups.append(list(items))
        await asyncio.sleep(0.01)
        if "all" in items and len(items) > 1 and self.fail_all is not None:
            raise self.fail_all
        if "all" in items:
            raise ValueError("refused alone")
        return [ValueError(f"bad {i}") if isinstance(i, int) and i < 0 else 2 * i for i in items]  # type: ignore[operator]


async def test_calls_arriving_while_one_is_written_go_together_as_the_next_group() -> None:
    writes = Writes()
    group: GroupCommit[object, object] = GroupCommit(writes)
    answers = await in_turn(group, range(10))
    assert answers == [2 * i for i in range(10)]
    # The first alone (nothing was in flight), the nine that came meanwhile together.
    assert writes.groups == [[0], list(range(1, 10))]


async def test_an_item_refused_by_the_write_fails_only_its_own_call() -> None:
    group: GroupCommit[object, object] = GroupCommit(Writes())
    answers = await asyncio.gather(*(group(i) for i in (1, -2, 3)), return_exceptions=True)
    assert answers[0] == 2 and answers[2] == 6
    assert isinstance(answers[1], ValueError) and str(answers[1]) == "bad -2"


async def test_a_statement_refused_as_a_whole_is_written_again_one_call_a_statement() -> None:
    writes = Writes(fail_all=RuntimeError("the statement failed"))
    group: GroupCommit[object, object] = GroupCommit(writes)
    answers = await asyncio.gather(*(group(i) for i in (0, 1, "all", 3)), return_exceptions=True)
    assert answers[0] == 0 and answers[1] == 2 and answers[3] == 6
    assert isinstance(answers[2], ValueError)
    assert [0] in writes.groups and [1] in writes.groups and ["all"] in writes.groups


async def test_an_unavailable_database_fails_the_groups_calls_without_writing_each() -> None:
    writes = Writes(fail_all=errors.DatabaseUnavailable())
    group: GroupCommit[object, object] = GroupCommit(writes)
    answers = await in_turn(group, (0, 1, "all", 3))
    assert answers[0] == 0
    assert all(isinstance(a, errors.DatabaseUnavailable) for a in answers[1:])
    assert writes.groups == [[0], [1, "all", 3]]


async def test_groups_hold_at_most_max_size_and_run_in_flight_at_once() -> None:
    writes = Writes()
    group: GroupCommit[object, object] = GroupCommit(
        writes, in_flight=2, size=lambda _: 10, max_size=30
    )
    answers = await asyncio.gather(*(group(i) for i in range(9)))
    assert answers == [2 * i for i in range(9)]
    # Two writers, each taking what waits, three at most (30 / 10).
    assert writes.groups == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert max(len(g) for g in writes.groups) == 3


@pytest.mark.parametrize("in_flight", [1, 2])
async def test_a_call_arriving_as_the_writer_finishes_is_written(in_flight: int) -> None:
    """A call whose first step runs after the writer found nothing waiting but before
    its task's done callbacks ran still gets a writer (it waited for the next call)."""
    late: list[asyncio.Future[object]] = []
    group: GroupCommit[object, object]

    async def write(items: Sequence[object]) -> list[object]:
        await asyncio.sleep(0.01)
        if not late:  # its first step is queued ahead of this writer's end
            late.append(asyncio.ensure_future(group("late")))
        return list(items)

    group = GroupCommit(write, in_flight=in_flight)
    assert await group("first") == "first"
    assert await asyncio.wait_for(late[0], 5) == "late"


@pytest.mark.parametrize("in_flight", [1, 2])
async def test_a_call_made_as_soon_as_the_last_is_answered_is_written(in_flight: int) -> None:
    writes = Writes()
    group: GroupCommit[object, object] = GroupCommit(writes, in_flight=in_flight)
    for i in range(20):
        assert await asyncio.wait_for(group(i), 5) == 2 * i
    assert writes.groups == [[i] for i in range(20)]
