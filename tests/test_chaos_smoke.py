"""The chaos run (scripts/chaos.py), short, end to end (with a small fleet); and its checks on
made-up evidence, so that a check which can no longer fail is noticed here rather than
trusted in a long run."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane.domain import Role
from control_plane.embedded import EmbeddedPostgres
from host_agent.clean_profile import parse
from host_agent.recovery import RecoverySettings
from host_agent.simulated import SimulatedSource
from tests.conftest import FAST
from tests.support import Farm, actions_spec, eventually, seconds, tap
from tests.support.agent import running_agent, status_is, submit
from tests.test_cleaning import cleaned_once
from tests.test_database_outage import own_database
from tests.test_device_health import is_in, on

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from chaos_lib import cleaning, doors, emulators, evidence, phones, screens, webdriver  # noqa: E402
from chaos_lib.dispatch import DispatchCheck, FaultWindow  # noqa: E402
from chaos_lib.evidence import AcquireCall, Action, AgentEvent, Evidence  # noqa: E402
from chaos_lib.faults import KINDS as FARM_KINDS  # noqa: E402
from chaos_lib.faults import Fault  # noqa: E402
from chaos_lib.invariants import NAMES, Checks  # noqa: E402
from chaos_lib.specs import random_plan  # noqa: E402
from chaos_lib.workload import Submitted  # noqa: E402

KINDS = FARM_KINDS + phones.KINDS + cleaning.KINDS + emulators.KINDS
__all__ = ["own_database"]  # a fixture


@pytest.mark.timeout(260)
def test_quick_chaos_run_injects_every_fault_and_breaks_no_invariant(tmp_path: Path) -> None:
    """THEN every fault kind ran (the fleet's too), every invariant held with a backlog of
    tasks no host can take and two teams' submissions, the fleet's hosts took work through
    their own Acquire calls, and chaos-results.json has its shape."""
    out = tmp_path / "chaos-results.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--quick", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=250,
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert {"summary", "tasks", "faults", "violations", "recovery"} <= set(results)
    assert set(results["violations"]) == {str(n) for n in NAMES}
    assert all({"name", "count", "examples"} <= set(v) for v in results["violations"].values())
    assert {k: results["faults"][k]["count"] >= 1 for k in KINDS} == dict.fromkeys(KINDS, True)
    assert set(results["recovery"]) == set(KINDS)
    assert results["tasks"]["submitted"] > 0
    # Issue 20: a backlog nobody can take, queued through the faults, and two teams.
    assert results["config"]["unmatched_backlog"] == 300
    assert set(results["config"]["tasks_by_team"]) == {"team-a", "team-b"}
    assert results["tasks"]["by_status"].get("cancelled", 0) >= 300
    dispatch = results["dispatch"]
    assert dispatch["fleet_hosts"] > 0 and dispatch["details"]["fleet acquire calls: OK"] > 0
    assert set(dispatch["first_pickup_s"]) >= {"rack", "serial"}
    # WebDriver sessions reached the agents' Appium (unless Appium could not be installed).
    webdriver_ = results["webdriver"]
    assert "skipped" in webdriver_ or webdriver_["appium_commands_on_hosts"] > 0, webdriver_
    broken = {n: v["examples"] for n, v in results["violations"].items() if v["count"]}
    assert not broken, json.dumps(broken, indent=1)
    assert results["summary"]["problems"] == []
    assert done.returncode == 0, done.stdout[-3000:]
    # Issue 22: every phone fault ran, and each phone took work again after its fault.
    assert set(results["phones"]["faults"]) == set(phones.KINDS)
    assert results["phones"]["details"]["phones back at work after their faults"] >= 1
    # Live screens: tasks watched through the faults (invariant 11 held above).
    assert results["screens"]["frames"] > 0 and results["screens"]["tasks_watched"] > 0
    # adb doors: opened and used through the faults (invariant 13 held above).
    assert results["doors"]["opened"] > 0 and results["doors"]["door_streams_on_phones"] > 0
    # Emulator pools: every emulator fault fired (invariants 12 and 14 held above), tasks
    # and sessions started from both snapshots.
    pool = results["emulators"]
    assert set(pool["fired"]) == set(emulators.KINDS) and min(pool["fired"].values()) >= 1, pool
    assert set(pool["tasks_by_start_snapshot"]) == {emulators.BOOT, emulators.APP}
    assert pool["details"]["double: died"] >= 2 and pool["details"]["instances started afresh"]


def test_phone_fault_checks_catch_a_sick_phone_given_work_and_a_spent_budget() -> None:
    """THEN invariant 10: an assignment to a phone well after its fault began (and before
    it was ready again) is a violation, one before the bound is not; a task failed on a lost
    phone with retries left, or a lost phone reported as the task's failure, is one too."""

    class F:
        def __init__(self, kind: str, target: str, start: float, healed: float) -> None:
            self.kind, self.target, self.started_at = kind, target, start
            self.healed_at, self.recovered_at, self.detail = healed, healed, {}

    fault = F("phone_overheat", "h1/sim-0", T0, T0 + 10)
    early = _attempt("t1", 1, "h1", T0 + 1, T0 + 2)
    late = _attempt("t2", 1, "h1", T0 + 6, T0 + 7)
    elsewhere = _attempt("t3", 1, "h2", T0 + 6, T0 + 7)
    attempts = {("t1", 1): early, ("t2", 1): late, ("t3", 1): elsewhere}
    verdict = phones.PhoneVerdict()
    phones._sick_phones(attempts, [fault], {}, verdict)
    assert [d["assigned_at"] for _, d in verdict.violations] == [T0 + 6]
    ready_again = phones.PhoneVerdict()
    phones._sick_phones(attempts, [fault], {"h1/sim-0": [T0 + 5]}, ready_again)
    assert ready_again.violations == []

    def task(error: str, retries: int) -> dict[str, Any]:
        return {"status": "failed", "error": error, "infra_retries": retries, "metadata": {}}

    def ended(kind: str) -> list[dict[str, Any]]:
        return [{"kind": kind, "to_status": "failed"}]

    tasks = {
        "spent": task("device lost on attempt 3 (x); infrastructure retries spent", 2),
        "early": task("device lost on attempt 1 (x)", 0),
        "reported": task("step 1 (tap): device lost: sim-0 was unplugged", 0),
        "own": task("step 2: `false` exited 1", 0),
    }
    events = {
        "spent": ended("device_lost"),
        "early": ended("device_lost"),
        "reported": ended("report"),
        "own": ended("report"),
    }
    budget = phones.PhoneVerdict()
    phones._budget(tasks, events, budget)
    assert sorted(d["task_id"] for _, d in budget.violations) == ["early", "reported"]


# -- the checks, on evidence made up for them ------------------------------------------------

T0 = 1_000_000.0


def _attempt(task_id: str, n: int, host: str, start: float, end: float, **extra: Any) -> Any:
    row = {
        "task_id": task_id,
        "attempt": n,
        "host_id": host,
        "device_serial": "sim-0",
        "state": "done",
        "created_at": start,
        "lease_expires_at": end + 2,
        "acknowledged_at": start,
        "reported_at": end,
        "ended_at": end,
        "outcome": "done",
        "cancel_requested_at": None,
    }
    return {**row, **extra}


def _evidence(attempts: list[dict[str, Any]], actions: list[Action]) -> Evidence:
    task_id = attempts[0]["task_id"]
    last = attempts[-1]
    events = [
        {"kind": "submit", "attempt": 0, "from_status": None, "to_status": "queued", "at": T0}
    ]
    for a in attempts:
        events.append(
            {
                "kind": "assign",
                "attempt": a["attempt"],
                "from_status": "queued",
                "to_status": "assigned",
                "at": a["created_at"],
            }
        )
        if a is not last:
            events.append(
                {
                    "kind": "expired",
                    "attempt": a["attempt"],
                    "from_status": "assigned",
                    "to_status": "queued",
                    "at": a["ended_at"],
                }
            )
    events.append(
        {
            "kind": "report",
            "attempt": last["attempt"],
            "from_status": "assigned",
            "to_status": "done",
            "at": last["reported_at"],
        }
    )
    task = {
        "task_id": task_id,
        "request_id": "r1",
        "status": "done",
        "attempt": last["attempt"],
        "max_attempts": 3,
        "cancel_requested_at": None,
        "result": None,
        "error": "",
        "metadata": {},
    }
    return Evidence(
        tasks={task_id: task},
        attempts={(a["task_id"], a["attempt"]): a for a in attempts},
        events={task_id: events},
        devices=[],
        actions=actions,
        agent_events=[],
    )


def _checks(ev: Evidence) -> Checks:
    import random

    submitted = [Submitted("r1", random_plan(random.Random(1)), None, task_id="t1")]
    return Checks(ev, submitted, freezes={}, delays={"h0": 0.1, "h1": 0.1}, lease_ttl=2.0)


def _act(host: str, start: float, end: float) -> Action:
    return Action(host, "sim-0", "tap", start, end, "ok")


def test_one_attempt_after_another_is_clean() -> None:
    """THEN a retry that acts only after the first attempt stopped breaks nothing."""
    ev = _evidence(
        [
            _attempt("t1", 1, "h0", T0 + 1, T0 + 3, state="expired", reported_at=None),
            _attempt("t1", 2, "h1", T0 + 4, T0 + 6),
        ],
        [_act("h0", T0 + 1.5, T0 + 1.6), _act("h1", T0 + 4.5, T0 + 4.6)],
    )
    assert _checks(ev).run([]) == []


def test_two_attempts_acting_at_once_break_invariant_4() -> None:
    """THEN an old attempt still acting while its retry acts is an invariant 4 violation."""
    ev = _evidence(
        [
            _attempt(
                "t1",
                1,
                "h0",
                T0 + 1,
                T0 + 3,
                state="expired",
                reported_at=None,
                lease_expires_at=T0 + 10,
            ),
            _attempt("t1", 2, "h1", T0 + 4, T0 + 6),
        ],
        [_act("h0", T0 + 4.4, T0 + 4.8), _act("h1", T0 + 4.5, T0 + 4.6)],
    )
    checks = [v.check for v in _checks(ev).run([]) if v.invariant == 4]
    assert "two attempts of a task acted at the same time" in checks


def test_acting_after_the_lease_ran_out_breaks_invariant_4() -> None:
    """THEN a frozen host that acts after its lease expired is an invariant 4 violation."""
    ev = _evidence(
        [
            _attempt(
                "t1",
                1,
                "h0",
                T0 + 1,
                T0 + 3,
                state="expired",
                reported_at=None,
                lease_expires_at=T0 + 3,
            ),
            _attempt("t1", 2, "h1", T0 + 20, T0 + 22),
        ],
        [_act("h0", T0 + 5, T0 + 5.1)],
    )
    checks = [v.check for v in _checks(ev).run([]) if v.invariant == 4]
    assert "device action after its attempt's lease ended" in checks


def test_report_after_the_lease_expired_breaks_invariant_6() -> None:
    """THEN a report recorded after the attempt's lease expiry is an invariant 6 violation."""
    ev = _evidence([_attempt("t1", 1, "h0", T0 + 1, T0 + 5, lease_expires_at=T0 + 4)], [])
    checks = [v.check for v in _checks(ev).run([]) if v.invariant == 6]
    assert checks == ["report accepted after the lease expired"]


@pytest.mark.parametrize(
    ("acked_after", "delivered_after", "broken"),
    [(None, 1.5, True), (1.0, 1.5, True), (3.04, 1.5, False), (1.0, 0.04, False)],
)
def test_a_renewal_without_the_cancel_breaks_invariant_3_once_the_cancel_was_answered(
    acked_after: float | None, delivered_after: float, broken: bool
) -> None:
    """THEN a renewal that did not carry a pending cancellation is a violation if it came
    after the cancel was requested, counted from the CancelTask answer where the client got
    one: a synchronous commit can wait seconds for the standby after its transaction began
    (the database time of the request), and no renewal can see it before it commits. A
    delivery marked 40 ms after the renewal's transaction began is a push's mark the
    renewal's update came after (as a soak saw right after a failover): surfaced."""
    ev = _evidence(
        [
            _attempt(
                "t1",
                1,
                "h0",
                T0,
                T0 + 5,
                lease_expires_at=T0 + 6,  # renewed at T0 + 4
                cancel_requested_at=T0 + 1,
                cancel_delivered_at=T0 + 4 + delivered_after,
            )
        ],
        [],
    )
    checks = _checks(ev)
    if acked_after is not None:
        checks.submitted[0].cancel_acked_at = T0 + 1 + acked_after
    found = [v.check for v in checks.run([]) if v.invariant == 3]
    assert ("cancellation not surfaced by the next renewal" in found) is broken


@pytest.mark.parametrize(("finished_after", "broken"), [(3.0, False), (10.0, True), (None, True)])
def test_a_session_whose_relay_was_lost_before_its_host_heard_of_the_cancel_ends_failed(
    finished_after: float | None, broken: bool
) -> None:
    """THEN a session that ended on its host when its relay was lost, before the host heard
    of the cancel, is not a violation even though its report (retried while the database
    was away) was recorded after the host heard of it; heard before its run ended, it is.
    Without the host's end in its log the report's time stands for it."""
    attempt = _attempt(
        "t1", 1, "h0", T0 + 1, T0 + 11, outcome="failed", cancel_requested_at=T0 + 8,
        cancel_delivered_at=T0 + 9,
    )  # fmt: skip
    ev = _evidence([attempt], [])
    task = ev.tasks["t1"]
    task.update(
        status="failed",
        cancel_requested_at=T0 + 8,
        error="session relay lost: UNAVAILABLE: the database is unreachable",
        metadata={"session": "1"},
    )
    events = ev.events["t1"]
    events[-1]["to_status"] = "failed"
    events.insert(-1, {"kind": "cancel_requested", "attempt": 1, "from_status": "assigned",
                       "to_status": "assigned", "at": T0 + 8})  # fmt: skip
    for i, e in enumerate(events):
        e["event_id"] = i + 1
    ev.trips[("t1", 1)] = (T0 + 9, "cancelled")
    if finished_after is not None:
        ev.finished[("t1", 1)] = T0 + finished_after
    found = [v.check for v in _checks(ev).run([]) if v.invariant == 3]
    assert ("session cancel seen by its host, yet it reported the relay's end" in found) is broken


def test_a_result_the_host_was_told_is_recorded_but_is_not_breaks_invariant_8() -> None:
    """THEN a report acknowledged to its host whose attempt the database has expired (a
    failover that lost the commit) is an invariant 8 violation; one recorded is not."""
    ev = _evidence(
        [
            _attempt("t1", 1, "h0", T0 + 1, T0 + 3, state="expired", reported_at=None),
            _attempt("t1", 2, "h1", T0 + 4, T0 + 6),
        ],
        [],
    )
    told = {"task_id": "t1", "status": "TASK_STATUS_DONE"}
    ev.agent_events = [
        AgentEvent("h0", T0 + 2.5, "result reported", {**told, "attempt": 1}),
        AgentEvent("h1", T0 + 6.1, "result reported", {**told, "attempt": 2}),
    ]
    lost = [v.detail for v in _checks(ev).run([]) if v.invariant == 8]
    assert [(d["host"], d["attempt"], d["attempt_state"]) for d in lost] == [("h0", 1, "expired")]


# -- invariant 7, dispatch liveness ---------------------------------------------------------


def _parked(offered: bool, faults: list[FaultWindow], rack: str = "r00") -> list[Any]:
    """A task for phone f0-0 (of `rack`) queued 30 s while host f0 sat parked, the phone idle
    all along (named by the parked Acquire, or freed after it was sent, the Acquire naming
    only f0-1); then the next Acquire takes it."""
    task = {
        "task_id": "t1",
        "selector_serial": "f0-0",
        "selector_labels": {"rack": rack},
        "status": "done",
    }
    events = [
        {"kind": "submit", "from_status": None, "to_status": "queued", "at": T0},
        {"kind": "assign", "from_status": "queued", "to_status": "assigned", "at": T0 + 30},
    ]
    earlier = _attempt("t0", 1, "f0", T0 - 5, T0 - 2, device_serial="f0-0")
    ev = Evidence(
        tasks={"t1": task},
        attempts={
            ("t0", 1): earlier,
            ("t1", 1): _attempt("t1", 1, "f0", T0 + 30, T0 + 31, device_serial="f0-0"),
        },
        events={"t1": events},
        devices=[
            {"host_id": "f0", "serial": s, "state": "device", "labels": {"rack": "r00"}}
            for s in ("f0-0", "f0-1")
        ],
        actions=[],
        agent_events=[],
        acquires=[
            AcquireCall("f0", ("f0-0",) if offered else ("f0-1",), 60, T0 - 3, T0 + 30, "OK", ()),
            AcquireCall("f0", ("f0-0",), 60, T0 + 30, T0 + 30.01, "OK", ("t1",)),
        ],
    )
    return DispatchCheck(ev, {"f0"}, faults, 10.0, {"t1": "rack"}).run()


@pytest.mark.parametrize("offered", [True, False])
def test_a_task_left_queued_beside_a_parked_fitting_host_breaks_invariant_7(offered: bool) -> None:
    """THEN 30 s queued while a parked host had an idle phone it fits is a strand, told
    apart by whether the parked Acquire named that phone."""
    (strand,) = _parked(offered, [])
    assert (strand.task_id, strand.host, strand.serial) == ("t1", "f0", "f0-0")
    assert strand.offered is offered and strand.seconds == pytest.approx(30, abs=0.1)


def test_what_faults_excuse_and_what_does_not_fit_break_no_invariant_7() -> None:
    """THEN PostgreSQL down, or the host cut off, through the wait excuses it; a task for
    another rack was never the parked host's to take."""
    outage = FaultWindow("pg_restart", (), T0 - 1, T0 + 25, T0 + 26)
    cut = FaultWindow("proxy_cut", ("f0",), T0 - 1, T0 + 27, None)
    assert _parked(True, [outage]) == []
    assert _parked(True, [cut]) == []
    assert _parked(True, [], rack="r01") == []


def test_the_soaks_pickup_waits_from_when_the_task_and_its_phone_were_both_free() -> None:
    """THEN a task queued behind a busy phone counts from the phone's previous attempt's
    end, a task queued at an idle phone from its queueing; an attempt never acknowledged,
    or behind an attempt that never ended, is not a pickup."""
    from chaos_lib.soak import pickups

    def attempt(task: str, created: float, acked: float | None, ended: float | None) -> Any:
        return {
            "task_id": task,
            "attempt": 1,
            "host_id": "f0",
            "device_serial": "f0-0",
            "created_at": created,
            "acknowledged_at": acked,
            "ended_at": ended,
            "reported_at": ended,
        }

    def queued(at: float) -> list[dict[str, Any]]:
        return [{"to_status": "queued", "at": at}]

    ev = Evidence(
        tasks={},
        attempts={
            ("a", 1): attempt("a", T0 + 1.00, T0 + 1.01, T0 + 5.0),  # idle phone: 1.01 s
            ("b", 1): attempt("b", T0 + 5.02, T0 + 5.03, None),  # queued at 2, phone free at 5
            ("c", 1): attempt("c", T0 + 9.0, T0 + 9.1, T0 + 10),  # behind b, never ended
            ("d", 1): {**attempt("d", T0 + 20, None, T0 + 21), "device_serial": "f0-1"},
        },
        events={"a": queued(T0), "b": queued(T0 + 2), "c": queued(T0 + 3), "d": queued(T0)},
        devices=[],
        actions=[],
        agent_events=[],
    )
    got = sorted(
        (round(p.start - T0, 2), round(p.seconds, 2), p.to_idle_phone) for p in pickups(ev)
    )
    assert got == [(0.0, 1.01, True), (5.0, 0.03, False)]


def test_the_soak_names_what_a_slow_pickup_overlapped_and_reads_the_replicas_stalls(
    tmp_path: Path,
) -> None:
    """THEN a replica's "event loop stalled" log line is read with its time; a pickup
    whose wait overlapped a fault on another host still counts as clear of faults but not
    as untouched by any, and its row of the slowest names that fault and the stall."""
    from datetime import UTC, datetime

    from chaos_lib.faults import Fault
    from chaos_lib.soak import stalls, summary

    def at(t: float) -> str:
        return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")

    log = tmp_path / "replica-0.log"
    log.write_text(
        json.dumps({"event": "control plane serving", "timestamp": at(T0)})
        + "\nnot json\n"
        + json.dumps({"seconds": 0.31, "event": "event loop stalled", "timestamp": at(T0 + 10.2)})
        + "\n"
    )
    found = stalls({"replica-0": log, "replica-1": tmp_path / "absent.log"})
    assert [(s.replica, round(s.at - T0, 3), s.seconds) for s in found] == [
        ("replica-0", 10.2, 0.31)
    ]

    def attempt(task: str, serial: str, created: float, acked: float) -> Any:
        return {
            "task_id": task,
            "attempt": 1,
            "host_id": "f0",
            "device_serial": serial,
            "created_at": created,
            "acknowledged_at": acked,
            "ended_at": acked + 1,
            "reported_at": acked + 1,
        }

    ev = Evidence(
        tasks={},
        attempts={
            ("slow", 1): attempt("slow", "f0-0", T0 + 10.4, T0 + 10.42),
            ("fast", 1): attempt("fast", "f0-1", T0 + 50.01, T0 + 50.02),
        },
        events={
            "slow": [{"to_status": "queued", "at": T0 + 10}],
            "fast": [{"to_status": "queued", "at": T0 + 50}],
        },
        devices=[],
        actions=[],
        agent_events=[],
    )
    elsewhere = Fault("fleet_freeze", "fleet-3", T0 + 5, healed_at=T0 + 20)
    earlier = Fault("pg_restart", "postgres", T0 - 30, healed_at=T0 - 25, recovered_at=T0 - 20)
    faults = [earlier, elsewhere]
    result = summary([], ev, faults, lambda target: {"f9"}, T0, T0 + 60, 60, loop_stalls=found)
    assert result["began_at"] == T0
    (window,) = result["windows"]
    assert window["pickups_to_idle_phones_clear"] == 2
    assert window["pickups_to_idle_phones_no_fault"] == 1
    assert window["pickup_to_idle_phone_p99_no_fault_ms"] == 20.0
    assert window["loop_stalls"] == 1 and window["loop_stall_max_ms"] == 310.0
    slowest = window["slowest_to_idle_phone_clear"][0]
    assert slowest["faults_elsewhere"] == ["fleet_freeze fleet-3"]
    assert slowest["after_farm_fault"] == "pg_restart over 30.0s before"
    assert slowest["replica_stall_ms"] == 310.0
    assert slowest["assign_ms"] == 400.0


def _children(pid: int) -> set[int]:
    """The live processes whose parent is `pid`."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.timeout(200)
def test_sigterm_stops_the_run_and_the_farm_it_started(tmp_path: Path) -> None:
    """THEN a run sent SIGTERM once its farm is up exits (status 2) and leaves none of the
    processes it started running (replicas, agents, fleet processes, PostgreSQL)."""
    out = tmp_path / "out.txt"
    with open(out, "w") as sink:
        run = subprocess.Popen(
            [
                *(sys.executable, str(ROOT / "scripts" / "chaos.py"), "--quick", "--hosts", "6"),
                *("--output", str(tmp_path / "results.json"), "--workdir", str(tmp_path / "w")),
            ],
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 150
        while "farm up" not in out.read_text() and time.monotonic() < deadline:
            assert run.poll() is None, out.read_text()[-3000:]
            time.sleep(0.2)
        assert "farm up" in out.read_text(), out.read_text()[-3000:]
        started = _children(run.pid)
        assert started, "the run started no process of its own"
        run.send_signal(signal.SIGTERM)
        assert run.wait(60) == 2, out.read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(10)  # reaped here, not warned of by a later test's garbage collection
    left = {pid for pid in started if _alive(pid)}
    assert not left, [Path(f"/proc/{p}/cmdline").read_bytes()[:200] for p in left]


def test_a_run_that_does_not_wind_down_after_sigterm_is_killed_with_its_farm(
    tmp_path: Path,
) -> None:
    """THEN a run still stopping when its time to stop is up kills its farm, shows every
    thread's stack and exits (status 2): it never hangs, whatever held it."""
    killed = tmp_path / "killed"
    script = f"""
import sys, time
sys.path.insert(0, {str(ROOT / "scripts")!r})
import chaos
class Farm:
    def kill_everything(self):
        open({str(killed)!r}, "w").write("yes")
chaos._stop_within(0.5, Farm())
time.sleep(60)  # what would hang: the loop, a thread, a task deaf to its cancellation
"""
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert time.monotonic() - began < 30
    assert killed.read_text() == "yes"
    assert "still stopping after" in done.stdout
    assert "Thread 0x" in done.stderr and "<module>" in done.stderr  # the stacks


def test_the_soaks_memory_growth_is_also_read_at_the_same_number_of_hosts() -> None:
    """THEN a replica whose hosts double after the warm-up (the other replica was killed
    and its hosts came over) shows the raw growth, the hosts it held then and now, and a
    growth at the most hosts it held that leaves the move out."""
    from chaos_lib.soak import Sample, _growth

    samples = []
    for n in range(180):  # 30 minutes, a sample every 10 s
        at = T0 + 10 * n
        hosts = 250 if n < 50 else 500  # the other replica's hosts came at minute 8:20
        rss = 60 + 0.25 * hosts + 0.01 * n  # 1.8 MiB of drift over the run
        samples.append(Sample(at, "replica-0", 7, rss, hosts))
    samples.append(Sample(T0 + 1805, "replica-0", 7, 300.0, None))  # the database was away
    (g,) = _growth(samples, T0, 300).values()
    assert g["hosts_baseline"] == 250 and g["hosts_last"] == 500
    assert g["growth_pct"] > 40
    assert g["at_most_hosts"] == 500
    assert 0 < g["at_most_hosts_growth_pct"] < 2


def test_the_soaks_memory_growth_at_the_most_hosts_is_also_read_once_they_settled() -> None:
    """THEN hosts that came over mid-run and filled in their state for a few minutes show
    in the growth at the most hosts, and not in the same growth read from a window after
    they came (shown beside it); a replica that grows all along grows in both."""
    from chaos_lib.soak import Sample, _growth

    def run(settling: float, drift: float) -> dict[str, float]:
        samples = []
        for n in range(180):
            hosts = 250 if n < 50 else 500
            since = max(0, n - 50)
            warm = settling * min(since, 25) / 25  # 250 s to settle
            samples.append(Sample(T0 + 10 * n, "replica-0", 7, 150 + warm + drift * n, hosts))
        (g,) = _growth(samples, T0, 300).values()
        return g

    settles = run(settling=40.0, drift=0.0)
    assert settles["at_most_hosts_growth_pct"] > 5
    assert settles["at_most_hosts_settled_growth_pct"] == 0
    grows = run(settling=0.0, drift=0.3)
    assert grows["at_most_hosts_settled_growth_pct"] > 10


def test_a_task_viewer_sent_a_frame_of_another_attempt_breaks_invariant_11() -> None:
    """THEN invariant 11: frames captured while the watched attempt ran on its phone are
    clean, and so is one captured after the attempt ended in the database but before the
    phone's next attempt began (its host did not know yet: counted); a frame that says
    another task, one of another phone, one captured before its attempt began, one
    captured once the phone had its next attempt, one that says nothing, and one sent
    long after its attempt ended each break it; so does a watched task done with other
    steps or device actions than its plan's."""
    ours = _attempt("t1", 1, "h1", T0, T0 + 10)
    theirs = _attempt("u1", 1, "h1", T0 + 12, T0 + 20)
    plan = random_plan(random.Random(11))
    steps = [task_pb2.StepResult(name=s.name) for s in plan.spec.workflow.steps]
    done = {"status": "done", "attempt": 1, "metadata": {},
            "result": task_pb2.TaskResult(steps=steps).SerializeToString()}  # fmt: skip
    # Its phone's actions, as the checks attribute them to their attempts.
    acted = [
        Action("h1", "sim-0", "tap", T0 + 1, T0 + 1.1, "ok", task_id="t1", attempt=1)
        for _ in range(plan.device_actions)
    ]
    ev = Evidence(
        tasks={"t1": done}, attempts={("t1", 1): ours, ("u1", 1): theirs}, events={},
        devices=[], actions=acted, agent_events=[],
    )  # fmt: skip

    def frame(captured: float, running: tuple[str, int] | None = ("t1", 1), **kw: Any) -> Any:
        fields = {"host_id": "h1", "serial": "sim-0", "received_at": captured + 0.1} | kw
        return screens.FrameSeen("t1", seq=1, captured_at=captured, running=running, **fields)

    clean = [frame(T0 + 1), frame(T0 + 9.9), frame(T0 + 11)]
    broken = {
        "a frame not captured during the watched task": frame(T0 + 2, ("u1", 1)),
        "a frame of a phone the attempt did not run on": frame(T0 + 2, serial="sim-1"),
        "a frame captured before its attempt began": frame(T0 - 0.5),
        "a frame captured after its phone was given to another attempt": frame(T0 + 12.5),
    }
    watch = [screens.WatchRecord("t1", T0, T0 + 11, "ABORTED", frames=1)]
    submitted = [Submitted("r1", plan, None, task_id="t1")]
    found, figures = screens.check(ev, clean, watch, submitted)
    assert found == []
    assert figures["frames captured after the attempt ended (its host not knowing yet)"] == 1
    for check, bad in broken.items():
        found, _ = screens.check(ev, [bad], watch, submitted)
        assert [c for c, _ in found] == [check], check
    silent, _ = screens.check(ev, [frame(T0 + 2, None)], watch, submitted)
    assert [c for c, _ in silent] == ["a frame not captured during the watched task"]
    late = frame(T0 + 9, received_at=T0 + 10 + screens.REFRESH_BOUND + screens.NOTICE_SLACK + 1)
    assert [c for c, _ in screens.check(ev, [late], watch, submitted)[0]] == [
        "a frame sent long after its attempt ended"
    ]
    ev.tasks["t1"] = {**done, "result": task_pb2.TaskResult(steps=steps[:-1]).SerializeToString()}
    ev.actions.append(acted[0])
    found, _ = screens.check(ev, clean, watch, submitted)
    assert [c for c, _ in found] == [
        "a watched task's steps are not its spec's",
        "a watched task's phone did other than its plan's actions",
    ]


def test_a_lease_after_a_failed_clean_and_a_task_during_a_clean_break_invariant_12() -> None:
    """THEN an attempt created after a phone's clean failed (from its last command's end,
    before the report) and before its next passing clean is a violation, one after the
    passing clean is not; a task action overlapping a clean command of its phone is one."""
    t = 1_000_000.0
    cleans = [
        Action("h1", "sim-0", "clean", t + 1.0, t + 1.2, "ok"),
        Action("h1", "sim-0", "clean", t + 1.2, t + 5.2, "cancelled"),  # hung: timed out
        Action("h1", "sim-0", "clean", t + 20.0, t + 20.1, "ok"),
    ]
    reports = [
        cleaning.Record("h1/sim-0", t + 5.5, False, "uninstall failed (4.0 s): timed out"),
        cleaning.Record("h1/sim-0", t + 20.3, True, ""),
    ]
    attempts = {
        ("early", 1): {"host_id": "h1", "device_serial": "sim-0", "created_at": t + 0.5},
        ("between", 1): {"host_id": "h1", "device_serial": "sim-0", "created_at": t + 5.3},
        ("held", 1): {"host_id": "h1", "device_serial": "sim-0", "created_at": t + 9.0},
        ("after", 1): {"host_id": "h1", "device_serial": "sim-0", "created_at": t + 21.0},
    }
    during = Action("h1", "sim-0", "tap", t + 20.05, t + 20.2, "ok")
    verdict = cleaning.check(cleans, [during], attempts, reports)
    leases = [d["lease_started_at"] for c, d in verdict.violations if c.startswith("a lease")]
    assert leases == [t + 5.3, t + 9.0]
    acted = [d for c, d in verdict.violations if c.startswith("a task acted")]
    assert acted == [
        {
            "phone": "h1/sim-0",
            "action": "tap",
            "acted": [t + 20.05, t + 20.2],
            "clean_command": [t + 20.0, t + 20.1],
        }
    ]
    assert verdict.stats["cleans failed"] == 1 and verdict.stats["cleans passed"] == 1
    assert NAMES[12].startswith("cleaning")


def test_cleans_that_passed_between_leases_break_no_invariant_12() -> None:
    t = 1_000_000.0
    cleans = [Action("h1", "sim-0", "clean", t + 2.0, t + 2.1, "ok")]
    attempts = {
        ("a", 1): {"host_id": "h1", "device_serial": "sim-0", "created_at": t},
        ("b", 1): {"host_id": "h1", "device_serial": "sim-0", "created_at": t + 3.0},
    }
    tapped = [
        Action("h1", "sim-0", "tap", t + 0.1, t + 1.9, "ok"),
        Action("h1", "sim-0", "tap", t + 3.1, t + 3.2, "ok"),
    ]
    reports = [cleaning.Record("h1/sim-0", t + 2.2, True, "")]
    assert cleaning.check(cleans, tapped, attempts, reports).violations == []


@pytest.mark.parametrize(
    ("reasons", "cleans"),
    [
        (["uninstall failed (4.0 s): timed out"], ["uninstall failed (4.0 s): timed out"]),
        (
            ["uninstall failed (4.0 s): hung", "uninstall (0 ms): x", "files (0 ms): y"],
            ["uninstall failed (4.0 s): hung", ""],
        ),
        (
            ["uninstall (0 ms): x", "files (0 ms): y", "uninstall (1 ms): x", "files (0 ms): y"],
            ["", ""],
        ),
        (
            ["uninstall (0 ms): x", "files failed (2 ms): rm -rf: exit 1"],
            ["files failed (2 ms): rm -rf: exit 1"],
        ),
        (
            ["uninstall (0 ms): x", "uninstall failed (4.0 s): hung"],
            ["", "uninstall failed (4.0 s): hung"],
        ),
    ],
    ids=["one-failed", "failed-then-passed", "two-passed", "failed-late", "passed-then-failed"],
)
def test_one_reports_cleans_are_told_apart_by_their_steps(
    reasons: list[str], cleans: list[str]
) -> None:
    assert cleaning.split_cleans(reasons) == cleans


def clean_step(name: str, detail: str, took: float, ok: bool = True) -> lease_pb2.CleanStep:
    return lease_pb2.CleanStep(name=name, detail=detail, took=seconds(took), ok=ok)


async def test_a_failed_clean_and_the_passing_one_after_it_in_one_report_break_no_invariant_12(
    farm: Farm,
) -> None:
    """GIVEN a phone whose clean failed (quarantined, reported), whose next clean failed too
    and the one after passed while the database was away, so that both reached the
    database in the one report the host sent once it was back (as chaos-h2/sim-2's did)
    WHEN the phone is leased after that report
    THEN invariant 12, read from the database as the chaos run reads it, sees three cleans
    (failed, failed, passed) and no lease after a failed clean."""
    host = await farm.host("h1", "s1")

    async def report(condition: int, *steps: lease_pb2.CleanStep, reason: str = "") -> None:
        device = lease_pb2.DeviceHealth(
            serial="s1", condition=condition, reason=reason, cleaned=steps
        )
        await host.c.lease.ReportDeviceHealth(
            lease_pb2.ReportDeviceHealthRequest(host_id=host.host_id, devices=[device])
        )

    timed_out = "timed out: the clean ran past its 4s"
    t0 = time.time()
    await report(
        scheduler_pb2.DEVICE_CONDITION_QUARANTINED,
        clean_step("uninstall", timed_out, 4.0, ok=False),
        reason=f"clean failed: uninstall: {timed_out}",
    )
    t1 = time.time()
    await report(
        scheduler_pb2.DEVICE_CONDITION_READY,
        clean_step("uninstall", timed_out, 4.0, ok=False),
        clean_step("uninstall", "nothing to remove", 0.0),
        clean_step("files", "nothing to remove", 0.0),
    )
    t2 = time.time()
    task = await submit(await farm.client(), actions_spec())
    assert (await host.acquire_one("s1")).task_id == task
    # The clean commands as the phone's action log has them: the first clean's before its
    # report, the second's and the third's before the report that carried both.
    cleans = [
        Action("h1", "s1", "clean", t0 - 4.0, t0, "cancelled"),
        Action("h1", "s1", "clean", t1, t1 + (t2 - t1) / 3, "cancelled"),
        Action("h1", "s1", "clean", t1 + (t2 - t1) / 2, t1 + (t2 - t1) / 2, "ok"),
    ]
    assert farm.db is not None
    rows = await farm.db.fetch(
        "SELECT task_id, attempt, host_id, device_serial,"
        " extract(epoch FROM created_at)::float8 AS created_at FROM attempts"
    )
    attempts = {(str(r["task_id"]), r["attempt"]): dict(r) for r in rows}
    assert len(attempts) == 1
    reported = await cleaning.records(farm.dsn)
    verdict = cleaning.check(cleans, [], attempts, reported)
    assert verdict.violations == []
    assert [(r.passed, r.failed_step) for r in reported] == [
        (False, f"uninstall failed (4.0 s): {timed_out}"),
        (False, f"uninstall failed (4.0 s): {timed_out}"),
        (True, ""),
    ]
    assert (verdict.stats["cleans failed"], verdict.stats["cleans passed"]) == (2, 1)


async def test_a_real_agents_cleans_reported_after_a_database_outage_break_no_invariant_12(
    own_database: EmbeddedPostgres,
) -> None:
    """GIVEN the real agent on a simulated phone whose cleans hang: its clean after a task
    fails and quarantines it (reported), the database goes away, the ladder's next clean
    fails too, the phone answers again and the clean after the ladder's next step passes
    WHEN the database is back (the agent's report carries both cleans) and a task waiting
    for the phone starts
    THEN the phone was leased only after that report, and invariant 12, read from the
    database and the phone's action log, sees the three cleans and no violation."""
    farm = Farm(own_database.url, FAST)
    await farm.start()
    try:
        source = SimulatedSource(1, delay=0.01)
        source.boot_time = 0.1
        settings = {
            "clean_profile": parse({"defaults": {"timeout": "500ms"}}),
            "probe_interval": 0.5,
            "recovery": RecoverySettings(failures=3, backoff=1.0, boot_timeout=2.0),
        }
        client = await farm.client()

        def refused_reports() -> float:
            return (
                REGISTRY.get_sample_value(
                    "amc_rpc_requests_total",
                    {"method": "Lease/ReportDeviceHealth", "code": "UNAVAILABLE"},
                )
                or 0.0
            )

        def hung() -> int:
            return sum(1 for c in source.cleans if c.outcome != "ok")

        async with running_agent(farm, source, **settings) as agent:
            await cleaned_once(farm, agent)
            source.hang_cleans("sim-0")
            first = await submit(client, actions_spec(tap()), selector=on("sim-0"))
            await status_is(farm, first, "done")
            await eventually(lambda: is_in(farm, "sim-0", "quarantined"), what="quarantined")
            waiting = await submit(client, actions_spec(tap()), selector=on("sim-0"))
            own_database.stop("immediate")
            await eventually(lambda: hung() >= 2, timeout=20, what="the ladder's clean failed")
            source.hang_cleans("sim-0", hung=False)
            await eventually(
                lambda: agent.recovery.outcomes == [("sim-0", True)],
                timeout=20,
                what="the ladder's end, its clean passed",
            )
            # Two reports refused since: the second was made after the passing clean (one
            # at a time), so the report that goes through carries both cleans.
            refused = refused_reports()
            await eventually(lambda: refused_reports() >= refused + 2, what="two reports refused")
            own_database.start()
            await farm.reconnect_db()
            await status_is(farm, waiting, "done", within=30)
        assert farm.db is not None
        rows = await farm.db.fetch(
            "SELECT task_id, attempt, host_id, device_serial,"
            " extract(epoch FROM created_at)::float8 AS created_at FROM attempts"
        )
        attempts = {(str(r["task_id"]), r["attempt"]): dict(r) for r in rows}
        reported = [r for r in await cleaning.records(farm.dsn) if r.phone == "host-1/sim-0"]
        cleans = [
            Action("host-1", c.serial, "clean", c.started_wall, c.ended_wall, c.outcome)
            for c in source.cleans
        ]
        verdict = cleaning.check(cleans, [], attempts, reported)
        assert verdict.violations == []
        at = sorted({r.at for r in reported if not r.passed})
        assert len(at) == 2, reported  # the first failure, then the report after the outage
        together = [r.passed for r in reported if r.at == at[-1]]
        assert together == [False, True], reported
        started = next(a["created_at"] for (t, _), a in attempts.items() if t == waiting)
        assert started > at[-1]
    finally:
        await farm.stop()


def test_a_door_past_its_lease_or_its_session_breaks_invariant_13(tmp_path: Path) -> None:
    """THEN invariant 13: a door's streams opened and written within their attempt's lease
    are clean, and so is a door stopped (done), cancelled or killed (failed) that hung up
    at its session's end; a stream written after the lease ended or after the host's token
    tripped, one on a phone outside any attempt, a door that hung up long after its
    session ended or never did, and a session ended otherwise than its door asked each
    break it."""
    ours = _attempt("t1", 1, "h1", T0, T0 + 10)
    log = tmp_path / "h1.jsonl"

    def stream(opened: float, written: float | None, serial: str = "sim-0") -> str:
        args = {"service": "shell:echo 1", "written_until": written}
        return json.dumps({"action": "adb", "serial": serial, "started_wall": opened, "args": args})

    def task(status: str, error: str = "") -> dict[str, Any]:
        return {
            "status": status,
            "error": error,
            "finished_at": T0 + 10,
            "metadata": {"door": "adb"},
        }

    def door(plan: str, did: str, exit_code: int, hung_up: float | None = T0 + 10.1) -> Any:
        return doors.DoorRecord(plan, "r", "t1", True, 2, did, "", hung_up, exit_code)

    ev = Evidence(
        tasks={"t1": task("done")}, attempts={("t1", 1): ours}, events={}, devices=[],
        actions=[], agent_events=[],
    )  # fmt: skip
    log.write_text(stream(T0 + 1, T0 + 9.99) + "\n" + stream(T0 + 2, None) + "\n")
    closed = door("close", "closed", 0)
    assert doors.check(ev, {"h1": log}, [closed])[0] == []
    ev.tasks["t1"] = task("failed", "session abandoned")
    assert doors.check(ev, {"h1": log}, [door("abandon", "killed", -9)])[0] == []
    ev.tasks["t1"] = task("cancelled")
    assert doors.check(ev, {"h1": log}, [door("cancel", "cancel_acked", 9)])[0] == []

    ev.tasks["t1"] = task("done")
    late = "a door wrote to a phone after its lease ended (or its host's token tripped)"
    log.write_text(stream(T0 + 1, T0 + 10.5) + "\n")
    assert [c for c, _ in doors.check(ev, {"h1": log}, [closed])[0]] == [late]
    ev.trips[("t1", 1)] = (T0 + 5, "cancelled")
    log.write_text(stream(T0 + 1, T0 + 6) + "\n")
    assert [c for c, _ in doors.check(ev, {"h1": log}, [closed])[0]] == [late]
    del ev.trips[("t1", 1)]
    log.write_text(stream(T0 - 1, None) + "\n")
    assert [c for c, _ in doors.check(ev, {"h1": log}, [closed])[0]] == [
        "a door's stream on a phone outside any attempt"
    ]

    log.write_text("")
    broken = {
        "a door outlived its session's end": door("close", "closed", 0, T0 + 10 + 6),
        "a door never hung up on its adb client": door("close", "closed", 0, None),
        "a door's session done though its door was not stopped": door("cancel", "cancel_acked", 9),
    }
    for check, bad in broken.items():
        found = [c for c, _ in doors.check(ev, {"h1": log}, [bad])[0]]
        assert check in found, (check, found)
    ev.tasks["t1"] = task("failed", "step 1: `false` exited 1")
    assert [c for c, _ in doors.check(ev, {"h1": log}, [door("abandon", "killed", -9)])[0]] == [
        "a door's session failed for a reason that is not a stop"
    ]
    assert NAMES[13].startswith("adb doors")


@pytest.mark.parametrize("plan", ["close", "cancel"])
async def test_a_door_whose_end_was_asked_as_the_run_ended_exits_with_its_sessions_end(
    farm: Farm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plan: str
) -> None:
    """THEN the run's end (the harness cancels its door clients) does not kill a door that
    was just stopped or whose session was just cancelled: the real `amc adb` exits by
    itself with its session's end, and invariant 13 holds on the farm's own evidence."""
    monkeypatch.setattr(doors, "ENDINGS", {plan: 1.0})
    token = await farm.token(Role.CLIENT)
    load = doors.DoorLoad([farm.address], token, random.Random(1), tmp_path, 1)
    async with running_agent(farm, SimulatedSource(1), labels={"pool": "agents"}):
        running = asyncio.create_task(load.run_forever())
        try:
            await eventually(
                lambda: load.records and load.records[0].did in doors.ASKED,
                timeout=60,
                interval=0.005,
                what="the door's end to be asked",
            )
        finally:
            load.stop()
            running.cancel()  # as the run ends, at once
            with contextlib.suppress(asyncio.CancelledError):
                await running
        await load.close()
        record = load.records[0]
        status = await status_is(farm, record.task_id, *doors.EXIT_FOR)
        ev = await evidence.load(farm.dsn, {}, {})
    asked = {"close": "done", "cancel": "cancelled"}[plan]
    assert record.at_run_end  # the run's end came while the door was taking its end
    assert (status, record.exit_code) == (asked, doors.EXIT_FOR[asked])
    assert doors.check(ev, {}, [record])[0] == []


def _emulator_events(t: float) -> list[dict[str, Any]]:
    """Two instances up from t; the first dies at t+10 under a task (in its load of the
    snapshot it starts from), starts afresh at t+12."""
    e = emulators.APP
    return [
        {"at": t, "event": "registered", "serial": "emulator-5660", "pid": 1},
        {"at": t, "event": "registered", "serial": "emulator-5662", "pid": 2},
        {"at": t + 9.9, "event": "loading", "serial": "emulator-5660", "pid": 1, "snapshot": e},
        {"at": t + 10.0, "event": "died", "serial": "emulator-5660", "pid": 1, "snapshot": e},
        {"at": t + 12.0, "event": "registered", "serial": "emulator-5660", "pid": 3},
    ]


def _emulator_attempt(
    task: str, attempt: int, serial: str, made: float, ended: float, state: str
) -> Any:
    return {
        "task_id": task,
        "attempt": attempt,
        "host_id": emulators.HOST,
        "device_serial": serial,
        "created_at": made,
        "ended_at": ended,
        "state": state,
    }


def test_a_task_whose_emulator_died_is_given_back_and_done_or_breaks_invariant_14() -> None:
    """THEN a task whose emulator died under its attempt, given back (released,
    device_lost) and then done, is counted; one failed there, or not done after, breaks
    it; a session failed there does not (invariant 9 judges it)."""
    t = 1_000_000.0
    ok = "ok"
    attempts = {
        (ok, 1): _emulator_attempt(ok, 1, "emulator-5660", t + 5, t + 10.1, "released"),
        (ok, 2): _emulator_attempt(ok, 2, "emulator-5662", t + 11, t + 13, "done"),
    }
    tasks: dict[str, dict[str, Any]] = {
        ok: {"status": "done", "cancel_requested_at": None, "metadata": {}}
    }
    lost = {ok: [{"kind": "device_lost", "attempt": 1}]}
    events = _emulator_events(t)
    verdict = emulators.check(events, tasks, attempts, lost, [], 2, t + 30)
    assert verdict.violations == []
    assert verdict.stats["tasks given back as device_lost, then done"] == 1
    assert verdict.stats["instances started afresh"] == 1

    failed = dict(tasks[ok], status="failed")
    verdict = emulators.check(events, {ok: failed}, attempts, lost, [], 2, t + 30)
    assert [c for c, _ in verdict.violations] == ["a task whose emulator died did not end done"]
    reported = {(ok, 1): dict(attempts[(ok, 1)], state="failed")}
    verdict = emulators.check(events, {ok: failed}, reported, {ok: []}, [], 2, t + 30)
    assert [c for c, _ in verdict.violations] == [
        "an attempt whose emulator died was not given back as device_lost"
    ]
    session = dict(failed, metadata={"session": "close"})
    verdict = emulators.check(events, {ok: session}, attempts, lost, [], 2, t + 30)
    assert verdict.violations == []
    assert verdict.stats["sessions whose emulator died, then failed"] == 1


def test_an_emulator_dying_in_its_reset_while_the_result_is_reported_keeps_invariant_14() -> None:
    """THEN an instance that dies in a load of the pool's snapshot (a reset: it starts as
    the lease's result is reported) while the control plane still has the attempt open is
    a reset's death, not a task's: the attempt ended done breaks nothing."""
    t = 1_000_000.0
    events = [
        dict(e, snapshot=emulators.BOOT) if e["event"] in ("loading", "died") else e
        for e in _emulator_events(t)
    ]
    attempts = {("ok", 1): _emulator_attempt("ok", 1, "emulator-5660", t + 5, t + 10.1, "done")}
    tasks = {"ok": {"status": "done", "cancel_requested_at": None, "metadata": {}}}
    verdict = emulators.check(events, tasks, attempts, {"ok": []}, [], 2, t + 30)
    assert verdict.violations == []
    assert verdict.stats["deaths between leases (in a reset)"] == 1


def test_an_emulator_not_started_afresh_or_a_pool_below_its_minimum_breaks_invariant_14() -> None:
    """THEN an instance that died and never registered again within the bound, and a pool
    below its minimum past the bound, break it, unless a start that never boots was the
    fault then (until its end); and a pool short at the quiesce breaks it."""
    t = 1_000_000.0
    events = _emulator_events(t)[:-1]  # never back
    verdict = emulators.check(events, {}, {}, {}, [], 2, t + 60)
    assert sorted(c for c, _ in verdict.violations) == [
        "an emulator that died or whose load failed was not started afresh",
        "the pool stayed below its minimum",
    ]
    assert verdict.longest_below_min_s == 50.0
    down = Fault("emu_boot_fails", "chaos-e0/fault-0", t + 9, t + 40, t + 45)
    late = [*events, {"at": t + 50, "event": "registered", "serial": "emulator-5660", "pid": 3}]
    assert emulators.check(late, {}, {}, {}, [down], 2, t + 60).violations == []
    short = emulators.check(late, {}, {}, {}, [down], 1, t + 60)
    assert [c for c, _ in short.violations] == ["the pool was below its minimum at the quiesce"]


def test_an_emulators_failed_clean_is_dated_by_the_double_for_invariant_12() -> None:
    """THEN a lease on an emulator after its restart was refused (the double's event) and
    before its failed clean's report breaks invariant 12: the emulator host keeps no action
    log, so the double's loads and refused starts stand for its clean's commands."""
    t = 1_000_000.0
    events = [
        {"at": t + 1.0, "event": "loading", "serial": "emulator-5660", "pid": 1,
         "snapshot": emulators.BOOT},
        {"at": t + 1.3, "event": "load_failed", "serial": "emulator-5660", "pid": 1,
         "snapshot": emulators.BOOT},
        {"at": t + 2.0, "event": "refused", "serial": "emulator-5660", "pid": 2},
    ]  # fmt: skip
    commands = emulators.clean_commands(events)
    assert [(c.start, c.end, c.outcome) for c in commands] == [
        (t + 1.0, t + 1.3, "load_failed"),
        (t + 2.0, t + 2.0, "refused"),
    ]
    phone = f"{emulators.HOST}/emulator-5660"
    reports = [cleaning.Record(phone, t + 3.0, False, "snapshot failed (2.0 s): did not start")]
    attempts = {("x", 1): _emulator_attempt("x", 1, "emulator-5660", t + 2.5, t + 4, "done")}
    verdict = cleaning.check(commands, [], attempts, reports)
    assert [d["lease_started_at"] for _, d in verdict.violations] == [t + 2.5]


def test_an_emulator_a_killed_agent_left_running_and_never_stopped_breaks_invariant_14() -> None:
    """THEN after the emulator host's agent was killed and started again, an instance it
    left running that was never stopped is a violation; one stopped within the bound, and
    one started after the kill, are not."""
    t = 1_000_000.0
    kill = Fault("emu_agent_kill", emulators.HOST, t + 20, t + 22, t + 30)
    events = [
        {"at": t, "event": "registered", "serial": "emulator-5660", "pid": 1},
        {"at": t, "event": "registered", "serial": "emulator-5662", "pid": 2},
        {"at": t + 23, "event": "killed", "serial": "emulator-5660", "pid": 1},
        {"at": t + 25, "event": "registered", "serial": "emulator-5664", "pid": 3},
        {"at": t + 26, "event": "registered", "serial": "emulator-5666", "pid": 4},
    ]
    verdict = emulators.check(events, {}, {}, {}, [kill], 2, t + 60)
    assert verdict.violations == [
        (
            "an emulator a killed agent left running was not stopped",
            {"serial": "emulator-5662", "pid": 2, "agent_back_at": t + 22},
        )
    ]
    assert verdict.stats["of those stopped by the agent started again"] == 1
    stopped = [*events, {"at": t + 24, "event": "killed", "serial": "emulator-5662", "pid": 2}]
    assert emulators.check(stopped, {}, {}, {}, [kill], 2, t + 60).violations == []


async def test_chaos_runs_at_once_on_one_machine_hold_emulator_ports_and_tokens_of_their_own(
    tmp_path: Path,
) -> None:
    """THEN two chaos runs at once get emulator port ranges that do not meet (each slot
    held until its run ends, then free for the next) and console tokens of their own: one
    run's agent never takes the other's emulators for leftovers of its own and kills them,
    nor starts its instances on their ports."""
    first = await emulators.EmulatorWorld.make(tmp_path / "a")
    try:
        second = await emulators.EmulatorWorld.make(tmp_path / "b")
        try:
            (a_low, a_high), (b_low, b_high) = first.ports, second.ports
            assert a_high < b_low or b_high < a_low, (first.ports, second.ports)
            assert f"{b_low}-{b_high}" in second.agent_args()
            token = ".emulator_console_auth_token"
            assert (tmp_path / "a/emulators/home" / token).read_text() != (
                tmp_path / "b/emulators/home" / token
            ).read_text()
        finally:
            await second.close()
        third = await emulators.EmulatorWorld.make(tmp_path / "c")
        await third.close()
        assert third.ports == second.ports  # given back when its run ended
    finally:
        await first.close()


def test_a_webdriver_command_past_its_lease_or_its_end_breaks_invariant_15(tmp_path: Path) -> None:
    """THEN invariant 15: Appium sessions whose commands came within their attempt's lease
    (and the DELETE that ends one, after it) are clean, and so are clients' sessions
    deleted (done), cancelled or abandoned (failed) whose OK answers came within the lease;
    a command Appium served after the lease ended (read from Appium's own log), an Appium
    session on a phone outside any attempt or left open at the run's end, an OK answer to
    a command sent after the lease ended or after the client was told the session ended, a
    DELETE answered before the phone was free, and an end not asked for each break it."""
    ours = _attempt("t1", 1, "h1", T0, T0 + 10)
    logs = tmp_path / "appium-logs"
    logs.mkdir()

    def stamp(at: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) + f":{round(at % 1 * 1000):03d}"

    sid = "2253c32d-01a8-4920-9d1d-70188d300328"

    def appium_log(*calls: tuple[float, str]) -> None:
        lines = [
            f'{stamp(T0 + 0.5)} [HTTP] --> POST /session {{"capabilities":{{"alwaysMatch":'
            f'{{"appium:udid":"sim-0"}}}}}}',
            f"{stamp(T0 + 0.6)} [2253c32d][FakeDriver@d7ae] Session created with session id: {sid}",
        ]
        lines += [
            f"{stamp(at)} [2253c32d][HTTP] --> {what.replace('SID', sid)} " for at, what in calls
        ]
        (logs / "h1-1234.log").write_text("\n".join(lines) + "\n")

    def task(status: str, error: str = "") -> dict[str, Any]:
        return {
            "status": status,
            "error": error,
            "finished_at": T0 + 10,
            "metadata": {"webdriver": "session"},
        }

    def client(plan: str, did: str, *commands: tuple[str, float, int]) -> Any:
        record = webdriver.WdRecord(plan, "http://r", "t1", did=did)
        record.commands = [webdriver.Command("POST", "", T0 - 1, T0 + 1, 200)]
        for what, sent, status in commands:
            method, _, path = what.partition(" ")
            record.commands.append(webdriver.Command(method, path, sent, sent + 0.01, status))
            if status == 404 and record.told_ended_at is None:
                record.told_ended_at = sent + 0.01
        return record

    ev = Evidence(
        tasks={"t1": task("done")}, attempts={("t1", 1): ours}, events={}, devices=[],
        actions=[], agent_events=[],
    )  # fmt: skip

    def found(records: list[Any], leftover: list[Any] | None = None) -> list[str]:
        sessions = webdriver.appium_sessions(logs)
        return [c for c, _ in webdriver.check(ev, sessions, records, leftover or [])[0]]

    appium_log((T0 + 2, "GET /session/SID/source"), (T0 + 11, "DELETE /session/SID"))
    deleted = client(
        "delete", "deleted", ("GET /source", T0 + 2, 200), ("DELETE ", T0 + 9.995, 200)
    )
    assert found([deleted]) == []
    ev.tasks["t1"] = task("failed", "idle timeout")
    assert found([client("abandon", "abandoned", ("GET /source", T0 + 12, 404))]) == []
    ev.tasks["t1"] = task("cancelled")
    assert found([client("cancel", "cancel_acked", ("GET /source", T0 + 2, 200))]) == []

    ev.tasks["t1"] = task("done")
    appium_log((T0 + 10.5, "GET /session/SID/source"))
    assert found([]) == ["Appium served a command outside its session's lease"]
    ev.attempts[("t1", 1)] = _attempt("t1", 1, "h1", T0 + 5, T0 + 10)
    appium_log()
    assert found([]) == ["an Appium session on a phone outside any attempt"]
    ev.attempts[("t1", 1)] = ours
    assert found([], [{"server": "h1/sim-0/4723", "session": sid}]) == [
        "an Appium session left open after the run"
    ]
    broken = {
        "a command was answered OK after its session's lease ended": client(
            "delete", "deleted", ("GET /source", T0 + 10.5, 200)
        ),
        "a command was answered OK after the session was said ended": client(
            "delete", "deleted", ("GET /source", T0 + 2, 404), ("GET /source", T0 + 3, 200)
        ),
        "DELETE answered before its session's phone was free": client(
            "delete", "deleted", ("DELETE ", T0 + 8, 200)
        ),
        "a WebDriver session done though its client did not DELETE it": client(
            "abandon", "abandoned"
        ),
    }
    for check, bad in broken.items():
        assert check in found([bad]), (check, found([bad]))
    ev.tasks["t1"] = task("failed", "step 1: webdriver failed")
    assert found([client("abandon", "abandoned")]) == [
        "a WebDriver session failed for a reason that is not a stop"
    ]
    assert NAMES[15].startswith("WebDriver sessions")
