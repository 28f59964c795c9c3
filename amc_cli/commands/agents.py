"""`amc mcp`: the farm's phones served to an AI agent over MCP (amc_client.mcp_server)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Annotated

import typer

from amc_cli import options
from amc_cli.client import read_token
from amc_cli.errors import BadInput
from amc_common.channel import with_default_port

app = typer.Typer(rich_markup_mode="markdown")


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
            metavar="DURATION",
            help="A session the agent leaves idle this long ends failed (1s to 1h).",
        ),
    ] = "5m",
    queue_timeout: Annotated[
        str,
        typer.Option(
            metavar="DURATION",
            help="How long open_session waits for a free phone before it gives up.",
        ),
    ] = "30s",
    sessions_per_client: Annotated[
        str | None,
        typer.Option(
            metavar="N",
            help="Sessions an agent may hold at once (1 to 100; default 1, with --http 4).",
            show_default=False,
        ),
    ] = None,
    http: Annotated[
        str | None,
        typer.Option(
            metavar="[HOST:]PORT",
            help="Serve MCP's streamable HTTP at http://HOST:PORT/mcp (HOST 127.0.0.1 unless"
            " given) instead of stdio, for many agents: each with its own bearer token (its AMC"
            " token).",
            show_default=False,
        ),
    ] = None,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            metavar="ORIGIN",
            help="A browser origin whose requests are taken (repeatable; none by default).",
            show_default=False,
        ),
    ] = None,
    http_cert: Annotated[
        str | None,
        typer.Option(metavar="FILE", help="Serve HTTPS with this certificate.", show_default=False),
    ] = None,
    http_key: Annotated[
        str | None,
        typer.Option(metavar="FILE", help="And this private key.", show_default=False),
    ] = None,
    reconnect_grace: Annotated[
        str,
        typer.Option(
            metavar="DURATION",
            help="How long an HTTP client whose event stream dropped has to come back before"
            " its sessions are abandoned (1s to 1h).",
        ),
    ] = "10s",
) -> None:
    """Serve MCP on stdin/stdout, or over HTTP for many agents (--http): AI agents drive
    phones of the farm through interactive sessions (tools list_phones, open_session,
    screenshot, ui_dump, tap, tap_element, swipe, type_text, press_key, launch_app,
    stop_app, install_app, wait_for, close_session). Needs the `mcp` extra."""
    labels = options.key_values(label, "--label")
    try:
        from amc_client import mcp_http, mcp_server
    except ImportError as exc:
        raise BadInput(
            f"amc mcp needs the mcp extra ({exc.name} is not installed): "
            "pip install 'agentic-mobile-control[mcp]'"
        ) from None
    idle = _within(mcp_server.within, idle_timeout, mcp_server.IDLE, "--idle-timeout")
    waits = _within(mcp_server.within, queue_timeout, mcp_server.QUEUE, "--queue-timeout")
    grace = _within(mcp_server.within, reconnect_grace, mcp_server.GRACE, "--reconnect-grace")
    per_client = None
    try:
        served = mcp_http.http_options(http, allow_origin or (), http_cert, http_key, grace)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    if sessions_per_client is not None:
        try:
            per_client = mcp_server.sessions_per_client(sessions_per_client)
        except ValueError as exc:
            raise BadInput(f"--sessions-per-client: {exc}") from None
    session = options.connection(ctx)
    mcp_server.run(
        with_default_port(session.addr),
        token=read_token(session.token, session.token_file),
        ca_file=session.ca,
        tls=session.tls,
        labels=labels,
        serial=serial,
        idle_timeout=idle,
        queue_timeout=waits,
        sessions_per_client=per_client,
        http=served,
    )


def _within(
    read: Callable[[str, float, float], float], text: str, span: tuple[float, float], flag: str
) -> float:
    """A flag's duration from span[0] to span[1] seconds; one line naming the flag if not."""
    try:
        return read(text, *span)
    except argparse.ArgumentTypeError as exc:
        raise BadInput(f"{flag}: {exc}") from None
