"""An infrastructure failure is not the task's (issue 22.3): a run whose phone was lost is
given back `device_lost` and run again on another phone, within an infrastructure-retry
budget of its own (apart from max_attempts), recorded as a device_lost event with what the
host saw. A cancel requested before the loss still ends the task cancelled; a stale
attempt's give-back changes nothing. Through the real agent with simulated phones, and
hosts played with `farm.host`."""

from __future__ import annotations

import time
from dataclasses import replace

from amc.v1 import scheduler_pb2, task_pb2
from host_agent.simulated import SimulatedSource
from tests.support import Farm, actions_spec, eventually, tap
from tests.support.agent import SHORT_TTL, running_agent, short_ttl_farm, status_is, submit


async def events(farm: Farm, task_id: str) -> list[tuple[str, str, str]]:
    assert farm.db is not None
    rows = await farm.db.fetch(
        "SELECT kind, to_status, detail FROM task_events WHERE task_id = $1 ORDER BY event_id",
        task_id,
    )
    return [(r["kind"], r["to_status"], r["detail"]) for r in rows]


async def running_on(farm: Farm, task_id: str) -> tuple[int, str] | None:
    """(attempt, device) while the task runs (dispatched), else None."""
    assert farm.db is not None
    row = await farm.db.fetchrow(
        "SELECT attempt, device_serial FROM tasks WHERE task_id = $1 AND status = 'dispatched'",
        task_id,
    )
    return (row["attempt"], row["device_serial"]) if row else None


async def test_a_phone_unplugged_mid_run_has_its_task_running_on_another_within_a_ttl(
    database_url: str,
) -> None:
    """The task (max_attempts 1) runs again on the other phone within one lease TTL + 2 s of
    the unplug, and ends done; its history says device_lost with what the host saw."""
    async with short_ttl_farm(database_url) as farm:
        source = SimulatedSource(2, delay=0.3)
        client = await farm.client()
        spec = actions_spec(*[tap() for _ in range(8)])
        async with running_agent(farm, source, probe_interval=60):
            task_id = await submit(client, spec, max_attempts=1)
            first = await eventually(lambda: running_on(farm, task_id), what="the first run")
            assert first is not None
            _, phone = first
            await eventually(lambda: source.in_flight(phone) > 0, what="an action in flight")
            unplugged = time.monotonic()
            source.unplug(phone)

            async def moved() -> tuple[int, str] | None:
                found = await running_on(farm, task_id)
                return found if found and found[0] == 2 else None

            ttl = SHORT_TTL.lease_ttl.total_seconds()
            second = await eventually(moved, timeout=ttl + 2, what="the run on another phone")
            assert second is not None and second[1] != phone
            assert time.monotonic() - unplugged <= ttl + 2
            await status_is(farm, task_id, "done", within=15)
        history = await events(farm, task_id)
        lost = [e for e in history if e[0] == "device_lost"]
        assert len(lost) == 1 and lost[0][1] == "queued"
        assert "device lost" in lost[0][2] and phone in lost[0][2]
        assert farm.db is not None
        assert (
            await farm.db.fetchval("SELECT infra_retries FROM tasks WHERE task_id = $1", task_id)
            == 1
        )


async def test_a_task_whose_phones_keep_vanishing_fails_once_the_budget_is_spent(
    database_url: str,
) -> None:
    """With a budget of 1: the first loss requeues, the second fails the task, saying so."""
    async with short_ttl_farm(database_url, replace(SHORT_TTL, infra_retries=1)) as farm:
        op = await farm.operator()
        host = await farm.host("h1", "s1", "s2")
        task = await op.scheduler.SubmitTask(
            scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap()), max_attempts=3)
        )
        a = await host.acquire_one("s1")
        await host.release(a.lease_id, "adb: device 's1' not found", device_lost=True)
        assert await farm.status(task.task_id) == "queued"
        b = await host.acquire_one("s2")
        assert b.attempt == 2
        await host.release(b.lease_id, "adb: device 's2' not found", device_lost=True)
        got = await op.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))
        assert got.status == task_pb2.TASK_STATUS_FAILED
        assert got.result.error == (
            "device lost on attempt 2 (adb: device 's2' not found); "
            "infrastructure retries spent (1 of 1)"
        )


async def test_a_cancel_requested_before_the_loss_still_ends_the_task_cancelled(
    farm: Farm,
) -> None:
    """Cancelled, never requeued; and a stale attempt's give-back changes nothing."""
    op = await farm.operator()
    host = await farm.host("h1", "s1")
    task = await op.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap())))
    a = await host.acquire_one("s1")
    await op.scheduler.CancelTask(
        scheduler_pb2.CancelTaskRequest(task_id=task.task_id, reason="test")
    )
    await host.release(a.lease_id, "device lost", device_lost=True)
    assert await farm.status(task.task_id) == "cancelled"
    # A stale attempt: given back again, device lost or not, nothing changes.
    await host.release(a.lease_id, "device lost", device_lost=True)
    assert await farm.status(task.task_id) == "cancelled"
    kinds = [e[0] for e in await events(farm, task.task_id)]
    assert kinds.count("device_lost") == 1


async def test_a_losing_attempt_does_not_count_against_max_attempts(farm: Farm) -> None:
    """max_attempts 1: a lost phone requeues it; the next attempt's own failure ends it."""
    op = await farm.operator()
    host = await farm.host("h1", "s1")
    task = await op.scheduler.SubmitTask(
        scheduler_pb2.SubmitTaskRequest(spec=actions_spec(tap()), max_attempts=1)
    )
    a = await host.acquire_one("s1")
    await host.release(a.lease_id, "gone", device_lost=True)
    b = await host.acquire_one("s1")
    await host.release(b.lease_id, "draining")  # an ordinary release: attempts spent
    assert await farm.status(task.task_id) == "failed"
    got = await op.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))
    assert got.result.error == "lease released on attempt 1 of 1"


async def test_a_phone_that_stops_answering_mid_run_has_its_task_run_on_another(
    database_url: str,
) -> None:
    """A tap that times out on a hung phone is the phone's failure, not the task's: the run
    is given back (device_lost, 'device unresponsive') and runs again on the other phone."""
    async with short_ttl_farm(database_url) as farm:
        source = SimulatedSource(2, delay=0.2)
        source.call_timeout = 0.5
        client = await farm.client()
        spec = actions_spec(*[tap() for _ in range(8)])
        async with running_agent(farm, source, probe_interval=60):
            task_id = await submit(client, spec, max_attempts=1)
            first = await eventually(lambda: running_on(farm, task_id), what="the first run")
            assert first is not None
            _, phone = first
            await eventually(lambda: source.in_flight(phone) > 0, what="an action in flight")
            source.hang(phone)
            await status_is(farm, task_id, "done", within=15)
            assert farm.db is not None
            device = await farm.db.fetchval(
                "SELECT device_serial FROM tasks WHERE task_id = $1", task_id
            )
            assert device != phone
        lost = [e for e in await events(farm, task_id) if e[0] == "device_lost"]
        assert len(lost) == 1 and "device unresponsive" in lost[0][2], lost


async def test_a_screenshot_that_times_out_on_a_hung_phone_is_the_phones_failure(
    database_url: str,
) -> None:
    """A slow read (a screenshot, a shell command) that times out is the task's failure
    only while the phone still answers: on a hung phone the run is given back device_lost
    and runs again on the other phone."""
    async with short_ttl_farm(database_url) as farm:
        source = SimulatedSource(2, delay=0.2)
        source.call_timeout = 0.5
        client = await farm.client()
        shot = task_pb2.Action(screenshot=task_pb2.Screenshot())
        spec = actions_spec(*[shot for _ in range(8)])
        async with running_agent(farm, source, probe_interval=60):
            task_id = await submit(client, spec, max_attempts=1)
            first = await eventually(lambda: running_on(farm, task_id), what="the first run")
            assert first is not None
            _, phone = first
            await eventually(lambda: source.in_flight(phone) > 0, what="an action in flight")
            source.hang(phone)
            await status_is(farm, task_id, "done", within=20)
        lost = [e for e in await events(farm, task_id) if e[0] == "device_lost"]
        assert len(lost) == 1 and "device unresponsive" in lost[0][2], lost
