"""The task state machine: one enum, one transition table (DESIGN.md's), nothing else.

The SQL in `queries.sql` and `migrations/002_transitions.sql` implements these transitions
as guarded statements; this table is what they implement and what the tests check against.

    queued -> assigned -> dispatched -> done | failed | cancelled
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class TaskStatus(enum.StrEnum):
    QUEUED = "queued"
    ASSIGNED = "assigned"
    DISPATCHED = "dispatched"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED})
IN_FLIGHT = frozenset({TaskStatus.ASSIGNED, TaskStatus.DISPATCHED})


class Event(enum.StrEnum):
    SUBMIT = "submit"
    ASSIGN = "assign"
    ACKNOWLEDGE = "acknowledge"
    CANCEL_QUEUED = "cancel"
    CANCEL_IN_FLIGHT = "cancel_requested"
    REPORT = "report"
    EXPIRE_CANCEL_PENDING = "expire_cancel_pending"
    EXPIRE_REQUEUE = "expire_requeue"
    EXPIRE_EXHAUSTED = "expire_exhausted"


@dataclass(frozen=True)
class Transition:
    sources: frozenset[TaskStatus]
    # None: the status does not change (a durable request is recorded instead); for REPORT
    # the target is the reported outcome.
    target: TaskStatus | None


_ = TaskStatus
TRANSITIONS: dict[Event, Transition] = {
    Event.SUBMIT: Transition(frozenset(), _.QUEUED),
    Event.ASSIGN: Transition(frozenset({_.QUEUED}), _.ASSIGNED),
    Event.ACKNOWLEDGE: Transition(frozenset({_.ASSIGNED}), _.DISPATCHED),
    Event.CANCEL_QUEUED: Transition(frozenset({_.QUEUED}), _.CANCELLED),
    Event.CANCEL_IN_FLIGHT: Transition(IN_FLIGHT, None),
    Event.REPORT: Transition(IN_FLIGHT, None),
    Event.EXPIRE_CANCEL_PENDING: Transition(IN_FLIGHT, _.CANCELLED),
    Event.EXPIRE_REQUEUE: Transition(IN_FLIGHT, _.QUEUED),
    Event.EXPIRE_EXHAUSTED: Transition(IN_FLIGHT, _.FAILED),
}
del _


class AttemptState(enum.StrEnum):
    ACTIVE = "active"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    RELEASED = "released"


class Outcome(enum.StrEnum):
    """What a host reports; each is also the task status it leads to."""

    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def status(self) -> TaskStatus:
        return TaskStatus(self.value)


def can(event: Event, status: TaskStatus) -> bool:
    return status in TRANSITIONS[event].sources
