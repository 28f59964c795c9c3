"""The `amc` commands. Each one reads its flags, makes its calls through `Client` and
hands the answer to `render`; failures are raised as `CliError` and printed by __main__."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from google.protobuf import duration_pb2
from typer.core import TyperOption

from amc.v1 import admin_pb2, scheduler_pb2, task_pb2
from amc_cli import artifacts, render, selectors
from amc_cli.client import Client, Target, read_token
from amc_cli.errors import EXIT_CODES_HELP, BadInput, CliError, ExitCode, RpcFailed
from amc_cli.follow import follow, outcome_exit
from amc_cli.specfile import load_request, parse_duration, with_flags
from amc_common.channel import DEFAULT_PORT, with_default_port
from amc_common.version import version_line

DEFAULT_ADDR = f"127.0.0.1:{DEFAULT_PORT}"


def _duration_option(help: str) -> Any:
    """A --option taking a duration ("30s", "5m"), with no default shown."""
    return typer.Option(metavar="DURATION", help=help, show_default=False)


app = typer.Typer(
    name="amc",
    help="Operate an Agentic Mobile Control phone farm: submit, follow and cancel tasks, "
    "see hosts and devices, manage tokens.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
tokens_app = typer.Typer(
    help="Bearer tokens (operator role).",
    no_args_is_help=True,
    rich_markup_mode="markdown",
    epilog=EXIT_CODES_HELP,
)
app.add_typer(tokens_app, name="tokens")
hosts_app = typer.Typer(
    help="Hosts (operator role): list them; cordon, drain, uncordon, remove one.",
    rich_markup_mode="markdown",
    epilog=EXIT_CODES_HELP,
)
app.add_typer(hosts_app, name="hosts")
devices_app = typer.Typer(
    help="Devices (operator role): cordon or uncordon one; release one from quarantine.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
    epilog=EXIT_CODES_HELP,
)
app.add_typer(devices_app, name="devices")
queue_app = typer.Typer(
    help="The queue (operator role): what waits, by selector and by fairness key; set a "
    "key's share of the phones.",
    rich_markup_mode="markdown",
    epilog=EXIT_CODES_HELP,
)
app.add_typer(queue_app, name="queue")
# How often `amc hosts drain --wait` asks whether the host still runs tasks.
DRAIN_POLL = 1.0


class Output(enum.StrEnum):
    table = "table"
    json = "json"


class Status(enum.StrEnum):
    queued = "queued"
    assigned = "assigned"
    dispatched = "dispatched"
    done = "done"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def pb(self) -> task_pb2.TaskStatus:
        return task_pb2.TaskStatus.Value(f"TASK_STATUS_{self.name.upper()}")


class RoleName(enum.StrEnum):
    client = "client"
    operator = "operator"
    host = "host"

    @property
    def pb(self) -> admin_pb2.Role:
        return admin_pb2.Role.Value(f"ROLE_{self.name.upper()}")


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


def _flags_take_no_value() -> None:
    """typer's help shows `<bool>` beside a flag (--wait, --tls, --help) as if it took a
    value; a flag takes none, so it is shown without one."""
    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()


@dataclass
class Session:
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


def _client(ctx: typer.Context) -> Client:
    session: Session = ctx.find_root().obj
    return session.client()


def _exit(code: ExitCode) -> NoReturn:
    raise typer.Exit(int(code))


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


def _key_values(values: list[str] | None, flag: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise BadInput(f"{flag}: expected KEY=VALUE, got {item!r}")
        out[key] = value
    return out


def _duration(value: str | None, flag: str) -> duration_pb2.Duration | None:
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise BadInput(f"{flag}: {exc}") from None


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
        float, typer.Option(envvar="AMC_TIMEOUT", help="Seconds to wait for each answer.")
    ] = 30.0,
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
    retry = _duration(retry_for, "--retry-for")
    seconds = None if retry is None else retry.ToTimedelta().total_seconds()
    session = Session(addr, token, token_file, ca, tls, timeout, seconds)
    ctx.obj = session
    ctx.call_on_close(session.close)


# -- tasks -----------------------------------------------------------------------------------


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
    priority: Annotated[int | None, typer.Option(help="Higher runs first.")] = None,
    max_attempts: Annotated[int | None, typer.Option(help="Attempts before failing.")] = None,
    request_id: Annotated[
        str | None, typer.Option(help="Idempotency key: resubmitting returns the same task.")
    ] = None,
    metadata: Annotated[
        list[str] | None,
        typer.Option("--metadata", "-m", metavar="KEY=VALUE", help="Metadata to attach."),
    ] = None,
    queue_timeout: Annotated[
        str | None,
        _duration_option("Fail the task if it waits in the queue longer than this (e.g. 5m)."),
    ] = None,
    deadline: Annotated[
        str | None,
        _duration_option("Fail an attempt that runs longer than this (e.g. 30s); not retried."),
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
        labels=_key_values(label, "--label"),
        priority=priority,
        max_attempts=max_attempts,
        request_id=request_id,
        metadata=_key_values(metadata, "--metadata"),
        queue_timeout=_duration(queue_timeout, "--queue-timeout"),
        deadline=_duration(deadline, "--deadline"),
        fairness_key=fairness_key,
    )
    client = _client(ctx)
    _check_selector(client, request, strict)
    task = client.submit(request)
    if not wait:
        if output is Output.json:
            render.print_json(task)
        else:
            render.console().print(
                f"submitted task {task.task_id} ({render.status_name(task.status)})",
                highlight=False,
            )
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
def get(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID", help="Task id.")],
    output: OutputOpt = Output.table,
) -> None:
    """Show one task: status, where it runs, its spec, step results, attempts and events."""
    client = _client(ctx)
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
        render.task_detail(task)
        render.history_tables(attempts, events)


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
    statuses = [s.pb for s in status or []]
    tasks, next_page = _client(ctx).list_tasks(statuses, host or "", limit)
    if output is Output.json:
        render.print_json(
            {"tasks": [render.to_dict(t) for t in tasks], "next_page_token": next_page}
        )
    else:
        render.task_table(tasks)
    if next_page and output is Output.table:
        render.note(f"showing the first {len(tasks)}; raise --limit for more")


@app.command()
def cancel(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID", help="Task id.")],
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
    client = _client(ctx)
    task = client.cancel(task_id, reason)
    if wait and task.status not in render.TERMINAL:
        _follow(client, task_id, output)
        return
    if output is Output.json:
        render.print_json(task)
    elif task.status in render.TERMINAL:
        render.console().print(f"task {task.task_id} {render.status_name(task.status)}")
    else:
        render.console().print(render.cancel_requested(task), highlight=False)


@app.command()
def watch(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="ID", help="Task id.")],
    output: OutputOpt = Output.table,
) -> None:
    """Follow a task live until it ends, one line per change, then its step results.

    While it runs, a line per step as it ends (its host reports it with its next lease
    renewal) and one for the step running, with its time so far.

    Exit code: 0 done, 8 failed, 9 cancelled. With --output json, prints the final task.
    """
    _follow(_client(ctx), task_id, output)


def _follow(client: Client, task_id: str, output: Output) -> NoReturn:
    def show(task: task_pb2.Task, before: task_pb2.Task | None) -> None:
        line = render.progress_line(task, before)
        if line is not None:
            out.print(line)
        for step in render.step_lines(task, before):
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
            render.steps_table(final, out)
    else:
        render.print_json(final)
    _exit(outcome_exit(final))


# -- artifacts -------------------------------------------------------------------------------


@app.command("artifacts")
def list_artifacts(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="TASK", help="Task id.")],
    output: OutputOpt = Output.table,
) -> None:
    """The files a task's steps kept (screenshots, UI dumps): attempt, step, kind, size,
    sha256."""
    found = _client(ctx).list_artifacts(task_id)
    if output is Output.json:
        render.print_json({"artifacts": [render.to_dict(a) for a in found]})
    else:
        render.artifacts_table(found)


@app.command("artifact")
def get_artifact(
    ctx: typer.Context,
    task_id: Annotated[str, typer.Argument(metavar="TASK", help="Task id.")],
    step: Annotated[str, typer.Argument(metavar="STEP", help="Step index or name.")],
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
        typer.Option(help="The action inside the step, when it kept several.", min=0),
    ] = None,
) -> None:
    """Write one file a step kept (a screenshot's PNG, a ui_dump's XML), its sha256
    checked."""
    client = _client(ctx)
    chosen = artifacts.choose(client.list_artifacts(task_id), task_id, step, attempt, action)
    size = artifacts.write(chosen, client.get_artifact(task_id, chosen.artifact_id), output)
    if output != "-":
        render.note(f"wrote {chosen.kind} of step {chosen.step_index} ({size} bytes) to {output}")


# -- agents ----------------------------------------------------------------------------------


@app.command("mcp")
def mcp(
    ctx: typer.Context,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label",
            "-l",
            metavar="KEY=VALUE",
            help="The phones a session asks for unless the agent names others (repeatable).",
            show_default=False,
        ),
    ] = None,
    serial: Annotated[
        str, typer.Option(help="The phone a session asks for, by serial.", show_default=False)
    ] = "",
    idle_timeout: Annotated[
        str,
        typer.Option(
            metavar="DURATION", help="A session the agent leaves idle this long ends failed."
        ),
    ] = "5m",
) -> None:
    """Serve MCP on stdin/stdout: an AI agent drives phones of the farm through interactive
    sessions (tools list_phones, open_session, screenshot, ui_dump, tap, tap_element, swipe,
    type_text, press_key, launch_app, stop_app, close_session). Needs the `mcp` extra."""
    labels = _key_values(label, "--label")
    idle = _duration(idle_timeout, "--idle-timeout")
    assert idle is not None
    try:
        from amc_client import mcp_server
    except ImportError as exc:
        raise BadInput(
            f"amc mcp needs the mcp extra ({exc.name} is not installed): "
            "pip install 'agentic-mobile-control[mcp]'"
        ) from None
    session: Session = ctx.find_root().obj
    mcp_server.run(
        with_default_port(session.addr),
        token=read_token(session.token, session.token_file),
        ca_file=session.ca,
        tls=session.tls,
        labels=labels,
        serial=serial,
        idle_timeout=idle.ToTimedelta().total_seconds(),
    )


# -- hosts and tokens ------------------------------------------------------------------------


@hosts_app.callback(invoke_without_command=True)
def hosts(ctx: typer.Context, output: OutputOpt = Output.table) -> None:
    """Hosts, their devices and which task holds each device; with a command, take a host
    out of service and back (operator role)."""
    if ctx.invoked_subcommand is not None:
        return
    response = _client(ctx).list_hosts()
    if output is Output.json:
        render.print_json(response)
    else:
        render.hosts_table(response)


HostArg = Annotated[str, typer.Argument(metavar="HOST", help="Host id.")]
ReasonOpt = Annotated[str, typer.Option("--reason", "-r", help="Why: recorded with who did it.")]
SerialArg = Annotated[str, typer.Argument(metavar="SERIAL", help="Device serial.")]
DeviceHostOpt = Annotated[
    str | None,
    typer.Option(
        "--host",
        help="The device's host; needed only when several hosts have a device with this serial.",
        show_default=False,
    ),
]


def _host_operation(
    ctx: typer.Context, operation: str, host_id: str, reason: str, output: Output
) -> admin_pb2.HostOperationResponse:
    response = _client(ctx).host_operation(operation, host_id, reason)
    if output is Output.json:
        render.print_json(response)
    else:
        render.console().print(render.host_line(response.host, response.leases), highlight=False)
    return response


@hosts_app.command("cordon")
def hosts_cordon(
    ctx: typer.Context, host_id: HostArg, reason: ReasonOpt = "", output: OutputOpt = Output.table
) -> None:
    """Give the host no new work; its running tasks go on."""
    _host_operation(ctx, "cordon", host_id, reason, output)


@hosts_app.command("uncordon")
def hosts_uncordon(
    ctx: typer.Context, host_id: HostArg, reason: ReasonOpt = "", output: OutputOpt = Output.table
) -> None:
    """Give the host work again (ends a drain too): queued work that fits goes to it at once."""
    _host_operation(ctx, "uncordon", host_id, reason, output)


@hosts_app.command("drain")
def hosts_drain(
    ctx: typer.Context,
    host_id: HostArg,
    reason: ReasonOpt = "",
    wait: Annotated[
        bool, typer.Option("--wait", "-w", help="Return when the host holds no lease.")
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Cordon the host and tell its agent to finish its running tasks and take no more.

    The agent stays connected and idle (as after SIGTERM, but without exiting) until
    `amc hosts uncordon`. With --wait, returns once its last task has ended (checked every
    second, for as long as it takes; Ctrl-C stops waiting, not the drain).
    """
    response = _host_operation(ctx, "drain", host_id, reason, output)
    if not wait or response.leases == 0:
        return
    client = _client(ctx)
    leases = response.leases
    while leases:
        time.sleep(DRAIN_POLL)
        now = client.get_host(host_id).leases
        if now != leases and output is Output.table:
            render.note(f"host {host_id}: {now} task(s) running")
        leases = now
    if output is Output.table:
        render.console().print(f"host {host_id} drained: no task running", highlight=False)


@hosts_app.command("show")
def hosts_show(
    ctx: typer.Context,
    host_id: HostArg,
    events: Annotated[
        int, typer.Option("--events", "-n", min=0, max=1000, help="How many latest events.")
    ] = 20,
    output: OutputOpt = Output.table,
) -> None:
    """One host with its devices, then who cordoned, drained or uncordoned it (or its
    devices), when and why, newest first."""
    response = _client(ctx).get_host(host_id, events)
    if output is Output.json:
        render.print_json(response)
    else:
        render.host_detail(response)


@hosts_app.command("remove")
def hosts_remove(ctx: typer.Context, host_id: HostArg, reason: ReasonOpt = "") -> None:
    """Forget a disconnected host that holds no lease, and its devices.

    Refused (exit 4) while the host is connected or holds leases: stop its agent first
    (drain it to let its tasks finish). A host that registers again comes back.
    """
    _client(ctx).remove_host(host_id, reason)
    render.console().print(f"host {host_id} removed", highlight=False)


def _device_operation(
    ctx: typer.Context,
    operation: str,
    serial: str,
    host_id: str | None,
    reason: str,
    output: Output,
) -> None:
    response = _client(ctx).device_operation(operation, host_id or "", serial, reason)
    if output is Output.json:
        render.print_json(response)
        return
    host = response.host.host_id
    if operation == "release":
        render.console().print(
            f"device {serial} on host {host} released from quarantine: its host probes it "
            "and reports its condition",
            highlight=False,
        )
        return
    verb = "cordoned" if operation == "cordon" else "uncordoned"
    render.console().print(f"device {serial} on host {host} {verb}", highlight=False)


def _device_command(operation: str, doc: str) -> None:
    """`amc devices OPERATION SERIAL [--host HOST]`: the same flags for each operation."""

    def command(
        ctx: typer.Context,
        serial: SerialArg,
        host: DeviceHostOpt = None,
        reason: ReasonOpt = "",
        output: OutputOpt = Output.table,
    ) -> None:
        _device_operation(ctx, operation, serial, host, reason, output)

    command.__doc__ = doc
    devices_app.command(operation)(command)


_device_command("cordon", "Give one device no new work; its running task goes on.")
_device_command("uncordon", "Give the device work again.")
_device_command(
    "release",
    "Take a quarantined device out of quarantine: its host probes it and, if it answers and "
    "has booted, gives it work again. Refused (exit 4) when it is not quarantined or its "
    "host is not connected.",
)


# -- the queue and fair shares ----------------------------------------------------------------


@queue_app.callback(invoke_without_command=True)
def queue(ctx: typer.Context, output: OutputOpt = Output.table) -> None:
    """What waits, as the control plane last counted it (every few seconds): by selector
    (queued, oldest wait, the devices it matches, why), then by fairness key (queued,
    running, cap, weight, oldest wait)."""
    if ctx.invoked_subcommand is not None:
        return
    client = _client(ctx)
    waiting, shares = client.get_queue(), client.list_fair_shares()
    if output is Output.json:
        render.print_json(
            {**render.to_dict(waiting), "fair_shares": render.to_dict(shares)["shares"]}
        )
    else:
        render.queue_tables(waiting, shares)


KeyArg = Annotated[str, typer.Argument(metavar="KEY", help="Fairness key (a team).")]


@queue_app.command("set")
def queue_set(
    ctx: typer.Context,
    key: KeyArg,
    weight: Annotated[
        int | None,
        typer.Option(
            min=1, max=1000, help="1 to 1000: keys take turns in proportion.", show_default=False
        ),
    ] = None,
    max_devices: Annotated[
        int | None,
        typer.Option(
            min=0,
            metavar="N",
            help="The most phones its tasks may hold at once (0: none until raised).",
            show_default=False,
        ),
    ] = None,
    no_cap: Annotated[bool, typer.Option("--no-cap", help="Remove the key's cap.")] = False,
    reason: ReasonOpt = "",
    output: OutputOpt = Output.table,
) -> None:
    """Set a fairness key's share of the phones: its weight among the keys whose tasks of
    equal priority want the same phones, and a cap of phones it may hold at once. What is
    not given stays as it is. Recorded with who did it and --reason (`amc queue show`)."""
    if max_devices is not None and no_cap:
        raise BadInput("give --max-devices or --no-cap, not both")
    if weight is None and max_devices is None and not no_cap:
        raise BadInput("nothing to set: give --weight, --max-devices or --no-cap")
    response = _client(ctx).set_fair_share(key, weight or 0, max_devices, no_cap, reason)
    if output is Output.json:
        render.print_json(response)
    else:
        render.console().print(render.fair_share_line(response.share), highlight=False)


@queue_app.command("show")
def queue_show(
    ctx: typer.Context,
    key: KeyArg,
    events: Annotated[
        int, typer.Option("--events", "-n", min=0, max=1000, help="How many latest changes.")
    ] = 20,
    output: OutputOpt = Output.table,
) -> None:
    """One fairness key: its share and tasks, then who changed its share, when and why,
    newest first."""
    response = _client(ctx).get_fair_share(key, events)
    if output is Output.json:
        render.print_json(response)
    else:
        render.fair_share_detail(response)


@tokens_app.command("create")
def tokens_create(
    ctx: typer.Context,
    role: Annotated[RoleName, typer.Option(case_sensitive=False, help="What the token may do.")],
    host_id: Annotated[
        str | None, typer.Option(help="The host a host token acts as.", show_default=False)
    ] = None,
    name: Annotated[str, typer.Option(help="A label to recognise it by.")] = "",
    team: Annotated[
        str,
        typer.Option(
            help="Client and operator tokens: the fairness key of the tasks submitted with it "
            "(unless a task names its own).",
        ),
    ] = "",
    output: OutputOpt = Output.table,
) -> None:
    """Create a token and print it. It is shown this once; only its hash is kept."""
    response = _client(ctx).create_token(role.pb, host_id or "", name, team)
    if output is Output.json:
        render.print_json(response)
        return
    team_note = f" of team {team}" if team else ""
    render.note(
        f"created {role} token {response.info.token_id}{team_note}; it is shown only now, so "
        "keep it safe"
    )
    typer.echo(response.token)


@tokens_app.command("list")
def tokens_list(ctx: typer.Context, output: OutputOpt = Output.table) -> None:
    """List tokens (never their secrets)."""
    response = _client(ctx).list_tokens()
    if output is Output.json:
        render.print_json(response)
    else:
        render.tokens_table(response.tokens)


@tokens_app.command("revoke")
def tokens_revoke(
    ctx: typer.Context,
    token_id: Annotated[str, typer.Argument(metavar="ID", help="Token id.")],
    output: OutputOpt = Output.table,
) -> None:
    """Revoke a token: calls made with it fail from now on."""
    response = _client(ctx).revoke_token(token_id)
    if output is Output.json:
        render.print_json(response)
    else:
        render.token_info(response.info, "revoked")
