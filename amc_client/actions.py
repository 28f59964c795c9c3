"""Builders of amc.v1.Action messages, for `Farm.submit` and `Phone.act`; each checks its
values with the shared action table (amc_common.action_table: the rules the control plane
applies) and raises ActionRefused, naming the field, for one past its limit."""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf import duration_pb2
from grpc import StatusCode

from amc.v1 import task_pb2
from amc_client.errors import ActionRefused
from amc_common import action_table
from amc_common.action_limits import ActionError, UiSelector
from amc_common.keycodes import keycode


def seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(value * 1e9))
    return d


def refused(exc: ActionError) -> ActionRefused:
    """An action the table refuses, as amc_client says it (INVALID_ARGUMENT, one line)."""
    return ActionRefused(StatusCode.INVALID_ARGUMENT, str(exc))


def check(action: task_pb2.Action) -> None:
    """Raise ActionRefused unless `action` is one the control plane takes."""
    try:
        action_table.from_message(action)
    except ActionError as exc:
        raise refused(exc) from None


def _checked(kind: str, **values: object) -> None:
    """The values of an action's plain fields against the table's limits, before protobuf
    (which refuses a number past an int32 in its own words)."""
    for f in action_table.FIELDS[kind]:
        if f.name in values:
            try:
                f.check(values[f.name])
            except ValueError as exc:
                raise refused(ActionError(f"{kind}.{f.name}", str(exc))) from None


def tap(x: int, y: int) -> task_pb2.Action:
    _checked("tap", x=x, y=y)
    return task_pb2.Action(tap=task_pb2.Tap(x=x, y=y))


def selector(text: str = "", resource_id: str = "", content_desc: str = "") -> task_pb2.UiSelector:
    """A UI element by exactly one of its text, resource id or content description."""
    try:
        chosen = UiSelector(text or None, resource_id or None, content_desc or None)
    except ActionError as exc:
        raise refused(exc.inside("selector")) from None
    return task_pb2.UiSelector(**{chosen.by: chosen.value})


def tap_on(text: str = "", resource_id: str = "", content_desc: str = "") -> task_pb2.Action:
    return task_pb2.Action(
        tap_on=task_pb2.TapOn(selector=selector(text, resource_id, content_desc))
    )


def swipe(x1: int, y1: int, x2: int, y2: int, duration: float = 0.3) -> task_pb2.Action:
    _checked("swipe", x1=x1, y1=y1, x2=x2, y2=y2, duration=duration)
    move = task_pb2.Swipe(x1=x1, y1=y1, x2=x2, y2=y2, duration=seconds(duration))
    return task_pb2.Action(swipe=move)


def type_text(text: str) -> task_pb2.Action:
    _checked("input_text", text=text)
    return task_pb2.Action(input_text=task_pb2.InputText(text=text))


def key(code: int | str) -> task_pb2.Action:
    """A key by its Android keycode, or by name (`home`, `BACK`, `KEYCODE_ENTER`: the
    names of amc_common.keycodes)."""
    if isinstance(code, str):
        try:
            code = keycode(code)
        except ValueError as exc:
            raise refused(ActionError("key.keycode", str(exc))) from None
    _checked("key", keycode=code)
    return task_pb2.Action(key=task_pb2.Key(keycode=code))


def launch_app(package: str, activity: str = "") -> task_pb2.Action:
    _checked("launch_app", package=package, activity=activity)
    return task_pb2.Action(launch_app=task_pb2.LaunchApp(package=package, activity=activity))


def stop_app(package: str) -> task_pb2.Action:
    _checked("stop_app", package=package)
    return task_pb2.Action(stop_app=task_pb2.StopApp(package=package))


def shell(command: str, timeout: float | None = None) -> task_pb2.Action:
    _checked("shell", command=command, timeout=timeout)
    pb = task_pb2.Shell(command=command)
    if timeout is not None:
        pb.timeout.CopyFrom(seconds(timeout))
    return task_pb2.Action(shell=pb)


def wait(duration: float) -> task_pb2.Action:
    _checked("wait", duration=duration)
    return task_pb2.Action(wait=task_pb2.Wait(duration=seconds(duration)))


def wait_for(
    text: str = "", resource_id: str = "", content_desc: str = "", timeout: float = 10.0
) -> task_pb2.Action:
    """Look at the screen until the element is there, for at most `timeout` seconds (the
    step fails if it never is)."""
    _checked("wait_for", timeout=timeout)
    found = selector(text, resource_id, content_desc)
    return task_pb2.Action(wait_for=task_pb2.WaitFor(selector=found, timeout=seconds(timeout)))


def screenshot() -> task_pb2.Action:
    return task_pb2.Action(screenshot=task_pb2.Screenshot())


def ui_dump() -> task_pb2.Action:
    return task_pb2.Action(ui_dump=task_pb2.UiDump())


def install_app(
    app: str, *, replace: bool = False, grant_permissions: bool = False
) -> task_pb2.Action:
    """Install an app of the farm's library: by its id (the sha256 of its APK) or its
    package name (the library's newest upload of it); `replace` an installed copy (its
    data kept), `grant_permissions` every runtime permission it asks for."""
    _checked("install_app", app=app)
    pb = task_pb2.InstallApp(app=app, replace=replace, grant_permissions=grant_permissions)
    return task_pb2.Action(install_app=pb)


def uninstall_app(package: str) -> task_pb2.Action:
    _checked("uninstall_app", package=package)
    return task_pb2.Action(uninstall_app=task_pb2.UninstallApp(package=package))


def apps(wanted: Sequence[str | task_pb2.InstallApp]) -> list[task_pb2.InstallApp]:
    """A session's or task's apps to install first (SessionOpen.apps, TaskSpec.apps): an
    app id or package name is installed replacing an installed copy (its data kept); an
    InstallApp says its own flags. ActionRefused names the one that is no app."""
    out: list[task_pb2.InstallApp] = []
    for i, app in enumerate(wanted):
        if isinstance(app, str):
            app = task_pb2.InstallApp(app=app, replace=True)
        try:
            action_table.from_message(task_pb2.Action(install_app=app))
        except ActionError as exc:
            inside = exc.field.removeprefix("install_app").lstrip(".")
            raise refused(ActionError(f"apps[{i}].{inside}", exc.problem)) from None
        out.append(app)
    return out
