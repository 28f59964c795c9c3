"""Runs a task spec on one device: TaskRunner (an action list) and WorkflowRunner (named
steps of actions), both stopping cooperatively through one shared StopToken.

Both runners are the same loop over steps: a TaskRunner step is one action named after its
kind ("tap", "wait_for", …); a WorkflowRunner step is a named list of actions. The token
is checked before every action; once it tripped no new action starts, the steps not run
are SKIPPED and `outcome_for` turns what happened into the reported Outcome.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, assert_never

import structlog

from amc_common.action_table import Action, InstallApp
from amc_common.statuses import Outcome
from amc_common.steps import label as step_label
from amc_common.steps import number as step_number
from host_agent.devices import Device, DeviceLost
from host_agent.executor import POLL_INTERVAL, StepOutput, describe_device_error, execute
from host_agent.install import Library
from host_agent.results import Kept, RunResult, StepResult, StepStatus, cut
from host_agent.spec import ActionList, Session, TaskSpec, Workflow
from host_agent.stop_token import Stopped, StopReason, StopToken

__all__ = [
    "DEFAULT_SHELL_TIMEOUT",
    "Outcome",
    "RunResult",
    "StepResult",
    "StepRunner",
    "StepStatus",
    "TaskRunner",
    "WorkflowRunner",
    "outcome_for",
    "run",
]

DEFAULT_SHELL_TIMEOUT = 60.0

log = structlog.get_logger(__name__)

# Told of each step that ran, as it ends (the agent sends it as progress).
OnStep = Callable[[StepResult], None]


class Marks(Protocol):
    """Told as each step begins and ends (host_agent.logcat's capture marks the phone's
    log there); `ended` answers the step as it is reported (with its warnings)."""

    async def began(self, index: int, name: str) -> None: ...

    async def ended(self, step: StepResult) -> StepResult: ...


def outcome_for(all_steps_ran: bool, failed: bool, stop_reason: StopReason | None) -> Outcome:
    """The one rule from how a run ended to what is reported.

    `failed`: a step failed and that ended the run (not continue_on_error).
    `stop_reason`: the token's reason, if the token is what ended the run.
    """
    if failed:
        return Outcome.FAILED
    if all_steps_ran:
        # A cancel that arrives after the last step changes nothing: the work is done.
        return Outcome.DONE
    match stop_reason:
        case StopReason.CANCELLED:
            return Outcome.CANCELLED
        case (
            StopReason.LEASE_LOST
            | StopReason.SHUTDOWN
            | StopReason.DEADLINE
            | StopReason.ABANDONED
            | StopReason.QUARANTINED
            | StopReason.DEVICE_LOST
        ):
            # A task stopped for a quarantine is given back (worker.py); a session, whose
            # client is attached to this phone, ends failed.
            return Outcome.FAILED
        case None:
            # Unfinished without a failure or a stop: nothing to call it but failed.
            return Outcome.FAILED
        case _:
            assert_never(stop_reason)


async def run(
    spec: TaskSpec,
    device: Device,
    token: StopToken,
    *,
    shell_default_timeout: float = DEFAULT_SHELL_TIMEOUT,
    poll_interval: float = POLL_INTERVAL,
    on_step: OnStep | None = None,
    library: Library | None = None,
    marks: Marks | None = None,
) -> RunResult:
    """Run `spec` with the runner its kind calls for; `on_step` is told of each step that
    ran as it ends (progress; the result returned is the record), `marks` as each begins
    and ends. The spec's apps are installed first, as a step of their own ("apps"), with
    `library`."""
    options: dict[str, Any] = {
        "shell_default_timeout": shell_default_timeout,
        "poll_interval": poll_interval,
        "on_step": on_step,
        "library": library,
        "marks": marks,
    }
    match spec:
        case ActionList():
            return await TaskRunner(device, token, **options).run(spec)
        case Workflow():
            return await WorkflowRunner(device, token, **options).run(spec)
        case Session():
            raise ValueError("a session runs through host_agent.session, not run()")
        case _:
            assert_never(spec)


@dataclass(frozen=True)
class _Step:
    name: str
    actions: tuple[Action, ...]
    continue_on_error: bool


@dataclass(frozen=True)
class _Halt:
    """Why the run ends before its last step is through."""

    error: str
    failed: bool = False
    stop_reason: StopReason | None = None
    device_lost: bool = False


@dataclass(frozen=True)
class _ActionEnd:
    output: StepOutput
    stop_reason: StopReason | None = None
    device_lost: bool = False


@dataclass(eq=False)
class _StepLoop:
    """The loop both runners share."""

    device: Device
    token: StopToken
    _: KW_ONLY
    shell_default_timeout: float = DEFAULT_SHELL_TIMEOUT
    poll_interval: float = POLL_INTERVAL
    on_step: OnStep | None = None
    # The app library, for install_app, push_file and a spec's apps (None: they fail).
    library: Library | None = None
    marks: Marks | None = None

    async def _run_steps(self, steps: Sequence[_Step]) -> RunResult:
        results: list[StepResult] = []
        halt: _Halt | None = None
        for index, step in enumerate(steps):
            if self.token.reason is not None:
                halt = _stopped(self.token.reason, f"stopped before {step_label(index, step.name)}")
                break
            result, halt = await self._run_step(index, step)
            results.append(result)
            if self.on_step is not None:
                self.on_step(result)
            log.debug("step finished", index=index, step=step.name, status=result.status.value)
            if halt is not None:
                break
        skipped = [StepResult(i, s.name, StepStatus.SKIPPED) for i, s in enumerate(steps)]
        results.extend(skipped[len(results) :])
        return _result(halt, tuple(results))

    async def _run_step(self, index: int, step: _Step) -> tuple[StepResult, _Halt | None]:
        if self.marks is not None:
            await self.marks.began(index, step.name)
        started_at, started = datetime.now(UTC), time.monotonic()
        outputs: list[StepOutput] = []
        error, halt, cancelled = "", None, False
        for position, action in enumerate(step.actions):
            end = await self._run_action(action)
            outputs.append(end.output)
            if not end.output.ok:
                where = (
                    f"action {step_number(position)} ({action.kind}): "
                    if len(step.actions) > 1
                    else ""
                )
                error = where + end.output.error
                halt = _halt_for(end, index, step, error)
                cancelled = end.stop_reason is StopReason.CANCELLED
                break
        duration = timedelta(seconds=time.monotonic() - started)
        result = _step_result(index, step.name, started_at, duration, outputs, error)
        if cancelled:
            result = dataclasses.replace(result, status=StepStatus.CANCELLED)
        if self.marks is not None:
            result = await self.marks.ended(result)
        return result, halt

    async def _run_action(self, action: Action) -> _ActionEnd:
        """One action; every way it can end becomes a value."""
        if self.token.reason is not None:  # every action is a boundary, inside a step too
            return _interrupted(self.token.reason)
        try:
            output = await execute(
                action,
                self.device,
                self.token,
                shell_default_timeout=self.shell_default_timeout,
                poll_interval=self.poll_interval,
                library=self.library,
            )
        except Stopped as stop:
            return _interrupted(stop.reason)
        except DeviceLost as exc:
            return _ActionEnd(StepOutput.failed(describe_device_error(exc)), device_lost=True)
        except Exception as exc:
            # A driver bug must fail this task and be reported, not kill the host's worker.
            log.exception("action crashed", action=action.kind)
            return _ActionEnd(StepOutput.failed(f"unexpected error: {type(exc).__name__}: {exc}"))
        return _ActionEnd(output)


class TaskRunner(_StepLoop):
    """Runs an action list; each action is one step, and a failed one ends the run."""

    async def run(self, spec: ActionList) -> RunResult:
        steps = [_Step(a.kind, (a,), False) for a in spec.actions]
        return await self._run_steps(with_apps(spec.apps, steps))


class WorkflowRunner(_StepLoop):
    """Runs named steps; a failed step ends the run unless it has continue_on_error."""

    async def run(self, spec: Workflow) -> RunResult:
        steps = [_Step(s.name, s.actions, s.continue_on_error) for s in spec.steps]
        return await self._run_steps(with_apps(spec.apps, steps))


class StepRunner(_StepLoop):
    """Runs one step at a time, as they come (a session's actions)."""

    async def run_step(
        self, index: int, name: str, actions: tuple[Action, ...]
    ) -> tuple[StepResult, StopReason | None, bool]:
        """The step's result, the stop that interrupted it (if one did) and whether the
        device was lost. A failed action ends only its step."""
        result, halt = await self._run_step(index, _Step(name, actions, False))
        if halt is None:
            return result, None, False
        return result, halt.stop_reason, halt.device_lost


APPS_STEP = "apps"


def with_apps(apps: tuple[InstallApp, ...], steps: list[_Step]) -> list[_Step]:
    """The spec's apps installed first, as one step of their own (a failed install ends
    the run there)."""
    return [_Step(APPS_STEP, apps, False), *steps] if apps else steps


def _interrupted(reason: StopReason) -> _ActionEnd:
    return _ActionEnd(StepOutput.failed(f"interrupted: {reason.label}"), stop_reason=reason)


def _stopped(reason: StopReason, where: str) -> _Halt:
    return _Halt(f"{reason.label}: {where}", stop_reason=reason)


def _halt_for(end: _ActionEnd, index: int, step: _Step, error: str) -> _Halt | None:
    """Whether (and why) a failed action ends the whole run."""
    if end.stop_reason is not None:
        return _stopped(end.stop_reason, f"interrupted during {step_label(index, step.name)}")
    if step.continue_on_error and not end.device_lost:
        return None
    # A lost device ends the run even under continue_on_error: nothing else can run on it.
    return _Halt(
        f"{step_label(index, step.name)} failed: {error}",
        failed=True,
        device_lost=end.device_lost,
    )


def _step_result(
    index: int,
    name: str,
    started_at: datetime,
    duration: timedelta,
    outputs: list[StepOutput],
    error: str,
) -> StepResult:
    data: dict[str, str] = {}
    kept: list[Kept] = []
    for position, output in enumerate(outputs):
        for key, value in output.data.items():
            # A later action's fact must not overwrite an earlier one's.
            data[key if key not in data else f"{key}#{position}"] = value
        kept += [dataclasses.replace(k, action_index=position) for k in output.kept]
    return StepResult(
        index=index,
        name=name,
        status=StepStatus.OK if all(o.ok for o in outputs) else StepStatus.FAILED,
        started_at=started_at,
        duration=duration,
        output=_joined([o.output for o in outputs]),
        error=cut(error),
        data=data,
        kept=tuple(kept),
    )


def _joined(outputs: list[str]) -> str:
    if len(outputs) == 1:
        return cut(outputs[0])
    return cut("\n".join(o.rstrip("\n") for o in outputs if o))


def _result(halt: _Halt | None, steps: tuple[StepResult, ...]) -> RunResult:
    if halt is None:
        return RunResult(outcome_for(True, False, None), "", steps)
    all_ran = halt.stop_reason is None and steps[-1].status is not StepStatus.SKIPPED
    outcome = outcome_for(all_ran, halt.failed, halt.stop_reason)
    return RunResult(outcome, cut(halt.error), steps, halt.stop_reason, halt.device_lost)
