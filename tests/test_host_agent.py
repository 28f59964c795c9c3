"""The host agent end to end: a real control plane (real PostgreSQL, real gRPC), the Agent
on a real channel, simulated phones that record every action they are asked for."""

from __future__ import annotations

from amc.v1 import task_pb2
from host_agent.agent import Ending
from host_agent.results import Outcome
from host_agent.simulated import SimulatedSource
from tests.host_agent_support import finished, running_agent, status_is, submit
from tests.support import Farm, actions_spec, tap, wait_action, workflow_spec


async def test_agent_runs_a_workflow_to_done_with_simulated_devices(farm: Farm) -> None:
    """THEN every step runs on the phone and the task is done with its step results."""
    source = SimulatedSource(1, delay=0.01)
    client = await farm.client()
    async with running_agent(farm, source) as agent:
        spec = workflow_spec(open=[tap(1, 2), wait_action(0.05)], confirm=[tap(3, 4)])
        task_id = await submit(client, spec)
        await status_is(farm, task_id, "done")
        record = await finished(agent, task_id)
    assert record.ending is Ending.REPORTED and record.result is not None
    assert record.result.outcome is Outcome.DONE
    assert [a.args for a in source.actions] == [{"x": 1, "y": 2}, {"x": 3, "y": 4}]
    row = await farm.task_row(task_id)
    result = task_pb2.TaskResult.FromString(row["result"])
    assert [s.name for s in result.steps] == ["open", "confirm"]
    assert all(s.status == task_pb2.STEP_STATUS_OK for s in result.steps)
    assert await farm.device_holder("host-1", "sim-0") is None
