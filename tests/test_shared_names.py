"""What the programs share is declared once, in amc_common: the task statuses and which of
them end a task, a device's conditions, and the text of a device selector (issue 26: one
home, one name)."""

from __future__ import annotations

import re
from pathlib import Path

from amc.v1 import scheduler_pb2, task_pb2
from amc_cli import render
from amc_cli.commands import tasks
from amc_client import farm
from amc_common import statuses
from amc_common.device_conditions import CONDITIONS
from amc_common.device_selector import describe
from control_plane import gauges, lifecycle, pending
from control_plane.domain import DeviceMatch
from host_agent.health import Condition

ROOT = Path(__file__).resolve().parent.parent


def test_the_task_statuses_are_declared_once() -> None:
    """THEN the state machine's statuses, the wire's and amc_common's are the same, in
    order, and every program's terminal set is amc_common's."""
    assert [s.value for s in lifecycle.TaskStatus] == list(statuses.STATUSES)
    wire = [n for n in task_pb2.TaskStatus.keys() if n != "TASK_STATUS_UNSPECIFIED"]
    assert wire == [statuses.wire_name(s) for s in statuses.STATUSES]
    assert {s.value for s in lifecycle.TERMINAL} == statuses.TERMINAL
    assert statuses.TERMINAL == {"done", "failed", "cancelled"}
    ended = {task_pb2.TASK_STATUS_DONE, task_pb2.TASK_STATUS_FAILED, task_pb2.TASK_STATUS_CANCELLED}
    assert farm.TERMINAL == render.TERMINAL == ended
    assert [s.value for s in tasks.Status] == list(statuses.STATUSES)


def test_a_selector_is_written_one_way() -> None:
    """THEN serial first, labels by key; asking for nothing reads `any device`; the pending
    reason's text is this one, the CLI's the same with spaces, the queue metric's label
    the same cut at 120 characters (`any` for nothing, `other` for the rest)."""
    assert describe("R58M", {"rack": "r1", "model": "Pixel9"}) == "serial=R58M,model=Pixel9,rack=r1"
    assert describe(None, {}) == describe("", {}) == "any device"
    assert describe("", {"rack": "r1"}, sep=" ", anything="any") == "rack=r1"
    nothing = DeviceMatch()
    reason = pending.explain("R58M", {"rack": "r1"}, nothing)
    assert reason == "no registered device matches serial=R58M,rack=r1"
    assert gauges.selector_label("R58M", {"rack": "r1"}) == "serial=R58M,rack=r1"
    assert gauges.selector_label(None, {}) == "any"
    assert gauges.selector_label(None, None) == "other"
    assert gauges.selector_label(None, {"k": "v" * 200}) == ("k=" + "v" * 200)[:120]
    selector = task_pb2.DeviceSelector(serial="R58M", labels={"rack": "r1", "model": "Pixel9"})
    assert render.selector_text(selector) == "serial=R58M model=Pixel9 rack=r1"
    assert render.selector_text(task_pb2.DeviceSelector()) == "any device"


def test_the_device_conditions_are_declared_once() -> None:
    """THEN the wire's device conditions, the host's judgement (health.Condition), the
    database's CHECK and amc_common's list are the same, in order."""
    wire = [n for n in scheduler_pb2.DeviceCondition.keys() if n != "DEVICE_CONDITION_UNSPECIFIED"]
    assert [n.removeprefix("DEVICE_CONDITION_").lower() for n in wire] == list(CONDITIONS)
    assert [c.value for c in Condition] == list(CONDITIONS)
    schema = (ROOT / "control_plane" / "schema.sql").read_text()
    check = re.search(
        r"condition\s+text NOT NULL DEFAULT 'ready' CHECK \(condition IN\s*\(([^)]*)\)", schema
    )
    assert check is not None
    assert re.findall(r"'([a-z_]+)'", check[1]) == list(CONDITIONS)
