"""What the MCP server's tools say, as text for a model: a session's end, a UI dump cut to
what can be acted on, and the screen's size beside a screenshot's."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ElementTree

from amc.v1 import task_pb2

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def said(task: task_pb2.Task | None) -> str:
    """A finished session in a line: `session ID done (4 actions)`."""
    if task is None:
        return "no session was open"
    status = task_pb2.TaskStatus.Name(task.status).removeprefix("TASK_STATUS_").lower()
    why = task.result.error
    if task.status == task_pb2.TASK_STATUS_CANCELLED and task.cancel_reason:
        why = task.cancel_reason
    error = f": {why}" if why else ""
    return f"session {task.task_id} {status}{error} ({len(task.result.steps)} actions)"


def compact_ui(xml: str) -> str:
    """A UI dump as one line per element worth acting on (text, id, description, or
    clickable), indented by depth: `text="OK" id=… desc=… Button clickable @(540,1200)`,
    the @ being the centre to tap."""
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError:
        return xml
    lines: list[str] = []

    def walk(node: ElementTree.Element, depth: int) -> None:
        a = node.attrib
        parts = [f'text="{a["text"]}"'] if a.get("text") else []
        parts += [f"id={a['resource-id']}"] if a.get("resource-id") else []
        parts += [f'desc="{a["content-desc"]}"'] if a.get("content-desc") else []
        if parts or a.get("clickable") == "true":
            parts.append(a.get("class", node.tag).rsplit(".", 1)[-1])
            if a.get("clickable") == "true":
                parts.append("clickable")
            bounds = a.get("bounds", "").replace("][", ",").strip("[]").split(",")
            if len(bounds) == 4 and all(b.lstrip("-").isdigit() for b in bounds):
                x1, y1, x2, y2 = (int(b) for b in bounds)
                parts.append(f"@({(x1 + x2) // 2},{(y1 + y2) // 2})")
            lines.append("  " * depth + " ".join(parts))
        for child in node:
            walk(child, depth + 1)

    walk(root, 0)
    return "\n".join(lines) or "(no element with text, id, description or a click)"


def png_size(png: bytes) -> tuple[int, int] | None:
    """A PNG's width and height, from its header; None for bytes that are not a PNG."""
    if len(png) < 24 or not png.startswith(PNG_MAGIC) or png[12:16] != b"IHDR":
        return None
    width, height = struct.unpack(">II", png[16:24])
    return width, height


def screenshot_note(png: bytes, screen: tuple[int, int] | None) -> str:
    """What a screenshot is against the screen taps use: `screenshot 360x800 of a 1080x2400
    screen; ... multiply a point on it by 3`; the screen's size unknown (a host that does
    not say it, no UI dump yet), that it is not known and where to find it."""
    size = png_size(png)
    if size is None:
        return "screenshot (not a PNG the server could read)"
    w, h = size
    if screen is None:
        return (
            f"screenshot {w}x{h}; the phone has not said its screen's size: tap and swipe in"
            " screen pixels, as ui_dump's centres are (ui_dump says the size)"
        )
    sw, sh = screen
    if (sw, sh) == (w, h):
        return f"screenshot {w}x{h}, the screen's own pixels: tap and swipe at points on it"
    sx, sy = sw / w, sh / h
    scale = f"by {sx:.3g}" if abs(sx - sy) < 0.01 else f"x by {sx:.3g} and y by {sy:.3g}"
    return (
        f"screenshot {w}x{h} of a {sw}x{sh} screen; tap and swipe in screen pixels (as"
        f" ui_dump's centres are): multiply a point on this image {scale}"
    )
