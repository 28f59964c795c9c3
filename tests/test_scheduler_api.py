"""The Scheduler service as its callers see it: submit, get, list, watch, hosts, and the
errors bad input gets."""

import asyncio

import grpc
import pytest

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane.admin_service import create_token
from control_plane.domain import Role
from tests.support import Farm, actions_spec, eventually, seconds, tap, workflow_spec


def submit_request(**kw) -> scheduler_pb2.SubmitTaskRequest:  # type: ignore[no-untyped-def]
    kw.setdefault("spec", actions_spec())
    return scheduler_pb2.SubmitTaskRequest(**kw)


async def test_submit_stores_the_task_as_queued_with_its_fields(farm: Farm) -> None:
    client = await farm.client()
    spec = workflow_spec(
        login=[tap(1, 2)],
        check=[
            task_pb2.Action(
                assert_visible=task_pb2.AssertVisible(selector=task_pb2.UiSelector(text="Welcome"))
            )
        ],
    )
    task = await client.scheduler.SubmitTask(
        submit_request(
            spec=spec,
            priority=7,
            max_attempts=5,
            metadata={"team": "qa"},
            selector=task_pb2.DeviceSelector(labels={"rack": "a"}),
        )
    )
    assert (task.status, task.priority, task.max_attempts) == (task_pb2.TASK_STATUS_QUEUED, 7, 5)
    got = await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))
    # A read of a queued task says why it waits; SubmitTask's answer does not.
    assert got.pending_reason == "no registered device matches rack=a"
    got.ClearField("pending_reason")
    assert got == task and got.spec == spec and dict(got.metadata) == {"team": "qa"}
    row = await farm.task_row(task.task_id)
    assert (row["status"], row["max_attempts"], row["selector_labels"]) == (
        "queued",
        5,
        {"rack": "a"},
    )


async def test_max_attempts_defaults_to_three(farm: Farm) -> None:
    client = await farm.client()
    task = await client.scheduler.SubmitTask(submit_request())
    assert task.max_attempts == 3


async def test_resubmitting_the_same_request_id_returns_the_same_task(farm: Farm) -> None:
    client = await farm.client()
    first = await client.scheduler.SubmitTask(submit_request(request_id="order-17"))
    second = await client.scheduler.SubmitTask(submit_request(request_id="order-17"))
    assert first == second
    concurrent = await asyncio.gather(
        *[client.scheduler.SubmitTask(submit_request(request_id="order-18")) for _ in range(8)]
    )
    assert len({t.task_id for t in concurrent}) == 1
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 2


async def test_request_ids_are_scoped_to_the_caller(farm: Farm) -> None:
    a, b = await farm.client(), await farm.client()
    ta = await a.scheduler.SubmitTask(submit_request(request_id="same"))
    tb = await b.scheduler.SubmitTask(submit_request(request_id="same"))
    assert ta.task_id != tb.task_id


@pytest.mark.parametrize(
    ("request_kw", "field"),
    [
        ({"spec": task_pb2.TaskSpec()}, "spec"),
        ({"spec": task_pb2.TaskSpec(actions=task_pb2.ActionList())}, "spec.actions.actions"),
        ({"spec": actions_spec(task_pb2.Action())}, "spec.actions.actions[0]"),
        ({"spec": actions_spec(tap(-1, 5))}, "spec.actions.actions[0].tap.x"),
        (
            {"spec": actions_spec(task_pb2.Action(tap_on=task_pb2.TapOn()))},
            "spec.actions.actions[0].tap_on.selector",
        ),
        (
            {"spec": actions_spec(task_pb2.Action(launch_app=task_pb2.LaunchApp(package="no")))},
            "spec.actions.actions[0].launch_app.package",
        ),
        (
            {"spec": actions_spec(task_pb2.Action(wait=task_pb2.Wait()))},
            "spec.actions.actions[0].wait.duration",
        ),
        (
            {
                "spec": actions_spec(
                    task_pb2.Action(shell=task_pb2.Shell(command="ls", timeout=seconds(-1)))
                )
            },
            "spec.actions.actions[0].shell.timeout",
        ),
        ({"spec": workflow_spec(**{"": [tap()]})}, "spec.workflow.steps[0].name"),
        ({"spec": task_pb2.TaskSpec(workflow=task_pb2.Workflow())}, "spec.workflow.steps"),
        ({"max_attempts": -1}, "max_attempts"),
        ({"priority": 10**9}, "priority"),
        ({"request_id": "has spaces"}, "request_id"),
        ({"selector": task_pb2.DeviceSelector(serial="x" * 500)}, "selector.serial"),
        ({"metadata": {"k": "v" * 5000}}, "metadata[k]"),
        ({"metadata": {f"k{i}": "v" for i in range(100)}}, "metadata"),
    ],
)
async def test_bad_submissions_are_invalid_argument_naming_the_field_and_change_nothing(
    farm: Farm, request_kw: dict, field: str
) -> None:  # type: ignore[type-arg]
    client = await farm.client()
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.scheduler.SubmitTask(submit_request(**request_kw))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field + ":"), err.value.details()
    assert await farm.snapshot() == before


def batch(*requests: scheduler_pb2.SubmitTaskRequest) -> scheduler_pb2.SubmitTasksRequest:
    return scheduler_pb2.SubmitTasksRequest(tasks=requests)


async def test_submit_tasks_queues_a_batch_in_order_and_runs_it_in_that_order(
    farm: Farm,
) -> None:
    client = await farm.client()
    answer = await client.scheduler.SubmitTasks(
        batch(
            *[submit_request(metadata={"n": str(i)}) for i in range(20)],
            submit_request(priority=5, metadata={"n": "urgent"}),
        )
    )
    tasks = list(answer.tasks)
    assert [t.metadata["n"] for t in tasks] == [*map(str, range(20)), "urgent"]
    assert {t.status for t in tasks} == {task_pb2.TASK_STATUS_QUEUED}
    assert farm.db is not None
    events = await farm.db.fetch(
        "SELECT task_id::text, kind, to_status FROM task_events WHERE kind = 'submit'"
    )
    assert sorted(e["task_id"] for e in events) == sorted(t.task_id for t in tasks)
    # One device, taking one task at a time: the urgent one, then the batch in its order.
    host = await farm.host("h1", "s1")
    order = []
    for _ in range(len(tasks)):
        a = await host.acquire_one("s1")
        order.append(a.task_id)
        await host.report(a, lease_pb2.OUTCOME_DONE)
    assert order == [tasks[-1].task_id] + [t.task_id for t in tasks[:-1]]


async def test_submit_tasks_returns_existing_tasks_for_request_ids_used_before(
    farm: Farm,
) -> None:
    client = await farm.client()
    first = await client.scheduler.SubmitTask(submit_request(request_id="r-1"))
    answer = await client.scheduler.SubmitTasks(
        batch(submit_request(request_id="r-1"), submit_request(request_id="r-2"), submit_request())
    )
    assert answer.tasks[0] == first
    again = await client.scheduler.SubmitTasks(
        batch(submit_request(request_id="r-2"), submit_request(request_id="r-1"))
    )
    assert [t.task_id for t in again.tasks] == [answer.tasks[1].task_id, first.task_id]
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 3
    assert await farm.db.fetchval("SELECT count(*) FROM task_events") == 3


@pytest.mark.parametrize(
    ("requests", "field"),
    [
        ([], "tasks"),
        ([submit_request()] * 501, "tasks"),
        ([submit_request(), submit_request(priority=10**9)], "tasks[1].priority"),
        (
            [submit_request(spec=actions_spec(tap(-1, 5)))],
            "tasks[0].spec.actions.actions[0].tap.x",
        ),
        (
            [submit_request(request_id="a"), submit_request(), submit_request(request_id="a")],
            "tasks[2].request_id",
        ),
    ],
)
async def test_bad_batches_are_invalid_argument_naming_the_field_and_change_nothing(
    farm: Farm, requests: list[scheduler_pb2.SubmitTaskRequest], field: str
) -> None:
    client = await farm.client()
    before = await farm.snapshot()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.scheduler.SubmitTasks(batch(*requests))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field + ":"), err.value.details()
    assert await farm.snapshot() == before


async def test_a_message_over_one_mebibyte_is_refused(farm: Farm) -> None:
    client = await farm.client()
    huge = actions_spec(task_pb2.Action(input_text=task_pb2.InputText(text="x" * (1 << 20))))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.scheduler.SubmitTask(submit_request(spec=huge))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM tasks") == 0


async def test_too_many_actions_are_refused(farm: Farm) -> None:
    client = await farm.client()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.scheduler.SubmitTask(submit_request(spec=actions_spec(*[tap()] * 1001)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "more than 1000 actions" in (err.value.details() or "")


@pytest.mark.parametrize("task_id", ["", "nope", "12345678-1234-1234-1234-1234567890123"])
async def test_malformed_task_ids_are_invalid_argument(farm: Farm, task_id: str) -> None:
    client = await farm.client()
    for call in (
        client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id)),
        client.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=task_id)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (err.value.details() or "").startswith("task_id:")


async def test_unknown_tasks_are_not_found(farm: Farm) -> None:
    client = await farm.client()
    missing = "00000000-0000-4000-8000-000000000001"
    for call in (
        client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=missing)),
        client.scheduler.CancelTask(scheduler_pb2.CancelTaskRequest(task_id=missing)),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    stream = client.scheduler.WatchTask(scheduler_pb2.WatchTaskRequest(task_id=missing))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stream:
            pass
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_list_tasks_filters_by_status_and_host_and_pages(farm: Farm) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1")
    made = [await client.scheduler.SubmitTask(submit_request()) for _ in range(7)]
    a = await host.acquire_one("s1")
    seen: list[str] = []
    token = ""
    while True:
        page = await client.scheduler.ListTasks(
            scheduler_pb2.ListTasksRequest(page_size=3, page_token=token)
        )
        assert len(page.tasks) <= 3
        seen += [t.task_id for t in page.tasks]
        token = page.next_page_token
        if not token:
            break
    assert seen == [t.task_id for t in reversed(made)]
    queued = await client.scheduler.ListTasks(
        scheduler_pb2.ListTasksRequest(statuses=[task_pb2.TASK_STATUS_QUEUED])
    )
    assert len(queued.tasks) == 6
    on_host = await client.scheduler.ListTasks(scheduler_pb2.ListTasksRequest(host_id="h1"))
    assert [t.task_id for t in on_host.tasks] == [a.task_id]


@pytest.mark.parametrize(
    ("request_kw", "field"),
    [
        ({"statuses": [99]}, "statuses[0]"),
        ({"page_size": -1}, "page_size"),
        ({"page_token": "garbage!"}, "page_token"),
    ],
)
async def test_bad_list_requests_name_the_field(
    farm: Farm,
    request_kw: dict,  # type: ignore[type-arg]
    field: str,
) -> None:
    client = await farm.client()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await client.scheduler.ListTasks(scheduler_pb2.ListTasksRequest(**request_kw))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(field)


async def test_watch_task_streams_every_change_and_ends_after_a_terminal_state(farm: Farm) -> None:
    client = await farm.client()
    host = await farm.host("h1", "s1")
    task = await client.scheduler.SubmitTask(submit_request())
    seen: list[int] = []

    async def watch() -> None:
        async for update in client.scheduler.WatchTask(
            scheduler_pb2.WatchTaskRequest(task_id=task.task_id)
        ):
            seen.append(update.status)

    watcher = asyncio.create_task(watch())
    await eventually(lambda: seen, what="the current state first")
    a = await host.acquire_one("s1")
    await eventually(lambda: task_pb2.TASK_STATUS_ASSIGNED in seen, what="assigned")
    await host.renew(a.lease_id)
    await eventually(lambda: task_pb2.TASK_STATUS_DISPATCHED in seen, what="dispatched")
    await host.report(a, lease_pb2.OUTCOME_DONE)
    await asyncio.wait_for(watcher, 10)
    assert seen == [
        task_pb2.TASK_STATUS_QUEUED,
        task_pb2.TASK_STATUS_ASSIGNED,
        task_pb2.TASK_STATUS_DISPATCHED,
        task_pb2.TASK_STATUS_DONE,
    ]


async def test_list_hosts_shows_devices_connection_and_holders(farm: Farm) -> None:
    client = await farm.client()
    operator = await farm.operator()
    host = await farm.host("h1", "s1", "s2", rack="a")
    task = await client.scheduler.SubmitTask(
        submit_request(selector=task_pb2.DeviceSelector(serial="s2"))
    )
    await host.acquire_one("s2")
    await host.register("s2", rack="a")  # s1 unplugged
    (h,) = (await operator.scheduler.ListHosts(scheduler_pb2.ListHostsRequest())).hosts
    assert (h.host_id, h.connected, dict(h.labels)) == ("h1", True, {"rack": "a"})
    devices = {d.serial: d for d in h.devices}
    assert devices["s1"].state == scheduler_pb2.DEVICE_STATE_GONE
    assert devices["s2"].task_id == task.task_id
    assert devices["s2"].labels["model"] == "Pixel Test"
    assert devices["s2"].labels["rack"] == "a"


async def test_register_host_rejects_bad_inventories(farm: Farm) -> None:
    host = await farm.host("h1")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.register("s1", "s1")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("devices")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await host.c.lease.RegisterHost(
            lease_pb2.RegisterHostRequest(
                host_id="h1", devices=[lease_pb2.DeviceInfo(serial="bad serial")]
            )
        )
    assert (err.value.details() or "").startswith("devices[0].serial")


async def test_a_task_says_who_submitted_it_by_its_tokens_name_else_its_id(farm: Farm) -> None:
    """THEN Task.submitted_by is the submitting token's name (SubmitTask's answer, GetTask,
    ListTasks, CancelTask alike), or the token's id when it has none."""
    assert farm.plane is not None
    _, named = await create_token(farm.plane.store, Role.CLIENT, None, "ci-nightly")
    info, unnamed = await create_token(farm.plane.store, Role.CLIENT, None, "")
    by_name = await farm.clients(named).scheduler.SubmitTask(submit_request())
    by_id = await farm.clients(unnamed).scheduler.SubmitTask(submit_request())
    assert (by_name.submitted_by, by_id.submitted_by) == ("ci-nightly", str(info.token_id))
    reader = await farm.client()
    got = await reader.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=by_name.task_id))
    listed = await reader.scheduler.ListTasks(scheduler_pb2.ListTasksRequest())
    assert got.submitted_by == "ci-nightly"
    assert {t.task_id: t.submitted_by for t in listed.tasks} == {
        by_name.task_id: "ci-nightly",
        by_id.task_id: str(info.token_id),
    }
    cancelled = await reader.scheduler.CancelTask(
        scheduler_pb2.CancelTaskRequest(task_id=by_name.task_id, reason="test")
    )
    assert cancelled.submitted_by == "ci-nightly"


async def test_list_tasks_by_id_reads_them_as_get_task_does_with_a_running_ones_progress(
    farm: Farm,
) -> None:
    """THEN ListTasks' task_ids answers those tasks (an unknown id left out), newest first,
    a running one with its progress and a queued one with its reason; ids with a filter, a
    malformed id or more than 500 are INVALID_ARGUMENT naming task_ids."""
    client = await farm.client()
    host = await farm.host("h1", "s1")
    running = await client.scheduler.SubmitTask(submit_request(spec=workflow_spec(a=[tap()])))
    a = await host.acquire_one("s1")
    await host.renew(a.lease_id)
    queued = await client.scheduler.SubmitTask(
        submit_request(selector=task_pb2.DeviceSelector(serial="nowhere"))
    )
    unknown = "00000000-0000-4000-8000-000000000000"
    got = await client.scheduler.ListTasks(
        scheduler_pb2.ListTasksRequest(task_ids=[running.task_id, unknown, queued.task_id])
    )
    assert [t.task_id for t in got.tasks] == [queued.task_id, running.task_id]
    assert got.tasks[1].progress.running_name == "a"
    assert got.tasks[0].pending_reason == "no registered device matches serial=nowhere"
    for bad, field in [
        ({"task_ids": [running.task_id], "host_id": "h1"}, "task_ids"),
        ({"task_ids": [running.task_id, "nope"]}, "task_ids[1]"),
        ({"task_ids": [unknown] * 501}, "task_ids"),
    ]:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await client.scheduler.ListTasks(scheduler_pb2.ListTasksRequest(**bad))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (caught.value.details() or "").startswith(field)
