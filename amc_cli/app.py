"""The root `amc` command: the connection flags every command shares, `--version`, and the
command groups of amc_cli.commands added in the order `amc --help` lists them. Each
command reads its flags, makes its calls through `Client` and hands the answer to
`render`; failures are raised as `CliError` and printed by __main__."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperOption

from amc_cli.commands import adb, agents, apps, devices, hosts, logs, queue, tasks, tokens
from amc_cli.errors import EXIT_CODES_HELP, BadInput
from amc_cli.options import Connection, duration, positive_seconds
from amc_common import durations
from amc_common.channel import DEFAULT_PORT
from amc_common.version import version_line

DEFAULT_ADDR = f"127.0.0.1:{DEFAULT_PORT}"

app = typer.Typer(
    name="amc",
    help="Operate an Agentic Mobile Control phone farm: submit, follow and cancel tasks, "
    "see hosts and devices, keep apps for tasks to install, manage tokens."
    f" {durations.GRAMMAR}",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
app.add_typer(tasks.app)
app.add_typer(logs.app)
app.add_typer(agents.app)
app.add_typer(adb.app)
app.add_typer(tokens.app, name="tokens")
app.add_typer(hosts.app, name="hosts")
app.add_typer(devices.app, name="devices")
app.add_typer(queue.app, name="queue")
app.add_typer(apps.app, name="apps")
app.add_typer(apps.files, name="files")


def _flags_take_no_value() -> None:
    """typer's help shows `<bool>` beside a flag (--wait, --tls, --help) as if it took a
    value; a flag takes none, so it is shown without one."""
    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()


def _from_command_line(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def token_source(
    token: str | None, token_file: Path | None, token_flag: bool, file_flag: bool
) -> tuple[str | None, Path | None]:
    """Which of --token/AMC_TOKEN and --token-file/AMC_TOKEN_FILE is used: a flag beats the
    environment; both flags are a mistake; both variables: AMC_TOKEN."""
    if token_flag and file_flag:
        raise BadInput("give --token or --token-file, not both")
    if file_flag or (token_file is not None and not token):
        return None, token_file
    return token, None


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line("amc"))
        raise typer.Exit()


@app.callback()
def connect(
    ctx: typer.Context,
    addr: Annotated[
        str,
        typer.Option(
            envvar="AMC_ADDR",
            help=f"Control plane address, host:port (the port defaults to {DEFAULT_PORT}).",
        ),
    ] = DEFAULT_ADDR,
    token: Annotated[
        str | None,
        typer.Option(envvar="AMC_TOKEN", help="Bearer token.", show_default=False),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option(
            envvar="AMC_TOKEN_FILE",
            help="File holding the bearer token; given as a flag, it beats AMC_TOKEN.",
        ),
    ] = None,
    ca: Annotated[
        Path | None,
        typer.Option(envvar="AMC_CA", help="PEM CA bundle: use TLS and trust this CA."),
    ] = None,
    tls: Annotated[
        bool,
        typer.Option("--tls", envvar="AMC_TLS", help="Use TLS with the system's CAs."),
    ] = False,
    timeout: Annotated[
        str,
        typer.Option(
            envvar="AMC_TIMEOUT",
            metavar="DURATION",
            help="How long to wait for each answer (a number: seconds).",
        ),
    ] = "30s",
    retry_for: Annotated[
        str | None,
        typer.Option(
            envvar="AMC_RETRY_FOR",
            metavar="DURATION",
            help="Keep trying cancel (and drain --wait's polls) this long (e.g. 2m) while the "
            "control plane is unavailable, even one that has not answered yet. Without it they "
            "are tried again only once it has answered, for up to --timeout.",
            show_default=False,
        ),
    ] = None,
    _version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Operate an Agentic Mobile Control phone farm."""
    token, token_file = token_source(
        token,
        token_file,
        _from_command_line(ctx, "token"),
        _from_command_line(ctx, "token_file"),
    )
    retry = duration(retry_for, "--retry-for")
    seconds = None if retry is None else retry.ToTimedelta().total_seconds()
    wait = positive_seconds(timeout, "--timeout")
    connection = Connection(addr, token, token_file, ca, tls, wait, seconds)
    ctx.obj = connection
    ctx.call_on_close(connection.close)
