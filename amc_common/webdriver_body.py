"""How a WebDriver command's body and Appium's answer cross a session's relay in parts: the
most either may be (MAX_BODY), the size of one part (PART), and the split.

The control plane takes at most 1 MiB in one message from a host (and 2 MiB from another
replica), so a body larger than PART crosses as several actions and steps of the session
(task_pb2.WebDriverCommand.part and .rest, WebDriverReply.size), each one message: the
relay carries them as any action and step, with no state of its own. Either end holds a
whole body (at most MAX_BODY) only while its command runs.
"""

from __future__ import annotations

from collections.abc import Iterator

# The most a WebDriver command's body, or Appium's answer to it, may be: a real phone's
# full-size screenshot in base64 (2-6 MiB), a page source, an app pushed in base64.
MAX_BODY = 64 << 20
# The most of a body one message carries: well under the 1 MiB a control plane takes from a
# host, with room for the step's other fields.
PART = 768 << 10


def parts(body: bytes) -> Iterator[bytes]:
    """`body` in order, PART bytes at a time (one empty part for an empty body)."""
    if len(body) <= PART:
        yield body
        return
    view = memoryview(body)
    for start in range(0, len(body), PART):
        yield bytes(view[start : start + PART])


def too_big(what: str, size: int | None) -> str:
    """Why a body over MAX_BODY is refused: its size where known, and the cap."""
    said = f"{size} bytes" if size is not None else f"more than {MAX_BODY} bytes"
    return f"{what} is {said}, more than the {MAX_BODY >> 20} MiB ({MAX_BODY} bytes) a farm carries"
