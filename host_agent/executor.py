"""Runs one action of a task spec on a device.

What the stop token interrupts: actions that wait or only look (wait, wait_for, shell,
screenshot, ui_dump, and the UI dumps of tap_on and assert_visible) are raced against the token
and end as soon as it trips. Single input actions (tap, swipe, input_text, key,
launch_app, stop_app) are short and bounded by the driver's own deadline; once started
they finish, so the step record says what the phone really did. None starts after the
token tripped.

`execute` turns every ordinary failure into a failed StepOutput; it raises only Stopped
(the token tripped) and DeviceLost (nothing more can run on this device).

What each action means, its fields and their defaults (a wait_for's 10 s, a swipe's
0.3 s) are amc_common.action_table'; an action arrives here with every field filled in, but
a shell timeout left to this host (`shell_default_timeout`, the agent's --shell-timeout).
The app library's actions (install_app, uninstall_app, push_file, pull_file) are
host_agent.install's, with the library the agent gives (`library`; without one they fail):
the app's look-up, the phone's API level and the fetch from the control plane are raced
against the token, the install itself runs to its end once started.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import assert_never

from amc_common.action_table import (
    Action,
    AssertVisible,
    InputText,
    InstallApp,
    Key,
    LaunchApp,
    PullFile,
    PushFile,
    Screenshot,
    Shell,
    StopApp,
    Swipe,
    Tap,
    TapOn,
    UiDump,
    UiSelector,
    UninstallApp,
    Wait,
    WaitFor,
)
from host_agent import install, metrics
from host_agent.devices import (
    CommandFailed,
    Device,
    DeviceError,
    DeviceLost,
    DeviceTimeout,
    DeviceUnresponsive,
    InputPath,
    SourceUnreachable,
)
from host_agent.results import Kept, cut
from host_agent.stop_token import Stopped, StopToken

# How often wait_for looks at the screen again (a `uiautomator dump` itself takes ~1 s).
POLL_INTERVAL = 0.5

_BOUNDS = re.compile(r"\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]")
# UiSelector field -> the attribute of a `uiautomator dump` node it matches.
_ATTRIBUTES = {"text": "text", "resource_id": "resource-id", "content_desc": "content-desc"}


@dataclass(frozen=True)
class StepOutput:
    """What one action produced."""

    ok: bool
    output: str = ""
    error: str = ""
    # Small structured facts, e.g. a screenshot's `png_bytes` and `sha256`.
    data: Mapping[str, str] = field(default_factory=dict)
    # Files to keep as artifacts of the task (a screenshot's PNG, a ui_dump's XML).
    kept: tuple[Kept, ...] = ()

    @classmethod
    def failed(
        cls, error: str, output: str = "", data: Mapping[str, str] | None = None
    ) -> StepOutput:
        return cls(ok=False, output=cut(output), error=cut(error), data=data or {})


_OK = StepOutput(ok=True)


class UnreadableDump(Exception):
    """The UI dump is not XML we can read."""


async def execute(
    action: Action,
    device: Device,
    token: StopToken,
    *,
    shell_default_timeout: float,
    poll_interval: float = POLL_INTERVAL,
    library: install.Library | None = None,
) -> StepOutput:
    """Run `action` on `device`. Raises Stopped or DeviceLost; other failures are outputs."""
    started = time.monotonic()
    status = "failed"
    try:
        if isinstance(action, InstallApp | UninstallApp | PushFile | PullFile):
            output = await _library_action(action, device, token, library)
        else:
            output = await _dispatch(action, device, token, shell_default_timeout, poll_interval)
        status = "ok" if output.ok else "failed"
        return output
    except Stopped:
        status = "stopped"
        raise
    except DeviceError as exc:
        metrics.DEVICE_ERRORS.labels(type(exc).__name__).inc()
        if isinstance(exc, DeviceLost):
            raise
        if _unresponsive(action, exc) or (
            isinstance(exc, DeviceTimeout) and not await _answers(device)
        ):
            raise DeviceUnresponsive(f"device unresponsive: {describe_device_error(exc)}") from exc
        return StepOutput.failed(describe_device_error(exc))
    finally:
        metrics.STEP_SECONDS.labels(action.kind, status).observe(time.monotonic() - started)


# Actions a phone answers at once: one of them timing out means the phone (not the task)
# is in trouble. A shell command, a UI dump or a screenshot may be slow by the task's doing.
_QUICK = (Tap, Swipe, InputText, Key, LaunchApp, StopApp)


def _unresponsive(action: Action, exc: DeviceError) -> bool:
    """Whether this failure is the phone's or the adb server's, not the task's."""
    if isinstance(exc, SourceUnreachable):
        return True
    return isinstance(exc, DeviceTimeout) and isinstance(action, _QUICK)


# How long a phone has to answer the check after a slow action timed out.
ANSWER_TIMEOUT = 2.0


async def _answers(device: Device) -> bool:
    """After a slow action (a shell command, a UI dump, a screenshot) timed out: whether
    the phone still answers a quick read. If it does, the timeout is the task's; if not, the
    phone stopped answering (an infrastructure failure)."""
    try:
        await device.shell("getprop sys.boot_completed", ANSWER_TIMEOUT)
    except DeviceError:
        return False
    return True


async def _dispatch(
    action: Action, device: Device, token: StopToken, shell_timeout: float, poll: float
) -> StepOutput:
    match action:
        case Tap():
            return _input(await device.tap(action.x, action.y))
        case Swipe():
            duration_ms = round(action.duration * 1000)
            path = await device.swipe(action.x1, action.y1, action.x2, action.y2, duration_ms)
            return _input(path)
        case InputText():
            return _input(await device.input_text(action.text))
        case Key():
            return _input(await device.key(action.keycode))
        case LaunchApp():
            await device.launch_app(action.package, action.activity)
        case StopApp():
            await device.stop_app(action.package)
        case Wait():
            await token.race(asyncio.sleep(action.duration))
        case TapOn():
            return await _tap_on(action.selector, device, token)
        case AssertVisible():
            return await _assert_visible(action.selector, device, token)
        case WaitFor():
            return await _wait_for(action, device, token, poll)
        case Shell():
            return await _shell(action, device, token, shell_timeout)
        case Screenshot():
            return await _screenshot(device, token)
        case UiDump():
            return await _ui_dump(device, token)
        case InstallApp() | UninstallApp() | PushFile() | PullFile():
            raise AssertionError("the app library's actions are _library_action's")
        case _:
            assert_never(action)
    return _OK


def _input(path: InputPath | None) -> StepOutput:
    """An input action done: its step's data says which way it reached the phone
    (`input`: "control", scrcpy's control socket; "input", the `input` command)."""
    return _OK if path is None else StepOutput(ok=True, data={"input": path})


async def _library_action(
    action: InstallApp | UninstallApp | PushFile | PullFile,
    device: Device,
    token: StopToken,
    library: install.Library | None,
) -> StepOutput:
    try:
        if isinstance(action, UninstallApp):
            await install.uninstall_app(action.package, device)
            return StepOutput(ok=True, output=f"uninstalled {action.package}")
        if isinstance(action, PullFile):
            data = await install.pull_file(action.path, device, token)
            facts = {"bytes": str(len(data)), "sha256": hashlib.sha256(data).hexdigest()}
            output = f"pulled {action.path}: {len(data)} bytes"
            return StepOutput(ok=True, output=output, data=facts, kept=(Kept("pulled_file", data),))
        if library is None:
            return StepOutput.failed(f"{action.kind}: this host has no app library")
        if isinstance(action, PushFile):
            size = await install.push_file(action, device, token, library)
            facts = {"bytes": str(size), "file": action.file}
            return StepOutput(ok=True, output=f"pushed {size} bytes to {action.path}", data=facts)
        done = await install.install_app(action, device, token, library)
    except install.LibraryError as exc:
        return StepOutput.failed(str(exc))
    app = done.app
    facts = {"package": app.package, "version_code": str(app.version_code), "app_id": app.app_id}
    output = f"installed {app.package} {app.version_name} ({done.how})"
    return StepOutput(ok=True, output=output, data={**facts, "install": done.how})


async def _on_screen(
    selector: UiSelector, device: Device, token: StopToken
) -> ET.Element | StepOutput:
    """The element `selector` finds in one UI dump, or the failed step if it finds none."""
    try:
        node = find_element(await token.race(device.ui_dump()), selector)
    except UnreadableDump as exc:
        return StepOutput.failed(str(exc))
    return StepOutput.failed(f"element not found: {selector}") if node is None else node


async def _tap_on(selector: UiSelector, device: Device, token: StopToken) -> StepOutput:
    node = await _on_screen(selector, device, token)
    if isinstance(node, StepOutput):
        return node
    centre = bounds_centre(node.get("bounds", ""))
    if centre is None:
        return StepOutput.failed(f"element {selector} has no usable bounds: {node.get('bounds')!r}")
    token.raise_if_tripped()  # the dump took a while: do not tap for a stopped task
    x, y = centre
    path = await device.tap(x, y)
    data = {"x": str(x), "y": str(y)} | ({"input": path} if path else {})
    return StepOutput(ok=True, output=f"tapped {selector} at ({x}, {y})", data=data)


async def _assert_visible(selector: UiSelector, device: Device, token: StopToken) -> StepOutput:
    node = await _on_screen(selector, device, token)
    if isinstance(node, StepOutput):
        return node
    return StepOutput(ok=True, output=f"visible: {selector}")


async def _wait_for(action: WaitFor, device: Device, token: StopToken, poll: float) -> StepOutput:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + action.timeout
    while True:
        found, problem = await _look_for(action.selector, device, token)
        if found:
            return StepOutput(ok=True, output=f"visible: {action.selector}")
        remaining = deadline - loop.time()
        if remaining <= 0:
            detail = f" (last ui dump: {problem})" if problem else ""
            return StepOutput.failed(
                f"element not found: {action.selector} within {action.timeout:g}s{detail}"
            )
        await token.race(asyncio.sleep(min(poll, remaining)))


async def _look_for(selector: UiSelector, device: Device, token: StopToken) -> tuple[bool, str]:
    """Whether `selector` is on screen, and why we could not tell (or "")."""
    try:
        return find_element(await token.race(device.ui_dump()), selector) is not None, ""
    except DeviceLost:
        raise
    except (DeviceError, UnreadableDump) as exc:
        # A dump taken mid-animation can fail; the next poll may succeed.
        message = describe_device_error(exc) if isinstance(exc, DeviceError) else str(exc)
        return False, message


async def _shell(
    action: Shell, device: Device, token: StopToken, default_timeout: float
) -> StepOutput:
    timeout = action.timeout if action.timeout is not None else default_timeout
    try:
        # The driver enforces the timeout too; this one also bounds a driver that hangs.
        async with asyncio.timeout(timeout):
            result = await token.race(device.shell(action.command, timeout))
    except (TimeoutError, DeviceTimeout):
        return StepOutput.failed(f"shell timed out after {timeout:g}s: {action.command!r}")
    data = {"exit_code": str(result.exit_code)}
    if result.exit_code != 0:
        return StepOutput.failed(f"shell exited with code {result.exit_code}", result.output, data)
    return StepOutput(ok=True, output=cut(result.output), data=data)


async def _screenshot(device: Device, token: StopToken) -> StepOutput:
    png = await token.race(device.screenshot())
    data = {"png_bytes": str(len(png)), "sha256": hashlib.sha256(png).hexdigest()}
    kept = (Kept("screenshot", png),)
    return StepOutput(ok=True, output=f"screenshot: {len(png)} bytes", data=data, kept=kept)


async def _ui_dump(device: Device, token: StopToken) -> StepOutput:
    xml = (await token.race(device.ui_dump())).encode()
    data = {"xml_bytes": str(len(xml)), "sha256": hashlib.sha256(xml).hexdigest()}
    kept = (Kept("ui_dump", xml),)
    return StepOutput(ok=True, output=f"ui dump: {len(xml)} bytes", data=data, kept=kept)


def find_element(xml: str, selector: UiSelector) -> ET.Element | None:
    """The first node of a `uiautomator dump` whose attribute matches `selector` exactly."""
    attribute = _ATTRIBUTES[selector.by]
    for node in _parse_dump(xml).iter():
        if node.get(attribute) == selector.value:
            return node
    return None


def _parse_dump(xml: str) -> ET.Element:
    # `uiautomator dump /dev/tty` appends "UI hierchary dumped to: …" after the XML.
    start, end = xml.find("<"), xml.rfind(">")
    if start < 0 or end < start:
        raise UnreadableDump(f"ui dump unreadable: no XML in {cut(xml, 200)!r}")
    try:
        return ET.fromstring(xml[start : end + 1])
    except ET.ParseError as exc:
        raise UnreadableDump(f"ui dump unreadable: {exc}") from exc


def bounds_centre(bounds: str) -> tuple[int, int] | None:
    """Centre of `[x1,y1][x2,y2]`, or None if it is not that or encloses nothing."""
    m = _BOUNDS.fullmatch(bounds.strip())
    if m is None:
        return None
    x1, y1, x2, y2 = map(int, m.groups())
    if x2 <= x1 or y2 <= y1:
        return None
    return (x1 + x2) // 2, (y1 + y2) // 2


def describe_device_error(exc: DeviceError) -> str:
    """A message that starts with what went wrong, e.g. "device lost: serial X is offline"."""
    prefix = next(_ERROR_PREFIXES[c] for c in type(exc).__mro__ if c in _ERROR_PREFIXES)
    detail = str(exc) or (type(exc).__doc__ or "").strip()
    return detail if detail.startswith(prefix) else f"{prefix}: {detail}"


_ERROR_PREFIXES: dict[type[DeviceError], str] = {
    DeviceUnresponsive: "device unresponsive",
    DeviceLost: "device lost",
    DeviceTimeout: "device timed out",
    CommandFailed: "command failed",
    DeviceError: "device error",
}
