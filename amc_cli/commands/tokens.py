"""`amc tokens`: create, list and revoke bearer tokens."""

from __future__ import annotations

import enum
from typing import Annotated

import typer

from amc.v1 import admin_pb2
from amc_cli import options, render, render_hosts
from amc_cli.options import Output, OutputOpt

app = options.group("Bearer tokens (operator role).", no_args_is_help=True)
TokenIdArg = Annotated[str, typer.Argument(metavar="ID", help="Token id.")]


class RoleName(enum.StrEnum):
    client = "client"
    operator = "operator"
    host = "host"

    @property
    def pb(self) -> admin_pb2.Role:
        return admin_pb2.Role.Value(f"ROLE_{self.name.upper()}")


@app.command("create")
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
    response = options.client(ctx).create_token(role.pb, host_id or "", name, team)
    if output is Output.json:
        render.print_json(response)
        return
    team_note = f" of team {team}" if team else ""
    render.note(
        f"created {role} token {response.info.token_id}{team_note}; it is shown only now, so "
        "keep it safe"
    )
    typer.echo(response.token)


@app.command("list")
def tokens_list(ctx: typer.Context, output: OutputOpt = Output.table) -> None:
    """List tokens (never their secrets)."""
    response = options.client(ctx).list_tokens()
    options.show(output, response, lambda: render_hosts.tokens_table(response.tokens))


@app.command("revoke")
def tokens_revoke(
    ctx: typer.Context, token_id: TokenIdArg, output: OutputOpt = Output.table
) -> None:
    """Revoke a token: calls made with it fail from now on."""
    response = options.client(ctx).revoke_token(token_id)
    options.show(output, response, lambda: render_hosts.token_info(response.info, "revoked"))
