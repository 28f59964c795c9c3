"""The task commands: submit, get, list, cancel, watch, and a task's kept files
(artifacts, artifact)."""

from __future__ import annotations

import enum
from typing import Annotated, NoReturn

import typer

from amc.v1 import scheduler_pb2, task_pb2
from amc_cli import artifact_download, options, render, render_tasks, selectors
from amc_cli.client import Client
from amc_cli.errors import BadInput, CliError, RpcFailed
from amc_cli.follow import follow, outcome_exit
from amc_cli.options import Output, OutputOpt, duration_option, int32_option
from amc_cli.specfile import load_request, with_flags
from amc_common import statuses
from amc_common.steps import label as step_label

app = typer.Typer(rich_markup_mode="markdown")
TaskIdArg = Annotated[str, typer.Argument(metavar="ID", help="Task id.")]
TaskArg = Annotated[str, typer.Argument(metavar="TASK", help="Task id.")]


# `--status` takes the statuses amc_common names.
Status = enum.StrEnum("Status", [(name, name) for name in statuses.STATUSES])  # type: ignore[misc]


@app.command()
def submit(
    ctx: typer.Context,
    file: Annotated[
        str, typer.Argument(metavar="FILE", help="YAML or JSON task spec; - reads stdin.")
    ],
    serial: Annotated[
        str | None, typer.Option(help="Run on this device serial only.", show_default=False)
    ] = None,
    label: Annotated[
        list[str] | None,
        typer.Option("--label", "-l", metavar="KEY=VALUE", help="Required device label."),
    ] = None,
    priority: Annotated[int | None, int32_option("Higher runs first.")] = None,
    max_attempts: Annotated[int | None, int32_option("Attempts before failing.", 0)] = None,
    request_id: Annotated[
        str | None, typer.Option(help="Idempotency key: resubmitting returns the same task.")
    ] = None,
    metadata: Annotated[
        list[str] | None,
        typer.Option("--metadata", "-m", metavar="KEY=VALUE", help="Metadata to attach."),
    ] = None,
    queue_timeout: Annotated[
        str | None,
        duration_option("Fail the task if it waits in the queue longer than this (e.g. 5m)."),
    ] = None,
    deadline: Annotated[
        str | None,
        duration_option("Fail an attempt that runs longer than this (e.g. 30s); not retried."),
    ] = None,
    fairness_key: Annotated[
        str | None,
        typer.Option(
            metavar="KEY",
            help="Count the task in this fairness key's share of the phones (default: the "
            "token's team, else 'default').",
            show_default=False,
        ),
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Follow the task until it ends, like watch.")
    ] = False,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Refuse (exit 2) a selector no registered device fits, instead of warning.",
        ),
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Submit a task from a YAML or JSON spec file (see docs/cli.md for the format).

    Flags override the file's selector, priority, max_attempts, request_id, queue_timeout,
    deadline and fairness_key; labels and metadata are merged into the file's. With --wait the exit
    code tells the outcome: 0 done, 8 failed, 9 cancelled.

    A selector label key, value or serial no registered device has gets a warning naming
    the nearest one there is (the task is queued anyway: such a phone may register later);
    --strict refuses it. The check needs the operator role (ListHosts); with a client
    token it is skipped (--strict then fails).
    """
    request = with_flags(
        load_request(file),
        serial=serial,
        labels=options.key_values(label, "--label"),
        priority=priority,
        max_attempts=max_attempts,
        request_id=request_id,
        metadata=options.key_values(metadata, "--metadata"),
        queue_timeout=options.duration(queue_timeout, "--queue-timeout"),
        deadline=options.duration(deadline, "--deadline"),
        fairness_key=fairness_key,
    )
    client = options.client(ctx)
    _check_selector(client, request, strict)
    task = client.submit(request)
    if not wait:
        line = f"submitted task {task.task_id} ({render.status_name(task.status)})"
        options.show(output, task, line)
        return
    if output is Output.table:
        render.console().print(f"submitted task {task.task_id}", highlight=False)
    _follow(client, task.task_id, output)


def _check_selector(client: Client, request: scheduler_pb2.SubmitTaskRequest, strict: bool) -> None:
    """Warn of (or, strict, refuse) a selector no registered device fits."""
    if not request.selector.serial and not request.selector.labels:
        return
    try:
        hosts = client.list_hosts().hosts
    except RpcFailed as exc:
        if strict:
            message = f"--strict: cannot check the selector: {exc.message}"
            raise CliError(message, exc.exit_code) from None
        return
    found = selectors.problems(request.selector, hosts)
    if found and strict:
        raise BadInput("; ".join(found) + " (--strict: nothing submitted)")
    for problem in found:
        render.warning(problem)


@app.command()
def get(ctx: typer.Context, task_id: TaskIdArg, output: OutputOpt = Output.table) -> None:
    """Show one task: status, where it runs, its spec, step results, attempts and events."""
    client = options.client(ctx)
    task = client.get_task(task_id)
    attempts, events = client.task_history(task_id)
    if output is Output.json:
        render.print_json(
            {
                **render.to_dict(task),
                "attempts": [render.to_dict(a) for a in attempts],
                "events": [render.to_dict(e) for e in events],
            }
        )
    else:
        render_tasks.task_detail(task)
        render_tasks.history_tables(attempts, events)


@app.command("list")
def list_tasks(
    ctx: typer.Context,
    status: Annotated[
        list[Status] | None,
        typer.Option(
            "--status",
            "-s",
            case_sensitive=False,
            help="Only tasks in this status (repeatable).",
        ),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Only tasks on this host.", show_default=False)
    ] = None,
    limit: Annotated[
        int, typer.Option("--limit", "-n", min=0, help="At most this many tasks; 0 for all.")
    ] = 50,
    output: OutputOpt = Output.table,
) -> None:
    """List tasks, newest first."""
    wanted = [task_pb2.TaskStatus.Value(statuses.wire_name(s)) for s in status or []]
    tasks, next_page = options.client(ctx).list_tasks(wanted, host or "", limit)
    document = {"tasks": [render.to_dict(t) for t in tasks], "next_page_token": next_page}
    options.show(output, document, lambda: render_tasks.task_table(tasks))
    if next_page and output is Output.table:
        render.note(f"showing the first {len(tasks)}; raise --limit for more")


@app.command()
def cancel(
    ctx: typer.Context,
    task_id: TaskIdArg,
    reason: Annotated[str, typer.Option("--reason", "-r", help="Recorded with the task.")] = "",
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Follow the task until it has stopped.")
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Cancel a task.

    A queued task is cancelled at once; for a running one the control plane pushes the
    request to its host, which stops the task at the next step boundary (a host that is
    offline sees it when it reconnects). Cancelling a cancelled task changes nothing;
    cancelling a done or failed task is a conflict (exit 4). With --wait, exits by
    outcome like watch.

    A cancel is idempotent: while a control plane that has answered is unavailable it is
    tried again, with backoff, for up to --timeout seconds (--retry-for: that long, even
    one that has not answered yet); an address that refuses fails at once.
    """
    client = options.client(ctx)
    task = client.cancel(task_id, reason)
    if wait and task.status not in render.TERMINAL:
        _follow(client, task_id, output)
        return
    if output is Output.json:
        render.print_json(task)
    elif task.status in render.TERMINAL:
        render.console().print(f"task {task.task_id} {render.status_name(task.status)}")
    else:
        render.console().print(render_tasks.cancel_requested(task), highlight=False)


@app.command()
def watch(ctx: typer.Context, task_id: TaskIdArg, output: OutputOpt = Output.table) -> None:
    """Follow a task live until it ends, one line per change, then its step results.

    While it runs, a line per step as it ends (its host reports it with its next lease
    renewal) and one for the step running, with its time so far.

    Exit code: 0 done, 8 failed, 9 cancelled. With --output json, prints the final task.
    """
    _follow(options.client(ctx), task_id, output)


def _follow(client: Client, task_id: str, output: Output) -> NoReturn:
    def show(task: task_pb2.Task, before: task_pb2.Task | None) -> None:
        line = render_tasks.progress_line(task, before)
        if line is not None:
            out.print(line)
        for step in render_tasks.step_lines(task, before):
            out.print(step)

    out = render.console()
    people = output is Output.table
    final = follow(
        client,
        task_id,
        show if people else lambda task, before: None,
        render.note if people else None,
    )
    if people:
        if final.result.steps:
            render_tasks.steps_table(final, out)
    else:
        render.print_json(final)
    options.exit_with(outcome_exit(final))


# -- artifacts -------------------------------------------------------------------------------


@app.command("artifacts")
def list_artifacts(ctx: typer.Context, task_id: TaskArg, output: OutputOpt = Output.table) -> None:
    """The files a task's steps kept (screenshots, UI dumps): attempt, step, kind, size,
    sha256."""
    found = options.client(ctx).list_artifacts(task_id)
    document = {"artifacts": [render.to_dict(a) for a in found]}
    options.show(output, document, lambda: render_tasks.artifacts_table(found))


@app.command("artifact")
def get_artifact(
    ctx: typer.Context,
    task_id: TaskArg,
    step: Annotated[str, typer.Argument(metavar="STEP", help="Step number (from 1) or name.")],
    output: Annotated[
        str,
        typer.Option("--output", "-o", metavar="FILE", help="Where to write it; - for stdout."),
    ],
    attempt: Annotated[
        int | None,
        typer.Option(help="Of this attempt (default: the latest that kept one).", min=1),
    ] = None,
    action: Annotated[
        int | None,
        typer.Option(help="The action inside the step (from 1), when it kept several.", min=1),
    ] = None,
) -> None:
    """Write one file a step kept (a screenshot's PNG, a ui_dump's XML), its sha256
    checked."""
    client = options.client(ctx)
    found = client.list_artifacts(task_id)
    chosen = artifact_download.choose(found, task_id, step, attempt, action)
    size = artifact_download.write(chosen, client.get_artifact(task_id, chosen.artifact_id), output)
    if output != "-":
        step = step_label(chosen.step_index, chosen.step_name)
        render.note(f"wrote {chosen.kind} of {step}, {size} bytes, to {output}")
