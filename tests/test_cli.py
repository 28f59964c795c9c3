"""The `amc` CLI against a live control plane: each command runs as a real subprocess
(`python -m amc_cli`) with AMC_ADDR and AMC_TOKEN, the way a person or a script runs it,
and the tests play the host agent with `farm.host` to move tasks along."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import REGISTRY

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from amc_cli.client import Client, Target
from amc_cli.errors import RpcFailed
from amc_cli.specfile import load_request
from amc_common.channel import with_default_port
from amc_common.durations import parse_duration
from control_plane.admin_service import create_token
from control_plane.config import Settings
from control_plane.domain import Role
from control_plane.server import ControlPlane, Tls
from host_agent.simulated import SimulatedSource
from tests.support import Farm, HostClient, eventually, seconds
from tests.support.agent import running_agent
from tests.support.fakes.tcp_proxy import TcpProxy
from tests.test_step_progress import progress, renew_with, step
from tests.test_tls import self_signed

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "scripts" / "examples"
TIMEOUT = 60.0


@dataclass
class Run:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)

    def assert_one_error_line(self) -> str:
        """The whole of stderr is one `amc: error:` line, and no traceback."""
        assert self.err.startswith("amc: error: "), self.err
        assert self.err.count("\n") == 1 and self.err.endswith("\n"), self.err
        assert "Traceback" not in self.err + self.out
        return self.err.strip()


@dataclass
class Running:
    """An `amc` process still going, read line by line as it prints."""

    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)

    async def line_with(self, text: str, timeout: float = 15.0) -> str:
        for line in self.lines:
            if text in line:
                return line
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                raw = await self.proc.stdout.readline()
                assert raw, f"stdout ended before a line with {text!r}: {self.lines}"
                line = raw.decode()
                self.lines.append(line)
                if text in line:
                    return line

    async def finish(self) -> Run:
        async with asyncio.timeout(TIMEOUT):
            rest, err = await self.proc.communicate()
        assert self.proc.returncode is not None
        return Run(self.proc.returncode, "".join(self.lines) + rest.decode(), err.decode())


@dataclass
class Cli:
    address: str
    token: str | None

    def env(
        self, token: str | None, address: str | None, extra: dict[str, str] | None = None
    ) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AMC_", "GRPC_"))}
        env["AMC_ADDR"] = address or self.address
        if token:
            env["AMC_TOKEN"] = token
        return env | (extra or {})

    async def start(
        self,
        *args: str,
        token: str | None = "",
        address: str | None = None,
        stdin: bool = False,
        env: dict[str, str] | None = None,
    ) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "amc_cli",
            *args,
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env(self.token if token == "" else token, address, env),
            cwd=ROOT,
        )

    async def __call__(
        self,
        *args: str,
        token: str | None = "",
        address: str | None = None,
        stdin: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Run:
        proc = await self.start(
            *args, token=token, address=address, stdin=stdin is not None, env=env
        )
        async with asyncio.timeout(TIMEOUT):
            out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
        assert proc.returncode is not None
        return Run(proc.returncode, out.decode(), err.decode())

    async def running(self, *args: str) -> Running:
        return Running(await self.start(*args))

    async def submit(self, *args: str, stdin: str | None = None) -> dict[str, Any]:
        run = await self("submit", *args, "--output", "json", stdin=stdin)
        assert run.code == 0, run.err
        return run.json()  # type: ignore[no-any-return]


@pytest.fixture
async def amc(farm: Farm) -> Cli:
    return Cli(farm.address, await farm.token(Role.OPERATOR))


TAP = "actions:\n  - tap: [10, 20]\n"


async def dispatched(host: HostClient, serial: str) -> lease_pb2.Assignment:
    """Take the next task onto `serial` and acknowledge it (assigned -> dispatched)."""
    a = await host.acquire_one(serial)
    await host.renew(a.lease_id)
    return a


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- submit ----------------------------------------------------------------------------------


async def test_submit_a_yaml_workflow_file_queues_it_as_written(amc: Cli, farm: Farm) -> None:
    """The example workflow arrives as a workflow with its steps, selector and settings."""
    task = await amc.submit(str(EXAMPLES / "login-workflow.yaml"))
    assert task["status"] == "TASK_STATUS_QUEUED"
    assert await farm.status(task["task_id"]) == "queued"
    steps = task["spec"]["workflow"]["steps"]
    assert [s["name"] for s in steps] == ["open the app", "log in", "evidence"]
    assert steps[2]["continue_on_error"] is True
    assert steps[0]["actions"][2] == {
        "wait_for": {"selector": {"text": "Simulated"}, "timeout": "10s"}
    }
    assert steps[1]["actions"][2] == {"key": {"keycode": 61}}
    assert task["selector"]["labels"] == {"sdk": "34"}
    assert (task["priority"], task["max_attempts"]) == (10, 2)
    assert task["metadata"] == {"ticket": "OPS-1234"}


async def test_submit_a_json_file(amc: Cli) -> None:
    """tap.json is submitted as an actions list, its durations as proto durations."""
    task = await amc.submit(str(EXAMPLES / "tap.json"))
    actions = task["spec"]["actions"]["actions"]
    assert actions[0] == {"tap": {"x": 540, "y": 1200}}
    assert actions[1] == {"wait": {"duration": "1s"}}
    assert actions[2] == {"tap_on": {"selector": {"text": "OK"}}}
    assert task["metadata"] == {"source": "tap.json"}


async def test_submit_from_stdin_with_flags_overriding_the_file(amc: Cli) -> None:
    """`-` reads stdin; --serial, --label, --priority, --max-attempts, --request-id and
    --metadata win over (or merge into) the file."""
    spec = "selector: {labels: {rack: a}}\npriority: 1\nmetadata: {team: qa}\n" + TAP
    flags = [
        "--serial", "s1", "--label", "model=Pixel 8", "-l", "rack=b", "--priority", "7",
        "--max-attempts", "4", "--request-id", "order-17", "--metadata", "run=nightly",
    ]  # fmt: skip
    task = await amc.submit("-", *flags, stdin=spec)
    assert task["selector"] == {"serial": "s1", "labels": {"rack": "b", "model": "Pixel 8"}}
    assert (task["priority"], task["max_attempts"], task["request_id"]) == (7, 4, "order-17")
    assert task["metadata"] == {"team": "qa", "run": "nightly"}
    again = await amc.submit("-", *flags, stdin=spec)
    assert again["task_id"] == task["task_id"]


async def test_submit_json_on_stdin(amc: Cli) -> None:
    """JSON works on stdin too."""
    task = await amc.submit("-", stdin=json.dumps({"actions": [{"wait": 0.25}]}))
    assert task["spec"]["actions"]["actions"] == [{"wait": {"duration": "0.250s"}}]


async def test_submit_prints_the_task_id_for_people(amc: Cli, farm: Farm) -> None:
    """Without --output json, one line names the new task."""
    run = await amc("submit", "-", stdin=TAP)
    assert run.code == 0 and run.err == ""
    words = run.out.split()
    assert words[:2] == ["submitted", "task"]
    assert await farm.status(words[2]) == "queued"


# -- get and list ----------------------------------------------------------------------------


async def test_get_shows_a_task_as_a_table_and_as_json(amc: Cli) -> None:
    """get prints the task's fields for people and the whole Task for scripts."""
    task = await amc.submit("-", "--metadata", "team=qa", stdin=TAP)
    table = await amc("get", task["task_id"])
    assert table.code == 0
    for text in (task["task_id"], "queued", "1 action: tap", "team=qa"):
        assert text in table.out
    doc = (await amc("get", task["task_id"], "-o", "json")).json()
    history = {k: doc.pop(k) for k in ("attempts", "events")}
    assert doc == task | {
        "updated_at": doc["updated_at"],
        "pending_reason": "no device is registered",
    }
    assert history["attempts"] == [] and history["events"][0]["kind"] == "submit"


async def test_list_filters_by_status_and_limits(amc: Cli) -> None:
    """--status picks statuses (repeatable), --limit cuts the list and says there is more."""
    queued = [(await amc.submit("-", stdin=TAP))["task_id"] for _ in range(3)]
    await amc("cancel", queued[0])
    listed = (await amc("list", "--status", "cancelled", "-o", "json")).json()
    assert [t["task_id"] for t in listed["tasks"]] == [queued[0]]
    listed = (await amc("list", "-s", "queued", "-s", "cancelled", "-o", "json")).json()
    assert {t["task_id"] for t in listed["tasks"]} == set(queued)
    assert listed["next_page_token"] == ""
    first = (await amc("list", "-s", "queued", "--limit", "1", "-o", "json")).json()
    assert [t["task_id"] for t in first["tasks"]] == [queued[2]]
    assert first["next_page_token"]
    table = await amc("list", "-s", "queued", "-n", "1")
    assert queued[2] in table.out and queued[1] not in table.out
    # The note is for the person, not for a script reading the table.
    assert "--limit" not in table.out
    assert table.err == "showing the first 1; raise --limit for more\n"


async def test_list_statuses_are_case_insensitive(amc: Cli) -> None:
    """--status Done means done; a status that does not exist is named without noise."""
    task = await amc.submit("-", stdin=TAP)
    await amc("cancel", task["task_id"])
    listed = (await amc("list", "--status", "Cancelled", "-s", "QUEUED", "-o", "JSON")).json()
    assert [t["task_id"] for t in listed["tasks"]] == [task["task_id"]]
    wrong = await amc("list", "--status", "Sleeping")
    assert wrong.code == 2
    line = wrong.assert_one_error_line()
    assert "'Sleeping' is not one of" in line and "Value error" not in line, line


async def test_list_filters_by_host(amc: Cli, farm: Farm) -> None:
    """--host keeps the tasks that ran on that host."""
    host = await farm.host("h1", "s1")
    ran = await amc.submit("-", stdin=TAP)
    await dispatched(host, "s1")
    await amc.submit("-", stdin=TAP)
    listed = (await amc("list", "--host", "h1", "-o", "json")).json()
    assert [t["task_id"] for t in listed["tasks"]] == [ran["task_id"]]


async def test_listing_pages_through_every_page(farm: Farm) -> None:
    """The client follows next_page_token until the limit, or to the end for --limit 0."""
    client = await farm.client()
    for _ in range(5):
        await client.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(
                spec=task_pb2.TaskSpec(
                    actions=task_pb2.ActionList(
                        actions=[task_pb2.Action(tap=task_pb2.Tap(x=1, y=2))]
                    )
                )
            )
        )
    cli = Client(Target(farm.address, await farm.token(Role.CLIENT)))
    try:
        every, rest = await asyncio.to_thread(cli.list_tasks, [], "", 0, 2)
        some, more = await asyncio.to_thread(cli.list_tasks, [], "", 3, 2)
    finally:
        cli.close()
    assert (len(every), rest) == (5, "")
    assert len({t.task_id for t in every}) == 5
    assert [t.task_id for t in some] == [t.task_id for t in every[:3]] and more


# -- cancel ----------------------------------------------------------------------------------


async def test_cancel_a_queued_task(amc: Cli, farm: Farm) -> None:
    """A queued task is cancelled at once, with the reason kept."""
    task = await amc.submit("-", stdin=TAP)
    run = await amc("cancel", task["task_id"], "--reason", "not needed", "-o", "json")
    assert run.code == 0
    assert run.json()["status"] == "TASK_STATUS_CANCELLED"
    assert run.json()["cancel_reason"] == "not needed"
    assert await farm.status(task["task_id"]) == "cancelled"


# What `amc cancel` says of a running task: what happened (the request is recorded) and
# how the host learns of it, never that it was pushed: the push goes by NOTIFY to whichever
# replica holds the host's stream, so the replica answering CancelTask cannot know.
CANCEL_DELIVERY = (
    "host {host} gets it at once if connected, or at its next renewal, and stops the task "
    "at the next step boundary (if it never renews, the task is cancelled when its lease "
    "runs out)"
)


async def test_cancel_a_running_task_requests_it(amc: Cli, farm: Farm) -> None:
    """A dispatched task stays dispatched; the line says the request is recorded and how
    the host gets it, and a connected host (stream open) gets it pushed."""
    host = await farm.host("h1", "s1")
    task = await amc.submit("-", stdin=TAP)
    a = await dispatched(host, "s1")
    stream = host.stream()
    await stream.renew(a.lease_id)  # the host's renewal stream is open: pushes go there
    run = await amc("cancel", task["task_id"])
    assert run.code == 0
    assert "cancellation requested" in run.out and "h1/s1" in run.out
    assert CANCEL_DELIVERY.format(host="h1") in " ".join(run.out.split())
    await eventually(lambda: stream.pushes, what="the push to the host")
    await stream.close()
    assert await farm.status(task["task_id"]) == "dispatched"


async def test_cancel_of_a_task_on_a_disconnected_host_claims_no_push(amc: Cli, farm: Farm) -> None:
    """Issue 21 item 7: with no renewal stream open, nothing can be pushed, and the line
    does not say it was ("pushed to its host" before); the host's next renewal carries the
    request."""
    host = await farm.host("h1", "s1")
    task = await amc.submit("-", stdin=TAP)
    a = await dispatched(host, "s1")  # its one renewal was on a stream now closed
    run = await amc("cancel", task["task_id"])
    assert run.code == 0, run.err
    out = " ".join(run.out.split())
    assert "pushed" not in out, out
    assert out.startswith(f"cancellation requested: task {task['task_id']} is dispatched on h1/s1")
    assert CANCEL_DELIVERY.format(host="h1") in out, out
    (state,) = await host.renew(a.lease_id)
    assert state.cancel_pending
    assert await farm.status(task["task_id"]) == "dispatched"


async def test_cancel_a_done_task_is_a_conflict(amc: Cli, farm: Farm) -> None:
    """Exit 4 and one line naming FAILED_PRECONDITION; the task stays done."""
    host = await farm.host("h1", "s1")
    task = await amc.submit("-", stdin=TAP)
    a = await dispatched(host, "s1")
    await host.report(a, lease_pb2.OUTCOME_DONE)
    run = await amc("cancel", task["task_id"])
    assert run.code == 4
    assert "FAILED_PRECONDITION" in run.assert_one_error_line()
    assert await farm.status(task["task_id"]) == "done"


async def test_cancel_with_retry_for_retries_while_the_control_plane_is_unavailable(
    amc: Cli, farm: Farm
) -> None:
    """A cancel is idempotent: with --retry-for, while the control plane cannot be reached
    `amc cancel` tries again with backoff, saying so once (not once per try), and succeeds
    once it is back, saying that too."""
    task = await amc.submit("-", stdin=TAP)
    async with TcpProxy("127.0.0.1", farm.plane.port if farm.plane else 0) as proxy:
        proxy.cut()  # every connection refused (closed on accept)
        cancel = await amc.start(
            "--retry-for", "30s", "cancel", task["task_id"], "-o", "json", address=proxy.address
        )
        await eventually(
            lambda: proxy.refused >= 4 or cancel.returncode is not None,
            timeout=20,
            what="four refused attempts",
        )
        assert cancel.returncode is None, "amc cancel gave up while the server was away"
        proxy.heal()
        async with asyncio.timeout(TIMEOUT):
            out, err = await cancel.communicate()
    assert cancel.returncode == 0, err.decode()
    assert json.loads(out)["status"] == "TASK_STATUS_CANCELLED"
    unavailable, back = err.decode().splitlines()
    assert unavailable.startswith(
        f"cancel task: the control plane at {proxy.address} is unavailable ("
    ), unavailable
    assert unavailable.endswith("); trying again for up to 30s"), unavailable
    assert back == f"cancel task: the control plane at {proxy.address} answers again"
    assert await farm.status(task["task_id"]) == "cancelled"


async def test_an_address_that_refuses_fails_in_one_line_at_once(amc: Cli) -> None:
    """A typo'd port: nothing there ever answered, so `amc cancel` does not retry, and it
    and `amc hosts` each end with exit 5 and one error line (no retry note), well before
    the --timeout (30 s) that retrying would take: not a speed bound, a loaded machine
    takes seconds to start the CLI."""
    address = f"127.0.0.1:{free_port()}"
    for args in (["cancel", str(uuid.uuid4())], ["hosts"]):
        began = asyncio.get_running_loop().time()
        run = await amc(*args, address=address)
        took = asyncio.get_running_loop().time() - began
        assert run.code == 5, (args, run.err)
        line = run.assert_one_error_line()
        assert "connection refused" in line and address in line and "UNAVAILABLE" in line, line
        assert took < 15.0, (args, took)


async def test_cancel_with_retry_for_gives_up_after_it_with_one_note(amc: Cli) -> None:
    """--retry-for bounds the retries: one note when the trouble starts, none per try,
    then exit 5 and one error line."""
    address = f"127.0.0.1:{free_port()}"
    began = asyncio.get_running_loop().time()
    run = await amc("--retry-for", "3s", "cancel", str(uuid.uuid4()), address=address)
    took = asyncio.get_running_loop().time() - began
    assert run.code == 5, run.err
    note, error = run.err.splitlines()
    assert note == (
        f"cancel task: the control plane at {address} is unavailable (connection refused); "
        "trying again for up to 3s"
    )
    assert error.startswith("amc: error: ") and "UNAVAILABLE" in error and address in error
    assert 1.5 < took < 3.5 + 2, took


async def test_a_control_plane_that_answered_before_is_retried_one_note_per_change(
    farm: Farm,
) -> None:
    """Without --retry-for, an idempotent call is tried again only against a control plane
    that has answered this client: it goes away, comes back; one note for each change."""
    notes: list[str] = []
    async with TcpProxy("127.0.0.1", farm.plane.port if farm.plane else 0) as proxy:
        token = await farm.token(Role.OPERATOR)
        cli = Client(Target(proxy.address, token, timeout=20), on_retry=notes.append)
        try:
            await asyncio.to_thread(cli.list_hosts)
            proxy.cut()
            cancel = asyncio.create_task(asyncio.to_thread(cli.cancel, str(uuid.uuid4()), ""))
            await eventually(lambda: proxy.refused >= 4, timeout=15, what="refused tries")
            assert not cancel.done()
            proxy.heal()
            with pytest.raises(RpcFailed) as refused:
                await cancel
        finally:
            cli.close()
    assert refused.value.status == grpc.StatusCode.NOT_FOUND
    # A try cut mid-call ("Stream removed") and the tries refused after it are two ways of
    # being unavailable: a second note says the way changed, none repeats one.
    assert 2 <= len(notes) <= 3, notes
    assert notes[0].startswith(f"cancel task: the control plane at {proxy.address} is unavail")
    assert all(" is still unavailable (" in n for n in notes[1:-1]), notes
    assert notes[-1] == f"cancel task: the control plane at {proxy.address} answers again"


# -- watch -----------------------------------------------------------------------------------


async def report_with_steps(
    host: HostClient, a: lease_pb2.Assignment, outcome: lease_pb2.Outcome
) -> None:
    step = task_pb2.StepResult(
        index=0,
        name="tap",
        status=task_pb2.STEP_STATUS_OK
        if outcome == lease_pb2.OUTCOME_DONE
        else task_pb2.STEP_STATUS_FAILED,
        duration=seconds(0.4),
        output="tapped at (10, 20)",
        error="" if outcome == lease_pb2.OUTCOME_DONE else "screen is off",
    )
    await host.c.lease.ReportResult(
        lease_pb2.ReportResultRequest(
            task_id=a.task_id,
            attempt=a.attempt,
            lease_id=a.lease_id,
            outcome=outcome,
            result=task_pb2.TaskResult(
                steps=[step], error="" if outcome == lease_pb2.OUTCOME_DONE else "step 0 failed"
            ),
        )
    )


async def test_watch_prints_each_change_as_it_happens_until_done(amc: Cli, farm: Farm) -> None:
    """One line per status, printed live, then the step results; exit 0 for done."""
    host = await farm.host("h1", "s1")
    task = await amc.submit("-", stdin=TAP)
    watch = await amc.running("watch", task["task_id"])
    await watch.line_with("queued")
    a = await host.acquire_one("s1")
    assert "attempt 1/3 on h1/s1" in await watch.line_with("assigned")
    await host.renew(a.lease_id)
    await watch.line_with("dispatched")
    await report_with_steps(host, a, lease_pb2.OUTCOME_DONE)
    run = await watch.finish()
    assert run.code == 0, run.err
    # The status lines (the step lines of the running task begin with spaces).
    lines = [line for line in run.out.splitlines() if not line.startswith(" ")]
    statuses = [line.split()[1] for line in lines[:4]]
    assert statuses == ["queued", "assigned", "dispatched", "done"]
    assert "tapped at (10, 20)" in run.out and "ok" in run.out


LOGIN_PAY = (
    "workflow:\n  - name: login\n    actions: [{tap: [1, 2]}]\n"
    "  - name: pay\n    actions: [{tap: [3, 4]}]\n"
)


async def test_watch_shows_each_step_as_it_ends_and_the_step_running(amc: Cli, farm: Farm) -> None:
    """While the task runs: a line per step its host reported as it ended, and one for the
    step running with its time so far (issue 27.8)."""
    host = await farm.host("h1", "s1")
    task = await amc.submit("-", stdin=LOGIN_PAY)
    watch = await amc.running("watch", task["task_id"])
    await watch.line_with("queued")
    a = await dispatched(host, "s1")
    assert "running for" in await watch.line_with("step 1/2 login")
    await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))
    assert "in 1.5s" in await watch.line_with("step 1/2 login  ok")
    assert "running for" in await watch.line_with("step 2/2 pay")
    await host.report(a, lease_pb2.OUTCOME_DONE)
    run = await watch.finish()
    assert run.code == 0, run.err
    assert run.out.index("step 1/2 login  ok") < run.out.index("step 2/2 pay  running for")


async def test_get_of_a_running_task_says_its_progress(amc: Cli, farm: Farm) -> None:
    """`amc get` of a running task has a progress row: the steps done, the step running
    and its time so far; `-o json` has the Task's progress (issue 27.8)."""
    host = await farm.host("h1", "s1")
    task = await amc.submit("-", stdin=LOGIN_PAY)
    a = await dispatched(host, "s1")
    await renew_with(host, [a.lease_id], progress(a.lease_id, step(0, "login")))
    run = await amc("get", task["task_id"])
    assert run.code == 0, run.err
    running = r"running step 2 pay for (\d+m)?\d+\.\ds"
    assert re.search(rf"^progress\s+1 of 2 steps done; {running}\s*$", run.out, re.M), run.out
    got = (await amc("get", task["task_id"], "-o", "json")).json()
    assert [s["name"] for s in got["progress"]["steps"]] == ["login"]
    assert got["progress"]["running_name"] == "pay"


async def test_watch_exits_8_when_the_task_failed(amc: Cli, farm: Farm) -> None:
    """A failed task ends the watch with exit 8 and shows the error."""
    host = await farm.host("h1", "s1")
    task = await amc.submit("-", "--max-attempts", "1", stdin=TAP)
    watch = await amc.running("watch", task["task_id"])
    await watch.line_with("queued")
    a = await dispatched(host, "s1")
    await report_with_steps(host, a, lease_pb2.OUTCOME_FAILED)
    run = await watch.finish()
    assert run.code == 8, run.err
    assert "failed" in run.out and "step 0 failed" in run.out and "screen is off" in run.out


async def test_watch_exits_9_when_the_task_was_cancelled(amc: Cli, farm: Farm) -> None:
    """A cancellation shows as a line when requested, and the watch exits 9."""
    host = await farm.host("h1", "s1")
    task = await amc.submit("-", stdin=TAP)
    watch = await amc.running("watch", task["task_id"])
    a = await dispatched(host, "s1")
    await watch.line_with("dispatched")
    assert (await amc("cancel", task["task_id"], "-r", "wrong phone")).code == 0
    assert "wrong phone" in await watch.line_with("cancel requested")
    await host.report(a, lease_pb2.OUTCOME_CANCELLED)
    run = await watch.finish()
    assert run.code == 9, run.err
    assert run.out.splitlines()[-1].split()[1] == "cancelled"


async def test_watch_of_a_finished_task_returns_at_once(amc: Cli) -> None:
    """Watching a task that already ended prints its end state and exits by outcome."""
    task = await amc.submit("-", stdin=TAP)
    await amc("cancel", task["task_id"])
    run = await amc("watch", task["task_id"], "-o", "json")
    assert run.code == 9
    assert run.json()["status"] == "TASK_STATUS_CANCELLED"


async def test_watch_carries_on_across_a_control_plane_restart(amc: Cli, farm: Farm) -> None:
    """A replica going away drops the stream; watch opens it again and sees the end."""
    host = await farm.host("h1", "s1")
    task = await amc.submit("-", stdin=TAP)
    watch = await amc.running("watch", task["task_id"])
    await watch.line_with("queued")
    await farm.restart()
    a = await dispatched(host, "s1")
    await host.report(a, lease_pb2.OUTCOME_DONE)
    run = await watch.finish()
    assert run.code == 0, run.err
    assert run.out.splitlines()[-1].split()[1] == "done"
    assert "watching again" in run.err and "Traceback" not in run.err, run.err


async def test_submit_wait_follows_the_task_and_exits_by_outcome(amc: Cli, farm: Farm) -> None:
    """submit --wait prints the final task as JSON and exits 0 once it is done."""
    host = await farm.host("h1", "s1")
    proc = await amc.start("submit", "-", "--wait", "-o", "json", stdin=True)
    assert proc.stdin is not None
    proc.stdin.write(TAP.encode())
    proc.stdin.close()
    a = await dispatched(host, "s1")
    await host.report(a, lease_pb2.OUTCOME_DONE)
    run = await Running(proc).finish()
    assert run.code == 0, run.err
    assert run.json()["task_id"] == a.task_id
    assert run.json()["status"] == "TASK_STATUS_DONE"


# -- hosts and tokens ------------------------------------------------------------------------


async def test_hosts_shows_devices_and_who_holds_them(amc: Cli, farm: Farm) -> None:
    """Each device with its state and the task holding it; JSON has the same."""
    host = await farm.host("h1", "s1", "s2")
    task = await amc.submit("-", "--serial", "s2", stdin=TAP)
    await dispatched(host, "s2")
    table = await amc("hosts")
    assert table.code == 0
    holder = next(line for line in table.out.splitlines() if "s2" in line)
    assert task["task_id"] in holder
    assert "idle" in next(line for line in table.out.splitlines() if "s1" in line)
    doc = (await amc("hosts", "-o", "json")).json()
    [h1] = doc["hosts"]
    assert h1["host_id"] == "h1"
    assert {d["serial"]: d["task_id"] for d in h1["devices"]} == {"s1": "", "s2": task["task_id"]}


async def test_tokens_create_list_and_revoke(amc: Cli) -> None:
    """A created token works at once, is listed, and stops working once revoked (exit 6)."""
    created = await amc("tokens", "create", "--role", "client", "--name", "ci")
    assert created.code == 0
    token = created.out.strip()
    assert token.startswith("amc_") and "\n" not in token
    assert "shown only now" in created.err
    assert (await amc("list", token=token)).code == 0
    listed = (await amc("tokens", "list", "-o", "json")).json()
    [mine] = [t for t in listed["tokens"] if t["name"] == "ci"]
    assert mine["role"] == "ROLE_CLIENT" and "revoked_at" not in mine
    assert mine["token_id"] in (await amc("tokens", "list")).out
    revoked = await amc("tokens", "revoke", mine["token_id"], "-o", "json")
    assert revoked.code == 0 and "revoked_at" in revoked.json()["info"]
    refused = await amc("list", token=token)
    assert refused.code == 6
    assert "UNAUTHENTICATED" in refused.assert_one_error_line()


async def test_tokens_create_a_host_token_as_json(amc: Cli) -> None:
    """--output json gives the secret and its info in one document."""
    run = await amc("tokens", "create", "--role", "host", "--host-id", "h9", "-o", "json")
    assert run.code == 0
    doc = run.json()
    assert doc["token"].startswith("amc_")
    assert (doc["info"]["role"], doc["info"]["host_id"]) == ("ROLE_HOST", "h9")


async def test_a_host_token_needs_a_host_id(amc: Cli) -> None:
    """The server's INVALID_ARGUMENT is bad input: exit 2, naming the field."""
    run = await amc("tokens", "create", "--role", "host")
    assert run.code == 2
    assert "host_id" in run.assert_one_error_line()


# -- exit codes and errors -------------------------------------------------------------------


async def test_an_unknown_task_is_not_found(amc: Cli) -> None:
    """Exit 3 for get, cancel and watch of a task that does not exist."""
    missing = str(uuid.uuid4())
    commands = ("get", "cancel", "watch")
    runs = await asyncio.gather(*(amc(command, missing) for command in commands))
    for command, run in zip(commands, runs, strict=True):
        assert run.code == 3, (command, run.err)
        assert "NOT_FOUND" in run.assert_one_error_line()


async def test_a_server_that_is_down_is_unavailable(amc: Cli) -> None:
    """Exit 5, one line naming the address, for calls and for watch."""
    address = f"127.0.0.1:{free_port()}"
    commands = (["list"], ["watch", str(uuid.uuid4())], ["tokens", "list"])
    runs = await asyncio.gather(*(amc(*args, address=address) for args in commands))
    for args, run in zip(commands, runs, strict=True):
        assert run.code == 5, (args, run.err)
        line = run.assert_one_error_line()
        assert address in line and "UNAVAILABLE" in line


async def test_a_bad_or_missing_token_is_an_auth_error(amc: Cli) -> None:
    """Exit 6 for a bad token, a missing one (with a hint) and a role that may not."""
    bad = await amc("list", token="amc_nope")
    assert bad.code == 6 and "UNAUTHENTICATED" in bad.assert_one_error_line()
    missing = await amc("list", token=None)
    assert missing.code == 6 and "AMC_TOKEN" in missing.assert_one_error_line()
    client = (await amc("tokens", "create", "--role", "client")).out.strip()
    denied = await amc("hosts", token=client)
    assert denied.code == 6 and "PERMISSION_DENIED" in denied.assert_one_error_line()


async def test_a_token_file_is_read(amc: Cli, tmp_path: Path) -> None:
    """--token-file works; an unreadable one is bad input."""
    assert amc.token is not None
    path = tmp_path / "token"
    path.write_text(amc.token + "\n")
    assert (await amc("--token-file", str(path), "list", token=None)).code == 0
    run = await amc("--token-file", str(tmp_path / "nope"), "list", token=None)
    assert run.code == 2 and "nope" in run.assert_one_error_line()


async def test_a_token_flag_beats_the_environment(amc: Cli, tmp_path: Path) -> None:
    """--token-file wins over AMC_TOKEN (and --token over AMC_TOKEN_FILE): a flag someone
    typed is never silently ignored."""
    assert amc.token is not None
    missing = str(tmp_path / "no-such-token")
    run = await amc("--token-file", missing, "list")  # AMC_TOKEN holds a good token
    assert run.code == 2
    assert missing in run.assert_one_error_line()
    good = tmp_path / "token"
    good.write_text(amc.token)
    assert (await amc("--token-file", str(good), "list", token="amc_bad")).code == 0
    flag = await amc("--token", amc.token, "list", token=None, env={"AMC_TOKEN_FILE": missing})
    assert flag.code == 0, flag.err
    both = await amc("--token", amc.token, "--token-file", str(good), "list")
    assert both.code == 2 and "not both" in both.assert_one_error_line()


BAD_INPUT = [
    ["get"],  # missing argument
    ["list", "--status", "sleeping"],  # not a status
    ["list", "--limit", "-1"],
    ["frobnicate"],  # no such command
    ["submit", "-", "--label", "no-equals-sign"],
    ["get", "not-a-uuid"],  # the server's INVALID_ARGUMENT
    ["submit", "-", "--priority", "99999999"],  # out of the server's range
    ["submit", "-", "--priority", "99999999999"],  # out of the field's (was "unexpected")
    ["submit", "-", "--max-attempts", "99999999999"],
    ["--timeout", "nan", "list"],  # was taken, then "no answer in time"
    ["--timeout", "0", "list"],
]


async def test_bad_input_exits_2_with_one_line(amc: Cli) -> None:
    """Usage errors and INVALID_ARGUMENT both exit 2 with one `amc: error:` line."""
    runs = await asyncio.gather(*(amc(*args, stdin=TAP) for args in BAD_INPUT))
    for args, run in zip(BAD_INPUT, runs, strict=True):
        assert run.code == 2, (args, run.err)
        line = run.assert_one_error_line()
        assert "Value error" not in line and "unexpected" not in line, (args, line)


BAD_SPECS = [
    ("broken.yaml", "actions:\n  - tap: {x: 1, y: 2\n  - wait: 2s\n", "invalid YAML"),
    ("kind.yaml", "actions:\n  - tap: [1, 2]\n  - tapp: {x: 1}\n", ":3: actions[1]: unknown"),
    ("wait.yaml", "actions:\n  - wait: 2 parsecs\n", ":2: actions[0].wait.duration"),
    ("field.yaml", "workflow:\n  - name: a\n    actions: [{tap: {x: 1, z: 2}}]\n", "'z'"),
    ("empty.yaml", "", "empty"),
    ("none.yaml", "priority: 3\n", "no actions or workflow"),
    ("broken.json", '{"actions": [\n{"tap": [1, 2]}\n', "broken.json:3: invalid JSON"),
    ("limit.yaml", "- wait_for: {text: OK, timeout: 25h}\n", ":1: actions[0].wait_for.timeout"),
]


async def test_a_bad_spec_file_gives_one_line_naming_the_problem(
    amc: Cli, farm: Farm, tmp_path: Path
) -> None:
    """Exit 2, one stderr line with the file (and line) and the problem, nothing sent."""
    for name, text, _ in BAD_SPECS:
        (tmp_path / name).write_text(text)
    runs = await asyncio.gather(*(amc("submit", str(tmp_path / n)) for n, _, _ in BAD_SPECS))
    for (name, _, expected), run in zip(BAD_SPECS, runs, strict=True):
        assert run.code == 2, (name, run.err)
        line = run.assert_one_error_line()
        assert str(tmp_path / name) in line and expected in line, line
        assert run.out == ""
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 0


async def test_a_missing_spec_file_is_bad_input(amc: Cli) -> None:
    """Exit 2 and one line naming the file."""
    run = await amc("submit", "no/such/file.yaml")
    assert run.code == 2
    assert "no/such/file.yaml" in run.assert_one_error_line()


async def test_help_lists_the_commands_and_exit_codes(amc: Cli) -> None:
    """`amc` alone and `amc --help` show the commands and the exit-code table."""
    for run in await asyncio.gather(amc(), amc("--help")):
        assert run.code == 0
        for word in ("submit", "watch", "hosts", "tokens", "Exit codes", "9 when it was"):
            assert word in run.out, word


async def test_every_command_can_answer_in_json(amc: Cli, farm: Farm) -> None:
    """Each read command's --output json is one parseable document."""
    await farm.host("h1", "s1")
    task = await amc.submit("-", stdin=TAP)
    commands = (["get", task["task_id"]], ["list"], ["hosts"], ["tokens", "list"])
    runs = await asyncio.gather(*(amc(*args, "--output", "json") for args in commands))
    for args, run in zip(commands, runs, strict=True):
        assert run.code == 0, (args, run.err)
        assert isinstance(run.json(), dict)


async def test_tls_with_a_ca_file(database_url: str, tmp_path: Path) -> None:
    """--ca (AMC_CA) trusts the server's CA; without it the TLS listener is unreachable."""
    cert, key = self_signed(tmp_path)
    plane = ControlPlane(
        database_url, Settings(), listen="127.0.0.1:0", tls=Tls(cert.read_bytes(), key.read_bytes())
    )
    await plane.start()
    try:
        _, token = await create_token(plane.store, Role.CLIENT, None, "tls")
        amc = Cli(f"127.0.0.1:{plane.port}", token)
        ok, plain, missing = await asyncio.gather(
            amc("--ca", str(cert), "submit", "-", stdin=TAP),
            amc("list"),
            amc("--ca", str(tmp_path / "nope.pem"), "list"),
        )
    finally:
        await plane.stop(0)
    assert ok.code == 0, ok.err
    assert plain.code == 5 and "UNAVAILABLE" in plain.assert_one_error_line()
    assert missing.code == 2 and "nope.pem" in missing.assert_one_error_line()


# -- the spec format, without a server -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "nanos"),
    [("2s", 2 * 10**9), ("500ms", 5 * 10**8), ("1m30s", 90 * 10**9), ("1.5", 15 * 10**8),
     (3, 3 * 10**9), ("2h", 7200 * 10**9), ("250us", 250_000), (0, 0)],
)  # fmt: skip
def test_durations_accept_units_and_plain_seconds(text: object, nanos: int) -> None:
    """2s, 500ms, 1m30s, 1.5 and plain numbers are all durations."""
    assert parse_duration(text).ToNanoseconds() == nanos


@pytest.mark.parametrize("text", ["-1s", "2 parsecs", "s", "", True, "1s2"])
def test_durations_refuse_nonsense(text: object) -> None:
    """Negative, unit-less garbage and booleans are refused."""
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "shown"), [("-5s", "'-5s'"), ("-5", "'-5'"), (-5, "'-5'"), ("-1m30s", "'-1m30s'")]
)
def test_a_negative_duration_gets_one_message_with_or_without_its_unit(
    value: object, shown: str
) -> None:
    """`-5s` and `-5` are refused in the same words: negative, not "not a duration"."""
    with pytest.raises(ValueError) as refused:
        parse_duration(value)
    assert str(refused.value) == f"{shown} is negative; a duration must be 0 or more"


async def test_a_negative_wait_in_a_file_says_negative_whether_or_not_it_has_a_unit(
    amc: Cli,
) -> None:
    """`wait: -5s` and `wait: -5` in a spec file: the same one line, exit 2."""
    runs = [await amc("submit", "-", stdin=f"- wait: {value}\n") for value in ("-5s", "-5")]
    for value, run in zip(("-5s", "-5"), runs, strict=True):
        assert run.code == 2, run.err
        assert run.assert_one_error_line() == (
            f"amc: error: <stdin>:1: actions[0].wait.duration: '{value}' is negative; "
            "a duration must be 0 or more"
        )


def test_shorthands_mean_the_full_forms(tmp_path: Path) -> None:
    """Every shorthand builds the same request as the proto's own JSON form."""
    short = tmp_path / "short.yaml"
    short.write_text(
        "- tap: [1, 2]\n- tap_on: OK\n- swipe: [1, 2, 3, 4, 300ms]\n- input_text: 1234\n"
        "- key: KEYCODE_BACK\n- launch_app: com.example.app\n- stop_app: com.example.app\n"
        "- shell: ls\n- screenshot\n- wait: 2s\n- wait_for: {content_desc: x, timeout: 1}\n"
        "- assert_visible: {resource_id: 'a:id/b'}\n"
    )
    full = tmp_path / "full.json"
    full.write_text(
        json.dumps(
            {
                "spec": {
                    "actions": {
                        "actions": [
                            {"tap": {"x": 1, "y": 2}},
                            {"tapOn": {"selector": {"text": "OK"}}},
                            {"swipe": {"x1": 1, "y1": 2, "x2": 3, "y2": 4, "duration": "0.3s"}},
                            {"inputText": {"text": "1234"}},
                            {"key": {"keycode": 4}},
                            {"launchApp": {"package": "com.example.app"}},
                            {"stopApp": {"package": "com.example.app"}},
                            {"shell": {"command": "ls"}},
                            {"screenshot": {}},
                            {"wait": {"duration": "2s"}},
                            {"waitFor": {"selector": {"contentDesc": "x"}, "timeout": "1s"}},
                            {"assertVisible": {"selector": {"resourceId": "a:id/b"}}},
                        ]
                    }
                }
            }
        )
    )
    assert load_request(str(short)) == load_request(str(full))


async def test_a_spec_is_checked_by_the_server_too(amc: Cli) -> None:
    """A value only the server judges comes back as INVALID_ARGUMENT naming the field."""
    run = await amc("submit", "-", stdin="priority: 2000000\nactions:\n  - tap: [1, 2]\n")
    assert run.code == 2
    line = run.assert_one_error_line()
    assert "priority" in line and "INVALID_ARGUMENT" in line


# -- the tour, end to end --------------------------------------------------------------------


async def test_the_tours_long_task_is_cancelled_mid_run_and_its_step_shows_cancelled(
    amc: Cli, farm: Farm
) -> None:
    """README's CLI tour on a simulated phone: the minute-long task is cancelled while it
    waits, the watch ends 9 within seconds, and the interrupted step reads `cancelled` in
    the tables and STEP_STATUS_CANCELLED in the JSON (one status in every output)."""
    tapped = REGISTRY.get_sample_value(*TAPS) or 0.0
    async with running_agent(farm, SimulatedSource(1), host_id="lab1"):
        task = await amc.submit(str(EXAMPLES / "long-task.yaml"))
        watch = await amc.running("watch", task["task_id"])
        await watch.line_with("dispatched")
        # Once the first tap is counted, the minute-long wait runs: cancel it mid-way.
        await eventually(lambda: (REGISTRY.get_sample_value(*TAPS) or 0.0) > tapped)
        started = asyncio.get_running_loop().time()
        cancel = await amc("cancel", task["task_id"], "--reason", "wrong build")
        assert cancel.code == 0, cancel.err
        assert CANCEL_DELIVERY.format(host="lab1") in " ".join(cancel.out.split()), cancel.out
        run = await watch.finish()
        took = asyncio.get_running_loop().time() - started
    assert run.code == 9, run.err
    assert took < 20, f"the cancellation took {took:.1f}s: the wait was not interrupted"
    assert _step_statuses(run.out) == ["ok", "cancelled", "skipped"], run.out
    assert _step_statuses((await amc("get", task["task_id"])).out) == ["ok", "cancelled", "skipped"]
    steps = (await amc("get", task["task_id"], "-o", "json")).json()["result"]["steps"]
    assert [s["status"] for s in steps] == [
        "STEP_STATUS_OK",
        "STEP_STATUS_CANCELLED",
        "STEP_STATUS_SKIPPED",
    ]
    assert steps[1]["error"] == "interrupted: cancelled"


TAPS = ("amc_agent_action_seconds_count", {"action": "tap", "status": "ok"})


def _step_statuses(table: str) -> list[str]:
    """The status column of a steps table (` 0 │ tap │ ok │ 0.1s │ …`), not of the attempts
    table `amc get` prints after it."""
    lines = table.splitlines()
    steps = lines[: next((i for i, line in enumerate(lines) if line.strip() == "attempts"), None)]
    rows = [line.split("│") for line in steps if line.count("│") >= 3]
    return [row[2].strip() for row in rows if row[0].strip().isdigit()]


# -- where the control plane is and what state it is in -------------------------------------


def test_an_address_without_a_port_gets_the_control_planes_port() -> None:
    """A bare host (or IPv6 address) gets :50051, not gRPC's own default of 443."""
    assert with_default_port("127.0.0.1") == "127.0.0.1:50051"
    assert with_default_port("farm.example") == "farm.example:50051"
    assert with_default_port("::1") == "[::1]:50051"
    assert with_default_port("[::1]") == "[::1]:50051"
    assert with_default_port("farm:") == "farm:50051"
    for given in ("farm:7000", "[::1]:7000", "dns:///farm:7000", "unix:///run/amc.sock"):
        assert with_default_port(given) == given


async def test_addr_without_a_port_reaches_port_50051(database_url: str) -> None:
    """`--addr 127.0.0.2` talks to 127.0.0.2:50051 (a loopback address of its own, so it
    does not meet a farm someone runs on 127.0.0.1:50051)."""
    plane = ControlPlane(database_url, Settings(), listen="127.0.0.2:50051")
    try:
        await plane.start()
    except Exception as exc:  # pragma: no cover - the port is taken on this machine
        pytest.skip(f"cannot listen on 127.0.0.2:50051: {exc}")
    try:
        _, token = await create_token(plane.store, Role.CLIENT, None, "port")
        run = await Cli("127.0.0.2", token)("list", "-o", "json")
    finally:
        await plane.stop(0)
    assert run.code == 0, run.err
    assert run.json()["tasks"] == []


async def test_a_control_plane_whose_database_is_down_is_not_called_unreachable(
    database_url: str,
) -> None:
    """The control plane answers, its database does not: the one line says the database is
    unavailable (exit 5), not that the control plane cannot be reached."""
    host, _, port = database_url.split("@", 1)[1].split("/", 1)[0].rpartition(":")
    async with TcpProxy(host, int(port)) as proxy:
        plane = ControlPlane(
            database_url.replace(f"{host}:{port}", proxy.address, 1),
            Settings(),
            listen="127.0.0.1:0",
        )
        await plane.start()
        try:
            _, token = await create_token(plane.store, Role.CLIENT, None, "db-down")
            amc = Cli(f"127.0.0.1:{plane.port}", token)
            assert (await amc("list")).code == 0
            proxy.cut()
            await eventually(lambda: _not_serving(amc), timeout=20, what="NOT_SERVING")
            run = await amc("--timeout", "5", "list")
            proxy.heal()
        finally:
            await plane.stop(0)
    assert run.code == 5, run.err
    line = run.assert_one_error_line()
    assert "database is unavailable" in line and "UNAVAILABLE" in line, line
    assert "cannot reach" not in line, line


async def _not_serving(amc: Cli) -> bool:
    async with grpc.aio.insecure_channel(amc.address) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
    return reply.status == health_pb2.HealthCheckResponse.NOT_SERVING


# -- help ------------------------------------------------------------------------------------


async def test_flags_are_shown_without_a_value_in_help(amc: Cli) -> None:
    """--tls, --wait and --help take no value, and --help does not pretend they do."""
    wide = {"COLUMNS": "200"}
    runs = await asyncio.gather(
        amc("--help", env=wide),
        amc("submit", "--help", env=wide),
        amc("cancel", "--help", env=wide),
    )
    for run in runs:
        assert run.code == 0, run.err
        flags = [line for line in run.out.splitlines() if re.search(r"--(tls|wait|help)\b", line)]
        assert flags, run.out
        for line in flags:
            assert "<bool>" not in line and "no-tls" not in line, line
    # Options that take a value still say what value.
    assert "<path>" in runs[0].out and "DURATION" in runs[0].out


# -- the control plane's and the Makefile's command lines ------------------------------------


async def control_plane(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> Run:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AMC_", "DATABASE_URL"))}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "control_plane",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**base, "PYTHONPATH": str(ROOT), **(env or {})},
        cwd=cwd,
    )
    async with asyncio.timeout(TIMEOUT):
        out, err = await proc.communicate()
    assert proc.returncode is not None
    return Run(proc.returncode, out.decode(), err.decode())


async def test_tokens_create_refuses_a_directory_without_a_database(tmp_path: Path) -> None:
    """Run where there is no database, `tokens create` makes none (and no token nobody
    could use): exit 2, one line naming the directory it looked in and --init."""
    run = await control_plane("tokens", "create", "--role", "operator", cwd=tmp_path)
    assert run.code == 2 and run.out == ""
    assert run.err.count("\n") == 1, run.err
    assert str(tmp_path / ".amc" / "pgdata") in run.err and "--init" in run.err, run.err
    assert not (tmp_path / ".amc").exists()


async def test_tokens_create_names_the_database_it_used(farm: Farm) -> None:
    """The token goes to stdout, and stderr says which database now holds it."""
    run = await control_plane(
        "tokens", "create", "--role", "operator", env={"DATABASE_URL": farm.dsn}
    )
    assert run.code == 0, run.err
    token = run.out.strip()
    assert token.startswith("amc_")
    database = farm.dsn.rsplit("/", 1)[1]
    assert database in run.err.splitlines()[-1], run.err
    assert (await Cli(farm.address, token)("hosts", "-o", "json")).code == 0


async def test_tokens_create_with_init_creates_the_embedded_database(tmp_path: Path) -> None:
    """--init makes the embedded database where there is none, and says where."""
    data = tmp_path / "pgdata"
    run = await control_plane(
        "tokens", "create", "--role", "operator", "--init", "--data-dir", str(data)
    )
    assert run.code == 0, run.err
    assert run.out.strip().startswith("amc_")
    assert (data / "PG_VERSION").exists()
    assert f"embedded database at {data}" in run.err.splitlines()[-1], run.err


async def test_serve_help_names_the_environment_variable_of_every_flag() -> None:
    """Every flag of `control-plane serve` can be set from the environment, and its help
    says by which variable."""
    from control_plane.flags import parser

    serve = parser({})._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    flags = [a for a in serve._actions if a.option_strings and a.dest != "help"]
    assert len(flags) >= 13
    run = await control_plane("serve", "--help", env={"COLUMNS": "300"})
    assert run.code == 0, run.err
    # Each option's entry: its line and the help lines under it.
    blocks = re.split(r"\n(?=  -)", run.out.split("options:", 1)[1] + "\n")
    for action in flags:
        match = re.search(r"\[\$(\w+)", action.help or "")
        assert match, f"{action.option_strings[0]} names no environment variable"
        flag = action.option_strings[0]
        block = next(b for b in blocks if b.lstrip().startswith(flag + " "))
        assert f"${match[1]}" in block, block


async def test_serve_flags_come_from_their_environment_variables() -> None:
    """AMC_GRACE, AMC_RENEW_INTERVAL and AMC_SWEEP_INTERVAL set what their flags set; a
    flag on the command line wins."""
    from control_plane.flags import parser

    env = {"AMC_GRACE": "9", "AMC_RENEW_INTERVAL": "2.5", "AMC_SWEEP_INTERVAL": "0.5"}
    args = parser(env).parse_args(["serve", "--grace", "3"])
    assert (args.grace, args.renew_interval, args.sweep_interval) == (3.0, 2.5, 0.5)


async def test_make_help_lists_every_target() -> None:
    """Each target of the Makefile has its line in `make help`."""
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):(?!=)", makefile, re.MULTILINE))
    assert {"run", "test", "lint", "help"} <= targets
    proc = await asyncio.create_subprocess_exec(
        "make", "-s", "help", cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    listed = set(re.findall(r"^make (\S+)", out.decode(), re.MULTILINE))
    assert targets <= listed, f"not in make help: {sorted(targets - listed)}"
