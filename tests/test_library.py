"""The app library on the control plane (amc.v1.Library, Lease.FindApp and FetchFile),
with real, signed APKs from the npm registry (tests.support.apks): an upload is read from
its manifest, checked against its sha256 and size limit, kept once by its bytes; who may
remove what; what a host may fetch; and a task naming what the library lacks is refused
with nothing queued."""

from __future__ import annotations

import io
import os
import zipfile
from dataclasses import replace
from typing import Any

import grpc
import pytest

from amc.v1 import lease_pb2, library_pb2, library_pb2_grpc, scheduler_pb2, task_pb2
from control_plane import metrics
from control_plane.admin_service import create_token
from control_plane.domain import Role
from tests.conftest import FAST
from tests.support import Farm, actions_spec, tap
from tests.support.apks import NEW, OLD, ApkFile, apk_cache, new_apk, old_apk
from tests.support.library import library, upload_app, upload_file

__all__ = ["apk_cache", "new_apk", "old_apk"]


async def team_token(farm: Farm, team: str, role: Role = Role.CLIENT, name: str = "") -> str:
    assert farm.plane is not None
    _, token = await create_token(farm.plane.store, role, None, name or f"{team}-ci", team)
    return token


async def library_rows(farm: Farm) -> dict[str, int]:
    assert farm.db is not None
    tables = ("library_blobs", "library_chunks", "library_apps", "library_files")
    return {t: await farm.db.fetchval(f"SELECT count(*) FROM {t}") for t in tables}


def counted(metric: Any, *labels: str) -> float:
    return float(metric.labels(*labels)._value.get())


async def test_an_uploaded_apk_is_read_from_its_manifest_and_kept_once_by_its_bytes(
    farm: Farm, old_apk: ApkFile
) -> None:
    """THEN the app says what its manifest says, its id is its sha256, its bytes are kept
    in chunks that read back whole; the same bytes uploaded again (by another team) answer
    the app kept the first time, and nothing more is stored."""
    data = old_apk.data
    first = library(farm, await team_token(farm, "qa", name="qa-ci"))
    app = await upload_app(first, data, "settings.apk")
    assert (app.package, app.version_name, app.version_code) == (OLD.package, "3.0.0", 24)
    assert (app.min_sdk, app.target_sdk) == (18, 28)
    assert (app.app_id, app.size_bytes, app.file_name) == (OLD.sha256, len(data), "settings.apk")
    assert (app.uploaded_by, app.team) == ("qa-ci", "qa")
    assert farm.db is not None
    chunks = await farm.db.fetch(
        "SELECT data FROM library_chunks WHERE sha256 = $1 ORDER BY seq", bytes.fromhex(app.app_id)
    )
    assert b"".join(bytes(c["data"]) for c in chunks) == data
    assert await library_rows(farm) == {
        "library_blobs": 1, "library_chunks": len(chunks), "library_apps": 1, "library_files": 0,
    }  # fmt: skip
    repeated = counted(metrics.LIBRARY_UPLOADS, "app", "repeated")
    again = await upload_app(library(farm, await team_token(farm, "web")), data, "other.apk")
    assert again == app
    assert counted(metrics.LIBRARY_UPLOADS, "app", "repeated") == repeated + 1
    assert (await library_rows(farm))["library_chunks"] == len(chunks)


async def test_an_upload_whose_bytes_are_not_the_announced_ones_keeps_nothing(
    farm: Farm, old_apk: ApkFile
) -> None:
    """THEN a wrong sha256, fewer bytes than announced, or more, are DATA_LOSS, saying what
    arrived; the library stays empty."""
    data = old_apk.data
    stub = library(farm, await team_token(farm, "qa"))
    cases: list[dict[str, Any]] = [
        {"sha256": "0" * 64},
        {"size": len(data) + 1},
        {"size": len(data) - 1},
    ]
    for case in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await upload_app(stub, data, **case)
        assert err.value.code() == grpc.StatusCode.DATA_LOSS, case
        assert "nothing was stored" in (err.value.details() or ""), err.value.details()
    assert set((await library_rows(farm)).values()) == {0}


async def test_an_upload_past_the_size_limit_is_refused_before_its_bytes(
    database_url: str, old_apk: ApkFile
) -> None:
    """THEN a header announcing more than --max-app-size is RESOURCE_EXHAUSTED, naming the
    limit and the flag, and nothing is kept."""
    farm = Farm(database_url, replace(FAST, max_app_bytes=1024 * 1024))
    await farm.start()
    try:
        stub = library(farm, await farm.token(Role.CLIENT))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await upload_app(stub, old_apk.data)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit of 1048576 bytes (--max-app-size)" in (err.value.details() or "")
        assert set((await library_rows(farm)).values()) == {0}
    finally:
        await farm.stop()


def _zip(**entries: bytes) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return out.getvalue()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"#!/bin/sh\necho hello\n", "not a ZIP archive"),
        (_zip(**{"classes.dex": b"dex\n035"}), "the archive has no AndroidManifest.xml"),
        (_zip(**{"AndroidManifest.xml": os.urandom(2048)}), "is not Android binary XML"),
    ],
)
async def test_a_file_that_is_not_an_apk_is_refused_in_one_line(
    farm: Farm, data: bytes, why: str
) -> None:
    """THEN INVALID_ARGUMENT, one line saying why, and nothing kept."""
    stub = library(farm, await farm.token(Role.CLIENT))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upload_app(stub, data, "notes.apk")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert details.startswith("file: not an APK: ") and why in details, details
    assert "\n" not in details and "Traceback" not in details
    assert set((await library_rows(farm)).values()) == {0}


async def test_an_app_is_found_by_id_or_by_package_its_newest_version(
    farm: Farm, old_apk: ApkFile, new_apk: ApkFile
) -> None:
    """THEN GetApp by package answers the highest version code; ListApps lists both, newest
    first; unknown ids and packages are NOT_FOUND; malformed ones INVALID_ARGUMENT."""
    stub = library(farm, await farm.token(Role.CLIENT))
    new = await upload_app(stub, new_apk.data)
    old = await upload_app(stub, old_apk.data)  # the latest upload, but older
    assert (await stub.GetApp(library_pb2.GetAppRequest(app=OLD.package))) == new
    assert (await stub.GetApp(library_pb2.GetAppRequest(app=old.app_id))) == old
    listed = await stub.ListApps(library_pb2.ListAppsRequest())
    assert [a.app_id for a in listed.apps] == [NEW.sha256, OLD.sha256]
    other = await stub.ListApps(library_pb2.ListAppsRequest(package="com.example.other"))
    assert list(other.apps) == []
    for ref, code in [
        ("com.example.other", grpc.StatusCode.NOT_FOUND),
        ("f" * 64, grpc.StatusCode.NOT_FOUND),
        ("not a package", grpc.StatusCode.INVALID_ARGUMENT),
        ("", grpc.StatusCode.INVALID_ARGUMENT),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.GetApp(library_pb2.GetAppRequest(app=ref))
        assert err.value.code() == code, ref


async def test_an_app_is_removed_by_an_operator_its_uploader_or_its_team_only(
    farm: Farm, old_apk: ApkFile
) -> None:
    """THEN another team's client is refused (PERMISSION_DENIED, naming who uploaded it) and
    the app stays; a client of the uploader's team removes it, bytes and all."""
    data = old_apk.data
    app = await upload_app(library(farm, await team_token(farm, "qa", name="qa-ci")), data)
    delete = library_pb2.DeleteAppRequest(app_id=app.app_id)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await library(farm, await team_token(farm, "web")).DeleteApp(delete)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "uploaded by qa-ci of team 'qa'" in (err.value.details() or "")
    assert (await library_rows(farm))["library_apps"] == 1
    removed = await library(farm, await team_token(farm, "qa", name="qa-2")).DeleteApp(delete)
    assert removed.app == app
    assert set((await library_rows(farm)).values()) == {0}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await library(farm, await farm.token(Role.OPERATOR)).DeleteApp(delete)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    again = await upload_app(library(farm, await team_token(farm, "qa")), data)
    await library(farm, await farm.token(Role.OPERATOR)).DeleteApp(delete)
    assert again.app_id == app.app_id and (await library_rows(farm))["library_apps"] == 0


async def test_an_app_and_a_file_of_the_same_bytes_share_them_until_both_are_gone(
    farm: Farm, old_apk: ApkFile
) -> None:
    data = old_apk.data
    stub = library(farm, await farm.token(Role.OPERATOR))
    file = await upload_file(stub, data, "settings.apk")
    app = await upload_app(stub, data)
    assert file.file_id == app.app_id and file.size_bytes == len(data)
    rows = await library_rows(farm)
    assert (rows["library_blobs"], rows["library_apps"], rows["library_files"]) == (1, 1, 1)
    await stub.DeleteApp(library_pb2.DeleteAppRequest(app_id=app.app_id))
    assert (await library_rows(farm))["library_chunks"] == rows["library_chunks"]
    assert [f.file_id for f in (await stub.ListFiles(library_pb2.ListFilesRequest())).files] == [
        file.file_id
    ]
    await stub.DeleteFile(library_pb2.DeleteFileRequest(file_id=file.file_id))
    assert set((await library_rows(farm)).values()) == {0}


async def test_a_host_finds_and_fetches_an_app_and_may_not_upload(
    farm: Farm, old_apk: ApkFile
) -> None:
    """THEN FindApp names the app by package, FetchFile streams its size then its bytes
    (counted as sent); a host token may not upload, a client may not fetch, and an id the
    library lacks is NOT_FOUND."""
    data = old_apk.data
    await upload_app(library(farm, await farm.token(Role.CLIENT)), data)
    host = (await farm.host("rack-1")).c
    found = await host.lease.FindApp(lease_pb2.FindAppRequest(app=OLD.package))
    assert (found.app_id, found.min_sdk, found.size_bytes) == (OLD.sha256, 18, len(data))
    sent = counted(metrics.LIBRARY_FETCHES, "sent")
    fetch = lease_pb2.FetchFileRequest(file_id=OLD.sha256)
    answers = [a async for a in host.lease.FetchFile(fetch)]
    assert answers[0].size_bytes == len(data)
    assert b"".join(a.chunk for a in answers[1:]) == data
    assert counted(metrics.LIBRARY_FETCHES, "sent") == sent + 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await upload_app(library_pb2_grpc.LibraryStub(host.channel), data)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    client = await farm.client()
    for lease, request, code in [
        (client.lease, lease_pb2.FetchFileRequest(file_id=OLD.sha256), "PERMISSION_DENIED"),
        (host.lease, lease_pb2.FetchFileRequest(file_id="e" * 64), "NOT_FOUND"),
        (host.lease, lease_pb2.FetchFileRequest(file_id="E" * 64), "INVALID_ARGUMENT"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            [a async for a in lease.FetchFile(request)]
        assert err.value.code().name == code


async def test_a_task_naming_what_the_library_lacks_is_refused_and_nothing_queued(
    farm: Farm, old_apk: ApkFile
) -> None:
    """THEN NOT_FOUND naming the field, nothing queued (single, batch and session alike);
    once the app is uploaded the same task is queued."""
    client = await farm.client()
    install = task_pb2.Action(install_app=task_pb2.InstallApp(app=OLD.package))
    push = task_pb2.Action(push_file=task_pb2.PushFile(file="a" * 64, path="/sdcard/x.bin"))
    before = await farm.snapshot()
    cases = [
        (actions_spec(tap(), install), "spec.actions.actions[1].install_app.app"),
        (task_pb2.TaskSpec(actions=task_pb2.ActionList(actions=[tap()]),
                           apps=[task_pb2.InstallApp(app=OLD.sha256)]), "spec.apps[0].app"),
        (actions_spec(push), "spec.actions.actions[0].push_file.file"),
    ]  # fmt: skip
    for spec, field in cases:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert (err.value.details() or "").startswith(f"{field}: the library has no "), field
    batch = scheduler_pb2.SubmitTasksRequest(
        tasks=[
            scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap())),
            scheduler_pb2.SubmitTaskRequest(spec=actions_spec(install)),
        ]
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.scheduler.SubmitTasks(batch)
    assert (err.value.details() or "").startswith("tasks[1].spec.actions.actions[0].install_app")
    assert await farm.snapshot() == before
    await upload_app(library_pb2_grpc.LibraryStub(client.channel), old_apk.data)
    task = await client.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap(), install))
    )
    assert await farm.status(task.task_id) == "queued"
