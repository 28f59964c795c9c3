"""A task's statuses as the API, the database and people spell them (amc.v1.TaskStatus
without its TASK_STATUS_ prefix, in lower case), and the one list of those a task ends in.

control_plane.lifecycle's TaskStatus takes its terminal set from here (and a test holds
its values to STATUSES); the CLI, the client library and the harnesses ask `numbers` for
the same set as the wire's numbers. `Outcome` is what a host reports an attempt ended as,
for the host agent and the control plane alike.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any

STATUSES = ("queued", "assigned", "dispatched", "done", "failed", "cancelled")
# A task in one of these has ended: nothing changes it again.
TERMINAL = frozenset({"done", "failed", "cancelled"})


class Outcome(enum.StrEnum):
    """What a host reports an attempt ended as (amc.v1.Outcome): a run on the host agent
    ends in one, and the control plane's report transition takes it. Its value is the task
    status it leads to."""

    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


def wire_name(status: str) -> str:
    """`queued` -> `TASK_STATUS_QUEUED`: the status's name in amc.v1.TaskStatus."""
    return f"TASK_STATUS_{status.upper()}"


def numbers(statuses: Iterable[str], wire: Any) -> frozenset[int]:
    """These statuses as numbers of the wire's enum (pass amc.v1.task_pb2.TaskStatus):
    taken as an argument so that this module stays free of the wire types, which
    control_plane.lifecycle may not import."""
    return frozenset(int(wire.Value(wire_name(name))) for name in statuses)
