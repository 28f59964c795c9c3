"""The small files a run kept go with its report (ReportResultRequest.kept) instead of an
upload call each before it: stored in the report's transaction when the result is
recorded, none when it is refused or repeated; bad ones refused, naming the field."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import hashlib

import grpc
import pytest
from prometheus_client import REGISTRY

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_common.statuses import Outcome
from host_agent.artifact_upload import carried
from host_agent.reporting import MAX_BATCH_BYTES, ResultBatcher
from host_agent.results import Kept, RunResult, StepResult, StepStatus
from host_agent.simulated import SimulatedSource
from tests.conftest import FAST
from tests.support import Farm, actions_spec
from tests.support.agent import get, running_agent, status_is, submit
from tests.test_result_batches import Counting, _assigned

SCREENSHOT = task_pb2.Action(screenshot=task_pb2.Screenshot())
UI_DUMP = task_pb2.Action(ui_dump=task_pb2.UiDump())
LOG = gzip.compress(b"12-05 10:00:00.000  100  100 I amc: a run's phone log\n")


def _uploads(result: str) -> float:
    value = REGISTRY.get_sample_value("amc_artifact_uploads_total", {"result": result})
    return value or 0.0


async def _artifacts(farm: Farm, task_id: str) -> list[tuple[str, int, int, bytes]]:
    """(kind, step, action, bytes) of the task's stored artifacts, in order."""
    assert farm.db is not None
    rows = await farm.db.fetch(
        "SELECT a.kind, a.step_index, a.action_index,"
        " COALESCE(string_agg(c.data, ''::bytea ORDER BY c.seq), ''::bytea) AS data"
        " FROM artifacts a LEFT JOIN artifact_chunks c USING (artifact_id)"
        " WHERE a.task_id = $1::uuid GROUP BY a.artifact_id"
        " ORDER BY a.step_index, a.action_index",
        task_id,
    )
    return [(r["kind"], r["step_index"], r["action_index"], bytes(r["data"])) for r in rows]


def _report(a: lease_pb2.Assignment, *kept: lease_pb2.KeptFile) -> lease_pb2.ReportResultRequest:
    step = task_pb2.StepResult(index=0, name="open", status=task_pb2.STEP_STATUS_OK)
    return lease_pb2.ReportResultRequest(
        task_id=a.task_id,
        attempt=a.attempt,
        lease_id=a.lease_id,
        outcome=lease_pb2.OUTCOME_DONE,
        result=task_pb2.TaskResult(steps=[step]),
        kept=kept,
    )


def _log(step: int = 0, action: int = 998, data: bytes = LOG) -> lease_pb2.KeptFile:
    return lease_pb2.KeptFile(step_index=step, action_index=action, kind="logcat", data=data)


async def test_a_runs_small_files_go_with_its_report_even_with_no_time_to_upload(
    farm: Farm,
) -> None:
    """THEN an agent given no time for uploads still keeps its run's screenshot and UI dump
    (small enough to go with the report): stored with the result, listed in their steps,
    their bytes read back whole, and not one upload call made."""
    client = await farm.client()
    uploaded, carried = _uploads("stored"), _uploads("with_report")
    async with running_agent(farm, SimulatedSource(1, delay=0.01), upload_timeout=1e-9):
        task_id = await submit(client, actions_spec(SCREENSHOT, UI_DUMP))
        await status_is(farm, task_id, "done")
    steps = (await get(client, task_id)).result.steps
    assert [[a.kind for a in s.artifacts if a.kind != "logcat"] for s in steps] == [
        ["screenshot"],
        ["ui_dump"],
    ]
    assert not any("artifact_error" in s.data for s in steps)
    stored = await _artifacts(farm, task_id)
    listed = {(a.kind, a.step_index, a.action_index): a for s in steps for a in s.artifacts}
    assert {(k, s, a) for k, s, a, _ in stored} == set(listed)
    for kind, step, action, data in stored:
        artifact = listed[(kind, step, action)]
        assert artifact.size_bytes == len(data) > 0
        assert artifact.sha256 == hashlib.sha256(data).hexdigest()
        # Read back as any artifact is.
        got = b"".join(
            [
                m.chunk
                async for m in client.scheduler.GetArtifact(
                    scheduler_pb2.GetArtifactRequest(
                        task_id=task_id, artifact_id=artifact.artifact_id
                    )
                )
            ]
        )
        assert got == data
    assert _uploads("stored") == uploaded
    assert _uploads("with_report") == carried + len(stored)


async def test_registration_says_what_a_report_may_carry(database_url: str) -> None:
    """THEN RegisterHost answers 64 KiB, or the control plane's limit per artifact when
    that is smaller."""
    for limit, expected in ((10 << 20, 64 * 1024), (1000, 1000)):
        farm = Farm(database_url, dataclasses.replace(FAST, max_artifact_bytes=limit))
        await farm.start()
        try:
            host = await farm.host("h1")
            answer = await host.c.lease.RegisterHost(
                lease_pb2.RegisterHostRequest(
                    host_id="h1", devices=[lease_pb2.DeviceInfo(serial="s0")]
                )
            )
            assert answer.kept_max_bytes == expected
        finally:
            await farm.stop()


async def test_a_carried_file_is_stored_once_and_never_for_a_refused_report(farm: Farm) -> None:
    """THEN a report's file is stored with its result; the same report sent again (its
    answer lost) stores nothing more; a stale lease's report stores nothing."""
    host, (a, b) = await _assigned(farm, 2)
    answer = await host.c.lease.ReportResult(_report(a, _log()))
    assert answer.status == task_pb2.TASK_STATUS_DONE
    (listed,) = answer.result.steps[0].artifacts
    assert (listed.kind, listed.action_index, listed.size_bytes) == ("logcat", 998, len(LOG))
    assert listed.content_type == "application/gzip" and listed.task_id == a.task_id
    assert await _artifacts(farm, a.task_id) == [("logcat", 0, 998, LOG)]
    again = await host.c.lease.ReportResult(_report(a, _log()))
    assert again.result.steps[0].artifacts[0].artifact_id == listed.artifact_id
    assert await _artifacts(farm, a.task_id) == [("logcat", 0, 998, LOG)]
    await farm.expire_now(b.lease_id)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await host.c.lease.ReportResult(_report(b, _log()))
    assert refused.value.code() is grpc.StatusCode.ABORTED
    assert await _artifacts(farm, b.task_id) == []


async def test_files_of_a_batch_are_kept_with_their_own_results(farm: Farm) -> None:
    """THEN in one ReportResults, each recorded result keeps its own file, an empty one
    too, and the refused one's file is not kept."""
    host, handed = await _assigned(farm, 3)
    await farm.expire_now(handed[2].lease_id)
    files = [_log(data=b""), _log(data=LOG), _log(data=b"x" * 1000)]
    answer = await host.c.lease.ReportResults(
        lease_pb2.ReportResultsRequest(
            results=[_report(a, f) for a, f in zip(handed, files, strict=True)]
        )
    )
    assert [x.code for x in answer.answers][:2] == [0, 0] and answer.answers[2].code != 0
    assert await _artifacts(farm, handed[0].task_id) == [("logcat", 0, 998, b"")]
    assert await _artifacts(farm, handed[1].task_id) == [("logcat", 0, 998, LOG)]
    assert await _artifacts(farm, handed[2].task_id) == []


@pytest.mark.parametrize(
    ("kept", "field", "says"),
    [
        ((_log(data=b"x" * (64 * 1024 + 1)),), "kept", "at most 65536"),
        ((_log(step=3),), "kept[0].step_index", "no step 3"),
        ((lease_pb2.KeptFile(step_index=0, kind="movie", data=b"x"),), "kept[0].kind", "one of"),
        ((_log(action=1000),), "kept[0].action_index", "between 0 and 999"),
        ((_log(), _log()), "kept[1].action_index", "already"),
        (tuple(_log(action=i, data=b"") for i in range(17)), "kept", "more than 16"),
    ],
)
async def test_a_bad_carried_file_is_refused_naming_it_and_records_nothing(
    farm: Farm, kept: tuple[lease_pb2.KeptFile, ...], field: str, says: str
) -> None:
    host, (a,) = await _assigned(farm, 1)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await host.c.lease.ReportResult(_report(a, *kept))
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert details.startswith(field) and says in details, details
    assert await farm.status(a.task_id) != "done"
    assert await _artifacts(farm, a.task_id) == []


async def test_a_file_clashing_with_an_uploaded_one_is_refused(farm: Farm) -> None:
    host, (a,) = await _assigned(farm, 1)
    request = _report(a, _log(action=0))
    request.result.steps[0].artifacts.add(action_index=0, kind="screenshot")
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await host.c.lease.ReportResult(request)
    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "kept[0].action_index" in (refused.value.details() or "")


async def test_results_carrying_files_are_batched_below_the_message_limit(farm: Farm) -> None:
    """THEN results whose files would make one call larger than the control plane takes go
    in several calls, each under MAX_BATCH_BYTES, and every one is recorded with its file."""
    host, handed = await _assigned(farm, 20)
    stub = Counting(host.c.lease)
    batcher = ResultBatcher(stub)  # type: ignore[arg-type]
    files = [_log(data=bytes([i]) * 60_000) for i in range(len(handed))]
    deliveries = await asyncio.gather(
        *(batcher.report(_report(a, f)) for a, f in zip(handed, files, strict=True))
    )
    assert all(d.accepted for d in deliveries)
    sizes = [n for _, n in stub.calls]
    assert sum(sizes) == 20 and len(sizes) >= 2
    assert max(sizes) * 60_000 <= MAX_BATCH_BYTES
    for a, f in zip(handed, files, strict=True):
        assert await _artifacts(farm, a.task_id) == [("logcat", 0, 998, f.data)]


async def test_a_result_refused_for_its_files_goes_again_without_them(database_url: str) -> None:
    """GIVEN a host that carries more than the control plane takes (its limit fell since
    the host registered) THEN the result is refused for its files, sent again without
    them, and recorded: the task done, its step saying why its screenshot was not kept."""
    farm = Farm(database_url, dataclasses.replace(FAST, max_artifact_bytes=16))
    await farm.start()
    try:
        client = await farm.client()
        async with running_agent(farm, SimulatedSource(1, delay=0.01)) as agent:
            # What an earlier start of this control plane said (64 KiB).
            agent.keeper.timing = dataclasses.replace(agent.keeper.timing, kept_max_bytes=65536)
            task_id = await submit(client, actions_spec(SCREENSHOT))
            await status_is(farm, task_id, "done")
        (step,) = (await get(client, task_id)).result.steps
        assert step.status == task_pb2.STEP_STATUS_OK
        errors = [v for k, v in step.data.items() if k.startswith("artifact_error")]
        assert any(
            e.startswith("screenshot not kept: refused with the report: kept") for e in errors
        )
        assert not [a for a in step.artifacts if a.kind == "screenshot"]
        assert await _artifacts(farm, task_id) == []
    finally:
        await farm.stop()


def test_a_result_near_the_message_limit_carries_nothing_and_a_small_one_its_log() -> None:
    """THEN a result whose report would come near the control plane's message limit keeps
    its files to be uploaded; a small one carries them (in step order, within the budget),
    leaving those that do not fit."""
    log, big = Kept("logcat", LOG, 998), Kept("screenshot", b"p" * 70_000, 0)

    def run(steps: int, output: str) -> RunResult:
        done = [StepResult(i, f"s{i}", StepStatus.OK, output=output) for i in range(steps)]
        done[-1] = dataclasses.replace(done[-1], kept=(big, log))
        return RunResult(Outcome.DONE, "", tuple(done))

    small, files = carried(run(3, "ok"), 65536)
    assert [(f.step_index, f.kind, f.data) for f in files] == [(2, "logcat", LOG)]
    assert small.steps[-1].kept == (big,)
    large = run(200, "x" * 4096)
    assert carried(large, 65536) == (large, [])
