"""`amc adb`: a phone of the farm on a local port for the real `adb` client, under an
interactive session's lease (amc_cli.adb_session)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Annotated

import typer

from amc_cli import options, render
from amc_cli.adb_session import DoorOptions, run_door
from amc_cli.client import read_token
from amc_cli.errors import BadInput
from amc_common import durations
from amc_common.channel import with_default_port

app = typer.Typer(rich_markup_mode="markdown")
# The idle timeout's range (a session's: 1 s to 1 hour) and the longest duration's.
IDLE = (1.0, 3600.0)
LONGEST = (1.0, 7 * 86400.0)


@app.command("adb")
def adb(
    ctx: typer.Context,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            "-l",
            metavar="KEY=VALUE",
            help="A label the phone must have (repeatable).",
            show_default=False,
        ),
    ] = None,
    serial: Annotated[str, typer.Option(help="The phone, by serial.", show_default=False)] = "",
    port: Annotated[
        int,
        typer.Option(min=0, max=65535, help="The local port to listen on (0: a free one)."),
    ] = 0,
    idle_timeout: Annotated[
        str,
        typer.Option(
            metavar="DURATION",
            help="The session ends when no adb stream is open and none was for this long"
            " (1s to 1h).",
        ),
    ] = "10m",
    max_duration: Annotated[
        str | None,
        typer.Option(
            metavar="DURATION",
            help="The longest the phone is kept (1s to 7d).",
            show_default=False,
        ),
    ] = None,
    queue_timeout: Annotated[
        str,
        typer.Option(metavar="DURATION", help="How long to wait for a phone."),
    ] = "5m",
    adb_key: Annotated[
        list[Path] | None,
        typer.Option(
            metavar="FILE",
            help="An adbkey.pub whose key may connect (repeatable; default: your own,"
            " ~/.android/adbkey.pub).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Take a phone with an interactive session (the same queue, fair shares and lease)
    and serve it on 127.0.0.1 for `adb connect`: then `adb shell`, `install`, `push`,
    `pull`, `logcat` and `forward` work as on a USB phone, until you stop this (Ctrl-C:
    the session ends done) or the session ends (cancelled, lease lost, idle): the phone
    then goes offline. Only an adb server signing with your adb key may connect."""
    door = DoorOptions(
        address=with_default_port(options.connection(ctx).addr),
        token=read_token(options.connection(ctx).token, options.connection(ctx).token_file),
        ca_file=options.connection(ctx).ca,
        tls=options.connection(ctx).tls,
        labels=options.key_values(label, "--label"),
        serial=serial,
        port=port,
        idle_timeout=_within(idle_timeout, IDLE, "--idle-timeout"),
        max_duration=None
        if max_duration is None
        else _within(max_duration, LONGEST, "--max-duration"),
        queue_timeout=options.positive_seconds(queue_timeout, "--queue-timeout"),
        keys=tuple(adb_key or ()),
    )
    for path in door.keys:
        if not path.is_file():
            raise BadInput(f"--adb-key {path}: no such file")
    code = asyncio.run(run_door(door, render.note, _show))
    raise typer.Exit(code)


def _show(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _within(text: str, span: tuple[float, float], flag: str) -> float:
    """A flag's duration within `span` seconds; one line naming the flag if not."""
    try:
        return durations.within(text, *span)
    except argparse.ArgumentTypeError as exc:
        raise BadInput(f"{flag}: {exc}") from None
