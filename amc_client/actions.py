"""Builders of amc.v1.Action messages, for `Farm.submit` and `Phone.act`."""

from __future__ import annotations

from google.protobuf import duration_pb2

from amc.v1 import task_pb2


def seconds(value: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(value * 1e9))
    return d


def tap(x: int, y: int) -> task_pb2.Action:
    return task_pb2.Action(tap=task_pb2.Tap(x=x, y=y))


def selector(text: str = "", resource_id: str = "", content_desc: str = "") -> task_pb2.UiSelector:
    """A UI element by exactly one of its text, resource id or content description."""
    if text:
        return task_pb2.UiSelector(text=text)
    if resource_id:
        return task_pb2.UiSelector(resource_id=resource_id)
    return task_pb2.UiSelector(content_desc=content_desc)


def tap_on(text: str = "", resource_id: str = "", content_desc: str = "") -> task_pb2.Action:
    return task_pb2.Action(
        tap_on=task_pb2.TapOn(selector=selector(text, resource_id, content_desc))
    )


def swipe(x1: int, y1: int, x2: int, y2: int, duration: float = 0.3) -> task_pb2.Action:
    move = task_pb2.Swipe(x1=x1, y1=y1, x2=x2, y2=y2, duration=seconds(duration))
    return task_pb2.Action(swipe=move)


def type_text(text: str) -> task_pb2.Action:
    return task_pb2.Action(input_text=task_pb2.InputText(text=text))


def key(keycode: int) -> task_pb2.Action:
    return task_pb2.Action(key=task_pb2.Key(keycode=keycode))


def launch_app(package: str, activity: str = "") -> task_pb2.Action:
    return task_pb2.Action(launch_app=task_pb2.LaunchApp(package=package, activity=activity))


def stop_app(package: str) -> task_pb2.Action:
    return task_pb2.Action(stop_app=task_pb2.StopApp(package=package))


def shell(command: str, timeout: float | None = None) -> task_pb2.Action:
    pb = task_pb2.Shell(command=command)
    if timeout is not None:
        pb.timeout.CopyFrom(seconds(timeout))
    return task_pb2.Action(shell=pb)


def wait(duration: float) -> task_pb2.Action:
    return task_pb2.Action(wait=task_pb2.Wait(duration=seconds(duration)))


def screenshot() -> task_pb2.Action:
    return task_pb2.Action(screenshot=task_pb2.Screenshot())


def ui_dump() -> task_pb2.Action:
    return task_pb2.Action(ui_dump=task_pb2.UiDump())
