"""Tasks for people: `amc get`'s detail and history, `amc list`'s table, the lines `amc
watch` prints as a task moves and its steps end, and a task's kept files."""

from __future__ import annotations

import time

from google.protobuf import duration_pb2, timestamp_pb2
from rich.console import Console
from rich.table import Table
from rich.text import Text

from amc.v1 import scheduler_pb2, task_pb2
from amc_cli.render import (
    STATUS_STYLE,
    TERMINAL,
    console,
    enum_name,
    pairs,
    seconds,
    selector_text,
    span,
    spec_summary,
    status_name,
    status_text,
    when,
    where,
)
from amc_common.steps import label as step_label
from amc_common.steps import number as step_number

STEP_STYLE = {"ok": "green", "failed": "red", "skipped": "dim", "cancelled": "magenta"}


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
        ("selector", selector_text(task.selector)),
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
        for warning in step.warnings:  # flagged in the phone's log (amc logs)
            detail.append(f"{chr(10) if detail else ''}warning: {warning}", style="yellow")
        for key, value in sorted(step.data.items()):
            detail.append(f"{chr(10) if detail else ''}{key}={value}", style="dim")
        for kept in step.artifacts:
            line = f"kept {kept.kind}, {kept.size_bytes} bytes (amc artifact)"
            detail.append(f"{chr(10) if detail else ''}{line}", style="cyan")
        table.add_row(
            str(step_number(step.index)),
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
        line = Text(f"  {step_label(step.index, count=p.step_count)} ")
        line.append(step.name, style="bold")
        line.append(f"  {status}", style=STEP_STYLE.get(status, ""))
        line.append(f" in {seconds(step.duration)}")
        if step.error:
            line.append(f"  {step.error}", style="red")
        for warning in step.warnings:
            line.append(f"\n    warning: {warning}", style="yellow")
        lines.append(line)
    running = (p.running_index, p.running_name, p.running_since)
    if p.HasField("running_since") and running != (
        old.running_index,
        old.running_name,
        old.running_since,
    ):
        line = Text(f"  {step_label(p.running_index, count=p.step_count)} ")
        line.append(p.running_name, style="bold")
        line.append(f"  running for {running_for(p.running_since)}", style="blue")
        lines.append(line)
    return lines


def progress_summary(p: task_pb2.TaskProgress) -> Text:
    """`2 of 5 steps done; running step 3 checkout for 4.2s`."""
    text = Text(f"{len(p.steps)} of {p.step_count} steps done")
    if p.HasField("running_since"):
        text.append(f"; running step {step_number(p.running_index)} ")
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


def artifacts_table(artifacts: list[task_pb2.Artifact]) -> None:
    out = console()
    table = Table(show_edge=False)
    for name in ("attempt", "#", "step", "action", "kind", "size", "sha256", "artifact id"):
        table.add_column(name, no_wrap=name in ("sha256", "artifact id"))
    for a in artifacts:
        table.add_row(
            str(a.attempt),
            str(step_number(a.step_index)),
            Text(a.step_name),
            str(step_number(a.action_index)),
            a.kind,
            str(a.size_bytes),
            a.sha256,
            a.artifact_id,
        )
    out.print(table if artifacts else "no artifacts")
