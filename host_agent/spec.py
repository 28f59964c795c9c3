"""Task specs as domain values: frozen dataclasses, checked when they are made.

The actions themselves are amc_common.action_table' classes: the one definition of each action's
fields, defaults and limits, which the control plane checked the spec against too.
`host_agent.wire.spec_from_proto` makes these from an `amc.v1.TaskSpec` (raising
InvalidSpec for a spec no runner could run); the runner only ever sees these.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from amc_common.action_table import Action, InstallApp


class InvalidSpec(ValueError):
    """The task spec cannot be run."""


@dataclass(frozen=True)
class ActionList:
    """Run by the TaskRunner: each action is one step."""

    kind: ClassVar[str] = "actions"
    actions: tuple[Action, ...]
    # Installed before the first action (TaskSpec.apps), as a step of their own.
    apps: tuple[InstallApp, ...] = ()
    # The emulator snapshot the task starts from (TaskSpec.start_snapshot; "": none).
    start_snapshot: str = ""


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
    apps: tuple[InstallApp, ...] = ()
    start_snapshot: str = ""


@dataclass(frozen=True)
class Session:
    """An interactive session (host_agent.session): its actions arrive one at a time; an
    adb door's (`adb`) serves the phone's adb streams too (host_agent.adb_door)."""

    kind: ClassVar[str] = "session"
    apps: tuple[InstallApp, ...] = ()
    start_snapshot: str = ""
    adb: bool = False
    # A WebDriver session's (host_agent.webdriver): its commands go to the phone's Appium.
    webdriver: bool = False


TaskSpec: TypeAlias = ActionList | Workflow | Session
