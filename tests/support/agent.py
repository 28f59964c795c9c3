"""Helpers for the host-agent tests: a real Agent on a real channel against a `Farm`."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import grpc

from amc.v1 import scheduler_pb2, task_pb2
from amc_common.channel import CHANNEL_OPTIONS, with_token
from amc_common.systemd import Notifier
from control_plane.config import Settings
from control_plane.domain import Role
from host_agent.agent import Agent
from host_agent.clean_profile import CleanProfile, Profiles
from host_agent.config import AgentSettings
from host_agent.devices import DeviceSource
from host_agent.worker import Finished
from tests.support import Clients, Farm, eventually

# Short leases, so lease loss and self-fencing happen within a test's patience.
SHORT_TTL = Settings(
    lease_ttl=timedelta(seconds=3),
    sweep_interval=timedelta(seconds=0.05),
    watch_refresh=timedelta(seconds=1),
)

# Phones are not cleaned between leases here (the product's default cleans them): a test
# of something else sees a phone offered again as soon as its lease ends, and no clean's
# events or commands. The tests of cleaning (tests/test_cleaning*.py) turn it on.
NO_CLEANING = Profiles(defaults=CleanProfile(enabled=False))

TEST_SETTINGS = AgentSettings(
    host_id="host-1",
    drain_timeout=0.5,
    inventory_interval=0.5,
    acquire_wait=2.0,
    report_timeout=5.0,
    shell_timeout=10.0,
    clean_profile=NO_CLEANING,
)


@asynccontextmanager
async def short_ttl_farm(database_url: str, settings: Settings = SHORT_TTL) -> AsyncIterator[Farm]:
    farm = Farm(database_url, settings)
    await farm.start()
    try:
        yield farm
    finally:
        await farm.stop()


# gRPC waits 1 s, then 1.6x longer each time (up to 120 s), before it reconnects to an
# address that refused it; a test that heals a cut must not wait that out.
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 300),
    # A connection of its own, as an agent (one per process) has: channels to one address
    # in one process otherwise share one.
    ("grpc.use_local_subchannel_pool", 1),
]


def agent_channel(address: str, token: str) -> grpc.aio.Channel:
    """What amc_common.channel.aio_channel builds (plaintext), with fast reconnects."""
    return with_token(
        grpc.aio.insecure_channel(address, options=[*CHANNEL_OPTIONS, *FAST_RECONNECT]), token
    )


@asynccontextmanager
async def running_agent(
    farm: Farm,
    source: DeviceSource,
    *,
    address: str | None = None,
    notifier: Notifier | None = None,
    token: str | None = None,
    **settings: Any,
) -> AsyncIterator[Agent]:
    """An Agent serving `farm` (through `address`, e.g. a proxy), stopped on exit; with a
    host token made now unless `token` is one made beforehand."""
    config = replace(TEST_SETTINGS, **settings)
    token = token or await farm.token(Role.HOST, config.host_id)
    channel = agent_channel(address or farm.address, token)
    agent = Agent(config, source, channel, notifier)
    task = asyncio.create_task(agent.run(), name="agent")
    try:
        await eventually(
            lambda: agent.registered.is_set() or task.done(), what="the agent to register"
        )
        if task.done():
            task.result()
        yield agent
    finally:
        agent.stop()
        try:
            await asyncio.wait_for(task, 30)
        finally:
            await channel.close()


async def submit(client: Clients, spec: task_pb2.TaskSpec, **fields: Any) -> str:
    task = await client.scheduler.SubmitTask(scheduler_pb2.SubmitTaskRequest(spec=spec, **fields))
    return str(task.task_id)


async def cancel(client: Clients, task_id: str) -> task_pb2.Task:
    return await client.scheduler.CancelTask(
        scheduler_pb2.CancelTaskRequest(task_id=task_id, reason="test")
    )


async def get(client: Clients, task_id: str) -> task_pb2.Task:
    return await client.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task_id))


async def finished(agent: Agent, task_id: str, within: float = 15.0) -> Finished:
    """The agent's record of the (first) attempt of `task_id` it finished."""

    def record() -> Finished | None:
        return next((f for f in agent.finished if f.lease.task_id == task_id), None)

    found = await eventually(record, timeout=within, what=f"the agent to finish {task_id}")
    assert found is not None
    return found


async def status_is(farm: Farm, task_id: str, *statuses: str, within: float = 15.0) -> str:
    async def check() -> str:
        status = await farm.status(task_id)
        return status if status in statuses else ""

    return await eventually(check, timeout=within, what=f"task status in {statuses}")
