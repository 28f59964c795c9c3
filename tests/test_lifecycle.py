"""The lifecycle table (control_plane.lifecycle) says what DESIGN.md's table says. That the
SQL keeps to it is checked on real runs by tests/test_model.py, and the kinds and codes by
tests/test_schema.py."""

from __future__ import annotations

import itertools

from control_plane.lifecycle import TRANSITIONS, Event, TaskStatus, allowed

Q, A, D = TaskStatus.QUEUED, TaskStatus.ASSIGNED, TaskStatus.DISPATCHED
DONE, FAILED, CANCELLED = TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED
# DESIGN.md's rows, one (event, from, to) each; None: no task before.
DESIGN = {
    (Event.SUBMIT, None, Q),
    (Event.ASSIGN, Q, A),
    (Event.ACKNOWLEDGE, A, D),
    (Event.CANCEL, Q, CANCELLED),
    *((Event.CANCEL_REQUESTED, s, s) for s in (A, D)),
    *((Event.REPORT, s, to) for s in (A, D) for to in (DONE, FAILED, CANCELLED)),
    *(
        (ended, s, to)
        for ended in (Event.EXPIRED, Event.RELEASED)
        for s in (A, D)
        for to in (CANCELLED, Q, FAILED)
    ),
    # Issue 22, beyond DESIGN.md's table: a lease given back because the phone was lost
    # ends as a release does (cancelled if a cancel was pending, requeued within the
    # infrastructure-retry budget, failed once it is spent).
    *((Event.DEVICE_LOST, s, to) for s in (A, D) for to in (CANCELLED, Q, FAILED)),
    (Event.QUEUE_TIMEOUT, Q, FAILED),
    *((Event.DEADLINE_EXCEEDED, s, to) for s in (A, D) for to in (FAILED, CANCELLED)),
}


def test_the_lifecycle_table_allows_designs_transitions_and_nothing_else() -> None:
    """THEN exactly DESIGN.md's (event, from, to) rows are allowed."""
    statuses: list[TaskStatus | None] = [None, *TaskStatus]
    every = itertools.product(Event, statuses, statuses)
    assert {(e, before, after) for e, before, after in every if allowed(e, before, after)} == (
        DESIGN
    )


def test_every_event_has_a_row_and_no_terminal_status_is_left() -> None:
    """THEN each event is in the table, and no event starts from a terminal status."""
    assert set(TRANSITIONS) == set(Event)
    assert not any(s.terminal for t in TRANSITIONS.values() for s in t.sources)
