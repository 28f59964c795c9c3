"""The task state machine: the statuses, the events that change them, which event may take
a task from which status to which (DESIGN.md's table), and what the transitions answer.

    queued -> assigned -> dispatched -> done | failed | cancelled

The SQL makes the transitions (the functions and statements of store/*.sql); each writes
one `task_events` row whose kind is an `Event`. This table is what they may do: the
database accepts no other kind (task_events.kind's CHECK, tests/test_schema.py), and every
row of the model-based test's runs is an allowed transition here (tests/test_model.py).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from amc_common import statuses


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


# The one list of statuses a task ends in is amc_common.statuses' (the CLI's, the harnesses').
TERMINAL = frozenset(TaskStatus(name) for name in statuses.TERMINAL)
IN_FLIGHT = frozenset({TaskStatus.ASSIGNED, TaskStatus.DISPATCHED})


class Event(enum.StrEnum):
    """What changed a task: `task_events.kind` (and the transitions metric's label)."""

    SUBMIT = "submit"
    ASSIGN = "assign"
    ACKNOWLEDGE = "acknowledge"  # the host's first renewal of the lease
    CANCEL = "cancel"  # of a queued task: at once
    CANCEL_REQUESTED = "cancel_requested"  # of a task in flight: recorded, pushed to the host
    REPORT = "report"
    EXPIRED = "expired"  # the lease ran out
    RELEASED = "released"  # the host gave the lease back
    QUEUE_TIMEOUT = "queue_timeout"  # queued past its queue timeout: failed by the sweep
    # The attempt ran past its deadline by more than a lease TTL without a report: the
    # sweep ended its lease and failed the task (cancelled if a cancel was pending).
    DEADLINE_EXCEEDED = "deadline_exceeded"
    # The host gave the lease back because the phone was lost mid-run: not the task's
    # failure, requeued within the infrastructure-retry budget (apart from max_attempts).
    DEVICE_LOST = "device_lost"


@dataclass(frozen=True)
class Transition:
    # Empty: the task did not exist before (submit).
    sources: frozenset[TaskStatus]
    # Empty: the status stays (a durable request is recorded instead).
    targets: frozenset[TaskStatus]


_ = TaskStatus
# A lease that ends without a report: cancelled if a cancel was pending (never requeued),
# else queued while attempts are left, else failed.
_LEASE_ENDED = frozenset({_.CANCELLED, _.QUEUED, _.FAILED})
TRANSITIONS: dict[Event, Transition] = {
    Event.SUBMIT: Transition(frozenset(), frozenset({_.QUEUED})),
    Event.ASSIGN: Transition(frozenset({_.QUEUED}), frozenset({_.ASSIGNED})),
    Event.ACKNOWLEDGE: Transition(frozenset({_.ASSIGNED}), frozenset({_.DISPATCHED})),
    Event.CANCEL: Transition(frozenset({_.QUEUED}), frozenset({_.CANCELLED})),
    Event.CANCEL_REQUESTED: Transition(IN_FLIGHT, frozenset()),
    Event.REPORT: Transition(IN_FLIGHT, TERMINAL),
    Event.EXPIRED: Transition(IN_FLIGHT, _LEASE_ENDED),
    Event.RELEASED: Transition(IN_FLIGHT, _LEASE_ENDED),
    # Cancelled if a cancel was pending, queued within the budget, failed once it is spent.
    Event.DEVICE_LOST: Transition(IN_FLIGHT, _LEASE_ENDED),
    Event.QUEUE_TIMEOUT: Transition(frozenset({_.QUEUED}), frozenset({_.FAILED})),
    # Never requeued: the deadline is the task's, so another attempt would overrun it too.
    Event.DEADLINE_EXCEEDED: Transition(IN_FLIGHT, frozenset({_.FAILED, _.CANCELLED})),
}
del _


def allowed(event: Event, before: TaskStatus | None, after: TaskStatus | None) -> bool:
    """May `event` take a task from `before` (None: it did not exist) to `after`?"""
    t = TRANSITIONS[event]
    if not t.sources:
        return before is None and after in t.targets
    if before not in t.sources:
        return False
    return after in t.targets if t.targets else after == before


class AttemptState(enum.StrEnum):
    ACTIVE = "active"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    RELEASED = "released"


# What a host reports; its value is the task status it leads to. One definition for the
# host agent and the control plane.
Outcome = statuses.Outcome


# -- what the transition functions answer: the `code` column of amc_cancel, amc_report and
# amc_release (store/*.sql) ----------------------------------------------------------------


class CancelCode(enum.StrEnum):
    CANCELLED = "cancelled"  # it was queued: cancelled now
    REQUESTED = "requested"  # in flight: the request is recorded and the host told
    UNCHANGED = "unchanged"  # cancelled already, or a request pending: nothing new
    TERMINAL = "terminal"  # done or failed: refused
    NOT_FOUND = "not_found"


class ReportCode(enum.StrEnum):
    RECORDED = "recorded"
    REPEATED = "repeated"  # the same outcome was recorded before: the same answer
    DIFFERENT = "different"  # another outcome was recorded: it stands
    STALE = "stale"  # not the current attempt's live lease
    FOREIGN = "foreign"  # the lease is not this host's, this task's or this attempt's
    NO_CANCEL = "no_cancel"  # `cancelled` without a cancellation request


class ReleaseCode(enum.StrEnum):
    RELEASED = "released"
    ENDED = "ended"  # its attempt had ended already: nothing to do
    FOREIGN = "foreign"  # no such lease for this host


class RemoveCode(enum.StrEnum):
    """What amc_remove_host() answers."""

    REMOVED = "removed"
    NOT_FOUND = "not_found"
    CONNECTED = "connected"  # its stream is open, or it was seen within the window
    LEASES = "leases"  # it holds leases


class HostEventKind(enum.StrEnum):
    """The kinds of host_events (its CHECK): what an operator did to a host or device."""

    CORDON = "cordon"
    UNCORDON = "uncordon"
    DRAIN = "drain"
    REMOVE = "remove"
    # A device out of quarantine (Admin.ReleaseDevice): its host's agent probes it again.
    RELEASE = "release"
    # Not an operator's: a host's recovery ladder quarantining or bringing back a device.
    RECOVERY = "recovery"
    # Not an operator's either: a step of a host's clean of a device between leases.
    CLEANING = "cleaning"
