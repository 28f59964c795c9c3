"""What a run produced: per-step results and the run's outcome.

Plain values, apart from the runner (which makes them) and `spec` (which turns them into
protobuf), so the two can share them without importing each other.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from host_agent.stop_token import StopReason

# Both `output` and `error` of a step result are cut to this many UTF-8 bytes.
OUTPUT_LIMIT = 4096


class Outcome(enum.Enum):
    """The terminal result reported for an attempt."""

    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class StepStatus(enum.Enum):
    OK = "ok"
    FAILED = "failed"
    # Not run: the task stopped before it (stop token, or an earlier step failed).
    SKIPPED = "skipped"


@dataclass(frozen=True)
class StepResult:
    """One action (TaskRunner) or one named step (WorkflowRunner). `index` counts from 0."""

    index: int
    name: str
    status: StepStatus
    # Wall clock, timezone-aware UTC; None for a skipped step.
    started_at: datetime | None = None
    duration: timedelta = timedelta(0)
    output: str = ""
    error: str = ""
    data: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    # Empty when DONE; otherwise why, e.g. "cancelled: stopped before step 2 'tap'".
    error: str
    steps: tuple[StepResult, ...]
    # Set when the stop token is what ended the run.
    stop_reason: StopReason | None = None


def cut(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """`text` in at most `limit` UTF-8 bytes; a cut one ends with a marker saying so."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    marker = "\n…[cut]"
    head = raw[: limit - len(marker.encode())]
    # errors="ignore" drops a character split by the byte cut.
    return head.decode(errors="ignore") + marker
