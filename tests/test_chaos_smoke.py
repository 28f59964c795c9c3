"""The chaos run (scripts/chaos.py), short, end to end; and its checks on made-up evidence,
so that a check which can no longer fail is noticed here rather than trusted in a long run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from chaos_lib.evidence import Action, Evidence  # noqa: E402
from chaos_lib.faults import KINDS  # noqa: E402
from chaos_lib.invariants import NAMES, Checks  # noqa: E402
from chaos_lib.specs import random_plan  # noqa: E402
from chaos_lib.workload import Submitted  # noqa: E402


@pytest.mark.timeout(170)
def test_quick_chaos_run_injects_every_fault_and_breaks_no_invariant(tmp_path: Path) -> None:
    """THEN every fault kind ran, every invariant held, and chaos-results.json has its shape."""
    out = tmp_path / "chaos-results.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "chaos.py"), "--quick", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=160,
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert {"summary", "tasks", "faults", "violations", "recovery"} <= set(results)
    assert set(results["violations"]) == {str(n) for n in NAMES}
    assert all({"name", "count", "examples"} <= set(v) for v in results["violations"].values())
    assert {k: results["faults"][k]["count"] >= 1 for k in KINDS} == dict.fromkeys(KINDS, True)
    assert set(results["recovery"]) == set(KINDS)
    assert results["tasks"]["submitted"] > 0
    broken = {n: v["examples"] for n, v in results["violations"].items() if v["count"]}
    assert not broken, json.dumps(broken, indent=1)
    assert results["summary"]["problems"] == []
    assert done.returncode == 0, done.stdout[-3000:]


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
