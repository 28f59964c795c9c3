"""What the commands share: the connection flags (a `Client` made on first use, so
`--help` needs none), `--output` and `--reason`, and KEY=VALUE and DURATION values read
from flags."""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from google.protobuf import duration_pb2
from google.protobuf.message import Message

from amc_cli import render
from amc_cli.client import Client, Target, read_token
from amc_cli.errors import EXIT_CODES_HELP, BadInput, ExitCode
from amc_common import durations
from amc_common.channel import with_default_port
from amc_common.durations import parse_duration


class Output(enum.StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[
    Output,
    typer.Option(
        "--output",
        "-o",
        envvar="AMC_OUTPUT",
        case_sensitive=False,
        help="table for people, json for scripts.",
    ),
]
ReasonOpt = Annotated[str, typer.Option("--reason", "-r", help="Why: recorded with who did it.")]


def group(help: str, *, no_args_is_help: bool) -> typer.Typer:
    """A command group (`amc hosts ...`): its help in markdown, the exit codes below it."""
    return typer.Typer(
        help=help,
        no_args_is_help=no_args_is_help,
        rich_markup_mode="markdown",
        epilog=EXIT_CODES_HELP,
    )


def events_option(what: str) -> Any:
    """`--events/-n N`: how many of the latest operator events (`what`) a `show` lists."""
    return typer.Option("--events", "-n", min=0, max=1000, help=f"How many latest {what}.")


def show(
    output: Output, answer: Message | dict[str, Any], for_people: str | Callable[[], None]
) -> None:
    """The answer as one JSON document with `--output json`; otherwise `for_people`: a line
    to print, or what prints the tables."""
    if output is Output.json:
        render.print_json(answer)
    elif isinstance(for_people, str):
        render.console().print(for_people, highlight=False)
    else:
        for_people()


def duration_option(help: str) -> Any:
    """A --option taking a duration ("30s", "5m"), with no default shown."""
    return typer.Option(metavar="DURATION", help=help, show_default=False)


# The range of a message's int32 field: a number past it is refused as the flag's, before
# the request is made; the control plane's own range for the field is its to name.
INT32_MAX = 2**31 - 1


def int32_option(help: str, lowest: int = -(2**31)) -> Any:
    """A --option taking an integer that goes into an int32 field, `lowest` or more."""
    return typer.Option(help=help, min=lowest, max=INT32_MAX)


@dataclass
class Connection:
    """The connection flags; the client is made on first use, so `--help` needs none."""

    addr: str
    token: str | None = field(repr=False)
    token_file: Path | None
    ca: Path | None
    tls: bool
    timeout: float
    retry_for: float | None = None
    _client: Client | None = field(default=None, repr=False)

    def client(self) -> Client:
        if self._client is None:
            token = read_token(self.token, self.token_file)
            target = Target(
                with_default_port(self.addr), token, self.ca, self.tls, self.timeout, self.retry_for
            )
            self._client = Client(target, on_retry=render.note)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def connection(ctx: typer.Context) -> Connection:
    """The connection the root command's flags describe."""
    found: Connection = ctx.find_root().obj
    return found


def client(ctx: typer.Context) -> Client:
    return connection(ctx).client()


def exit_with(code: ExitCode) -> NoReturn:
    raise typer.Exit(int(code))


def key_values(values: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput(f"{flag}: expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def duration(value: str | None, flag: str) -> duration_pb2.Duration | None:
    """A flag's duration (amc_common.durations' grammar), 0 or more; None: not given."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise BadInput(f"{flag}: {exc}") from None


def positive_seconds(value: str, flag: str) -> float:
    """A flag's time above 0, in seconds, as every program reads one."""
    try:
        return durations.above_zero(value)
    except argparse.ArgumentTypeError as exc:
        raise BadInput(f"{flag}: {exc}") from None
