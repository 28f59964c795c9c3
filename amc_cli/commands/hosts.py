"""`amc hosts`: list the hosts; cordon, uncordon, drain, show, remove one."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from amc.v1 import admin_pb2
from amc_cli import options, render, render_hosts
from amc_cli.options import Output, OutputOpt, ReasonOpt

app = options.group(
    "Hosts (operator role): list them; cordon, drain, uncordon, remove one.",
    no_args_is_help=False,
)
# How often `amc hosts drain --wait` asks whether the host still runs tasks.
DRAIN_POLL = 1.0


@app.callback(invoke_without_command=True)
def hosts(ctx: typer.Context, output: OutputOpt = Output.table) -> None:
    """Hosts, their devices and which task holds each device; with a command, take a host
    out of service and back (operator role)."""
    if ctx.invoked_subcommand is not None:
        return
    response = options.client(ctx).list_hosts()
    options.show(output, response, lambda: render_hosts.hosts_table(response))


HostArg = Annotated[str, typer.Argument(metavar="HOST", help="Host id.")]
EventsOpt = Annotated[int, options.events_option("events")]


def _host_operation(
    ctx: typer.Context, operation: str, host_id: str, reason: str, output: Output
) -> admin_pb2.HostOperationResponse:
    response = options.client(ctx).host_operation(operation, host_id, reason)
    options.show(output, response, render_hosts.host_line(response.host, response.leases))
    return response


@app.command("cordon")
def hosts_cordon(
    ctx: typer.Context, host_id: HostArg, reason: ReasonOpt = "", output: OutputOpt = Output.table
) -> None:
    """Give the host no new work; its running tasks go on."""
    _host_operation(ctx, "cordon", host_id, reason, output)


@app.command("uncordon")
def hosts_uncordon(
    ctx: typer.Context, host_id: HostArg, reason: ReasonOpt = "", output: OutputOpt = Output.table
) -> None:
    """Give the host work again (ends a drain too): queued work that fits goes to it at once."""
    _host_operation(ctx, "uncordon", host_id, reason, output)


@app.command("drain")
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
    client = options.client(ctx)
    leases = response.leases
    while leases:
        time.sleep(DRAIN_POLL)
        now = client.get_host(host_id).leases
        if now != leases and output is Output.table:
            render.note(f"host {host_id}: {now} task(s) running")
        leases = now
    if output is Output.table:
        render.console().print(f"host {host_id} drained: no task running", highlight=False)


@app.command("show")
def hosts_show(
    ctx: typer.Context, host_id: HostArg, events: EventsOpt = 20, output: OutputOpt = Output.table
) -> None:
    """One host with its devices, then who cordoned, drained or uncordoned it (or its
    devices), when and why, newest first."""
    response = options.client(ctx).get_host(host_id, events)
    options.show(output, response, lambda: render_hosts.host_detail(response))


@app.command("remove")
def hosts_remove(ctx: typer.Context, host_id: HostArg, reason: ReasonOpt = "") -> None:
    """Forget a disconnected host that holds no lease, and its devices.

    Refused (exit 4) while the host is connected or holds leases: stop its agent first
    (drain it to let its tasks finish). A host that registers again comes back.
    """
    options.client(ctx).remove_host(host_id, reason)
    render.console().print(f"host {host_id} removed", highlight=False)
