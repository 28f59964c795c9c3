from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from tests.support import Farm, actions_spec


async def test_submit_assign_renew_report_runs_a_task_to_done(farm: Farm) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec()))
    assert task.status == task_pb2.TASK_STATUS_QUEUED
    a = await host.acquire_one("s1")
    assert a.task_id == task.task_id and a.attempt == 1
    assert await farm.status(task.task_id) == "assigned"
    (state,) = await host.renew(a.lease_id)
    assert state.result == lease_pb2.RENEWAL_RESULT_RENEWED
    assert await farm.status(task.task_id) == "dispatched"
    done = await host.report(a, lease_pb2.OUTCOME_DONE)
    assert done.status == task_pb2.TASK_STATUS_DONE
    assert await farm.device_holder("h1", "s1") is None
