"""Artifacts: a screenshot's PNG and a ui_dump's XML kept by the host agent, uploaded under
the attempt's lease before its report, and read back through the Scheduler API and `amc`.

End to end through the real gRPC API, the real `amc` process, the real host agent (in
process, and as a process) on simulated phones and on the fake adb phone; every refused
upload is checked to have stored nothing in the database."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import os
import uuid
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane import metrics
from control_plane.domain import Role
from host_agent.adb import AdbSource
from host_agent.simulated import SimulatedSource
from host_agent.simulated_screen import UI_XML, make_png, screenshot_png
from scripts.launch import HostAgentCommand
from tests.conftest import FAST
from tests.support import (
    Clients,
    Farm,
    HostClient,
    actions_spec,
    eventually,
    tap,
    workflow_spec,
)
from tests.support.agent import get, running_agent, status_is, submit
from tests.support.fakes.adb_server import FakeAdbServer
from tests.support.fakes.phone import FakePhone
from tests.test_cli import EXAMPLES, Cli
from tests.test_host_agent_process import agent_process

SCREENSHOT = task_pb2.Action(screenshot=task_pb2.Screenshot())
UI_DUMP = task_pb2.Action(ui_dump=task_pb2.UiDump())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def stored(farm: Farm) -> tuple[int, int]:
    """(artifact rows, chunk rows) in the database."""
    assert farm.db is not None
    row = await farm.db.fetchrow(
        "SELECT (SELECT count(*) FROM artifacts) AS a, (SELECT count(*) FROM artifact_chunks) AS c"
    )
    assert row is not None
    return row["a"], row["c"]


async def fetch(client: Clients, task_id: str, artifact_id: str) -> tuple[task_pb2.Artifact, bytes]:
    request = scheduler_pb2.GetArtifactRequest(task_id=task_id, artifact_id=artifact_id)
    messages = [m async for m in client.scheduler.GetArtifact(request)]
    return messages[0].artifact, b"".join(m.chunk for m in messages[1:])


async def listed(client: Clients, task_id: str) -> list[task_pb2.Artifact]:
    """The files the steps' actions kept (not the run's phone log, kept with its last
    step: test_phone_logs)."""
    answer = await client.scheduler.ListArtifacts(
        scheduler_pb2.ListArtifactsRequest(task_id=task_id)
    )
    return [a for a in answer.artifacts if a.kind != "logcat"]


# -- the host agent keeps them ----------------------------------------------------------------


async def test_a_screenshot_and_a_ui_dump_are_kept_and_read_back_byte_for_byte(
    farm: Farm,
) -> None:
    """THEN the PNG and the XML come back as taken, and the report's step results carry
    their references."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source):
        task_id = await submit(client, workflow_spec(look=[UI_DUMP], capture=[SCREENSHOT]))
        await status_is(farm, task_id, "done")
    shot = screenshot_png("sim-0")
    found = await listed(client, task_id)
    assert [(a.step_index, a.step_name, a.kind, a.content_type) for a in found] == [
        (0, "look", "ui_dump", "application/xml"),
        (1, "capture", "screenshot", "image/png"),
    ]
    assert [a.size_bytes for a in found] == [len(UI_XML.encode()), len(shot)]
    assert [a.sha256 for a in found] == [sha(UI_XML.encode()), sha(shot)]
    xml_info, xml = await fetch(client, task_id, found[0].artifact_id)
    png_info, png = await fetch(client, task_id, found[1].artifact_id)
    assert (xml, png) == (UI_XML.encode(), shot)
    assert xml_info == found[0] and png_info == found[1]
    steps = (await get(client, task_id)).result.steps
    kept = [a.artifact_id for s in steps for a in s.artifacts if a.kind != "logcat"]
    assert kept == [a.artifact_id for a in found]
    assert steps[1].artifacts[0].task_id == task_id and steps[1].artifacts[0].attempt == 1
    assert "artifact_error" not in steps[1].data


async def test_the_fake_adb_phone_s_screencap_png_is_kept_as_taken(farm: Farm) -> None:
    """THEN the artifact is the phone's own PNG, trimmed of screencap's noise, byte-exact."""
    phone = FakePhone("emu-5554", png=make_png(300, 200, (200, 10, 10)), screencap_prefix=b"W\n")
    async with FakeAdbServer([phone]) as server:
        source = AdbSource(server.host, server.port, call_timeout=5.0)
        client = await farm.client()
        async with running_agent(farm, source):
            task_id = await submit(client, actions_spec(SCREENSHOT, UI_DUMP))
            await status_is(farm, task_id, "done")
    shot, dump = await listed(client, task_id)
    assert (await fetch(client, task_id, shot.artifact_id))[1] == phone.png
    assert (await fetch(client, task_id, dump.artifact_id))[1] == phone.ui_xml.encode()


async def test_a_refused_upload_marks_the_step_and_the_task_is_still_reported(
    database_url: str,
) -> None:
    """THEN over the control plane's size limit the task still ends done, the step's data
    says why its screenshot was not kept, and nothing is stored."""
    farm = Farm(database_url, dataclasses.replace(FAST, max_artifact_bytes=16))
    await farm.start()
    try:
        client = await farm.client()
        async with running_agent(farm, SimulatedSource(1, delay=0.01)):
            task_id = await submit(client, actions_spec(SCREENSHOT))
            await status_is(farm, task_id, "done")
        (step,) = (await get(client, task_id)).result.steps
        assert step.status == task_pb2.STEP_STATUS_OK
        assert "RESOURCE_EXHAUSTED" in step.data["artifact_error"]
        assert "limit" in step.data["artifact_error"]
        assert list(step.artifacts) == []
        assert await stored(farm) == (0, 0)
    finally:
        await farm.stop()


async def test_uploads_are_bounded_by_the_upload_timeout_and_the_report_still_goes(
    database_url: str,
) -> None:
    """THEN with no time left for uploads the task is reported at once, done, each kept
    file marked not kept. (Artifacts of at most 16 bytes here, so none is small enough to
    go with the report instead: tests/test_report_files.py has those.)"""
    farm = Farm(database_url, dataclasses.replace(FAST, max_artifact_bytes=16))
    await farm.start()
    try:
        client = await farm.client()
        async with running_agent(farm, SimulatedSource(1, delay=0.01), upload_timeout=1e-9):
            task_id = await submit(client, actions_spec(SCREENSHOT, UI_DUMP))
            await status_is(farm, task_id, "done")
        steps = (await get(client, task_id)).result.steps
        assert all("took longer than" in s.data["artifact_error"] for s in steps)
        assert await stored(farm) == (0, 0)
    finally:
        await farm.stop()


# -- amc artifacts / amc artifact: the example workflow, with the agent as a process -----------


async def test_login_workflow_screenshot_is_retrievable_with_amc_artifact(
    farm: Farm, tmp_path: Path
) -> None:
    """THEN `amc artifact TASK evidence -o FILE` writes the evidence step's PNG, `-o -` the
    same bytes to stdout, and `amc artifacts` lists it with its size and sha256."""
    token = tmp_path / "host.token"
    token.write_text(await farm.token(Role.HOST, "host-p") + "\n")
    command = HostAgentCommand(
        farm.address, "host-p", token_file=token, simulated_devices=1, sim_delay=0.01
    )
    amc = Cli(farm.address, await farm.token(Role.CLIENT))
    async with agent_process(command, tmp_path / "agent.log"):
        run = await amc(
            "submit", str(EXAMPLES / "login-workflow.yaml"), "--wait", "--output", "json"
        )
        assert run.code == 0, run.err + (tmp_path / "agent.log").read_text()
    task_id = run.json()["task_id"]
    png = screenshot_png("sim-0")

    listing = await amc("artifacts", task_id, "-o", "json")
    assert listing.code == 0, listing.err
    entry, log = listing.json()["artifacts"]
    assert (log["step_index"], log["kind"]) == (2, "logcat")  # the run's phone log
    assert (entry["step_index"], entry["step_name"], entry["kind"]) == (2, "evidence", "screenshot")
    assert (int(entry["size_bytes"]), entry["sha256"]) == (len(png), sha(png))

    table = await amc("artifacts", task_id)
    assert table.code == 0 and "evidence" in table.out and sha(png) in table.out

    out = tmp_path / "evidence.png"
    wrote = await amc("artifact", task_id, "evidence", "-o", str(out))
    assert wrote.code == 0, wrote.err
    assert out.read_bytes() == png
    # The third step, numbered from 1 as every listing numbers it (its index is 2).
    assert f"wrote screenshot of step 3 (evidence), {len(png)} bytes" in wrote.err
    by_number = await amc("artifact", task_id, "3", "-o", str(tmp_path / "three.png"))
    assert by_number.code == 0 and (tmp_path / "three.png").read_bytes() == png

    proc = await amc.start("artifact", task_id, "evidence", "-o", "-")
    stdout, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0 and stdout == png


async def test_amc_artifact_for_a_step_without_one_is_one_line_and_exit_3(
    farm: Farm, tmp_path: Path
) -> None:
    """THEN it names the steps that have artifacts, and writes no file."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        task_id = await submit(client, workflow_spec(touch=[tap()], capture=[SCREENSHOT]))
        await status_is(farm, task_id, "done")
    amc = Cli(farm.address, await farm.token(Role.OPERATOR))
    out = tmp_path / "x.png"
    run = await amc("artifact", task_id, "touch", "-o", str(out))
    assert run.code == 3
    assert "no artifact for step 'touch'" in run.assert_one_error_line()
    assert "steps with artifacts: step 2 (capture)" in run.err
    assert not out.exists()
    into_a_folder = await amc("artifact", task_id, "capture", "-o", str(tmp_path))
    assert into_a_folder.code == 2
    assert "cannot write" in into_a_folder.assert_one_error_line()
    assert not any(os.scandir(tmp_path))  # no partial file left behind
    missing = await amc("artifacts", str(uuid.uuid4()))
    assert missing.code == 3 and "NOT_FOUND" in missing.assert_one_error_line()


async def test_amc_artifact_asks_which_when_a_step_kept_several(farm: Farm, tmp_path: Path) -> None:
    """THEN without --action it is refused (exit 2) listing the choices; with it, written."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        task_id = await submit(client, workflow_spec(both=[UI_DUMP, SCREENSHOT]))
        await status_is(farm, task_id, "done")
    amc = Cli(farm.address, await farm.token(Role.CLIENT))
    run = await amc("artifact", task_id, "both", "-o", str(tmp_path / "f"))
    assert run.code == 2
    assert "--action 1 (ui_dump), --action 2 (screenshot)" in run.assert_one_error_line()
    run = await amc("artifact", task_id, "both", "--action", "1", "-o", str(tmp_path / "f"))
    assert run.code == 0 and (tmp_path / "f").read_bytes() == UI_XML.encode()


async def test_amc_artifact_writes_its_file_with_the_users_umask(
    farm: Farm, tmp_path: Path
) -> None:
    """THEN the file `-o` writes has the mode any new file of the user gets (0644 under
    umask 022, 0640 under 027), as `curl -o` or `cp` would leave it, not a private 0600."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1, delay=0.01)):
        task_id = await submit(client, workflow_spec(capture=[SCREENSHOT]))
        await status_is(farm, task_id, "done")
    amc = Cli(farm.address, await farm.token(Role.CLIENT))
    for umask, mode in ((0o022, 0o644), (0o027, 0o640)):
        out = tmp_path / f"umask-{umask:03o}.png"
        before = os.umask(umask)  # the amc process inherits it
        try:
            run = await amc("artifact", task_id, "capture", "-o", str(out))
        finally:
            os.umask(before)
        assert run.code == 0, run.err
        assert out.read_bytes() == screenshot_png("sim-0")
        assert out.stat().st_mode & 0o777 == mode, oct(out.stat().st_mode)


# -- the upload RPC: fenced, limited, checked ------------------------------------------------


async def dispatched(
    farm: Farm, host_id: str = "h1", serial: str = "s1"
) -> tuple[HostClient, lease_pb2.Assignment]:
    host = await farm.host(host_id, serial)
    client = await farm.client()
    await submit(client, actions_spec(SCREENSHOT), selector=task_pb2.DeviceSelector(serial=serial))
    a = await host.acquire_one(serial)
    await host.renew(a.lease_id)
    return host, a


def upload_messages(
    a: lease_pb2.Assignment,
    data: bytes,
    *,
    size: int | None = None,
    digest: str | None = None,
    kind: str = "screenshot",
    chunk: int = 1000,
) -> list[lease_pb2.UploadArtifactRequest]:
    header = lease_pb2.ArtifactHeader(
        task_id=a.task_id,
        attempt=a.attempt,
        lease_id=a.lease_id,
        step_index=0,
        step_name="screenshot",
        kind=kind,
        size_bytes=len(data) if size is None else size,
        sha256=sha(data) if digest is None else digest,
    )
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    return [lease_pb2.UploadArtifactRequest(header=header)] + [
        lease_pb2.UploadArtifactRequest(chunk=c) for c in chunks
    ]


async def upload(
    host: HostClient, messages: list[lease_pb2.UploadArtifactRequest]
) -> task_pb2.Artifact:
    return await host.c.lease.UploadArtifact(iter(messages))


async def refused(
    farm: Farm, host: HostClient, messages: list[lease_pb2.UploadArtifactRequest]
) -> grpc.aio.AioRpcError:
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await upload(host, messages)
    assert await stored(farm) == (0, 0)
    assert await farm.snapshot() == before
    return info.value


async def test_an_upload_under_the_live_lease_is_stored_once_in_chunks(farm: Farm) -> None:
    """THEN the bytes are stored in 256 KiB rows, and the same upload again answers the
    artifact stored the first time."""
    host, a = await dispatched(farm)
    data = bytes(range(256)) * 4096  # 1 MiB
    first = await upload(host, upload_messages(a, data, chunk=100_000))
    # Other chunk sizes, small enough to differ, big enough to finish well within the lease.
    again = await upload(host, upload_messages(a, data, chunk=1000))
    assert again.artifact_id == first.artifact_id
    assert await stored(farm) == (1, 4)
    _, back = await fetch(await farm.client(), a.task_id, first.artifact_id)
    assert back == data


async def test_an_oversized_upload_is_resource_exhausted_and_stores_nothing(
    database_url: str,
) -> None:
    """THEN a header announcing too much, and bytes past the limit under a header that
    announced less, are both refused naming the limit."""
    farm = Farm(database_url, dataclasses.replace(FAST, max_artifact_bytes=1000))
    await farm.start()
    try:
        host, a = await dispatched(farm)
        exc = await refused(farm, host, upload_messages(a, b"x" * 1001))
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limit of 1000 bytes" in (exc.details() or "")
        # Refused at the header while megabytes are still being sent: the sender reads
        # the refusal, not a broken stream.
        big = upload_messages(a, b"y" * (8 << 20), chunk=256 * 1024)
        exc = await refused(farm, host, big)
        assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    finally:
        await farm.stop()


async def test_a_wrong_checksum_or_size_is_data_loss_and_stores_nothing(farm: Farm) -> None:
    """THEN the answer says what arrived and what the header said."""
    host, a = await dispatched(farm)
    exc = await refused(farm, host, upload_messages(a, b"real bytes", digest=sha(b"other")))
    assert exc.code() == grpc.StatusCode.DATA_LOSS
    assert f"header said {sha(b'other')}" in (exc.details() or "")
    exc = await refused(farm, host, upload_messages(a, b"short", size=6))
    assert exc.code() == grpc.StatusCode.DATA_LOSS
    assert "received 5 bytes, the header said 6" in (exc.details() or "")
    exc = await refused(farm, host, upload_messages(a, b"x" * 5000, size=10))
    assert exc.code() == grpc.StatusCode.DATA_LOSS
    assert "more than the header's 10 bytes" in (exc.details() or "")


async def test_uploads_past_the_replica_s_memory_budget_are_unavailable_until_it_frees(
    database_url: str,
) -> None:
    """THEN while one upload holds most of the budget another is refused UNAVAILABLE
    (nothing stored: the host tries again), and once the first is through it is taken."""
    farm = Farm(database_url, dataclasses.replace(FAST, max_upload_memory=1000))
    await farm.start()
    try:
        host, a = await dispatched(farm)
        first = upload_messages(a, b"a" * 800, chunk=400)
        call = host.c.lease.UploadArtifact()
        await call.write(first[0])
        await call.write(first[1])

        def held() -> float:
            return REGISTRY.get_sample_value("amc_artifact_upload_bytes_held") or 0.0

        await eventually(lambda: held() == 800, what="the first upload to reserve its bytes")
        second = upload_messages(a, b"b" * 300)
        second[0].header.action_index = 1
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await upload(host, second)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "try again" in (info.value.details() or "")
        assert await stored(farm) == (0, 0)
        await call.write(first[2])
        await call.done_writing()
        await call
        assert held() == 0
        await upload(host, second)
        assert await stored(farm) == (2, 2)
    finally:
        await farm.stop()


async def test_an_upload_under_another_host_s_lease_is_permission_denied(farm: Farm) -> None:
    """THEN host B cannot keep a file under host A's lease; nothing is stored."""
    _, a = await dispatched(farm, "host-a", "sa")
    other = await farm.host("host-b", "sb")
    exc = await refused(farm, other, upload_messages(a, b"png"))
    assert exc.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "belongs to another host" in (exc.details() or "")


async def test_a_stale_attempt_s_upload_is_failed_precondition(farm: Farm) -> None:
    """THEN after its lease expired (the task requeued and assigned again), and after a
    report ended it, the attempt can keep nothing."""
    host, first = await dispatched(farm)
    await farm.expire_now(first.lease_id)
    await status_is(farm, first.task_id, "queued")
    second = await host.acquire_one("s1")
    assert second.attempt == 2
    exc = await refused(farm, host, upload_messages(first, b"late"))
    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no longer current" in (exc.details() or "")
    await host.report(second, lease_pb2.OUTCOME_DONE)
    exc = await refused(farm, host, upload_messages(second, b"after the report"))
    assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ("no header", "header"),
        ("two headers", "message 1"),
        ("kind", "header.kind"),
        ("sha256", "header.sha256"),
        ("lease_id", "header.lease_id"),
        ("step_index", "header.step_index"),
    ],
)
async def test_a_malformed_upload_is_invalid_argument_naming_the_field(
    farm: Farm, bad: str, field: str
) -> None:
    """THEN nothing is stored and the message names what is wrong."""
    host, a = await dispatched(farm)
    messages = upload_messages(a, b"data")
    header = messages[0].header
    if bad == "no header":
        messages = messages[1:]
    elif bad == "two headers":
        messages = [messages[0], messages[0]]
    elif bad == "kind":
        header.kind = "video"
    elif bad == "sha256":
        header.sha256 = "ABC"
    elif bad == "lease_id":
        header.lease_id = "nope"
    else:
        header.step_index = -1
    exc = await refused(farm, host, messages)
    assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (exc.details() or "").startswith(field), exc.details()


async def test_a_different_file_for_a_stored_step_is_refused_and_the_first_stands(
    farm: Farm,
) -> None:
    """THEN FAILED_PRECONDITION, and the stored bytes are the first upload's."""
    host, a = await dispatched(farm)
    first = await upload(host, upload_messages(a, b"first"))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await upload(host, upload_messages(a, b"second"))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (await fetch(await farm.client(), a.task_id, first.artifact_id))[1] == b"first"
    assert await stored(farm) == (1, 1)


async def test_reading_artifacts_of_unknown_tasks_or_ids_is_not_found(farm: Farm) -> None:
    client = await farm.client()
    host, a = await dispatched(farm)
    kept = await upload(host, upload_messages(a, b"x"))
    for task_id, artifact_id in [
        (str(uuid.uuid4()), kept.artifact_id),
        (a.task_id, str(uuid.uuid4())),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await fetch(client, task_id, artifact_id)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await listed(client, str(uuid.uuid4()))
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await fetch(client, a.task_id, "not-an-id")
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "artifact_id" in (info.value.details() or "")


async def test_deleting_a_task_deletes_its_artifacts(farm: Farm) -> None:
    """THEN retention (which deletes task rows) leaves no artifact or chunk behind."""
    host, a = await dispatched(farm)
    await upload(host, upload_messages(a, b"x" * 300_000))
    await host.report(a, lease_pb2.OUTCOME_DONE)
    assert await stored(farm) == (1, 2)
    assert farm.db is not None
    async with farm.db.transaction():
        await farm.db.execute("DELETE FROM task_events WHERE task_id = $1::uuid", a.task_id)
        await farm.db.execute("DELETE FROM attempts WHERE task_id = $1::uuid", a.task_id)
        await farm.db.execute("DELETE FROM tasks WHERE task_id = $1::uuid", a.task_id)
    assert await stored(farm) == (0, 0)


async def test_upload_metrics_count_stored_and_refused(farm: Farm) -> None:
    def value(name: str, result: str) -> float:
        return REGISTRY.get_sample_value(name, {"result": result}) or 0.0

    before = {r: value("amc_artifact_uploads_total", r) for r in metrics.ARTIFACT_RESULTS}
    stored_bytes = value("amc_artifact_bytes_total", "stored")
    host, a = await dispatched(farm)
    await upload(host, upload_messages(a, b"12345"))
    with pytest.raises(grpc.aio.AioRpcError):
        await upload(host, upload_messages(a, b"12345", digest=sha(b"no")))
    await eventually(
        lambda: value("amc_artifact_uploads_total", "damaged") == before["damaged"] + 1
    )
    assert value("amc_artifact_uploads_total", "stored") == before["stored"] + 1
    assert value("amc_artifact_bytes_total", "stored") == stored_bytes + 5
