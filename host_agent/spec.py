"""Task specs as domain values, and the protobuf edge of the runner.

`spec_from_proto` turns an `amc.v1.TaskSpec` into frozen dataclasses (raising InvalidSpec
for a spec no runner could run); `result_to_proto`, `outcome_to_proto` and
`report_request` turn a RunResult back into protobuf. Nothing else in the runner sees pb2
types.

Defaults for unset (or zero) durations: `wait` 0 s, `wait_for` 10 s, `swipe` 300 ms,
`shell` the host agent's configured default (None here).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from typing import ClassVar, TypeAlias, assert_never

from google.protobuf import duration_pb2

from amc.v1 import lease_pb2, task_pb2
from host_agent.results import Outcome, RunResult, StepResult, StepStatus, cut

DEFAULT_WAIT_FOR_TIMEOUT = 10.0
DEFAULT_SWIPE_MS = 300

# UiSelector field -> attribute of a `uiautomator dump` node.
_SELECTOR_ATTRIBUTES = {
    "text": "text",
    "resource_id": "resource-id",
    "content_desc": "content-desc",
}


class InvalidSpec(ValueError):
    """The task spec cannot be run."""


@dataclass(frozen=True)
class UiSelector:
    """Exactly one of the fields, matched exactly against the UI dump."""

    text: str | None = None
    resource_id: str | None = None
    content_desc: str | None = None

    def __post_init__(self) -> None:
        chosen = [f.name for f in fields(self) if getattr(self, f.name) is not None]
        if len(chosen) != 1:
            raise InvalidSpec(
                f"a selector needs exactly one of text, resource_id, content_desc; got {chosen}"
            )
        if not self.value:
            raise InvalidSpec(f"selector {chosen[0]} is empty")

    @property
    def by(self) -> str:
        return next(f.name for f in fields(self) if getattr(self, f.name) is not None)

    @property
    def value(self) -> str:
        return str(getattr(self, self.by))

    @property
    def attribute(self) -> str:
        """The XML attribute this selector matches, e.g. "resource-id"."""
        return _SELECTOR_ATTRIBUTES[self.by]

    def __str__(self) -> str:
        return f"{self.by}={self.value!r}"


@dataclass(frozen=True)
class Tap:
    kind: ClassVar[str] = "tap"
    x: int
    y: int


@dataclass(frozen=True)
class TapOn:
    kind: ClassVar[str] = "tap_on"
    selector: UiSelector


@dataclass(frozen=True)
class Swipe:
    kind: ClassVar[str] = "swipe"
    x1: int
    y1: int
    x2: int
    y2: int
    duration_ms: int = DEFAULT_SWIPE_MS


@dataclass(frozen=True)
class InputText:
    kind: ClassVar[str] = "input_text"
    text: str


@dataclass(frozen=True)
class Key:
    kind: ClassVar[str] = "key"
    keycode: int


@dataclass(frozen=True)
class LaunchApp:
    kind: ClassVar[str] = "launch_app"
    package: str
    # Empty: the package's default activity.
    activity: str = ""


@dataclass(frozen=True)
class StopApp:
    kind: ClassVar[str] = "stop_app"
    package: str


@dataclass(frozen=True)
class Shell:
    kind: ClassVar[str] = "shell"
    command: str
    # Seconds; None: the host agent's default shell timeout.
    timeout: float | None = None


@dataclass(frozen=True)
class Screenshot:
    kind: ClassVar[str] = "screenshot"


@dataclass(frozen=True)
class Wait:
    kind: ClassVar[str] = "wait"
    seconds: float


@dataclass(frozen=True)
class WaitFor:
    kind: ClassVar[str] = "wait_for"
    selector: UiSelector
    timeout: float = DEFAULT_WAIT_FOR_TIMEOUT


@dataclass(frozen=True)
class AssertVisible:
    kind: ClassVar[str] = "assert_visible"
    selector: UiSelector


Action: TypeAlias = (
    Tap
    | TapOn
    | Swipe
    | InputText
    | Key
    | LaunchApp
    | StopApp
    | Shell
    | Screenshot
    | Wait
    | WaitFor
    | AssertVisible
)


@dataclass(frozen=True)
class ActionList:
    """Run by the TaskRunner: each action is one step."""

    actions: tuple[Action, ...]


@dataclass(frozen=True)
class WorkflowStep:
    name: str
    actions: tuple[Action, ...]
    # A failed action ends this step, but the workflow goes on to the next one.
    continue_on_error: bool = False


@dataclass(frozen=True)
class Workflow:
    """Run by the WorkflowRunner: named steps in order."""

    steps: tuple[WorkflowStep, ...]


TaskSpec: TypeAlias = ActionList | Workflow


# --- protobuf -> domain ------------------------------------------------------------------


def spec_from_proto(pb: task_pb2.TaskSpec) -> TaskSpec:
    """The domain spec of `pb`; InvalidSpec says what is wrong and where."""
    kind = pb.WhichOneof("kind")
    match kind:
        case "actions":
            return ActionList(_actions_from_proto(pb.actions.actions, where=""))
        case "workflow":
            return Workflow(tuple(_step_from_proto(i, s) for i, s in enumerate(pb.workflow.steps)))
        case None:
            raise InvalidSpec("task spec has neither actions nor a workflow")
        case _:
            raise InvalidSpec(f"unknown task spec kind {kind!r}")


def _step_from_proto(index: int, pb: task_pb2.WorkflowStep) -> WorkflowStep:
    name = pb.name or f"step {index}"
    actions = _actions_from_proto(pb.actions, where=f"workflow step {index} {name!r}, ")
    return WorkflowStep(name=name, actions=actions, continue_on_error=pb.continue_on_error)


def _actions_from_proto(pbs: Iterable[task_pb2.Action], where: str) -> tuple[Action, ...]:
    actions = []
    for i, pb in enumerate(pbs):
        try:
            actions.append(action_from_proto(pb))
        except InvalidSpec as exc:
            raise InvalidSpec(f"{where}action {i}: {exc}") from exc
    return tuple(actions)


def action_from_proto(pb: task_pb2.Action) -> Action:
    kind = pb.WhichOneof("kind")
    match kind:
        case "tap":
            return Tap(_non_negative(pb.tap.x), _non_negative(pb.tap.y))
        case "tap_on":
            return TapOn(_selector(pb.tap_on.selector))
        case "swipe":
            return _swipe(pb.swipe)
        case "input_text":
            return InputText(_required(pb.input_text.text, "text"))
        case "key":
            return Key(_non_negative(pb.key.keycode))
        case "launch_app":
            return LaunchApp(_required(pb.launch_app.package, "package"), pb.launch_app.activity)
        case "stop_app":
            return StopApp(_required(pb.stop_app.package, "package"))
        case "shell":
            return Shell(_required(pb.shell.command, "command"), _seconds(pb.shell.timeout) or None)
        case "screenshot":
            return Screenshot()
        case "wait":
            return Wait(_seconds(pb.wait.duration))
        case "wait_for":
            timeout = _seconds(pb.wait_for.timeout) or DEFAULT_WAIT_FOR_TIMEOUT
            return WaitFor(_selector(pb.wait_for.selector), timeout)
        case "assert_visible":
            return AssertVisible(_selector(pb.assert_visible.selector))
        case None:
            raise InvalidSpec("no action kind set")
        case _:
            raise InvalidSpec(f"unknown action kind {kind!r}")


def _swipe(pb: task_pb2.Swipe) -> Swipe:
    x1, y1, x2, y2 = (_non_negative(v) for v in (pb.x1, pb.y1, pb.x2, pb.y2))
    duration_ms = round(_seconds(pb.duration) * 1000) or DEFAULT_SWIPE_MS
    return Swipe(x1, y1, x2, y2, duration_ms=duration_ms)


def _selector(pb: task_pb2.UiSelector) -> UiSelector:
    by = pb.WhichOneof("by")
    if by is None:
        raise InvalidSpec("selector has none of text, resource_id, content_desc")
    return UiSelector(**{by: getattr(pb, by)})


def _non_negative(value: int) -> int:
    if value < 0:
        raise InvalidSpec(f"negative value {value}")
    return value


def _required(value: str, name: str) -> str:
    if not value:
        raise InvalidSpec(f"{name} is empty")
    return value


def _seconds(pb: duration_pb2.Duration) -> float:
    """Seconds of a Duration; an unset one is 0."""
    seconds = float(pb.seconds + pb.nanos / 1e9)
    if seconds < 0:
        raise InvalidSpec(f"negative duration {seconds:g}s")
    return seconds


# --- domain -> protobuf ------------------------------------------------------------------


def outcome_to_proto(outcome: Outcome) -> lease_pb2.Outcome:
    match outcome:
        case Outcome.DONE:
            return lease_pb2.OUTCOME_DONE
        case Outcome.FAILED:
            return lease_pb2.OUTCOME_FAILED
        case Outcome.CANCELLED:
            return lease_pb2.OUTCOME_CANCELLED
        case _:
            assert_never(outcome)


def _status_to_proto(status: StepStatus) -> task_pb2.StepStatus:
    match status:
        case StepStatus.OK:
            return task_pb2.STEP_STATUS_OK
        case StepStatus.FAILED:
            return task_pb2.STEP_STATUS_FAILED
        case StepStatus.SKIPPED:
            return task_pb2.STEP_STATUS_SKIPPED
        case _:
            assert_never(status)


def step_to_proto(step: StepResult) -> task_pb2.StepResult:
    pb = task_pb2.StepResult(
        index=step.index,
        name=step.name,
        status=_status_to_proto(step.status),
        duration=step.duration,
        output=cut(step.output),
        error=cut(step.error),
        data=dict(step.data),
    )
    if step.started_at is not None:
        pb.started_at.FromDatetime(step.started_at)
    return pb


def result_to_proto(result: RunResult) -> task_pb2.TaskResult:
    return task_pb2.TaskResult(
        error=cut(result.error), steps=[step_to_proto(s) for s in result.steps]
    )


def report_request(
    result: RunResult, *, task_id: str, attempt: int, lease_id: str
) -> lease_pb2.ReportResultRequest:
    """The ReportResult request for `result`; build it once and resend that same message."""
    return lease_pb2.ReportResultRequest(
        task_id=task_id,
        attempt=attempt,
        lease_id=lease_id,
        outcome=outcome_to_proto(result.outcome),
        result=result_to_proto(result),
    )
