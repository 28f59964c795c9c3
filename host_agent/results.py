"""What a run produced: per-step results and the run's outcome (amc_common.statuses'
`Outcome`, the control plane's too).

Plain values, apart from the runner (which makes them) and `spec` (which turns them into
protobuf), so the two can share them without importing each other.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from amc_common.statuses import Outcome
from host_agent.stop_token import StopReason

# Both `output` and `error` of a step result are cut to this many UTF-8 bytes.
OUTPUT_LIMIT = 4096


class StepStatus(enum.Enum):
    OK = "ok"
    FAILED = "failed"
    # Not run: the task stopped before it (stop token, or an earlier step failed).
    SKIPPED = "skipped"
    # Stopped part-way because the task was cancelled (not a failure of the step).
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Kept:
    """A file an action kept (a screenshot's PNG, a ui_dump's XML), to be uploaded as an
    artifact of the task before the result is reported."""

    # amc_common.action_table.KEEPS: "screenshot" or "ui_dump".
    kind: str
    data: bytes = field(repr=False)
    # The action's position inside its step.
    action_index: int = 0


@dataclass(frozen=True)
class StoredArtifact:
    """A kept file the control plane stored (its answer to the upload)."""

    artifact_id: str
    kind: str
    action_index: int
    size_bytes: int
    sha256: str


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
    # Files kept by the step's actions, until uploaded (then dropped).
    kept: tuple[Kept, ...] = ()
    # Those the control plane stored.
    artifacts: tuple[StoredArtifact, ...] = ()
    # Lines of the phone's log that flag this step (host_agent.logcat: an app's crash,
    # an ANR), as logcat wrote them.
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunResult:
    outcome: Outcome
    # Empty when DONE; otherwise why, e.g. "cancelled: stopped before step 2 'tap'".
    error: str
    steps: tuple[StepResult, ...]
    # Set when the stop token is what ended the run.
    stop_reason: StopReason | None = None
    # The run ended because the phone was lost (DeviceLost): not the task's failure.
    device_lost: bool = False


def cut(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """`text` in at most `limit` UTF-8 bytes; a cut one ends with a marker saying so."""
    raw = text.encode()
    if len(raw) <= limit:
        return text
    marker = "\n…[cut]"
    head = raw[: limit - len(marker.encode())]
    # errors="ignore" drops a character split by the byte cut.
    return head.decode(errors="ignore") + marker
