"""A run's phone log (logcat) through the real parts: a real host agent on simulated phones
and a real control plane. Each attempt's log is kept (gzipped, with step marks), an app's
crash and an ANR are flagged on the step where they happened, and Scheduler.StreamLogs
reads it: the kept log of a finished task, the live tail of a running one (lines sent up
only while followed), filtered on the control plane, for its team and operators only."""

from __future__ import annotations

import asyncio
import gzip
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_client import Farm as Library
from amc_common import logcat
from control_plane.admin_service import create_token
from control_plane.domain import Role
from host_agent.adb import AdbSource
from host_agent.log_feed import LogFeed
from host_agent.logcat import CLOCK_TRIES
from host_agent.simulated import SimulatedSource
from tests.support import Clients, Farm, actions_spec, eventually, tap, wait_action
from tests.support.agent import finished, get, running_agent, status_is, submit
from tests.support.fakes.adb_server import FakeAdbServer
from tests.support.fakes.adbd import FakeAdbd
from tests.support.fakes.phone import FakePhone
from tests.support.fakes.real_adb import RealAdbServer
from tests.test_sessions import act, dispatched, opening

APP = "com.example.shop"


def shell(command: str) -> task_pb2.Action:
    return task_pb2.Action(shell=task_pb2.Shell(command=command))


def launch(package: str = APP) -> task_pb2.Action:
    return task_pb2.Action(launch_app=task_pb2.LaunchApp(package=package))


def crashing_spec() -> task_pb2.TaskSpec:
    """Five steps: launch, tap, the app's crash (step 3), a tap, an ANR logged (step 5)."""
    return actions_spec(
        launch(),
        tap(540, 1200),
        shell(f"am crash {APP}"),
        tap(100, 200),
        shell(f"log -p e -t ActivityManager 'ANR in {APP} (ui thread blocked)'"),
    )


async def read_log(
    client: Clients, task_id: str, **fields: Any
) -> list[scheduler_pb2.StreamLogsResponse]:
    request = scheduler_pb2.StreamLogsRequest(task_id=task_id, **fields)
    return [m async for m in client.scheduler.StreamLogs(request)]


def lines_of(messages: list[scheduler_pb2.StreamLogsResponse]) -> list[str]:
    return [x for m in messages for x in m.lines]


async def kept_log(client: Clients, task_id: str) -> tuple[task_pb2.Artifact, str]:
    found = await client.scheduler.ListArtifacts(
        scheduler_pb2.ListArtifactsRequest(task_id=task_id)
    )
    kept = [a for a in found.artifacts if a.kind == "logcat"]
    assert len(kept) == 1, found
    data = b""
    get = scheduler_pb2.GetArtifactRequest(task_id=task_id, artifact_id=kept[0].artifact_id)
    async for message in client.scheduler.GetArtifact(get):
        data += message.chunk
    return kept[0], gzip.decompress(data).decode()


async def test_a_crash_and_an_anr_are_flagged_on_their_steps_and_the_log_is_kept(
    farm: Farm,
) -> None:
    """THEN the report's step 3 (the `am crash`) carries the FATAL EXCEPTION with its
    process, step 5 the ANR, the others none; the attempt's log is kept as a gzip artifact
    of kind logcat with the last step, holding every step's marks in order (numbered from
    1), the launch, the taps as input events and the crash block between step 3's marks."""
    client = await farm.client()
    source = SimulatedSource(1)
    async with running_agent(farm, source) as agent:
        task_id = await submit(client, crashing_spec())
        await finished(agent, task_id)
        await status_is(farm, task_id, "done")
        task = await get(client, task_id)
    steps = task.result.steps
    assert [list(s.warnings) for s in steps[:2]] == [[], []] and not steps[3].warnings
    (crash,) = steps[2].warnings
    assert "AndroidRuntime: FATAL EXCEPTION: main" in crash
    assert f"(Process: {APP}, PID: " in crash
    (anr,) = steps[4].warnings
    assert f"ActivityManager: ANR in {APP}" in anr
    artifact, text = await kept_log(client, task_id)
    assert (artifact.step_index, artifact.content_type) == (4, "application/gzip")
    lines = text.splitlines()
    marks = [e.message for x in lines if (e := logcat.parse(x)) and e.tag == logcat.MARK_TAG]
    names = ["launch_app", "tap", "shell", "tap", "shell"]
    began = [m for m in marks if m.endswith("began")]
    assert began == ["run began", *(f"step {i} '{n}' began" for i, n in enumerate(names, 1))]
    assert sum(m.startswith("step ") and " ended: ok in " in m for m in marks) == 5
    at = {m: i for i, x in enumerate(lines) for m in marks if x.endswith(m)}
    fatal = next(i for i, x in enumerate(lines) if "FATAL EXCEPTION" in x)
    assert at["step 3 'shell' began"] < fatal < at["step 4 'tap' began"]
    assert any("Delivering touch ACTION_DOWN (x=540.0, y=1200.0)" in x for x in lines)
    assert any("START u0" in x and APP in x for x in lines)
    assert "logcat" not in steps[4].data  # said only when lines were left out


async def test_a_finished_tasks_log_is_read_back_filtered_by_level_and_tag(farm: Farm) -> None:
    """THEN StreamLogs of a finished task streams its kept log, the last message
    caught_up; --level E keeps E and F lines (and the step marks); a tag keeps that tag's."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1)) as agent:
        task_id = await submit(client, crashing_spec())
        await finished(agent, task_id)
        await status_is(farm, task_id, "done")
    everything = await read_log(client, task_id)
    assert everything[-1].caught_up and all(m.attempt == 1 for m in everything)
    errors = lines_of(await read_log(client, task_id, min_level="E"))
    entries = [e for x in errors if (e := logcat.parse(x))]
    assert {e.level for e in entries if e.tag != "amc"} <= {"E", "F"}
    assert any("FATAL EXCEPTION" in x for x in errors)
    assert sum(e.tag == "amc" for e in entries) >= 10  # the marks pass
    assert len(errors) < len(lines_of(everything))
    tagged = lines_of(await read_log(client, task_id, tags=["AndroidRuntime"]))
    tags = {e.tag for x in tagged if (e := logcat.parse(x)) and e.tag != "amc"}
    assert tags == {"AndroidRuntime"}


async def test_a_running_tasks_log_is_followed_live_and_ends_with_the_attempt(
    farm: Farm,
) -> None:
    """THEN a follow of a running task gets the lines so far (caught_up), then a tap
    done while it follows as it is logged, and ends OK when the attempt ends."""
    client = await farm.client()
    source = SimulatedSource(1)
    async with running_agent(farm, source):
        spec = actions_spec(launch(), wait_action(3), tap(321, 654), wait_action(1))
        task_id = await submit(client, spec)
        await status_is(farm, task_id, "dispatched")
        await eventually(
            lambda: any(r.action == "launch_app" for r in source.actions), what="the launch"
        )
        request = scheduler_pb2.StreamLogsRequest(task_id=task_id, follow=True)
        call = client.scheduler.StreamLogs(request)
        seen: list[str] = []
        caught = False
        async for message in call:
            seen += message.lines
            caught = caught or message.caught_up
        assert caught
        assert any("step 1 'launch_app' began" in x for x in seen)
        assert any("(x=321.0, y=654.0)" in x for x in seen)
        assert any("step 4 'wait' ended" in x for x in seen)


async def refused(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await asyncio.wait_for(call.read(), 20)
    return caught.value.code(), caught.value.details() or ""


async def test_a_log_is_for_its_submitters_team_and_operators(farm: Farm) -> None:
    """THEN the submitter, a token of its team and an operator read the log, running
    (live) and finished (kept); a client of another team, or of none, is refused
    PERMISSION_DENIED in one line, and so is its relay-free live read."""
    assert farm.plane is not None
    store = farm.plane.store

    async def token(role: Role, team: str = "") -> str:
        _, made = await create_token(store, role, None, "test", team)
        return made

    submitter = farm.clients(await token(Role.CLIENT, "qa"))
    teammate = farm.clients(await token(Role.CLIENT, "qa"))
    operator = farm.clients(await token(Role.OPERATOR))
    strangers = [farm.clients(await token(Role.CLIENT, "web")), await farm.client()]
    async with running_agent(farm, SimulatedSource(1)) as agent:
        task_id = await submit(submitter, actions_spec(launch(), wait_action(30)))
        await status_is(farm, task_id, "dispatched")
        request = scheduler_pb2.StreamLogsRequest(task_id=task_id)
        for who in (submitter, teammate, operator):
            assert (await read_log(who, task_id))[-1].caught_up
        for who in strangers:
            code, details = await refused(who.scheduler.StreamLogs(request))
            assert code == grpc.StatusCode.PERMISSION_DENIED, details
            assert "only its team and operators may read its phone's log" in details
        await operator.scheduler.CancelTask(
            scheduler_pb2.CancelTaskRequest(task_id=task_id, reason="test over")
        )
        await finished(agent, task_id)
        await status_is(farm, task_id, "cancelled")
    for who in (submitter, teammate, operator):
        assert any("launch_app" in x for x in lines_of(await read_log(who, task_id)))
    for who in strangers:
        code, _ = await refused(who.scheduler.StreamLogs(request))
        assert code == grpc.StatusCode.PERMISSION_DENIED
    # Its kept file too: GetArtifact holds a log to the same rule (not a screenshot).
    _, text = await kept_log(submitter, task_id)
    assert "launch_app" in text
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await kept_log(strangers[0], task_id)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED


BAD = grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("fields", "code", "words"),
    [
        ({"task_id": "nope"}, grpc.StatusCode.INVALID_ARGUMENT, "task_id"),
        ({"task_id": str(uuid.UUID(int=7))}, grpc.StatusCode.NOT_FOUND, "not found"),
        (
            {"min_level": "loud"},
            grpc.StatusCode.INVALID_ARGUMENT,
            "min_level: 'loud' is not a log priority",
        ),
        ({"tags": ["a:b"]}, grpc.StatusCode.INVALID_ARGUMENT, "tags: 'a:b' is not a log tag"),
        (
            {"tags": [f"t{i}" for i in range(21)]},
            grpc.StatusCode.INVALID_ARGUMENT,
            "at most 20 tags",
        ),
        ({"attempt": -1}, grpc.StatusCode.INVALID_ARGUMENT, "attempt"),
        ({"attempt": 2}, grpc.StatusCode.NOT_FOUND, "has no attempt 2"),
        ({}, grpc.StatusCode.FAILED_PRECONDITION, "has not run yet"),
    ],
)
async def test_bad_requests_are_refused_in_one_line(
    farm: Farm, fields: dict[str, Any], code: grpc.StatusCode, words: str
) -> None:
    """THEN a malformed id or filter is INVALID_ARGUMENT naming it, an attempt the task
    never had NOT_FOUND, a queued task's log (not followed) FAILED_PRECONDITION: each in
    one line, never INTERNAL."""
    client = await farm.client()
    queued = await submit(
        client, actions_spec(tap()), selector=task_pb2.DeviceSelector(serial="none")
    )
    request = scheduler_pb2.StreamLogsRequest(**{"task_id": queued, **fields})
    got, details = await refused(client.scheduler.StreamLogs(request))
    assert got == code, details
    assert words in details and "\n" not in details


async def test_a_phone_behind_the_real_adb_server_has_its_log_kept_and_its_crash_flagged(
    farm: Farm, tmp_path: Path
) -> None:
    """THEN through pure-python-adb → the real adb server → the fake adbd, the agent
    clears the phone's log (`logcat -c`), writes the run's first line into it (`log -p i -t
    amc`) and streams `logcat -v threadtime -v usec`, all in one command, writes more lines
    only when that was slow (the phone's clock) and as the run ends, none per step (the
    steps are marked by the phone's clock), and the crash lands on step 3 as on a simulated
    phone; the log it keeps holds the step marks around the crash."""
    phone = FakePhone("FAKE0001")
    async with FakeAdbd(phone) as adbd, RealAdbServer(tmp_path / "adb-home") as adb:
        await adb.connect(adbd.address)
        source = AdbSource(adb.host, adb.port, call_timeout=10.0)
        client = await farm.client()
        async with running_agent(farm, source):
            task_id = await submit(client, crashing_spec())
            await status_is(farm, task_id, "done", within=30)
            task = await get(client, task_id)
    commands = phone.shell_commands()
    # One command empties the log, writes the run's first line and follows it.
    (started,) = [c for c in commands if "logcat -v threadtime -v usec" in c]
    assert started == (
        "logcat -c || log -p w -t amc 'the log was not cleared';"
        " log -p i -t amc 'run began'; exec logcat -v threadtime -v usec"
    )
    written = [
        c.split(";")[0][len("log -p i -t amc ") :]
        for c in commands
        if c.startswith("log -p i -t amc")
    ]
    # Up to two more lines when the first was slow (the clock), and the last.
    assert written[-1].startswith("'run ended ("), written
    assert written[:-1] == [f"'clock {i}'" for i in range(2, len(written) + 1)][: CLOCK_TRIES - 1]
    warned = [i for i, s in enumerate(task.result.steps) if s.warnings]
    assert warned == [2, 4], [list(s.warnings) for s in task.result.steps]
    assert f"(Process: {APP}, PID: " in task.result.steps[2].warnings[0]
    _, text = await kept_log(client, task_id)
    lines = text.splitlines()
    fatal = next(i for i, x in enumerate(lines) if "FATAL EXCEPTION" in x)
    began = next(i for i, x in enumerate(lines) if x.endswith("step 3 'shell' began"))
    ended = next(i for i, x in enumerate(lines) if "step 3 'shell' ended: ok" in x)
    assert began < fatal < ended


async def test_a_phone_whose_log_could_not_be_cleared_says_so_with_the_log_kept(
    farm: Farm,
) -> None:
    """THEN through the adb host protocol, a phone whose `logcat -c` fails writes the line
    that says so before the run's first (in the command that starts the log), and the
    kept log's step says the log could not be cleared first: the run goes on."""
    phone = FakePhone("FAKE0002")
    phone.failures["logcat -c"] = (1, "logcat: failed to clear the 'main' log\n")
    async with FakeAdbServer([phone]) as server:
        client = await farm.client()
        async with running_agent(farm, AdbSource(port=server.port, call_timeout=10.0)):
            task_id = await submit(client, actions_spec(tap(), tap()))
            await status_is(farm, task_id, "done", within=30)
            task = await get(client, task_id)
    assert task.result.steps[-1].data["logcat"] == "the phone's log could not be cleared first"
    _, text = await kept_log(client, task_id)
    ours = [e.message for x in text.splitlines() if (e := logcat.parse(x)) and e.tag == "amc"]
    assert ours[:2] == ["the log was not cleared", "run began"], ours


async def test_a_sessions_steps_carry_their_warnings_and_its_log_is_kept(farm: Farm) -> None:
    """THEN a session's step that crashed the app has the crash as its warning in the
    report (its answer says it only if the line was read by the step's end; no answer
    says it on another step, though it may be read during the next), and the session's
    log is kept with its last step, its steps marked."""
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1)) as agent:
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        answers = []
        for action in (launch(), shell(f"am crash {APP}"), tap()):
            await call.write(act(action))
            answers.append((await asyncio.wait_for(call.read(), 20)).step.step)
        await call.done_writing()
        while await asyncio.wait_for(call.read(), 20) is not grpc.aio.EOF:
            pass
        await finished(agent, task.task_id)
        await status_is(farm, task.task_id, "done")
    steps = (await get(client, task.task_id)).result.steps
    assert [len(s.warnings) for s in steps] == [0, 1, 0]
    assert "FATAL EXCEPTION" in steps[1].warnings[0]
    assert [list(a.warnings) for a in answers] in (
        [[], [], []],
        [[], list(steps[1].warnings), []],
    )
    _, text = await kept_log(client, task.task_id)
    assert "step 2 'shell' began" in text and "step 3 'tap' ended: ok" in text


async def test_a_follow_of_a_queued_task_waits_for_it_and_gets_its_log_from_the_start(
    farm: Farm,
) -> None:
    """THEN a follow opened while the task waits in the queue (no phone yet) gets, once a
    phone takes it, its log from its first step's mark, and ends with the attempt."""
    client = await farm.client()
    task_id = await submit(client, actions_spec(launch(), tap(11, 22)))
    request = scheduler_pb2.StreamLogsRequest(task_id=task_id, follow=True)
    call = client.scheduler.StreamLogs(request)
    reading = asyncio.ensure_future(read_all(call))
    await asyncio.sleep(0)  # the follow is open before a phone can take the task
    assert await farm.status(task_id) == "queued"
    async with running_agent(farm, SimulatedSource(1)):
        seen = await asyncio.wait_for(reading, 30)
        await status_is(farm, task_id, "done")
    marks = [e.message for x in seen if (e := logcat.parse(x)) and e.tag == "amc"]
    assert marks[:2] == ["run began", "step 1 'launch_app' began"]
    assert "step 2 'tap' ended: ok" in " ".join(marks)


async def test_a_follow_whose_attempt_ended_before_its_host_opened_its_call_gets_the_kept_log(
    farm: Farm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """THEN a follow of a running session whose host opens its live call only after the
    attempt ended (the host then has no line to send and says `ended`) is served the log
    the attempt kept, from its first step's mark to its last."""
    asked = asyncio.Event()
    deferred: list[LogFeed] = []

    def want_later(feed: LogFeed) -> None:  # the host hears the wish, answers it later
        deferred.append(feed)
        asked.set()

    monkeypatch.setattr(LogFeed, "want", want_later)
    client = await farm.client()
    async with running_agent(farm, SimulatedSource(1)) as agent:
        call = client.scheduler.OpenSession()
        await call.write(opening())
        task = await dispatched(call)
        for action in (launch(), tap(11, 22)):
            await call.write(act(action))
            await asyncio.wait_for(call.read(), 20)
        follow = scheduler_pb2.StreamLogsRequest(task_id=task.task_id, follow=True)
        reading = asyncio.ensure_future(read_all(client.scheduler.StreamLogs(follow)))
        await asyncio.wait_for(asked.wait(), 20)  # followed while it runs
        await call.done_writing()
        while await asyncio.wait_for(call.read(), 20) is not grpc.aio.EOF:
            pass
        await finished(agent, task.task_id)
        await status_is(farm, task.task_id, "done")
        monkeypatch.undo()
        deferred[0].want()  # the host's call opens now: the attempt is over on the host
        seen = await asyncio.wait_for(reading, 30)
    _, text = await kept_log(client, task.task_id)
    assert seen == text.splitlines()
    marks = [e.message for x in seen if (e := logcat.parse(x)) and e.tag == "amc"]
    assert marks[:2] == ["run began", "step 1 'launch_app' began"]
    assert "step 2 'tap' ended: ok" in " ".join(marks)


async def read_all(call: Any) -> list[str]:
    return [x async for m in call for x in m.lines]


async def test_a_report_with_too_many_warnings_on_a_step_is_refused_naming_it(
    farm: Farm,
) -> None:
    """THEN a host's report whose step carries more than 20 warnings is INVALID_ARGUMENT
    naming the field, records nothing, and 20 are kept as sent."""
    host = await farm.host("host-9", "p-1")
    client = await farm.client()
    task_id = await submit(client, actions_spec(tap()))
    a = await host.acquire_one("p-1")
    await host.renew(a.lease_id)

    def report(count: int) -> lease_pb2.ReportResultRequest:
        step = task_pb2.StepResult(index=0, name="tap", warnings=[f"w{i}" for i in range(count)])
        return lease_pb2.ReportResultRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            outcome=lease_pb2.OUTCOME_DONE,
            result=task_pb2.TaskResult(steps=[step]),
        )

    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await host.c.lease.ReportResult(report(21))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "result.steps[0].warnings: more than 20 warnings" in (caught.value.details() or "")
    assert await farm.status(task_id) == "dispatched"
    await host.c.lease.ReportResult(report(20))
    steps = (await get(client, task_id)).result.steps
    assert list(steps[0].warnings) == [f"w{i}" for i in range(20)]


async def test_the_client_library_follows_a_sessions_log_and_refuses_bad_input(
    farm: Farm,
) -> None:
    """THEN amc_client's `Farm.logs(follow=True)` of a session gets its lines as the phone
    writes them (the crash an action caused, each action's marks) and ends when the session
    closes; `level="E"` afterwards keeps the crash and the marks only; a bad level is
    INVALID_ARGUMENT naming it and a task that does not exist NOT_FOUND."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(1)),
        Library(farm.address, token=token) as library,
    ):
        async with library.session() as phone:
            following = asyncio.ensure_future(_lines(library.logs(phone.task_id, follow=True)))
            await phone.launch_app(APP)
            await phone.shell(f"am crash {APP}")
            await phone.tap(5, 6)
        seen = await asyncio.wait_for(following, 30)
        errors = await _lines(library.logs(phone.task_id, level="E"))
        with pytest.raises(grpc.aio.AioRpcError) as bad_level:
            await _lines(library.logs(phone.task_id, level="loud"))
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await _lines(library.logs(str(uuid.UUID(int=7))))
    assert any("FATAL EXCEPTION" in x for x in seen)
    assert any("step 3 'tap' ended: ok" in x for x in seen)
    entries = [e for x in errors if (e := logcat.parse(x))]
    assert {e.level for e in entries if e.tag != logcat.MARK_TAG} <= {"E", "F"}
    assert any("FATAL EXCEPTION" in x for x in errors) and len(errors) < len(seen)
    assert bad_level.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "min_level: 'loud' is not a log priority" in (bad_level.value.details() or "")
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def _lines(lines: AsyncIterator[str]) -> list[str]:
    return [x async for x in lines]
