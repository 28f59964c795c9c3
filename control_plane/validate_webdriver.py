"""Checks on a WebDriver command carried as a session's action (SessionAction.webdriver): a
command under the session, or a part of a large body, or the ask for the next part of a
large answer (amc_common.webdriver_body). Each problem names its field."""

from __future__ import annotations

from amc.v1 import task_pb2
from control_plane.errors import InvalidArgument

MAX_PATH = 2048


def command(c: task_pb2.WebDriverCommand) -> None:
    """A WebDriver command: GET, POST or DELETE, and a path under the session; or, alone, a
    part of a body (`part`, with its bytes) or the ask for an answer's next part (`rest`)."""
    if c.part or c.rest:
        if c.method or c.path or (c.part and c.rest) or (c.rest and c.body):
            raise InvalidArgument(
                "action.webdriver",
                "a body's part (part) or the ask for an answer's next part (rest) names no"
                " method or path, and a rest carries no body",
            )
        return
    if c.method not in ("GET", "POST", "DELETE"):
        raise InvalidArgument("action.webdriver.method", "GET, POST or DELETE")
    parts = c.path.split("/")
    if (c.path and parts[0]) or len(c.path) > MAX_PATH or {".", ".."} & set(parts):
        raise InvalidArgument("action.webdriver.path", "empty, or a command's path from '/'")
