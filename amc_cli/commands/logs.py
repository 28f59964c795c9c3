"""`amc logs TASK`: a task's phone log (Scheduler.StreamLogs) — the log an ended attempt
kept, or the running attempt's live tail, `--follow`ed as the phone writes it; filtered by
priority and tag on the control plane; printed as logcat prints it (`-v threadtime -v
usec`), with the lines that mark each step's beginning and end."""

from __future__ import annotations

import sys
from typing import Annotated

import grpc
import typer

from amc_cli import options
from amc_cli.errors import BadInput
from amc_common import logcat

app = typer.Typer(rich_markup_mode="markdown")


@app.command("logs")
def logs(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="TASK", help="Task id.")],
    follow: Annotated[
        bool,
        typer.Option(
            "--follow",
            "-f",
            help="Keep printing the running attempt's lines as they come, until it ends"
            " (a task still queued is waited for).",
        ),
    ] = False,
    level: Annotated[
        str,
        typer.Option(
            "--level",
            metavar="LEVEL",
            help="Only lines of this priority or higher: V, D, I, W, E, F (or verbose …"
            " fatal). Step marks always show.",
            show_default=False,
        ),
    ] = "",
    tag: Annotated[
        list[str] | None,
        typer.Option("--tag", "-t", metavar="TAG", help="Only lines of this tag (repeatable)."),
    ] = None,
    attempt: Annotated[
        int,
        typer.Option(help="Of this attempt (default: the latest).", min=0, show_default=False),
    ] = 0,
) -> None:
    """Print a task's phone log: the log its attempt kept once it ended, or the running
    attempt's recent lines (its whole log is kept when it ends); with --follow, each line
    as the phone writes it until the attempt ends."""
    try:
        wanted, tags = logcat.level(level), sorted(logcat.tags(tag or ()))
    except ValueError as exc:
        raise BadInput(f"--level/--tag: {exc}") from None
    client = options.client(ctx)
    out = sys.stdout
    try:
        for message in client.stream_logs(task_id, attempt, follow, wanted, tags):
            if message.lines:
                out.write("".join(f"{line}\n" for line in message.lines))
                out.flush()
    except grpc.RpcError as exc:
        raise client.failed(exc, "read log") from None
