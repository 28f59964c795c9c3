"""Output: rich tables for people, one JSON document for scripts. This module holds what
every kind of output shares (the console, JSON, small values, operator events, notes on
stderr); render_tasks, render_hosts and render_queue what each command shows.

Values from the server go into `Text` cells, never markup strings, so a step output that
happens to contain `[bold]` prints as written. When stdout is not a terminal the console
gets a wide page, so piped tables are not wrapped mid-id.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC
from typing import Any

from google.protobuf import duration_pb2, json_format, timestamp_pb2
from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from rich.text import Text

from amc.v1 import task_pb2
from amc_common import statuses
from amc_common.device_selector import describe

STATUS_STYLE = {
    "queued": "yellow",
    "assigned": "cyan",
    "dispatched": "blue",
    "done": "green",
    "failed": "red",
    "cancelled": "magenta",
}
TERMINAL = statuses.numbers(statuses.TERMINAL, task_pb2.TaskStatus)


def console() -> Console:
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, width=500 if piped else None)


# -- JSON ------------------------------------------------------------------------------------


def to_dict(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def print_json(document: Message | dict[str, Any]) -> None:
    data = to_dict(document) if isinstance(document, Message) else document
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


# -- small values ----------------------------------------------------------------------------


def enum_name(prefix: str, name: str) -> str:
    return name.removeprefix(prefix).lower()


def status_name(status: int) -> str:
    return enum_name("TASK_STATUS_", task_pb2.TaskStatus.Name(status))


def status_text(status: int, width: int = 0) -> Text:
    name = status_name(status)
    return Text(name.ljust(width), style=STATUS_STYLE.get(name, ""))


def when(ts: timestamp_pb2.Timestamp) -> str:
    """A time as ISO 8601 in the local zone, to the second, with the zone's offset
    (2026-03-01T09:15:02+01:00): the one format of every table, line and console page."""
    if not ts.seconds and not ts.nanos:
        return "-"
    return ts.ToDatetime(tzinfo=UTC).astimezone().isoformat(timespec="seconds")


def seconds(d: duration_pb2.Duration) -> str:
    total = d.seconds + d.nanos / 1e9
    return f"{total:.1f}s" if total < 60 else f"{int(total // 60)}m{total % 60:04.1f}s"


def span(d: duration_pb2.Duration) -> str:
    """A limit as it is written in a spec file: 30s, 5m, 1h30m, 1.5s."""
    total = d.seconds + d.nanos / 1e9
    hours, rest = divmod(int(total), 3600)
    minutes, secs = divmod(rest, 60)
    fraction = total - int(total)
    out = (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "")
    if secs or fraction or not out:
        out += f"{secs + fraction:g}s"
    return out


def pairs(values: Iterable[tuple[str, str]]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(values)) or "-"


def where(task: task_pb2.Task) -> str:
    if not task.host_id:
        return "-"
    return f"{task.host_id}/{task.device_serial}"


def spec_summary(spec: task_pb2.TaskSpec, limit: int = 6) -> str:
    def kinds(actions: Iterable[task_pb2.Action]) -> list[str]:
        return [a.WhichOneof("kind") or "?" for a in actions]

    if spec.WhichOneof("kind") == "session":
        idle = spec.session.idle_timeout.ToTimedelta().total_seconds()
        return f"interactive session (idle timeout {idle:g}s)"
    if spec.WhichOneof("kind") == "workflow":
        steps = spec.workflow.steps
        names = [s.name for s in steps]
        shown = ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")
        return f"workflow, {len(steps)} step{'s' * (len(steps) != 1)}: {shown}"
    acts = kinds(spec.actions.actions)
    shown = ", ".join(acts[:limit]) + (", ..." if len(acts) > limit else "")
    return f"{len(acts)} action{'s' * (len(acts) != 1)}: {shown}"


def selector_text(sel: task_pb2.DeviceSelector) -> str:
    return describe(sel.serial, sel.labels, sep=" ")


def waited(ts: timestamp_pb2.Timestamp) -> str:
    """How long ago `ts` was, as a wait reads: 42s, 5m12s, 3h05m, 2d4h; `-` if unset."""
    if not ts.seconds and not ts.nanos:
        return "-"
    total = max(0, int(time.time() - ts.seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h"
    if hours:
        return f"{hours}h{minutes:02}m"
    return f"{minutes}m{secs:02}s" if minutes else f"{secs}s"


# -- who did what, and notes on stderr ---------------------------------------------------------


def operator_events(
    events: Sequence[Any],
    none: str,
    columns: tuple[str, ...],
    cells: Callable[[Any], list[str | Text]],
) -> None:
    """What operators did, one row each: when, the event's own `columns`, who, why."""
    out = console()
    if not events:
        out.print(none)
        return
    table = Table(show_edge=False)
    for name in ("when", *columns, "by", "reason"):
        table.add_column(name, no_wrap=name == "when")
    for e in events:
        who = f"{e.actor_name} ({e.actor})" if e.actor_name else e.actor
        table.add_row(when(e.at), *cells(e), Text(who), Text(e.reason or "-"))
    out.print(table)


def warning(message: str) -> None:
    """Something probably not meant, said on stderr (one line, like `amc: error:`)."""
    sys.stderr.write(f"amc: warning: {message}\n")
    sys.stderr.flush()


def note(message: str) -> None:
    """A remark for the person at the terminal, on stderr so stdout stays the result."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(Text(message, style="dim"))
