"""`amc devices`: cordon or uncordon one device; release one from quarantine."""

from __future__ import annotations

from typing import Annotated

import typer

from amc_cli import options, render
from amc_cli.options import Output, OutputOpt, ReasonOpt

app = options.group(
    "Devices (operator role): cordon or uncordon one; release one from quarantine.",
    no_args_is_help=True,
)
SerialArg = Annotated[str, typer.Argument(metavar="SERIAL", help="Device serial.")]
DeviceHostOpt = Annotated[
    str | None,
    typer.Option(
        "--host",
        help="The device's host; needed only when several hosts have a device with this serial.",
        show_default=False,
    ),
]


def _device_operation(
    ctx: typer.Context,
    operation: str,
    serial: str,
    host_id: str | None,
    reason: str,
    output: Output,
) -> None:
    response = options.client(ctx).device_operation(operation, host_id or "", serial, reason)
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
    app.command(operation)(command)


_device_command("cordon", "Give one device no new work; its running task goes on.")
_device_command("uncordon", "Give the device work again.")
_device_command(
    "release",
    "Take a quarantined device out of quarantine: its host probes it and, if it answers and "
    "has booted, gives it work again. Refused (exit 4) when it is not quarantined or its "
    "host is not connected.",
)
