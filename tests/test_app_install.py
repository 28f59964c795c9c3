"""Apps from the farm, end to end: a real, signed APK uploaded to the library, installed by
the real host agent on phones faked at the adb wire (the fake adb server's host protocol,
and Debian's real adb server in front of the fake adbd), with the host's cache between
the control plane and its phones; pushes, pulls and uninstalls; a spec's apps; and the
refusals (a phone too old for the app, a package not installed)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import scheduler_pb2, task_pb2
from control_plane import metrics
from control_plane.domain import Role
from host_agent.adb import AdbSource
from host_agent.recovery import RecoverySettings
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, eventually, tap, workflow_spec
from tests.support.agent import get, running_agent, status_is, submit
from tests.support.apks import NEW, OLD, ApkFile, apk_cache, new_apk, old_apk
from tests.support.fakes.adb_server import FakeAdbServer
from tests.support.fakes.adbd import FakeAdbd
from tests.support.fakes.phone import DEFAULT_PROPS, FakePhone
from tests.support.fakes.real_adb import RealAdbServer
from tests.support.fakes.tcp_proxy import TcpProxy
from tests.support.library import library, upload_app, upload_file
from tests.test_device_health import is_in
from tests.test_sessions import act, dispatched, last_task, opening

PROBES = {"probe_interval": 0.3, "probe_timeout": 0.3}
FINISHED = (task_pb2.TASK_STATUS_DONE, task_pb2.TASK_STATUS_FAILED, task_pb2.TASK_STATUS_CANCELLED)
LIST = scheduler_pb2.ListTasksRequest()

__all__ = ["apk_cache", "new_apk", "old_apk"]


def phone(serial: str, sdk: int = 34) -> FakePhone:
    return FakePhone(serial, props={**DEFAULT_PROPS, "ro.build.version.sdk": str(sdk)})


def install(app: str, *, replace: bool = False, grant: bool = False) -> task_pb2.Action:
    return task_pb2.Action(
        install_app=task_pb2.InstallApp(app=app, replace=replace, grant_permissions=grant)
    )


def uninstall(package: str) -> task_pb2.Action:
    return task_pb2.Action(uninstall_app=task_pb2.UninstallApp(package=package))


def push(file_id: str, path: str) -> task_pb2.Action:
    return task_pb2.Action(push_file=task_pb2.PushFile(file=file_id, path=path))


def pull(path: str) -> task_pb2.Action:
    return task_pb2.Action(pull_file=task_pb2.PullFile(path=path))


def fetches() -> float:
    return float(metrics.LIBRARY_FETCHES.labels("sent")._value.get())


async def uploaded(farm: Farm, apk: ApkFile) -> None:
    await upload_app(library(farm, await farm.token(Role.CLIENT)), apk.data)


async def on_phones(
    farm: Farm, phones: list[FakePhone], cache: Path, *specs: tuple[str, task_pb2.TaskSpec]
) -> list[task_pb2.Task]:
    """Each (serial, spec) run on the fake adb server's phone of that serial, all at once
    (queued before the agent starts: its first Acquire takes them together); the tasks once
    ended."""
    client = await farm.client()
    ids = [await submit(client, spec, selector=_on(serial)) for serial, spec in specs]
    async with FakeAdbServer(phones) as server:
        source = AdbSource(server.host, server.port, call_timeout=10.0)
        async with running_agent(farm, source, app_cache_dir=cache):
            for task_id in ids:
                await status_is(farm, task_id, "done", "failed", within=60)
    return [await get(client, task_id) for task_id in ids]


def _on(serial: str) -> task_pb2.DeviceSelector:
    return task_pb2.DeviceSelector(serial=serial)


async def test_one_apk_installed_on_a_hosts_phones_at_once_is_fetched_once(
    farm: Farm, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN each of four phones of one host lists the package (its manifest read from the
    APK it was streamed), the control plane sent the APK once, and the host's cache holds
    it: a later install on them sends nothing."""
    await uploaded(farm, old_apk)
    phones = [phone(f"emu-{i}") for i in range(4)]
    before = fetches()
    spec = actions_spec(install(OLD.package, grant=True))
    tasks = await on_phones(farm, phones, tmp_path, *((p.serial, spec) for p in phones))
    assert [t.status for t in tasks] == [task_pb2.TASK_STATUS_DONE] * 4, tasks
    assert fetches() == before + 1
    for p, task in zip(phones, tasks, strict=True):
        assert "package:io.appium.settings\n" == p.handle_shell("pm list packages").decode()
        assert p.apps.installs == [("stream", ("-g",))]
        data = task.result.steps[0].data
        assert (data["install"], data["package"], data["app_id"]) == (
            "streamed",
            OLD.package,
            OLD.sha256,
        )
    assert (tmp_path / OLD.sha256).read_bytes() == old_apk.data
    again = await on_phones(farm, phones[:1], tmp_path, ("emu-0", spec))
    assert again[0].status == task_pb2.TASK_STATUS_DONE and fetches() == before + 1


async def test_an_android_older_than_7_gets_the_apk_pushed_then_pm_installed(
    farm: Farm, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN on API 23 the APK goes to /data/local/tmp by sync, `pm install -r -g` installs
    it, and the copy is removed; without `replace` a second install is the package
    manager's refusal, word for word."""
    await uploaded(farm, old_apk)
    old = phone("old-1", sdk=23)
    spec = actions_spec(install(OLD.sha256, replace=True, grant=True), install(OLD.package))
    (task,) = await on_phones(farm, [old], tmp_path, ("old-1", spec))
    assert old.apps.installs == [("file", ("-r", "-g")), ("file", ())]
    assert "io.appium.settings" in old.apps.packages
    assert not any(path.startswith("/data/local/tmp/") for path in old.files)
    assert task.result.steps[0].data["install"] == "pushed"
    assert task.status == task_pb2.TASK_STATUS_FAILED
    assert "Failure [INSTALL_FAILED_ALREADY_EXISTS" in task.result.steps[1].error


async def test_a_phone_whose_streamed_install_is_not_taken_gets_the_apk_pushed(
    farm: Farm, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN `cmd package` failing (not the package manager's refusal) falls back to the
    push and `pm install`, and the app is installed."""
    await uploaded(farm, old_apk)
    broken = phone("emu-9")
    broken.failures["cmd package install"] = (0, b"cmd: Can't find service: package\n")
    (task,) = await on_phones(
        farm, [broken], tmp_path, ("emu-9", actions_spec(install(OLD.package)))
    )
    assert task.status == task_pb2.TASK_STATUS_DONE, task.result
    assert broken.apps.installs == [("file", ())]
    assert task.result.steps[0].data["install"] == "pushed"


async def test_an_app_needing_a_newer_android_fails_its_step_and_installs_nothing(
    farm: Farm, new_apk: ApkFile, tmp_path: Path
) -> None:
    await uploaded(farm, new_apk)
    old = phone("old-2", sdk=19)
    (task,) = await on_phones(farm, [old], tmp_path, ("old-2", actions_spec(install(NEW.sha256))))
    assert task.status == task_pb2.TASK_STATUS_FAILED
    error = task.result.steps[0].error
    assert error == "io.appium.settings 5.0.0 needs Android API 21 or later; this phone has API 19"
    assert old.apps.installs == [] and old.files == {}


async def test_a_file_is_pushed_and_pulled_back_as_an_artifact_and_an_app_uninstalled(
    farm: Farm, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN the pushed file is on the phone, the pulled one is kept as a `pulled_file`
    artifact of the task with the same bytes, the package is gone after its uninstall, and
    uninstalling it again fails that step with the phone's words."""
    await uploaded(farm, old_apk)
    data = b"fixture\n" * 1000
    file = await upload_file(library(farm, await farm.token(Role.CLIENT)), data, "data.bin")
    target = "/sdcard/Download/data.bin"
    spec = workflow_spec(
        setup=[install(OLD.package), push(file.file_id, target)],
        check=[pull(target), uninstall(OLD.package)],
        again=[uninstall(OLD.package)],
    )
    p = phone("emu-1")
    (task,) = await on_phones(farm, [p], tmp_path, ("emu-1", spec))
    assert p.files[target] == data and p.apps.packages == {}
    assert [s.status for s in task.result.steps] == [
        task_pb2.STEP_STATUS_OK, task_pb2.STEP_STATUS_OK, task_pb2.STEP_STATUS_FAILED,
    ]  # fmt: skip
    assert task.result.steps[2].error == (
        "uninstalling io.appium.settings: Failure [DELETE_FAILED_INTERNAL_ERROR]"
    )
    (kept,) = task.result.steps[1].artifacts
    assert (kept.kind, kept.content_type) == ("pulled_file", "application/octet-stream")
    assert kept.sha256 == hashlib.sha256(data).hexdigest()
    client = await farm.client()
    answers = [
        a
        async for a in client.scheduler.GetArtifact(
            scheduler_pb2.GetArtifactRequest(task_id=task.task_id, artifact_id=kept.artifact_id)
        )
    ]
    assert b"".join(a.chunk for a in answers[1:]) == data


async def test_a_specs_apps_are_installed_first_as_a_step_named_apps(
    farm: Farm, old_apk: ApkFile, tmp_path: Path
) -> None:
    await uploaded(farm, old_apk)
    spec = actions_spec(tap())
    spec.apps.add(app=OLD.package, grant_permissions=True)
    p = phone("emu-2")
    (task,) = await on_phones(farm, [p], tmp_path, ("emu-2", spec))
    assert task.status == task_pb2.TASK_STATUS_DONE
    assert [s.name for s in task.result.steps] == ["apps", "tap"]
    assert task.result.steps[0].output == "installed io.appium.settings 3.0.0 (streamed)"
    assert p.apps.packages["io.appium.settings"].granted


async def test_a_session_has_its_apps_installed_before_its_first_action(
    farm: Farm, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN on a simulated phone the session's first step is "apps" (the package now in
    `pm list packages`), its actions follow from step 1, and an install_app sent in the
    session runs too; a session naming an app the library lacks is refused NOT_FOUND."""
    await uploaded(farm, old_apk)
    client = await farm.client()
    source = SimulatedSource(1, delay=0.01)
    async with running_agent(farm, source, app_cache_dir=tmp_path):
        call = client.scheduler.OpenSession()
        apps = [task_pb2.InstallApp(app=OLD.package)]
        await call.write(opening(apps=apps))
        task = await dispatched(call)
        listed = task_pb2.Action(shell=task_pb2.Shell(command="pm list packages"))
        await call.write(act(listed))
        step = (await asyncio.wait_for(call.read(), 20)).step.step
        assert (step.index, step.output) == (1, "package:io.appium.settings\n")
        await call.write(act(install(OLD.sha256)))
        again = (await asyncio.wait_for(call.read(), 20)).step.step
        assert again.status == task_pb2.STEP_STATUS_OK, again.error
        await call.done_writing()
        final = await last_task(call)
        missing = client.scheduler.OpenSession()
        await missing.write(opening(apps=[task_pb2.InstallApp(app="com.example.none")]))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await missing.read()
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "open.apps[0].app: the library has no app of package" in (err.value.details() or "")
    assert final.status == task_pb2.TASK_STATUS_DONE
    steps = (await get(client, task.task_id)).result.steps
    assert [s.name for s in steps] == ["apps", "shell", "install_app"]
    assert list(source.apps["sim-0"].packages) == ["io.appium.settings"]


async def ended(call: Any) -> task_pb2.Task:
    """The session's responses up to its finished task; the stream then ends OK."""
    while True:
        response = await asyncio.wait_for(call.read(), 20)
        assert response is not grpc.aio.EOF and response.HasField("task"), response
        if response.task.status in FINISHED:
            await call.done_writing()
            assert await asyncio.wait_for(call.read(), 5) is grpc.aio.EOF
            return response.task


async def slow_phone_opened_with_apps(farm: Farm, source: SimulatedSource, client: Any) -> Any:
    """A session naming an app, opened once the phone is ready and made slow: its apps
    step is held at its first call to the phone (reading its API level) for a minute."""
    await eventually(lambda: is_in(farm, "sim-0", "ready"), what="the first probe")
    source.delay = 60.0
    call = client.scheduler.OpenSession()
    await call.write(opening(apps=[task_pb2.InstallApp(app=OLD.package)]))
    await eventually(lambda: source.in_flight("sim-0") == 1, what="the apps step at the phone")
    return call


async def test_a_session_quarantined_while_its_apps_install_ends_failed_as_at_any_step(
    farm: Farm, old_apk: ApkFile, tmp_path: Path
) -> None:
    """The phone stops answering while the session's apps step is at it: the step stops at
    once (not after the phone's own deadline), the session ends failed in the words of any
    of its steps ("device quarantined: during step 0 'apps'"), on its one attempt, before
    the recovery ladder disturbs the phone."""
    await uploaded(farm, old_apk)
    source = SimulatedSource(1, delay=0.02)
    source.boot_time = 0.3
    recovery = RecoverySettings(failures=1, backoff=0.2, boot_timeout=5.0)
    client = await farm.client()
    async with running_agent(
        farm, source, recovery=recovery, app_cache_dir=tmp_path, **PROBES
    ) as agent:
        call = await slow_phone_opened_with_apps(farm, source, client)
        source.hang("sim-0")
        final = await ended(call)
        await eventually(lambda: agent.recovery.outcomes, timeout=15, what="the ladder's end")
    assert final.status == task_pb2.TASK_STATUS_FAILED
    assert final.result.error == "device quarantined: during step 0 'apps'"
    assert [(s.name, s.error) for s in final.result.steps] == [
        ("apps", "interrupted: device quarantined")
    ]
    assert [a["state"] for a in await farm.attempts(final.task_id)] == ["failed"]
    assert source.recovery_steps and "io.appium.settings" not in source.apps["sim-0"].packages


async def test_a_session_whose_client_leaves_while_its_apps_install_frees_the_phone_at_once(
    farm: Farm, old_apk: ApkFile, tmp_path: Path
) -> None:
    """The client goes away while its session's apps step is at the phone: the session is
    withdrawn ("session abandoned: its client left before it started"), the step stops at
    once rather than after the phone's minute, the session ends cancelled in the words of
    any of its steps, and the phone takes the next task."""
    await uploaded(farm, old_apk)
    source = SimulatedSource(1, delay=0.02)
    client = await farm.client()
    async with running_agent(farm, source, app_cache_dir=tmp_path):
        call = await slow_phone_opened_with_apps(farm, source, client)
        (task_id,) = [t.task_id for t in (await client.scheduler.ListTasks(LIST)).tasks]
        call.cancel()
        await status_is(farm, task_id, "cancelled", within=10)
        assert source.in_flight("sim-0") == 0
        source.delay = 0.02
        after = await submit(client, actions_spec(tap()), selector=_on("sim-0"))
        await status_is(farm, after, "done", within=20)
    task = await get(client, task_id)
    assert task.result.error == "cancelled: during step 0 'apps'"
    assert [(s.name, s.error) for s in task.result.steps] == [("apps", "interrupted: cancelled")]
    (asked,) = [e for e in await farm.events(task_id) if e["kind"] == "cancel_requested"]
    assert asked["detail"] == "session abandoned: its client left before it started"


async def test_a_fetch_cut_off_midway_is_tried_again_and_the_install_goes_on(
    farm: Farm, old_apk: ApkFile, tmp_path: Path
) -> None:
    """The connection to the control plane is reset while the APK is half fetched (the
    call fails UNAVAILABLE): the host fetches it again and keeps only the bytes past those
    it had, the cache holds the whole APK, and the install is done on the one attempt."""
    await uploaded(farm, old_apk)
    client = await farm.client()
    source = SimulatedSource(1, delay=0.01)
    half = len(old_apk.data) // 2
    port = int(farm.address.rsplit(":", 1)[1])
    async with (
        TcpProxy("127.0.0.1", port) as proxy,
        running_agent(farm, source, address=proxy.address, app_cache_dir=tmp_path),
    ):
        midway = proxy.freeze_after("down", old_apk.data[half : half + 64])
        task_id = await submit(client, actions_spec(install(OLD.package)))
        await asyncio.wait_for(midway.wait(), 20)
        proxy.heal()  # no more freezing; the frozen connection is reset:
        proxy.cut(refuse=False)
        await status_is(farm, task_id, "done", "failed", within=30)
    task = await get(client, task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE, task.result
    assert list(source.apps["sim-0"].packages) == ["io.appium.settings"]
    assert (tmp_path / OLD.sha256).read_bytes() == old_apk.data
    assert [a["state"] for a in await farm.attempts(task_id)] == ["done"]


async def test_a_task_may_push_and_pull_only_under_the_shared_storage(farm: Farm) -> None:
    """THEN a path outside /sdcard/, /storage/emulated/0/ or /data/local/tmp/, or one that
    climbs out of them, is refused INVALID_ARGUMENT naming the field, and nothing queued."""
    client = await farm.client()
    before = await farm.snapshot()
    for action, field in [
        (pull("/data/data/com.bank/databases/db"), "pull_file.path: must be a file under"),
        (pull("/sdcard/../data/x"), "pull_file.path: must not have"),
        (push("a" * 64, "/system/bin/sh"), "push_file.path: must be a file under"),
        (push("nope", "/sdcard/x"), "push_file.file: must be a library id"),
    ]:
        with pytest.raises(Exception) as err:
            await client.scheduler.SubmitTask(
                scheduler_pb2.SubmitTaskRequest(spec=actions_spec(action))
            )
        exc: Any = err.value
        assert exc.code().name == "INVALID_ARGUMENT"
        assert exc.details().startswith(f"spec.actions.actions[0].{field}"), exc.details()
    assert await farm.snapshot() == before


async def test_an_install_and_a_push_through_the_real_adb_server(
    farm: Farm, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN pure-python-adb → Debian's adb server → the fake adbd carries the streamed
    install (`exec:` with the APK on stdin) and the sync protocol's push and pull."""
    await uploaded(farm, old_apk)
    data = b"\x00\x01binary\xff" * 5000
    file = await upload_file(library(farm, await farm.token(Role.CLIENT)), data)
    p = FakePhone("FAKE0002")
    spec = actions_spec(
        install(OLD.package),
        push(file.file_id, "/data/local/tmp/x.bin"),
        pull("/data/local/tmp/x.bin"),
    )
    async with FakeAdbd(p) as adbd, RealAdbServer(tmp_path / "adb-home") as adb:
        await adb.connect(adbd.address)
        source = AdbSource(adb.host, adb.port, call_timeout=20.0)
        async with running_agent(farm, source, app_cache_dir=tmp_path / "cache"):
            task_id = await submit(await farm.client(), spec)
            await status_is(farm, task_id, "done", "failed", within=60)
    task = await get(await farm.client(), task_id)
    assert task.status == task_pb2.TASK_STATUS_DONE, task.result
    assert "io.appium.settings" in p.apps.packages and p.apps.installs[0][0] == "stream"
    assert p.files["/data/local/tmp/x.bin"] == data
    assert task.result.steps[2].artifacts[0].sha256 == hashlib.sha256(data).hexdigest()
