"""`amc queue`: what waits, by selector and by fairness key; set or show a key's share."""

from __future__ import annotations

from typing import Annotated

import typer

from amc_cli import options, render, render_queue
from amc_cli.errors import BadInput
from amc_cli.options import Output, OutputOpt, ReasonOpt

app = options.group(
    "The queue (operator role): what waits, by selector and by fairness key; set a "
    "key's share of the phones.",
    no_args_is_help=False,
)


@app.callback(invoke_without_command=True)
def queue(ctx: typer.Context, output: OutputOpt = Output.table) -> None:
    """What waits, as the control plane last counted it (every few seconds): by selector
    (queued, oldest wait, the devices it matches, why), then by fairness key (queued,
    running, cap, weight, oldest wait)."""
    if ctx.invoked_subcommand is not None:
        return
    client = options.client(ctx)
    waiting, shares = client.get_queue(), client.list_fair_shares()
    document = {**render.to_dict(waiting), "fair_shares": render.to_dict(shares)["shares"]}
    options.show(output, document, lambda: render_queue.queue_tables(waiting, shares))


KeyArg = Annotated[str, typer.Argument(metavar="KEY", help="Fairness key (a team).")]
ChangesOpt = Annotated[int, options.events_option("changes")]


@app.command("set")
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
            max=options.INT32_MAX,
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
    response = options.client(ctx).set_fair_share(key, weight or 0, max_devices, no_cap, reason)
    options.show(output, response, render_queue.fair_share_line(response.share))


@app.command("show")
def queue_show(
    ctx: typer.Context, key: KeyArg, events: ChangesOpt = 20, output: OutputOpt = Output.table
) -> None:
    """One fairness key: its share and tasks, then who changed its share, when and why,
    newest first."""
    response = options.client(ctx).get_fair_share(key, events)
    options.show(output, response, lambda: render_queue.fair_share_detail(response))
