"""The app library from the command line: a local file checked and uploaded (an APK read
first with amc_common.apk, so a file that is not one is refused before a byte is sent),
an app named by its id, a prefix of it or its package, and the tables `amc apps list` and
`amc files list` print."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from rich.table import Table
from rich.text import Text

from amc.v1 import library_pb2, library_pb2_grpc
from amc_cli import render
from amc_cli.client import Client
from amc_cli.errors import BadInput, CliError, ExitCode
from amc_common.apk import NotAnApk, read_apk

CHUNK = 256 * 1024
# The upload's deadline grows with its size: --timeout, and a second per MiB on top.
SECONDS_PER_MIB = 1.0


def _stub(client: Client) -> library_pb2_grpc.LibraryStub:
    return library_pb2_grpc.LibraryStub(client._channel)


def readable(path: Path) -> int:
    """The file's size; BadInput (one line) when it cannot be read."""
    try:
        if not path.is_file():
            raise BadInput(f"{path}: no such file" if not path.exists() else f"{path}: not a file")
        with path.open("rb"):
            return path.stat().st_size
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None


def check_apk(path: Path) -> None:
    try:
        read_apk(path)
    except NotAnApk as exc:
        raise BadInput(f"{path}: {exc}") from None
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def upload(client: Client, path: Path, what: str) -> Any:
    """UploadApp (`what` "app") or UploadFile ("file") of the file: the App or LibraryFile
    kept."""
    size = readable(path)
    if what == "app":
        check_apk(path)
    header = library_pb2.UploadHeader(file_name=path.name, size_bytes=size, sha256=_sha256(path))
    kind = library_pb2.UploadAppRequest if what == "app" else library_pb2.UploadFileRequest

    def messages() -> Iterator[Any]:
        yield kind(header=header)
        with path.open("rb") as file:
            while chunk := file.read(CHUNK):
                yield kind(chunk=chunk)

    stub = _stub(client)
    method = stub.UploadApp if what == "app" else stub.UploadFile
    timeout = client.target.timeout + SECONDS_PER_MIB * size / (1 << 20)
    try:
        return method(messages(), metadata=client._metadata, timeout=timeout)
    except grpc.RpcError as exc:
        raise client.failed(exc, f"upload {what}") from None


def list_apps(client: Client, package: str = "") -> list[library_pb2.App]:
    request = library_pb2.ListAppsRequest(package=package)
    return list(client._call("list apps", _stub(client).ListApps, request).apps)


def list_files(client: Client) -> list[library_pb2.LibraryFile]:
    request = library_pb2.ListFilesRequest()
    return list(client._call("list files", _stub(client).ListFiles, request).files)


def named_app(client: Client, name: str) -> library_pb2.App:
    """The one app `name` names: its id, a prefix of it (6 hex digits or more) or its package
    (when the library has one version of it)."""
    apps = list_apps(client)
    if "." in name:
        found = [a for a in apps if a.package == name]
        if len(found) > 1:
            versions = ", ".join(f"{a.version_name} {a.app_id[:12]}" for a in found)
            raise BadInput(
                f"{name} has {len(found)} versions in the library ({versions}): name one by its id"
            )
    elif len(name) >= 6 and all(c in "0123456789abcdef" for c in name):
        found = [a for a in apps if a.app_id.startswith(name)]
        if len(found) > 1:
            raise BadInput(f"{name} is the start of {len(found)} app ids: give more of it")
    else:
        raise BadInput(f"{name!r} is neither an app id (6 hex digits or more) nor a package name")
    if not found:
        raise CliError(f"the library has no app {name} (amc apps list)", ExitCode.NOT_FOUND)
    return found[0]


def delete_app(client: Client, app: library_pb2.App) -> library_pb2.DeleteAppResponse:
    request = library_pb2.DeleteAppRequest(app_id=app.app_id)
    return client._call("remove app", _stub(client).DeleteApp, request)


def delete_file(client: Client, file_id: str) -> library_pb2.DeleteFileResponse:
    files = [f for f in list_files(client) if f.file_id.startswith(file_id)] if file_id else []
    if len(file_id) < 6 or not files:
        raise CliError(f"the library has no file {file_id} (amc files list)", ExitCode.NOT_FOUND)
    if len(files) > 1:
        raise BadInput(f"{file_id} is the start of {len(files)} file ids: give more of it")
    request = library_pb2.DeleteFileRequest(file_id=files[0].file_id)
    return client._call("remove file", _stub(client).DeleteFile, request)


def size_text(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1 << 20):.1f} MiB"


def app_line(app: library_pb2.App) -> str:
    return (
        f"{app.package} {app.version_name} (version code {app.version_code}, min SDK"
        f" {app.min_sdk}, {size_text(app.size_bytes)}) as {app.app_id}"
    )


def apps_table(apps: list[library_pb2.App]) -> None:
    table = Table(show_edge=False)
    columns = ("id", "package", "version", "code", "min sdk", "size", "uploaded by", "uploaded")
    for name in columns:
        table.add_column(name, no_wrap=name in ("id", "uploaded"))
    for a in apps:
        by = f"{a.uploaded_by} ({a.team})" if a.team else a.uploaded_by
        table.add_row(
            a.app_id[:12],
            Text(a.package),
            Text(a.version_name),
            str(a.version_code),
            str(a.min_sdk or "-"),
            size_text(a.size_bytes),
            Text(by),
            render.when(a.uploaded_at),
        )
    render.console().print(table if apps else "the library has no apps (amc apps upload FILE)")


def files_table(files: list[library_pb2.LibraryFile]) -> None:
    table = Table(show_edge=False)
    for name in ("id", "name", "size", "uploaded by", "uploaded"):
        table.add_column(name, no_wrap=name in ("id", "uploaded"))
    for f in files:
        by = f"{f.uploaded_by} ({f.team})" if f.team else f.uploaded_by
        table.add_row(
            f.file_id[:12],
            Text(f.file_name),
            size_text(f.size_bytes),
            Text(by),
            render.when(f.uploaded_at),
        )
    render.console().print(table if files else "the library has no files (amc files upload FILE)")
