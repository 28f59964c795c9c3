"""The host agent's protobuf edge: every message ⇄ domain conversion of the session and
the worker, in one place.

Protobuf -> domain: `assignment_from_proto` (one HeldAssignment of an Acquire answer, its spec
parsed by `spec_from_proto`, which raises InvalidSpec for a spec no runner could run) and
`timing_from_proto` (what RegisterHost answered).
Domain -> protobuf: `register_request` (with `device_to_proto`), `acquire_request`, and
`report_request` (with `result_to_proto`, `step_to_proto`, `outcome_to_proto`).

Past this module the session, the worker, the runner and the spec model see domain values
only. The renewal stream (`leases`) and the final calls (`reporting`) speak their own
messages, which are all they are about.

An action's fields, their defaults and limits are amc_common.action_table': an unset
`wait_for.timeout` is 10 s there, an unset `shell.timeout` None (the host agent's
--shell-timeout).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from google.protobuf import duration_pb2

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_common.action_table import KEEPS, Action, ActionError, InstallApp, from_message
from amc_common.device_selector import SNAPSHOT_NAME
from amc_common.statuses import Outcome
from amc_common.steps import default_name
from amc_common.steps import label as step_label
from amc_common.steps import number as step_number
from host_agent.devices import AttachedDevice
from host_agent.fencing import Timing
from host_agent.health import Condition, Health
from host_agent.results import RunResult, StepResult, StepStatus, cut
from host_agent.spec import ActionList, InvalidSpec, Session, TaskSpec, Workflow, WorkflowStep

# The control plane's limits on registered text (validate.py there); longer is cut here
# rather than have one odd phone make every registration fail.
_MAX_TEXT, _MAX_LABEL = 128, 1024
# What a clean step's detail may say (validate_lease's MAX_VALUE there).
_MAX_DETAIL = 1024

_DEVICE_STATES = {
    "device": scheduler_pb2.DEVICE_STATE_DEVICE,
    "offline": scheduler_pb2.DEVICE_STATE_OFFLINE,
    "unauthorized": scheduler_pb2.DEVICE_STATE_UNAUTHORIZED,
}


@dataclass(frozen=True)
class HeldAssignment:
    """One attempt the control plane gave this host (an Acquire answer's
    lease_pb2.Assignment), as the worker runs it under its lease: the spec parsed, the
    lease's validity counted from its arrival."""

    task_id: str
    attempt: int
    lease_id: str
    device_serial: str
    # The spec to run, or why it cannot run (reported as the attempt's failure).
    spec: TaskSpec | InvalidSpec
    # Seconds the lease is valid for, counted from when the assignment arrived.
    valid_for: float
    # Seconds the run may take (None: no limit), counted from its start.
    deadline: float | None = None
    # (frames a second, most frames) of the screen recording asked for; None: none.
    record_screen: tuple[int, int] | None = None


# --- durations ---------------------------------------------------------------------------


def seconds(d: duration_pb2.Duration) -> float:
    """The seconds of a Duration (an unset one is 0)."""
    return float(d.ToTimedelta().total_seconds())


def duration(value: float) -> duration_pb2.Duration:
    """A Duration of `value` seconds."""
    d = duration_pb2.Duration()
    d.FromNanoseconds(round(value * 1e9))
    return d


# --- the session's calls -----------------------------------------------------------------


def device_to_proto(d: AttachedDevice) -> lease_pb2.DeviceInfo:
    return lease_pb2.DeviceInfo(
        serial=d.serial,
        state=_DEVICE_STATES.get(d.state, scheduler_pb2.DEVICE_STATE_OFFLINE),
        model=_one_line(d.model, _MAX_TEXT),
        manufacturer=_one_line(d.manufacturer, _MAX_TEXT),
        sdk=d.sdk,
        abi=_one_line(d.abi, _MAX_TEXT),
        labels={_one_line(k, _MAX_TEXT): _one_line(v, _MAX_LABEL) for k, v in d.labels.items()},
    )


# Control characters and line separators: the control plane refuses them in labels.
_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def _one_line(text: str, limit: int) -> str:
    """What a phone reports (an adb error, a getprop value) as one line the control plane
    accepts: an odd phone must not make the whole host's registration fail."""
    return _BREAKS.sub(" ", text).strip()[:limit]


def _duration(seconds: float) -> duration_pb2.Duration:
    took = duration_pb2.Duration()
    took.FromNanoseconds(round(max(0.0, seconds) * 1e9))
    return took


def register_request(
    host_id: str, labels: Mapping[str, str], inventory: Iterable[AttachedDevice]
) -> lease_pb2.RegisterHostRequest:
    return lease_pb2.RegisterHostRequest(
        host_id=host_id, labels=dict(labels), devices=[device_to_proto(d) for d in inventory]
    )


def health_request(
    host_id: str, changed: Iterable[tuple[str, Health]]
) -> lease_pb2.ReportDeviceHealthRequest:
    return lease_pb2.ReportDeviceHealthRequest(
        host_id=host_id,
        devices=[
            lease_pb2.DeviceHealth(
                serial=serial,
                condition=scheduler_pb2.DeviceCondition.Value(
                    f"DEVICE_CONDITION_{h.condition.name}"
                ),
                reason=h.reason,
                battery_percent=h.battery_percent,
                temperature_celsius=h.temperature_celsius,
                charging=h.charging,
                cleaned=[
                    lease_pb2.CleanStep(
                        name=step.name,
                        detail=_one_line(step.detail, _MAX_DETAIL),
                        took=_duration(step.seconds),
                        ok=step.ok,
                    )
                    for step in h.cleaned
                ],
            )
            for serial, h in changed
        ],
    )


def timing_from_proto(response: lease_pb2.RegisterHostResponse) -> Timing:
    return Timing(
        ttl=seconds(response.lease_ttl),
        interval=seconds(response.renew_interval),
        kept_max_bytes=response.kept_max_bytes,
    )


def held_from_proto(response: lease_pb2.RegisterHostResponse) -> list[tuple[str, Health]]:
    """The phones the control plane records as quarantined or recovering, as reported."""
    recovering = scheduler_pb2.DEVICE_CONDITION_RECOVERING
    return [
        (
            h.serial,
            Health(
                Condition.RECOVERING if h.condition == recovering else Condition.QUARANTINED,
                h.reason,
            ),
        )
        for h in response.quarantined
    ]


def acquire_request(host_id: str, idle: list[str], wait: float) -> lease_pb2.AcquireRequest:
    return lease_pb2.AcquireRequest(host_id=host_id, idle_serials=idle, wait=duration(wait))


def assignment_from_proto(pb: lease_pb2.Assignment) -> HeldAssignment:
    spec: TaskSpec | InvalidSpec
    try:
        spec = spec_from_proto(pb.spec)
    except InvalidSpec as exc:
        spec = exc
    return HeldAssignment(
        task_id=pb.task_id,
        attempt=pb.attempt,
        lease_id=pb.lease_id,
        device_serial=pb.device_serial,
        spec=spec,
        valid_for=seconds(pb.valid_for),
        deadline=seconds(pb.deadline) if pb.HasField("deadline") else None,
        record_screen=(
            (pb.spec.record_screen.fps, pb.spec.record_screen.max_frames)
            if pb.spec.HasField("record_screen")
            else None
        ),
    )


# --- spec: protobuf -> domain ------------------------------------------------------------


def spec_from_proto(pb: task_pb2.TaskSpec) -> TaskSpec:
    """The domain spec of `pb`; InvalidSpec says what is wrong and where."""
    kind = pb.WhichOneof("kind")
    installs = (task_pb2.Action(install_app=app) for app in pb.apps)
    apps = tuple(a for a in _actions_from_proto(installs, "apps: ") if isinstance(a, InstallApp))
    start = pb.start_snapshot
    if start and not SNAPSHOT_NAME.fullmatch(start):
        raise InvalidSpec(f"start_snapshot: not a snapshot name: {start!r}")
    match kind:
        case "actions":
            return ActionList(_actions_from_proto(pb.actions.actions, where=""), apps, start)
        case "workflow":
            steps = tuple(_step_from_proto(i, s) for i, s in enumerate(pb.workflow.steps))
            return Workflow(steps, apps, start)
        case "session":
            session = pb.session
            return Session(apps, start, adb=session.adb, webdriver=session.webdriver)
        case None:
            raise InvalidSpec("task spec has neither actions nor a workflow")
        case _:
            raise InvalidSpec(f"unknown task spec kind {kind!r}")


def _step_from_proto(index: int, pb: task_pb2.WorkflowStep) -> WorkflowStep:
    name = pb.name or default_name(index)
    actions = _actions_from_proto(pb.actions, where=f"workflow {step_label(index, name)}, ")
    return WorkflowStep(name=name, actions=actions, continue_on_error=pb.continue_on_error)


def _actions_from_proto(pbs: Iterable[task_pb2.Action], where: str) -> tuple[Action, ...]:
    actions = []
    for i, pb in enumerate(pbs):
        try:
            actions.append(action_from_proto(pb))
        except InvalidSpec as exc:
            raise InvalidSpec(f"{where}action {step_number(i)}: {exc}") from exc
    return tuple(actions)


def action_from_proto(pb: task_pb2.Action) -> Action:
    """The action `pb` asks for, by its definition in amc_common.action_table: checked as the
    control plane checked it, and with the defaults of the fields it leaves out."""
    try:
        return from_message(pb)
    except ActionError as exc:
        raise InvalidSpec(str(exc)) from None


# --- results: domain -> protobuf ---------------------------------------------------------


_OUTCOMES = {
    Outcome.DONE: lease_pb2.OUTCOME_DONE,
    Outcome.FAILED: lease_pb2.OUTCOME_FAILED,
    Outcome.CANCELLED: lease_pb2.OUTCOME_CANCELLED,
}
_STEP_STATUSES = {
    StepStatus.OK: task_pb2.STEP_STATUS_OK,
    StepStatus.FAILED: task_pb2.STEP_STATUS_FAILED,
    StepStatus.SKIPPED: task_pb2.STEP_STATUS_SKIPPED,
    StepStatus.CANCELLED: task_pb2.STEP_STATUS_CANCELLED,
}


def outcome_to_proto(outcome: Outcome) -> lease_pb2.Outcome:
    return _OUTCOMES[outcome]


def step_to_proto(step: StepResult) -> task_pb2.StepResult:
    pb = task_pb2.StepResult(
        index=step.index,
        name=step.name,
        status=_STEP_STATUSES[step.status],
        duration=step.duration,
        output=cut(step.output),
        error=cut(step.error),
        data=dict(step.data),
        artifacts=[
            task_pb2.Artifact(
                artifact_id=a.artifact_id,
                step_index=step.index,
                step_name=step.name,
                action_index=a.action_index,
                kind=a.kind,
                content_type=KEEPS.get(a.kind, ""),
                size_bytes=a.size_bytes,
                sha256=a.sha256,
            )
            for a in step.artifacts
        ],
        warnings=step.warnings,
    )
    if step.started_at is not None:
        pb.started_at.FromDatetime(step.started_at)
    return pb


def result_to_proto(result: RunResult) -> task_pb2.TaskResult:
    return task_pb2.TaskResult(
        error=cut(result.error), steps=[step_to_proto(s) for s in result.steps]
    )


def report_request(
    result: RunResult,
    *,
    task_id: str,
    attempt: int,
    lease_id: str,
    cleans: bool = False,
    kept: Sequence[lease_pb2.KeptFile] = (),
) -> lease_pb2.ReportResultRequest:
    """The ReportResult request for `result`; build it once and resend that same message.
    `cleans`: the host cleans the phone next (the control plane marks it `cleaning`);
    `kept`: the small files carried with it (host_agent.artifact_upload.carried)."""
    pb = result_to_proto(result)
    for step in pb.steps:
        for artifact in step.artifacts:
            artifact.task_id, artifact.attempt = task_id, attempt
    return lease_pb2.ReportResultRequest(
        task_id=task_id,
        attempt=attempt,
        lease_id=lease_id,
        outcome=outcome_to_proto(result.outcome),
        result=pb,
        cleans=cleans,
        kept=kept,
    )
