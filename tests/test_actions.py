"""One action on a (fake) device: what it does to the phone and what it reports."""

from __future__ import annotations

import asyncio
import hashlib
import math

import pytest

from amc_common.action_table import (
    Action,
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
from host_agent.devices import (
    CommandFailed,
    DeviceLost,
    DeviceTimeout,
    DeviceUnresponsive,
    ShellResult,
    SourceUnreachable,
)
from host_agent.executor import StepOutput, bounds_centre, execute, find_element
from host_agent.results import OUTPUT_LIMIT, cut
from host_agent.stop_token import Stopped, StopReason, StopToken
from tests.support.runner_fakes import EMPTY_SCREEN, HOME_SCREEN, Call, FakeDevice

SHELL_DEFAULT = 7.0


async def run(action: Action, device: FakeDevice, token: StopToken | None = None) -> StepOutput:
    return await execute(
        action,
        device,
        token or StopToken(),
        shell_default_timeout=SHELL_DEFAULT,
        poll_interval=0.01,
    )


@pytest.mark.parametrize(
    ("action", "call"),
    [
        (Tap(10, 20), ("tap", (10, 20))),
        (Swipe(1, 2, 3, 4, duration=0.25), ("swipe", (1, 2, 3, 4, 250))),
        (InputText("hello"), ("input_text", ("hello",))),
        (Key(66), ("key", (66,))),
        (LaunchApp("com.example", ".Main"), ("launch_app", ("com.example", ".Main"))),
        (StopApp("com.example"), ("stop_app", ("com.example",))),
    ],
)
async def test_input_actions_drive_the_device(action: Action, call: tuple[str, tuple]) -> None:
    """THEN exactly the matching device call is made, with the spec's arguments."""
    device = FakeDevice()
    out = await run(action, device)
    assert out.ok and out.error == ""
    assert [(c.method, c.args) for c in device.calls] == [call]


@pytest.mark.parametrize(
    ("selector", "centre"),
    [
        (UiSelector(text="OK"), (300, 1100)),
        (UiSelector(resource_id="com.example:id/ok"), (300, 1100)),
        (UiSelector(content_desc="Open menu"), (1010, 90)),
    ],
)
async def test_tap_on_taps_the_centre_of_the_element_bounds(
    selector: UiSelector, centre: tuple[int, int]
) -> None:
    """THEN the device is tapped at the centre of the matching node's bounds."""
    device = FakeDevice()
    out = await run(TapOn(selector), device)
    assert out.ok, out.error
    assert [(c.method, c.args) for c in device.calls] == [("ui_dump", ()), ("tap", centre)]
    assert out.data == {"x": str(centre[0]), "y": str(centre[1])}


async def test_tap_on_a_missing_element_fails_without_tapping() -> None:
    device = FakeDevice()
    out = await run(TapOn(UiSelector(text="Cancel")), device)
    assert not out.ok
    assert out.error == "element not found: text='Cancel'"
    assert device.methods() == ["ui_dump"]


async def test_tap_on_an_element_without_usable_bounds_fails() -> None:
    screen = '<hierarchy><node text="OK" bounds="[5,5][5,5]" /></hierarchy>'
    device = FakeDevice(screens=[screen])
    out = await run(TapOn(UiSelector(text="OK")), device)
    assert not out.ok and "no usable bounds" in out.error
    assert device.count("tap") == 0


async def test_tap_on_does_not_tap_once_the_token_tripped_during_the_dump() -> None:
    """THEN a stop observed while reading the screen means no tap at all."""
    token = StopToken()

    def trip_on_dump(call: Call) -> None:
        if call.method == "ui_dump":
            token.trip(StopReason.CANCELLED)

    device = FakeDevice(on_call=trip_on_dump)
    with pytest.raises(Stopped):
        await run(TapOn(UiSelector(text="OK")), device, token)
    assert device.count("tap") == 0


async def test_ui_dump_with_trailing_text_is_still_read() -> None:
    device = FakeDevice(screens=[HOME_SCREEN + "\nUI hierchary dumped to: /dev/tty\n"])
    out = await run(TapOn(UiSelector(text="OK")), device)
    assert out.ok
    assert device.calls[-1].args == (300, 1100)


async def test_unreadable_ui_dump_fails_the_step() -> None:
    device = FakeDevice(screens=["ERROR: null root node returned by UiTestAutomationBridge."])
    out = await run(AssertVisible(UiSelector(text="OK")), device)
    assert not out.ok and out.error.startswith("ui dump unreadable")


async def test_assert_visible_passes_when_present_and_fails_when_absent() -> None:
    assert (await run(AssertVisible(UiSelector(text="Welcome")), FakeDevice())).ok
    out = await run(AssertVisible(UiSelector(text="OK")), FakeDevice(screens=[EMPTY_SCREEN]))
    assert not out.ok
    assert out.error == "element not found: text='OK'"


async def test_wait_for_polls_until_the_element_appears() -> None:
    """THEN it keeps dumping the UI (past an unreadable dump) and succeeds once it shows up."""
    device = FakeDevice(screens=[EMPTY_SCREEN, "garbage", EMPTY_SCREEN, HOME_SCREEN])
    out = await run(WaitFor(UiSelector(resource_id="com.example:id/ok"), timeout=30), device)
    assert out.ok, out.error
    assert device.methods() == ["ui_dump"] * 4


async def test_wait_for_times_out_with_a_clear_error() -> None:
    device = FakeDevice(screens=[EMPTY_SCREEN])
    out = await run(WaitFor(UiSelector(text="OK"), timeout=0.1), device)
    assert not out.ok
    assert out.error == "element not found: text='OK' within 0.1s"
    assert device.count("ui_dump") >= 2


async def test_wait_for_gives_up_on_device_lost() -> None:
    device = FakeDevice(failures={"ui_dump": DeviceLost("fake-1 is offline")})
    with pytest.raises(DeviceLost):
        await run(WaitFor(UiSelector(text="OK"), timeout=30), device)
    assert device.count("ui_dump") == 1


async def test_wait_sleeps_for_its_duration() -> None:
    device = FakeDevice()
    loop = asyncio.get_running_loop()
    started = loop.time()
    out = await run(Wait(0.05), device)
    assert out.ok
    assert loop.time() - started >= 0.04
    assert device.calls == []


async def test_shell_success_returns_its_output_and_uses_the_default_timeout() -> None:
    device = FakeDevice(shell_result=ShellResult(0, "package:com.example\n"))
    out = await run(Shell("pm list packages"), device)
    assert out.ok
    assert out.output == "package:com.example\n"
    assert out.data == {"exit_code": "0"}
    assert device.calls[0].args == ("pm list packages", SHELL_DEFAULT)


async def test_shell_uses_its_own_timeout_when_set() -> None:
    device = FakeDevice()
    await run(Shell("true", timeout=3.5), device)
    assert device.calls[0].args == ("true", 3.5)


async def test_shell_non_zero_exit_fails_the_step_with_its_output() -> None:
    device = FakeDevice(shell_result=ShellResult(2, "ls: /nope: No such file or directory\n"))
    out = await run(Shell("ls /nope"), device)
    assert not out.ok
    assert out.error == "shell exited with code 2"
    assert "No such file" in out.output
    assert out.data == {"exit_code": "2"}


async def test_shell_timeout_fails_the_step_and_cancels_the_call() -> None:
    device = FakeDevice(delays={"shell": math.inf})
    out = await run(Shell("sleep 100", timeout=0.05), device)
    assert not out.ok
    assert out.error == "shell timed out after 0.05s: 'sleep 100'"
    assert device.calls[0].cancelled


async def test_shell_output_is_cut_to_4_kib() -> None:
    device = FakeDevice(shell_result=ShellResult(0, "é" * 5000))
    out = await run(Shell("cat big"), device)
    assert len(out.output.encode()) <= OUTPUT_LIMIT
    assert out.output.endswith("[cut]")


async def test_screenshot_reports_size_and_sha256() -> None:
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    device = FakeDevice(png=png)
    out = await run(Screenshot(), device)
    assert out.ok
    assert out.data == {"png_bytes": str(len(png)), "sha256": hashlib.sha256(png).hexdigest()}
    assert device.methods() == ["screenshot"]


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (CommandFailed("input: unknown keycode"), "command failed: input: unknown keycode"),
        (CommandFailed(), "command failed: The command ran but failed."),
    ],
)
async def test_device_errors_fail_the_step_with_a_clear_message(
    error: Exception, message: str
) -> None:
    device = FakeDevice(failures={"key": error})
    out = await run(Key(4), device)
    assert not out.ok
    assert out.error == message


async def test_a_slow_shell_fails_its_step_but_a_quick_action_that_times_out_is_the_phones() -> (
    None
):
    """A shell timing out is the task's failure; a key press timing out, or the adb server
    gone, means the phone cannot be driven: DeviceUnresponsive (as good as lost)."""
    out = await run(Shell("sleep 99", 1), FakeDevice(failures={"shell": DeviceTimeout("slow")}))
    assert not out.ok and out.error == "shell timed out after 1s: 'sleep 99'"
    with pytest.raises(DeviceUnresponsive, match="device unresponsive: device timed out"):
        await run(Key(4), FakeDevice(failures={"key": DeviceTimeout("no answer in 10s")}))
    with pytest.raises(DeviceUnresponsive, match="adb server unreachable"):
        await run(
            Tap(1, 1), FakeDevice(failures={"tap": SourceUnreachable("adb server unreachable")})
        )


async def test_device_lost_propagates_out_of_execute() -> None:
    device = FakeDevice(failures={"tap": DeviceLost()})
    with pytest.raises(DeviceLost):
        await run(Tap(1, 1), device)


def test_find_element_matches_exactly() -> None:
    assert find_element(HOME_SCREEN, UiSelector(text="Welcome")) is not None
    assert find_element(HOME_SCREEN, UiSelector(text="Welc")) is None


@pytest.mark.parametrize(
    ("bounds", "centre"),
    [
        ("[0,0][100,200]", (50, 100)),
        ("[101,1000][500,1201]", (300, 1100)),
        ("", None),
        ("[10,10][5,20]", None),
        ("0,0,10,10", None),
    ],
)
def test_bounds_centre(bounds: str, centre: tuple[int, int] | None) -> None:
    assert bounds_centre(bounds) == centre


def test_cut_keeps_short_text_and_never_splits_a_character() -> None:
    assert cut("short") == "short"
    text = cut("€" * 3000, limit=100)
    assert len(text.encode()) <= 100
    assert text.endswith("…[cut]")
    assert text.startswith("€")
