"""The host agent's protobuf edge (host_agent.wire): TaskSpec in, TaskResult and Outcome out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf import duration_pb2

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_common import statuses
from amc_common.action_table import (
    ActionError,
    AssertVisible,
    InputText,
    Key,
    LaunchApp,
    Screenshot,
    Shell,
    StopApp,
    Swipe,
    Tap,
    TapOn,
    UiSelector,
    Wait,
    WaitFor,
)
from amc_common.statuses import Outcome
from control_plane import lifecycle
from host_agent.devices import AttachedDevice
from host_agent.fencing import Timing
from host_agent.results import OUTPUT_LIMIT, RunResult, StepResult, StepStatus
from host_agent.spec import ActionList, InvalidSpec, Workflow, WorkflowStep
from host_agent.stop_token import StopReason
from host_agent.wire import (
    HeldAssignment,
    acquire_request,
    assignment_from_proto,
    device_to_proto,
    duration,
    outcome_to_proto,
    register_request,
    report_request,
    result_to_proto,
    seconds,
    spec_from_proto,
    timing_from_proto,
)


def secs(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(timedelta(seconds=value))
    return d


def actions_spec(*actions: task_pb2.Action) -> task_pb2.TaskSpec:
    return task_pb2.TaskSpec(actions=task_pb2.ActionList(actions=list(actions)))


def test_every_action_kind_converts() -> None:
    ok = task_pb2.UiSelector(text="OK")
    pb = actions_spec(
        task_pb2.Action(tap=task_pb2.Tap(x=1, y=2)),
        task_pb2.Action(tap_on=task_pb2.TapOn(selector=task_pb2.UiSelector(resource_id="a:id/b"))),
        task_pb2.Action(swipe=task_pb2.Swipe(x1=1, y1=2, x2=3, y2=4, duration=secs(0.5))),
        task_pb2.Action(input_text=task_pb2.InputText(text="hi")),
        task_pb2.Action(key=task_pb2.Key(keycode=66)),
        task_pb2.Action(launch_app=task_pb2.LaunchApp(package="com.x", activity=".Main")),
        task_pb2.Action(stop_app=task_pb2.StopApp(package="com.x")),
        task_pb2.Action(shell=task_pb2.Shell(command="id", timeout=secs(5))),
        task_pb2.Action(screenshot=task_pb2.Screenshot()),
        task_pb2.Action(wait=task_pb2.Wait(duration=secs(1.5))),
        task_pb2.Action(wait_for=task_pb2.WaitFor(selector=ok, timeout=secs(3))),
        task_pb2.Action(
            assert_visible=task_pb2.AssertVisible(selector=task_pb2.UiSelector(content_desc="Menu"))
        ),
    )
    assert spec_from_proto(pb) == ActionList(
        (
            Tap(1, 2),
            TapOn(UiSelector(resource_id="a:id/b")),
            Swipe(1, 2, 3, 4, duration=0.5),
            InputText("hi"),
            Key(66),
            LaunchApp("com.x", ".Main"),
            StopApp("com.x"),
            Shell("id", timeout=5.0),
            Screenshot(),
            Wait(1.5),
            WaitFor(UiSelector(text="OK"), timeout=3.0),
            AssertVisible(UiSelector(content_desc="Menu")),
        )
    )


def test_unset_fields_take_the_defaults_of_the_action_table() -> None:
    """THEN a swipe takes 0.3 s, a wait_for looks for 10 s, a shell is left to the host's
    own timeout (None), a launch_app opens the default activity; a set zero stays zero."""
    ok = task_pb2.UiSelector(text="OK")
    pb = actions_spec(
        task_pb2.Action(swipe=task_pb2.Swipe(x1=1, y1=2, x2=3, y2=4)),
        task_pb2.Action(shell=task_pb2.Shell(command="id")),
        task_pb2.Action(wait_for=task_pb2.WaitFor(selector=ok)),
        task_pb2.Action(launch_app=task_pb2.LaunchApp(package="com.x")),
        task_pb2.Action(wait_for=task_pb2.WaitFor(selector=ok, timeout=secs(0))),
        task_pb2.Action(swipe=task_pb2.Swipe(x1=1, y1=2, x2=3, y2=4, duration=secs(0))),
    )
    assert spec_from_proto(pb) == ActionList(
        (
            Swipe(1, 2, 3, 4, duration=0.3),
            Shell("id", timeout=None),
            WaitFor(UiSelector(text="OK"), timeout=10.0),
            LaunchApp("com.x", activity=""),
            WaitFor(UiSelector(text="OK"), timeout=0.0),
            Swipe(1, 2, 3, 4, duration=0.0),
        )
    )


def test_workflow_converts_with_names_and_continue_on_error() -> None:
    pb = task_pb2.TaskSpec(
        workflow=task_pb2.Workflow(
            steps=[
                task_pb2.WorkflowStep(
                    name="open",
                    actions=[task_pb2.Action(launch_app=task_pb2.LaunchApp(package="com.x"))],
                ),
                task_pb2.WorkflowStep(
                    actions=[task_pb2.Action(key=task_pb2.Key(keycode=4))],
                    continue_on_error=True,
                ),
            ]
        )
    )
    assert spec_from_proto(pb) == Workflow(
        (
            WorkflowStep("open", (LaunchApp("com.x"),)),
            WorkflowStep("step 2", (Key(4),), continue_on_error=True),
        )
    )


@pytest.mark.parametrize(
    ("pb", "message"),
    [
        (task_pb2.TaskSpec(), "task spec has neither actions nor a workflow"),
        (
            actions_spec(task_pb2.Action(tap=task_pb2.Tap()), task_pb2.Action()),
            "action 2: empty action: set one of tap, tap_on, swipe, input_text, key, launch_app,"
            " stop_app, shell, screenshot, wait, wait_for, assert_visible, ui_dump, install_app,"
            " uninstall_app, push_file, pull_file",
        ),
        (
            actions_spec(task_pb2.Action(tap_on=task_pb2.TapOn())),
            "action 1: tap_on.selector: required: set one of text, resource_id, content_desc",
        ),
        (
            actions_spec(
                task_pb2.Action(tap_on=task_pb2.TapOn(selector=task_pb2.UiSelector(text="")))
            ),
            "action 1: tap_on.selector.text: required",
        ),
        (
            actions_spec(task_pb2.Action(launch_app=task_pb2.LaunchApp())),
            "action 1: launch_app.package: required",
        ),
        (
            actions_spec(task_pb2.Action(shell=task_pb2.Shell())),
            "action 1: shell.command: required",
        ),
        (
            actions_spec(task_pb2.Action(wait=task_pb2.Wait())),
            "action 1: wait.duration: required",
        ),
        (
            actions_spec(task_pb2.Action(wait=task_pb2.Wait(duration=secs(-1)))),
            "action 1: wait.duration: must be a non-negative duration",
        ),
        (
            actions_spec(task_pb2.Action(tap=task_pb2.Tap(x=-5))),
            "action 1: tap.x: must be between 0 and 100000",
        ),
        (
            task_pb2.TaskSpec(
                workflow=task_pb2.Workflow(
                    steps=[task_pb2.WorkflowStep(name="login", actions=[task_pb2.Action()])]
                )
            ),
            "workflow step 1 (login), action 1: empty action: set one of tap, tap_on, swipe,"
            " input_text, key, launch_app, stop_app, shell, screenshot, wait, wait_for,"
            " assert_visible, ui_dump, install_app, uninstall_app, push_file, pull_file",
        ),
    ],
)
def test_invalid_specs_are_refused_with_where_and_why(pb: task_pb2.TaskSpec, message: str) -> None:
    with pytest.raises(InvalidSpec) as info:
        spec_from_proto(pb)
    assert str(info.value) == message


def test_ui_selector_needs_exactly_one_field() -> None:
    with pytest.raises(ActionError):
        UiSelector()
    with pytest.raises(ActionError):
        UiSelector(text="a", content_desc="b")
    selector = UiSelector(resource_id="com.x:id/ok")
    assert (selector.by, selector.value, str(selector)) == (
        "resource_id",
        "com.x:id/ok",
        "resource_id='com.x:id/ok'",
    )


@pytest.mark.parametrize(
    ("outcome", "pb"),
    [
        (Outcome.DONE, lease_pb2.OUTCOME_DONE),
        (Outcome.FAILED, lease_pb2.OUTCOME_FAILED),
        (Outcome.CANCELLED, lease_pb2.OUTCOME_CANCELLED),
    ],
)
def test_outcome_to_proto(outcome: Outcome, pb: int) -> None:
    assert outcome_to_proto(outcome) == pb


def test_an_outcome_is_one_type_for_the_host_and_the_control_plane() -> None:
    """THEN what a run ends in on the host is what the control plane's report transition
    takes (amc_common's one Outcome): the wire's outcomes by name, terminal statuses by
    value."""
    assert lifecycle.Outcome is Outcome
    assert [f"OUTCOME_{o.name}" for o in Outcome] == lease_pb2.Outcome.keys()[1:]
    assert {o.value for o in Outcome} == statuses.TERMINAL


def test_result_to_proto_carries_every_step_field() -> None:
    started = datetime(2025, 1, 2, 3, 4, 5, 600000, tzinfo=UTC)
    result = RunResult(
        Outcome.CANCELLED,
        "cancelled: stopped before step 3 (key)",
        (
            StepResult(0, "tap", StepStatus.OK, started, timedelta(milliseconds=120)),
            StepResult(
                1,
                "screenshot",
                StepStatus.FAILED,
                started,
                timedelta(seconds=1),
                "out",
                "bad",
                {"png_bytes": "10"},
            ),
            StepResult(2, "key", StepStatus.SKIPPED),
        ),
        StopReason.CANCELLED,
    )

    pb = result_to_proto(result)

    assert pb.error == "cancelled: stopped before step 3 (key)"
    assert [s.status for s in pb.steps] == [
        task_pb2.STEP_STATUS_OK,
        task_pb2.STEP_STATUS_FAILED,
        task_pb2.STEP_STATUS_SKIPPED,
    ]
    first, second, skipped = pb.steps
    assert first.started_at.ToDatetime(tzinfo=UTC) == started
    assert first.duration.ToTimedelta() == timedelta(milliseconds=120)
    assert (second.index, second.name, second.output, second.error) == (
        1,
        "screenshot",
        "out",
        "bad",
    )
    assert dict(second.data) == {"png_bytes": "10"}
    assert not skipped.HasField("started_at")


def test_result_to_proto_cuts_long_text() -> None:
    step = StepResult(0, "shell", StepStatus.FAILED, output="x" * 10_000, error="y" * 10_000)
    pb = result_to_proto(RunResult(Outcome.FAILED, "z" * 10_000, (step,)))
    assert len(pb.steps[0].output.encode()) <= OUTPUT_LIMIT
    assert len(pb.steps[0].error.encode()) <= OUTPUT_LIMIT
    assert len(pb.error.encode()) <= OUTPUT_LIMIT


def test_report_request_is_the_same_message_every_time() -> None:
    """THEN retries of a report are identical, as idempotent reporting needs."""
    result = RunResult(Outcome.DONE, "", (StepResult(0, "tap", StepStatus.OK),))
    first = report_request(result, task_id="t", attempt=2, lease_id="l")
    again = report_request(result, task_id="t", attempt=2, lease_id="l")
    assert first == again
    assert (first.task_id, first.attempt, first.lease_id) == ("t", 2, "l")
    assert first.outcome == lease_pb2.OUTCOME_DONE
    assert first.result.steps[0].name == "tap"


def test_an_assignment_becomes_a_domain_assignment() -> None:
    pb = lease_pb2.Assignment(
        task_id="t",
        attempt=3,
        lease_id="l",
        device_serial="s1",
        spec=actions_spec(task_pb2.Action(tap=task_pb2.Tap(x=1, y=2))),
        valid_for=secs(15),
    )
    assert assignment_from_proto(pb) == HeldAssignment(
        task_id="t",
        attempt=3,
        lease_id="l",
        device_serial="s1",
        spec=ActionList((Tap(1, 2),)),
        valid_for=15.0,
    )


def test_an_assignment_with_an_invalid_spec_carries_the_error() -> None:
    """THEN the worker still acknowledges it, and reports it FAILED with this error."""
    pb = lease_pb2.Assignment(task_id="t", attempt=1, lease_id="l", device_serial="s1")
    a = assignment_from_proto(pb)
    assert isinstance(a.spec, InvalidSpec)
    assert str(a.spec) == "task spec has neither actions nor a workflow"


def test_device_info_is_cut_to_the_control_planes_limits() -> None:
    long = "m" * 500
    pb = device_to_proto(
        AttachedDevice("s1", "recovery", model=long, sdk=34, labels={"k" * 200: "v" * 2000})
    )
    assert pb.state == scheduler_pb2.DEVICE_STATE_OFFLINE
    assert (len(pb.model), pb.sdk) == (128, 34)
    assert [(len(k), len(v)) for k, v in pb.labels.items()] == [(128, 1024)]


def test_register_and_acquire_requests_and_the_timing_answered() -> None:
    request = register_request("h", {"pool": "a"}, [AttachedDevice("s1", "device")])
    assert (request.host_id, dict(request.labels)) == ("h", {"pool": "a"})
    assert [d.state for d in request.devices] == [scheduler_pb2.DEVICE_STATE_DEVICE]
    acquire = acquire_request("h", ["s1", "s2"], 60.0)
    assert (list(acquire.idle_serials), seconds(acquire.wait)) == (["s1", "s2"], 60.0)
    answer = lease_pb2.RegisterHostResponse(lease_ttl=secs(15), renew_interval=secs(5))
    assert timing_from_proto(answer) == Timing(ttl=15.0, interval=5.0)
    assert duration(0.25) == secs(0.25)


def test_device_facts_with_line_breaks_are_registered_as_one_line() -> None:
    """The control plane refuses control characters in labels: the agent flattens what a
    phone reports rather than have one phone's adb error refuse the host's registration."""
    from host_agent.devices import AttachedDevice
    from host_agent.wire import device_to_proto

    d = device_to_proto(
        AttachedDevice(
            serial="s1",
            state="device",
            model="Pixel\n7",
            labels={"error": "adb: failed\r\n\tdevice offline\u2028", "rack\n": "a"},
        )
    )
    assert d.model == "Pixel 7"
    assert dict(d.labels) == {"error": "adb: failed device offline", "rack": "a"}
