"""The MCP server's phones and sessions through the `mcp` SDK's client on the server's own
JSON-RPC loop (as over stdio): list_phones says which phones could be had and why not, and
an agent allowed several sessions names the one each call is for."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("mcp")

from amc.v1 import admin_pb2, lease_pb2, scheduler_pb2
from amc_client import Farm
from amc_client.mcp_phones import HELD, READY, use
from amc_client.mcp_server import ClientSessions, Defaults
from control_plane.domain import Role
from host_agent.simulated import SimulatedSource
from tests.support import Farm as Harness
from tests.support import device
from tests.support.agent import running_agent
from tests.test_mcp_server import _content, _error, agent

C = scheduler_pb2


async def test_list_phones_says_which_are_free_busy_held_or_offline_and_why(
    farm: Harness,
) -> None:
    """THEN with one phone in the agent's session, one in another's, one cordoned, one
    free, and one adb may not use: a line counting them, then the free one, the busy ones
    (the agent's own session named as its), the held one and the offline one with their
    reasons; labels narrow the list."""
    token = await farm.token(Role.OPERATOR)
    operator = await farm.operator()
    other = await farm.host("host-2")
    locked = device("locked-0")
    locked.state = C.DEVICE_STATE_UNAUTHORIZED  # its user never took the adb key
    await other.c.lease.RegisterHost(
        lease_pb2.RegisterHostRequest(host_id="host-2", devices=[locked])
    )
    async with (
        running_agent(farm, SimulatedSource(4, delay=0.01)),
        Farm(farm.address, token=token) as client,
        client.session(serial="sim-1") as others,
    ):
        await operator.admin.CordonDevice(
            admin_pb2.CordonDeviceRequest(serial="sim-2", reason="screen cracked")
        )
        sessions = ClientSessions(client, Defaults(idle_timeout=30))
        async with agent(sessions) as mcp:
            (opened,) = _content(await mcp.call_tool("open_session", {"serial": "sim-0"}))
            mine = opened.text.split()[1]

            async def listed() -> list[str]:
                return str(_content(await mcp.call_tool("list_phones", {}))[0].text).splitlines()

            lines = await listed()
            assert lines[0] == "5 phones: 1 free, 2 busy, 1 held, 1 offline", lines
            assert lines[1].startswith("sim-3  free  "), lines
            assert lines[2].startswith(f"sim-0  busy: your session {mine}  ")
            assert lines[3].startswith(f"sim-1  busy: task {others.task_id}")
            assert lines[4].startswith("sim-2  held: cordoned by an operator")
            assert lines[5].startswith(
                "locked-0  offline: not authorized for adb on its host  abi=arm64-v8a,"
            )
            (narrowed,) = _content(
                await mcp.call_tool("list_phones", {"labels": {"simulated": "true"}})
            )
            assert narrowed.text.splitlines()[0] == "4 phones: 1 free, 2 busy, 1 held"
            (none,) = _content(await mcp.call_tool("list_phones", {"labels": {"model": "X"}}))
            assert none.text == "no phone is registered with those labels"
            _content(await mcp.call_tool("close_session", {}))


def test_a_phone_held_by_its_health_or_its_host_says_why() -> None:
    """THEN a phone charging says so with its host's reason, one too hot, being cleaned or
    quarantined says so (every condition has its words), a phone of a draining or cordoned
    host is held by it, an unauthorized one is offline; busy comes before held (a running
    session goes on)."""
    host = C.Host(host_id="h1", connected=True)
    ready = C.Device(serial="s", state=C.DEVICE_STATE_DEVICE)

    def device(**fields: object) -> C.Device:
        d = C.Device()
        d.CopyFrom(ready)
        for k, v in fields.items():
            setattr(d, k, v)
        return d

    charging = device(condition=C.DEVICE_CONDITION_CHARGING_HOLD, condition_reason="battery 9%")
    assert use(host, charging) == ("held", "charging (battery low) (battery 9%)")
    assert use(host, device(condition=C.DEVICE_CONDITION_TOO_HOT)) == ("held", "too hot")
    cleaning = device(condition=C.DEVICE_CONDITION_CLEANING)
    assert use(host, cleaning) == ("held", "being cleaned after its last lease")
    assert use(host, device(condition=C.DEVICE_CONDITION_QUARANTINED))[1].startswith("quarantined")
    draining = C.Host(host_id="h1", connected=True, draining=True, cordoned=True)
    assert use(draining, ready) == ("held", "its host h1 is draining")
    assert use(C.Host(host_id="h1", connected=True, cordoned=True), ready) == (
        "held",
        "its host h1 is cordoned",
    )
    unauthorized = device(state=C.DEVICE_STATE_UNAUTHORIZED)
    assert use(host, unauthorized) == ("offline", "not authorized for adb on its host")
    every = set(C.DeviceCondition.values()) - set(READY)
    assert every == set(HELD), "each condition a phone is held in has its words"
    busy = device(task_id="t1", cordoned=True)
    assert use(host, busy, mine={"t1"}) == ("busy", "your session t1")
    assert use(host, device()) == ("free", "")


async def test_a_client_allowed_two_sessions_names_the_one_each_call_is_for(
    farm: Harness,
) -> None:
    """THEN with a limit of 2 (over stdio too), two open_session calls at once open two
    sessions on two phones; a tap naming none is refused naming both, one naming either
    goes to its phone; a third is refused while two are open; close_session naming none
    is refused while two are open; once one is closed, calls naming none go to the other."""
    token = await farm.token(Role.CLIENT)
    async with (
        running_agent(farm, SimulatedSource(3, delay=0.01)),
        Farm(farm.address, token=token) as client,
    ):
        defaults = Defaults({"model": "Simulated"}, idle_timeout=30, limit=2, implicit=True)
        sessions = ClientSessions(client, defaults)
        async with agent(sessions) as mcp, asyncio.timeout(60):
            opened = await asyncio.gather(*(mcp.call_tool("open_session", {}) for _ in range(2)))
            said = [_content(o)[0].text for o in opened]
            ids = [s.split()[1] for s in said]
            assert len({s.split()[-1] for s in said}) == 2, said
            said_one = _error(await mcp.call_tool("tap", {"x": 1, "y": 1}))
            assert all(i in said_one for i in ids), said_one
            for task_id in ids:
                tapped = await mcp.call_tool("tap", {"x": 1, "y": 1, "session": task_id})
                assert (tapped.meta or {})["amc/session"] == task_id
            assert "as many as this server lets a client hold" in _error(
                await mcp.call_tool("open_session", {})
            )
            refused = _error(await mcp.call_tool("close_session", {}))
            assert "name the one to close as `session`" in refused, refused
            (closed,) = _content(await mcp.call_tool("close_session", {"session": ids[0]}))
            assert closed.text == f"session {ids[0]} done (1 actions)"
            tapped = await mcp.call_tool("tap", {"x": 2, "y": 2})
            assert (tapped.meta or {})["amc/session"] == ids[1]
            (closed,) = _content(await mcp.call_tool("close_session", {}))
            assert closed.text == f"session {ids[1]} done (2 actions)"
            (nothing,) = _content(await mcp.call_tool("close_session", {}))
            assert nothing.text == "no session was open"
