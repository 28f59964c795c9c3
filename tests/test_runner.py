"""TaskRunner and WorkflowRunner on a fake device: where they stop, and what they report."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from datetime import UTC

import pytest

from amc.v1 import lease_pb2
from amc_common.action_table import (
    Action,
    InputText,
    Key,
    LaunchApp,
    Screenshot,
    Shell,
    Swipe,
    Tap,
    TapOn,
    UiSelector,
    Wait,
    WaitFor,
)
from host_agent.devices import DeviceLost
from host_agent.runner import (
    Outcome,
    RunResult,
    StepStatus,
    TaskRunner,
    WorkflowRunner,
    outcome_for,
    run,
)
from host_agent.spec import ActionList, TaskSpec, Workflow, WorkflowStep
from host_agent.stop_token import StopReason, StopToken
from host_agent.wire import outcome_to_proto, report_request
from tests.support import eventually
from tests.support.runner_fakes import EMPTY_SCREEN, Call, FakeDevice

FIVE_STEPS: tuple[Action, ...] = (
    Tap(1, 1),
    Tap(2, 2),
    Key(66),
    Swipe(0, 0, 10, 10),
    InputText("hello"),
)
# Generous: only catches a runner that waits out the action instead of stopping.
PROMPT = 5.0


def trip_on(
    token: StopToken, reason: StopReason, method: str, nth: int = 1
) -> Callable[[Call], None]:
    """An `on_call` hook tripping `token` as the nth call of `method` starts."""
    seen = 0

    def hook(call: Call) -> None:
        nonlocal seen
        if call.method == method:
            seen += 1
            if seen == nth:
                token.trip(reason)

    return hook


async def run_fast(spec: TaskSpec, device: FakeDevice, token: StopToken) -> RunResult:
    return await run(spec, device, token, shell_default_timeout=30, poll_interval=0.01)


def statuses(result: RunResult) -> list[StepStatus]:
    return [s.status for s in result.steps]


async def interrupt_while(
    spec: TaskSpec, device: FakeDevice, started: Callable[[], bool], reason: StopReason
) -> tuple[RunResult, float]:
    """Start `spec`, wait until `started()` holds, trip; the result and seconds until it came."""
    token = StopToken()
    task = asyncio.create_task(run_fast(spec, device, token))
    await eventually(started, interval=0.005, what="the action under test is running")
    tripped_at = time.monotonic()
    token.trip(reason)
    await eventually(
        task.done, timeout=PROMPT, interval=0.005, what="the run returned after the trip"
    )
    return task.result(), time.monotonic() - tripped_at


# --- the spec's scenarios ------------------------------------------------------------------


async def test_renewal_response_signals_a_pending_cancellation_stops_at_next_boundary() -> None:
    """THEN the Host Agent stops further planned actions at the next available step boundary."""
    token = StopToken()
    device = FakeDevice(on_call=trip_on(token, StopReason.CANCELLED, "tap", nth=2))

    result = await run_fast(ActionList(FIVE_STEPS), device, token)

    # Step 2 (a tap, not interruptible) finishes; steps 3..5 never touch the device.
    assert [(c.method, c.args) for c in device.calls] == [("tap", (1, 1)), ("tap", (2, 2))]
    assert statuses(result) == [StepStatus.OK] * 2 + [StepStatus.SKIPPED] * 3
    assert result.outcome is Outcome.CANCELLED
    assert result.error == "cancelled: stopped before step 3 (key)"
    assert result.stop_reason is StopReason.CANCELLED


async def test_renewal_response_signals_a_pending_cancellation_the_same_way_as_lease_loss() -> None:
    """THEN a cancel and a lease loss stop the run at the same boundary; only the reason differs."""
    runs = {}
    for reason in (StopReason.CANCELLED, StopReason.LEASE_LOST):
        token = StopToken()
        device = FakeDevice(on_call=trip_on(token, reason, "tap", nth=2))
        runs[reason] = (await run_fast(ActionList(FIVE_STEPS), device, token), device.methods())

    (cancelled, cancelled_calls), (lost, lost_calls) = runs.values()
    assert cancelled_calls == lost_calls == ["tap", "tap"]
    assert statuses(cancelled) == statuses(lost)
    assert lost.error == "lease lost: stopped before step 3 (key)"


async def test_stop_triggered_by_cancellation_reports_cancelled() -> None:
    """THEN the terminal result it reports for that attempt is `cancelled`."""
    token = StopToken()
    device = FakeDevice(on_call=trip_on(token, StopReason.CANCELLED, "key"))

    result = await run_fast(ActionList(FIVE_STEPS), device, token)

    assert result.outcome is Outcome.CANCELLED
    assert device.methods() == ["tap", "tap", "key"]
    request = report_request(result, task_id="t-1", attempt=1, lease_id="l-1")
    assert request.outcome == lease_pb2.OUTCOME_CANCELLED
    assert request.result.error == "cancelled: stopped before step 4 (swipe)"


async def test_stop_triggered_by_lease_loss_reports_failed_not_cancelled() -> None:
    """THEN the terminal result it reports for that attempt is `failed`, not `cancelled`."""
    token = StopToken()
    device = FakeDevice(on_call=trip_on(token, StopReason.LEASE_LOST, "key"))

    result = await run_fast(ActionList(FIVE_STEPS), device, token)

    assert result.outcome is Outcome.FAILED
    assert result.stop_reason is StopReason.LEASE_LOST
    assert result.error.startswith("lease lost")
    assert device.methods() == ["tap", "tap", "key"]
    request = report_request(result, task_id="t-1", attempt=1, lease_id="l-1")
    assert request.outcome == lease_pb2.OUTCOME_FAILED


async def test_stop_triggered_by_lease_loss_before_a_later_cancel_still_reports_failed() -> None:
    """THEN a cancel seen after the lease was lost does not make it `cancelled`: first trip wins."""
    token = StopToken()

    def hook(call: Call) -> None:
        if call.method == "key":
            token.trip(StopReason.LEASE_LOST)
            token.trip(StopReason.CANCELLED)

    result = await run_fast(ActionList(FIVE_STEPS), FakeDevice(on_call=hook), token)
    assert result.outcome is Outcome.FAILED


@pytest.mark.parametrize(
    ("reason", "outcome", "report"),
    [
        (StopReason.CANCELLED, Outcome.CANCELLED, lease_pb2.OUTCOME_CANCELLED),
        (StopReason.LEASE_LOST, Outcome.FAILED, lease_pb2.OUTCOME_FAILED),
    ],
)
async def test_stop_triggered_by_cancellation_or_lease_loss_in_a_workflow(
    reason: StopReason, outcome: Outcome, report: int
) -> None:
    """THEN the WorkflowRunner reports `cancelled` only for a cancellation, else `failed`."""
    token = StopToken()
    device = FakeDevice(on_call=trip_on(token, reason, "launch_app"))
    workflow = Workflow((WorkflowStep("open", (LaunchApp("com.example"),)), LOGIN))

    result = await WorkflowRunner(device, token).run(workflow)

    assert device.methods() == ["launch_app"]
    assert statuses(result) == [StepStatus.OK, StepStatus.SKIPPED]
    assert result.outcome is outcome
    assert result.error == f"{reason.label}: stopped before step 2 (login)"
    assert outcome_to_proto(result.outcome) == report


# --- outcome rule ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("all_ran", "failed", "reason", "outcome"),
    [
        (True, False, None, Outcome.DONE),
        (True, False, StopReason.CANCELLED, Outcome.DONE),
        (True, False, StopReason.LEASE_LOST, Outcome.DONE),
        (False, False, StopReason.CANCELLED, Outcome.CANCELLED),
        (False, False, StopReason.LEASE_LOST, Outcome.FAILED),
        (False, False, StopReason.SHUTDOWN, Outcome.FAILED),
        (True, True, None, Outcome.FAILED),
        (False, True, None, Outcome.FAILED),
        (False, True, StopReason.CANCELLED, Outcome.FAILED),
        (False, False, None, Outcome.FAILED),
    ],
)
def test_outcome_for(
    all_ran: bool, failed: bool, reason: StopReason | None, outcome: Outcome
) -> None:
    assert outcome_for(all_ran, failed, reason) is outcome


async def test_cancel_arriving_during_the_last_step_still_reports_done() -> None:
    """THEN every step ran, so the run is DONE even though a cancel arrived."""
    token = StopToken()
    device = FakeDevice(on_call=trip_on(token, StopReason.CANCELLED, "input_text"))

    result = await run_fast(ActionList(FIVE_STEPS), device, token)

    assert token.reason is StopReason.CANCELLED
    assert result.outcome is Outcome.DONE
    assert result.error == ""
    assert statuses(result) == [StepStatus.OK] * 5
    assert outcome_to_proto(result.outcome) == lease_pb2.OUTCOME_DONE


async def test_shutdown_stop_reports_failed() -> None:
    token = StopToken()
    device = FakeDevice(on_call=trip_on(token, StopReason.SHUTDOWN, "tap"))
    result = await run_fast(ActionList(FIVE_STEPS), device, token)
    assert result.outcome is Outcome.FAILED
    assert result.error == "host shutting down: stopped before step 2 (tap)"


async def test_token_tripped_before_the_run_touches_nothing() -> None:
    token = StopToken()
    token.trip(StopReason.CANCELLED)
    device = FakeDevice()
    result = await run_fast(ActionList(FIVE_STEPS), device, token)
    assert device.calls == []
    assert statuses(result) == [StepStatus.SKIPPED] * 5
    assert all(s.started_at is None for s in result.steps)
    assert result.outcome is Outcome.CANCELLED
    assert result.error == "cancelled: stopped before step 1 (tap)"


# --- interruptible actions -------------------------------------------------------------------


async def test_wait_is_interrupted_promptly_when_the_token_trips() -> None:
    """THEN an hour-long wait ends soon after the trip and nothing after it runs."""
    device = FakeDevice()
    spec = ActionList((Tap(1, 1), Wait(3600), Key(4)))

    result, waited = await interrupt_while(
        spec, device, lambda: device.count("tap") == 1, StopReason.CANCELLED
    )

    assert waited < PROMPT
    assert device.methods() == ["tap"]
    assert statuses(result) == [StepStatus.OK, StepStatus.CANCELLED, StepStatus.SKIPPED]
    assert result.steps[1].error == "interrupted: cancelled"
    assert result.outcome is Outcome.CANCELLED
    assert result.error == "cancelled: interrupted during step 2 (wait)"


async def test_wait_for_is_interrupted_promptly_when_the_token_trips() -> None:
    """THEN polling stops soon after the trip: no UI dump starts after it."""
    device = FakeDevice(screens=[EMPTY_SCREEN])
    spec = ActionList((WaitFor(UiSelector(text="OK"), timeout=3600), Tap(1, 1)))

    result, waited = await interrupt_while(
        spec, device, lambda: device.count("ui_dump") >= 3, StopReason.LEASE_LOST
    )

    assert waited < PROMPT
    last_dump = max(c.started for c in device.calls)
    assert last_dump <= time.monotonic() - waited  # none started after the trip
    assert device.count("tap") == 0
    assert result.steps[0].status is StepStatus.FAILED
    assert result.outcome is Outcome.FAILED
    assert result.error == "lease lost: interrupted during step 1 (wait_for)"


async def test_shell_is_interrupted_promptly_when_the_token_trips() -> None:
    """THEN the hanging shell call is cancelled (the driver closes its connection)."""
    device = FakeDevice(delays={"shell": math.inf})
    spec = ActionList((Shell("sleep 3600", timeout=7200), Screenshot()))

    result, waited = await interrupt_while(
        spec, device, lambda: device.count("shell") == 1, StopReason.CANCELLED
    )

    assert waited < PROMPT
    assert device.methods() == ["shell"]
    assert device.calls[0].cancelled
    assert result.outcome is Outcome.CANCELLED
    assert statuses(result) == [StepStatus.CANCELLED, StepStatus.SKIPPED]


# --- TaskRunner ------------------------------------------------------------------------------


async def test_task_runner_names_steps_after_action_kinds_and_records_them() -> None:
    device = FakeDevice()
    spec = ActionList((LaunchApp("com.example"), TapOn(UiSelector(text="OK")), Screenshot()))

    result = await TaskRunner(device, StopToken()).run(spec)

    assert result.outcome is Outcome.DONE
    assert [(s.index, s.name) for s in result.steps] == [
        (0, "launch_app"),
        (1, "tap_on"),
        (2, "screenshot"),
    ]
    assert device.methods() == ["launch_app", "ui_dump", "tap", "screenshot"]
    starts = [s.started_at for s in result.steps if s.started_at is not None]
    assert len(starts) == 3 and all(t.tzinfo is UTC for t in starts)
    assert starts == sorted(starts)
    assert all(s.duration.total_seconds() >= 0 for s in result.steps)
    assert set(result.steps[2].data) == {"png_bytes", "sha256"}


async def test_task_runner_stops_at_the_first_failed_action() -> None:
    device = FakeDevice(screens=[EMPTY_SCREEN])
    spec = ActionList((Tap(1, 1), TapOn(UiSelector(text="OK")), Key(4)))

    result = await TaskRunner(device, StopToken()).run(spec)

    assert result.outcome is Outcome.FAILED
    assert result.error == "step 2 (tap_on) failed: element not found: text='OK'"
    assert statuses(result) == [StepStatus.OK, StepStatus.FAILED, StepStatus.SKIPPED]
    assert device.methods() == ["tap", "ui_dump"]


async def test_empty_action_list_is_done() -> None:
    result = await run_fast(ActionList(()), FakeDevice(), StopToken())
    assert result == RunResult(Outcome.DONE, "", ())


async def test_device_lost_mid_step_fails_the_run_with_device_lost() -> None:
    """THEN the step fails with "device lost", nothing else runs, and the run is FAILED."""
    device = FakeDevice(failures={"key": DeviceLost("fake-1 is offline")})

    result = await run_fast(ActionList(FIVE_STEPS), device, StopToken())

    assert device.methods() == ["tap", "tap", "key"]
    assert result.steps[2].status is StepStatus.FAILED
    assert result.steps[2].error == "device lost: fake-1 is offline"
    assert result.outcome is Outcome.FAILED
    assert result.error == "step 3 (key) failed: device lost: fake-1 is offline"


async def test_unexpected_driver_exception_fails_the_run_instead_of_escaping() -> None:
    device = FakeDevice(failures={"tap": RuntimeError("driver bug")})
    result = await run_fast(ActionList((Tap(1, 1), Key(4))), device, StopToken())
    assert result.outcome is Outcome.FAILED
    assert result.steps[0].error == "unexpected error: RuntimeError: driver bug"
    assert device.methods() == ["tap"]


# --- WorkflowRunner --------------------------------------------------------------------------

LOGIN = WorkflowStep("login", (TapOn(UiSelector(text="OK")), InputText("secret")))


async def test_workflow_continue_on_error_goes_on_to_the_next_step() -> None:
    """THEN the failed step is FAILED, the workflow continues, and the run is DONE."""
    device = FakeDevice()
    workflow = Workflow(
        (
            WorkflowStep("open", (LaunchApp("com.example"),)),
            WorkflowStep("dismiss popup", (TapOn(UiSelector(text="Later")),), True),
            LOGIN,
        )
    )

    result = await WorkflowRunner(device, StopToken()).run(workflow)

    assert result.outcome is Outcome.DONE
    assert [s.name for s in result.steps] == ["open", "dismiss popup", "login"]
    assert statuses(result) == [StepStatus.OK, StepStatus.FAILED, StepStatus.OK]
    assert result.steps[1].error == "element not found: text='Later'"
    assert [(c.method, c.args) for c in device.calls] == [
        ("launch_app", ("com.example", "")),
        ("ui_dump", ()),
        ("ui_dump", ()),
        ("tap", (300, 1100)),
        ("input_text", ("secret",)),
    ]


async def test_workflow_failed_step_without_continue_on_error_stops_the_run() -> None:
    device = FakeDevice(screens=[EMPTY_SCREEN])
    workflow = Workflow((LOGIN, WorkflowStep("home", (Key(3),))))

    result = await WorkflowRunner(device, StopToken()).run(workflow)

    assert result.outcome is Outcome.FAILED
    assert result.error == "step 1 (login) failed: action 1 (tap_on): element not found: text='OK'"
    assert statuses(result) == [StepStatus.FAILED, StepStatus.SKIPPED]
    assert device.methods() == ["ui_dump"]


async def test_workflow_device_lost_ends_the_run_even_with_continue_on_error() -> None:
    """THEN nothing more runs on a lost device: the run is FAILED with "device lost"."""
    device = FakeDevice(failures={"tap": DeviceLost()})
    workflow = Workflow(
        (
            WorkflowStep("poke", (Tap(1, 1),), continue_on_error=True),
            WorkflowStep("home", (Key(3),)),
        )
    )

    result = await WorkflowRunner(device, StopToken()).run(workflow)

    assert result.outcome is Outcome.FAILED
    assert "device lost" in result.error
    assert result.steps[0].error == "device lost: it is no longer attached to this host."
    assert statuses(result) == [StepStatus.FAILED, StepStatus.SKIPPED]
    assert device.methods() == ["tap"]


async def test_workflow_checks_the_token_before_every_action_inside_a_step() -> None:
    """THEN a cancel during a step's first action stops it before its second one."""
    token = StopToken()
    device = FakeDevice(on_call=trip_on(token, StopReason.CANCELLED, "tap"))
    workflow = Workflow((LOGIN, WorkflowStep("home", (Key(3),))))

    result = await WorkflowRunner(device, token).run(workflow)

    assert device.methods() == ["ui_dump", "tap"]
    assert result.steps[0].status is StepStatus.CANCELLED
    assert result.steps[0].error == "action 2 (input_text): interrupted: cancelled"
    assert result.steps[1].status is StepStatus.SKIPPED
    assert result.outcome is Outcome.CANCELLED
    assert result.error == "cancelled: interrupted during step 1 (login)"


async def test_workflow_step_collects_output_and_data_of_its_actions() -> None:
    device = FakeDevice()
    step = WorkflowStep("evidence", (Screenshot(), Shell("echo hi"), Screenshot()))
    result = await run_fast(Workflow((step,)), device, StopToken())
    assert result.outcome is Outcome.DONE
    data = result.steps[0].data
    assert {"png_bytes", "sha256", "exit_code", "png_bytes#2", "sha256#2"} == set(data)
    assert "ok" in result.steps[0].output
