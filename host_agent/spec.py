"""Task specs as domain values: frozen dataclasses, checked when they are made.

`host_agent.convert.spec_from_proto` makes them from an `amc.v1.TaskSpec` (raising
InvalidSpec for a spec no runner could run); the runner only ever sees these.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar, TypeAlias

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

    kind: ClassVar[str] = "actions"
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

    kind: ClassVar[str] = "workflow"
    steps: tuple[WorkflowStep, ...]


TaskSpec: TypeAlias = ActionList | Workflow
