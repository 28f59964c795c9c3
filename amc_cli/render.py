"""Output: rich tables for people, one JSON document for scripts.

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

from amc.v1 import admin_pb2, scheduler_pb2, task_pb2

STATUS_STYLE = {
    "queued": "yellow",
    "assigned": "cyan",
    "dispatched": "blue",
    "done": "green",
    "failed": "red",
    "cancelled": "magenta",
}
TERMINAL = {task_pb2.TASK_STATUS_DONE, task_pb2.TASK_STATUS_FAILED, task_pb2.TASK_STATUS_CANCELLED}
STEP_STYLE = {"ok": "green", "failed": "red", "skipped": "dim", "cancelled": "magenta"}


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


# -- tasks -----------------------------------------------------------------------------------


def task_detail(task: task_pb2.Task) -> None:
    out = console()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    status = status_text(task.status)
    if task.attempt:
        status.append(f"  (attempt {task.attempt} of {task.max_attempts})")
    rows: list[tuple[str, str | Text]] = [
        ("task", task.task_id),
        ("status", status),
        ("device", where(task)),
        ("spec", spec_summary(task.spec)),
        ("selector", _selector(task.selector)),
        ("priority", str(task.priority)),
        ("fairness key", task.fairness_key or "default"),
    ]
    if task.HasField("queue_timeout"):
        rows.append(("queue timeout", span(task.queue_timeout)))
    if task.HasField("deadline"):
        rows.append(("deadline", f"{span(task.deadline)} per attempt"))
    if task.request_id:
        rows.append(("request id", task.request_id))
    if task.metadata:
        rows.append(("metadata", pairs(task.metadata.items())))
    rows += [("created", when(task.created_at)), ("updated", when(task.updated_at))]
    if task.HasField("finished_at"):
        rows.append(("finished", when(task.finished_at)))
    if task.HasField("cancel_requested_at"):
        reason = f": {task.cancel_reason}" if task.cancel_reason else ""
        rows.append(("cancel", f"requested {when(task.cancel_requested_at)}{reason}"))
    if task.result.error:
        rows.append(("error", Text(task.result.error, style="red")))
    if task.pending_reason:
        rows.append(("waiting", Text(task.pending_reason, style="yellow")))
    if task.status not in TERMINAL and task.HasField("progress"):
        rows.append(("progress", progress_summary(task.progress)))
    for key, value in rows:
        grid.add_row(key, value if isinstance(value, Text) else Text(value))
    out.print(grid)
    if task.result.steps:
        out.print()
        steps_table(task, out)


def _selector(sel: task_pb2.DeviceSelector) -> str:
    parts = [f"serial={sel.serial}"] if sel.serial else []
    parts += [f"{k}={v}" for k, v in sorted(sel.labels.items())]
    return " ".join(parts) or "any device"


def step_status(step: task_pb2.StepResult) -> str:
    """ok, failed, skipped or cancelled: the status the host reported, as `-o json` has it
    (a host older than STEP_STATUS_CANCELLED reports a cancelled step failed)."""
    return enum_name("STEP_STATUS_", task_pb2.StepStatus.Name(step.status))


def steps_table(task: task_pb2.Task, out: Console | None = None) -> None:
    table = Table(title="steps", title_justify="left", show_edge=False)
    for name in ("#", "step", "status", "took", "output / error"):
        table.add_column(name, overflow="fold")
    for step in task.result.steps:
        name = step_status(step)
        style = STEP_STYLE.get(name, "")
        detail = Text(step.output.strip())
        if step.error:
            if detail:
                detail.append("\n")
            detail.append(step.error, style="red")
        for key, value in sorted(step.data.items()):
            detail.append(f"{chr(10) if detail else ''}{key}={value}", style="dim")
        for kept in step.artifacts:
            line = f"kept {kept.kind}, {kept.size_bytes} bytes (amc artifact)"
            detail.append(f"{chr(10) if detail else ''}{line}", style="cyan")
        table.add_row(
            str(step.index),
            Text(step.name),
            Text(name, style=style),
            seconds(step.duration) if step.HasField("duration") else "-",
            detail,
        )
    (out or console()).print(table)


def history_tables(
    attempts: list[scheduler_pb2.TaskAttempt], events: list[scheduler_pb2.TaskEvent]
) -> None:
    out = console()
    if attempts:
        table = Table(title="attempts", title_justify="left", show_edge=False)
        for name in ("#", "host", "device", "lease", "assigned", "acknowledged", "ended", "how"):
            table.add_column(name, no_wrap=name == "lease")
        for a in attempts:
            how = enum_name("ATTEMPT_STATE_", scheduler_pb2.AttemptState.Name(a.state))
            table.add_row(
                str(a.attempt),
                Text(a.host_id),
                Text(a.device_serial),
                a.lease_id,
                when(a.created_at),
                when(a.acknowledged_at),
                when(a.ended_at),
                Text(how, style=STATUS_STYLE.get(how, "")),
            )
        out.print()
        out.print(table)
    if events:
        table = Table(title="events", title_justify="left", show_edge=False)
        for name in ("time", "attempt", "event", "from", "to", "detail"):
            table.add_column(name, overflow="fold")
        for e in events:
            table.add_row(
                when(e.at),
                str(e.attempt or "-"),
                Text(e.kind),
                status_name(e.from_status) if e.from_status else "-",
                status_text(e.to_status) if e.to_status else "-",
                Text(e.detail or ""),
            )
        out.print()
        out.print(table)


def task_table(tasks: list[task_pb2.Task]) -> None:
    out = console()
    if not tasks:
        out.print("no tasks")
        return
    table = Table(show_edge=False)
    for name in ("task", "status", "attempt", "priority", "device", "created", "spec"):
        table.add_column(name, no_wrap=name == "task")
    for t in tasks:
        table.add_row(
            t.task_id,
            status_text(t.status),
            f"{t.attempt}/{t.max_attempts}",
            str(t.priority),
            Text(where(t)),
            when(t.created_at),
            Text(spec_summary(t.spec, limit=3)),
        )
    out.print(table)


def cancel_requested(task: task_pb2.Task) -> str:
    """What `amc cancel` says of a running task: what is known. The control plane has
    recorded the request; it is pushed by whichever replica holds the host's renewal stream
    (if one does), which the replica that answered cannot know, and every renewal answer
    carries it; a lease that runs out with it pending ends the task cancelled."""
    return (
        f"cancellation requested: task {task.task_id} is {status_name(task.status)} on "
        f"{where(task)}; host {task.host_id} gets it at once if connected, or at its next "
        "renewal, and stops the task at the next step boundary (if it never renews, the task "
        "is cancelled when its lease runs out)"
    )


def step_lines(task: task_pb2.Task, before: task_pb2.Task | None) -> list[Text]:
    """Lines for a running task's steps that ended since `before` (all of them at first
    sight), and for the step it runs now when that changed, with its time so far."""
    p = task.progress
    if task.status in TERMINAL or not (p.steps or p.HasField("running_since")):
        return []
    old = before.progress if before is not None else task_pb2.TaskProgress()
    lines = []
    for step in p.steps[len(old.steps) :]:
        status = step_status(step)
        line = Text(f"  step {step.index + 1}/{p.step_count} ")
        line.append(step.name, style="bold")
        line.append(f"  {status}", style=STEP_STYLE.get(status, ""))
        line.append(f" in {seconds(step.duration)}")
        if step.error:
            line.append(f"  {step.error}", style="red")
        lines.append(line)
    running = (p.running_index, p.running_name, p.running_since)
    if p.HasField("running_since") and running != (
        old.running_index,
        old.running_name,
        old.running_since,
    ):
        line = Text(f"  step {p.running_index + 1}/{p.step_count} ")
        line.append(p.running_name, style="bold")
        line.append(f"  running for {running_for(p.running_since)}", style="blue")
        lines.append(line)
    return lines


def progress_summary(p: task_pb2.TaskProgress) -> Text:
    """`2 of 5 steps done; running step 3 checkout for 4.2s`."""
    text = Text(f"{len(p.steps)} of {p.step_count} steps done")
    if p.HasField("running_since"):
        text.append(f"; running step {p.running_index + 1} ")
        text.append(p.running_name, style="bold")
        text.append(f" for {running_for(p.running_since)}")
    return text


def running_for(since: timestamp_pb2.Timestamp, now: float | None = None) -> str:
    """How long a step has run, from when it started to now (or `now`, epoch seconds)."""
    elapsed = max(0.0, (time.time() if now is None else now) - since.ToNanoseconds() / 1e9)
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(elapsed * 1e9))
    return seconds(d)


def progress_line(task: task_pb2.Task, before: task_pb2.Task | None) -> Text | None:
    """One line for what changed since `before` (None: the first state seen)."""
    if before is not None:
        cancel_new = task.HasField("cancel_requested_at") and not before.HasField(
            "cancel_requested_at"
        )
        moved = (task.status, task.attempt) != (before.status, before.attempt)
        why_new = task.pending_reason != before.pending_reason and bool(task.pending_reason)
        if not (moved or cancel_new or why_new):
            return None
    line = Text(when(task.updated_at) + "  ", style="dim")
    line.append_text(status_text(task.status, width=10))
    if task.status in (task_pb2.TASK_STATUS_ASSIGNED, task_pb2.TASK_STATUS_DISPATCHED):
        line.append(f"  attempt {task.attempt}/{task.max_attempts} on {where(task)}")
    elif task.status == task_pb2.TASK_STATUS_QUEUED and task.attempt:
        line.append(f"  again, after attempt {task.attempt}/{task.max_attempts}")
    if task.status == task_pb2.TASK_STATUS_QUEUED and task.pending_reason:
        line.append(f"  waiting: {task.pending_reason}", style="yellow")
    if task.HasField("cancel_requested_at") and task.status not in TERMINAL:
        reason = f": {task.cancel_reason}" if task.cancel_reason else ""
        line.append(f"  cancel requested{reason}", style="magenta")
    if task.status in TERMINAL and task.result.error:
        line.append(f"  {task.result.error}", style="red")
    return line


# -- hosts and tokens ------------------------------------------------------------------------


def hosts_table(response: scheduler_pb2.ListHostsResponse) -> None:
    out = console()
    if not response.hosts:
        out.print("no hosts have registered")
        return
    table = Table(show_edge=False)
    columns = ("host", "connected", "work", "last seen", "device", "state", "model", "sdk")
    for name in (*columns, "condition", "battery", "temp", "task"):
        table.add_column(name, no_wrap=name in ("device", "task"))
    devices = busy = 0
    for host in response.hosts:
        connected = Text("yes", style="green") if host.connected else Text("no", style="red")
        first: list[Text | str] = [
            Text(host.host_id),
            connected,
            host_work(host),
            when(host.last_seen_at),
        ]
        for device in host.devices or [None]:
            if device is None:
                table.add_row(*first, "-", "-", "-", "-", "-", "-", "-", "-")
                break
            devices += 1
            busy += bool(device.task_id)
            state = enum_name("DEVICE_STATE_", scheduler_pb2.DeviceState.Name(device.state))
            shown = Text(state, style="green" if state == "device" else "yellow")
            if device.cordoned:
                shown.append(" cordoned", style="magenta")
            table.add_row(
                *first,
                Text(device.serial),
                shown,
                Text(device.model or "-"),
                str(device.sdk or "-"),
                *device_health(device),
                device.task_id or Text("idle", style="dim"),
            )
            first = ["", "", "", ""]
        table.add_section()
    out.print(table)
    connected_count = sum(h.connected for h in response.hosts)
    cordoned = sum(h.cordoned for h in response.hosts)
    out.print(
        Text(
            f"{len(response.hosts)} hosts ({connected_count} connected, {cordoned} cordoned), "
            f"{devices} devices ({busy} busy)",
            style="dim",
        )
    )


def device_health(device: scheduler_pb2.Device) -> tuple[Text, str, str]:
    """Its condition (`ready`, or why it takes no work), battery and temperature as its
    host last probed them (`-`: not read); `+` after the battery: charging."""
    name = scheduler_pb2.DeviceCondition.Name(device.condition)
    condition = enum_name("DEVICE_CONDITION_", name) if device.condition else "ready"
    shown = Text(condition, style="green" if condition == "ready" else "yellow")
    battery = "-"
    if device.HasField("battery_percent"):
        battery = f"{device.battery_percent}%" + ("+" if device.charging else "")
    temp = f"{device.temperature_celsius:.0f}°C" if device.HasField("temperature_celsius") else "-"
    return shown, battery, temp


def host_work(host: scheduler_pb2.Host) -> Text:
    """Whether the host takes work: `draining`, `cordoned` or `yes`."""
    if host.draining:
        return Text("draining", style="magenta")
    if host.cordoned:
        return Text("cordoned", style="magenta")
    return Text("yes", style="green")


def host_line(host: scheduler_pb2.Host, leases: int) -> str:
    """One line on a host after an operation: whether it takes work, what it runs."""
    work = host_work(host).plain
    state = "takes work" if work == "yes" else work
    cordoned = [d.serial for d in host.devices if d.cordoned]
    devices = f"; cordoned devices: {', '.join(cordoned)}" if cordoned else ""
    return f"host {host.host_id}: {state}, {leases} task(s) running{devices}"


def _role(role: int) -> str:
    return enum_name("ROLE_", admin_pb2.Role.Name(role))


def tokens_table(tokens: Iterable[admin_pb2.TokenInfo]) -> None:
    out = console()
    table = Table(show_edge=False)
    for name in ("token id", "name", "role", "host", "team", "created", "revoked"):
        table.add_column(name, no_wrap=name == "token id")
    rows = 0
    for t in tokens:
        rows += 1
        revoked = when(t.revoked_at) if t.HasField("revoked_at") else ""
        table.add_row(
            t.token_id,
            Text(t.name or "-"),
            _role(t.role),
            Text(t.host_id or "-"),
            Text(t.team or "-"),
            when(t.created_at),
            Text(revoked, style="red"),
        )
    out.print(table if rows else "no tokens")


def host_detail(response: admin_pb2.GetHostResponse) -> None:
    """`amc hosts show`: the host as `amc hosts` lists it, then what operators did to it."""
    hosts_table(scheduler_pb2.ListHostsResponse(hosts=[response.host]))
    _operator_events(
        response.events,
        "no operator events",
        ("what", "device"),
        lambda e: [e.kind, Text(e.serial or "-")],
    )


def token_info(info: admin_pb2.TokenInfo, verb: str) -> None:
    name = f" {info.name!r}" if info.name else ""
    host = f" for host {info.host_id}" if info.host_id else ""
    team = f" of team {info.team}" if info.team else ""
    console().print(Text(f"{verb} {_role(info.role)} token {info.token_id}{name}{host}{team}"))


# -- the queue and fair shares ---------------------------------------------------------------


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


def cap_text(share: admin_pb2.FairShare) -> str:
    return str(share.max_devices) if share.HasField("max_devices") else "-"


def queue_tables(
    queue: scheduler_pb2.GetQueueResponse, shares: admin_pb2.ListFairSharesResponse
) -> None:
    """`amc queue`: the queue by selector, then by fairness key, as last counted."""
    out = console()
    if queue.groups:
        table = Table(show_edge=False)
        for name in ("selector", "queued", "oldest wait", "devices idle/busy/other", "why"):
            table.add_column(name)
        for g in queue.groups:
            devices = f"{g.devices_idle}/{g.devices_busy}/{g.devices_unavailable}"
            table.add_row(
                Text(_selector(g.selector)),
                str(g.count),
                waited(g.oldest_queued_at),
                devices,
                Text(g.waiting_because),
            )
        out.print(table)
    else:
        out.print("nothing queued")
    out.print()
    table = Table(show_edge=False)
    for name in ("fairness key", "queued", "running", "cap", "weight", "oldest wait"):
        table.add_column(name, no_wrap=name == "fairness key")
    for share in shares.shares:
        table.add_row(
            Text(share.fairness_key),
            str(share.queued),
            str(share.running),
            cap_text(share),
            str(share.weight),
            waited(share.oldest_queued_at),
        )
    out.print(table if shares.shares else "no fairness key has tasks or a share set")
    counted = (
        f"counted {when(queue.counted_at)}" if queue.HasField("counted_at") else "not counted yet"
    )
    out.print(Text(f"{queue.total} queued in all; {counted} (every few seconds)", style="dim"))


def fair_share_line(share: admin_pb2.FairShare) -> str:
    """`fairness key qa: weight 3, cap 40 phones; 12 queued, 40 running`."""
    if share.HasField("max_devices"):
        cap = f"cap {share.max_devices} phone{'s' * (share.max_devices != 1)}"
    else:
        cap = "no cap"
    return (
        f"fairness key {share.fairness_key}: weight {share.weight}, {cap}; "
        f"{share.queued} queued, {share.running} running"
    )


def fair_share_detail(response: admin_pb2.GetFairShareResponse) -> None:
    """`amc queue show KEY`: the key's share and tasks, then who changed its share and why."""
    console().print(Text(fair_share_line(response.share)))
    _operator_events(
        response.events,
        "no operator has set its share",
        ("weight", "cap"),
        lambda e: [str(e.weight), str(e.max_devices) if e.HasField("max_devices") else "-"],
    )


def _operator_events(
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


def artifacts_table(artifacts: list[task_pb2.Artifact]) -> None:
    out = console()
    table = Table(show_edge=False)
    for name in ("attempt", "#", "step", "action", "kind", "size", "sha256", "artifact id"):
        table.add_column(name, no_wrap=name in ("sha256", "artifact id"))
    for a in artifacts:
        table.add_row(
            str(a.attempt),
            str(a.step_index),
            Text(a.step_name),
            str(a.action_index),
            a.kind,
            str(a.size_bytes),
            a.sha256,
            a.artifact_id,
        )
    out.print(table if artifacts else "no artifacts")


def warning(message: str) -> None:
    """Something probably not meant, said on stderr (one line, like `amc: error:`)."""
    sys.stderr.write(f"amc: warning: {message}\n")
    sys.stderr.flush()


def note(message: str) -> None:
    """A remark for the person at the terminal, on stderr so stdout stays the result."""
    Console(stderr=True, highlight=False, soft_wrap=True).print(Text(message, style="dim"))
