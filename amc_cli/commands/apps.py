"""`amc apps` and `amc files`: the farm's app library — APKs for tasks to install
(install_app, a spec's `apps:`) and files for them to push (push_file)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from amc_cli import library, options, render
from amc_cli.options import Output, OutputOpt

app = options.group(
    "The app library: APKs tasks install (install_app, a spec's apps:).", no_args_is_help=True
)
files = options.group(
    "The app library's files, for tasks to push to their phones (push_file).",
    no_args_is_help=True,
)
FileArg = Annotated[Path, typer.Argument(metavar="FILE", help="The file.", show_default=False)]


@app.command("upload")
def apps_upload(ctx: typer.Context, path: FileArg, output: OutputOpt = Output.table) -> None:
    """Upload an APK: its package, version and minimum SDK are read from its manifest. The
    same bytes uploaded again answer the app kept the first time."""
    kept = library.upload(options.client(ctx), path, "app")
    options.show(output, kept, f"kept {library.app_line(kept)}")


@app.command("list")
def apps_list(
    ctx: typer.Context,
    package: Annotated[str, typer.Option(help="Only this package's versions.")] = "",
    output: OutputOpt = Output.table,
) -> None:
    """The library's apps, by package, newest version first."""
    found = library.list_apps(options.client(ctx), package)
    if output is Output.json:
        render.print_json({"apps": [render.to_dict(a) for a in found]})
    else:
        library.apps_table(found)


@app.command("rm")
def apps_rm(
    ctx: typer.Context,
    name: Annotated[
        str,
        typer.Argument(
            metavar="APP",
            help="Its id (or its first 6+ hex digits), or its package.",
            show_default=False,
        ),
    ],
    output: OutputOpt = Output.table,
) -> None:
    """Remove an app (operators: any; clients: their own token's or their team's)."""
    client = options.client(ctx)
    removed = library.delete_app(client, library.named_app(client, name))
    options.show(output, removed, f"removed {library.app_line(removed.app)}")


@files.command("upload")
def files_upload(ctx: typer.Context, path: FileArg, output: OutputOpt = Output.table) -> None:
    """Upload a file for tasks to push (push_file names it by its id)."""
    kept = library.upload(options.client(ctx), path, "file")
    options.show(
        output,
        kept,
        f"kept {kept.file_name} ({library.size_text(kept.size_bytes)}) as {kept.file_id}",
    )


@files.command("list")
def files_list(ctx: typer.Context, output: OutputOpt = Output.table) -> None:
    """The library's files, newest first."""
    found = library.list_files(options.client(ctx))
    if output is Output.json:
        render.print_json({"files": [render.to_dict(f) for f in found]})
    else:
        library.files_table(found)


@files.command("rm")
def files_rm(
    ctx: typer.Context,
    file_id: Annotated[
        str,
        typer.Argument(
            metavar="ID", help="Its id (or its first 6+ hex digits).", show_default=False
        ),
    ],
    output: OutputOpt = Output.table,
) -> None:
    """Remove a file (on `amc apps rm`'s terms)."""
    removed = library.delete_file(options.client(ctx), file_id)
    options.show(output, removed, f"removed {removed.file.file_name} ({removed.file.file_id})")
