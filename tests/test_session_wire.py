"""A session's step crosses the relay as the bytes the host sent: the two messages that carry
it must keep the step at the same field, and nothing but the step may reach the client."""

from __future__ import annotations

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane.session_wire import RawStep, as_bytes, host_request


def _step() -> task_pb2.SessionStep:
    step = task_pb2.SessionStep()
    step.step.name = "tap"
    step.screenshot_png = b"\x89PNG"
    return step


def test_a_hosts_step_and_a_clients_response_hold_the_step_at_the_same_field() -> None:
    host = lease_pb2.SessionActionsRequest.DESCRIPTOR.fields_by_name["step"]
    client = scheduler_pb2.OpenSessionResponse.DESCRIPTOR.fields_by_name["step"]
    assert (host.number, host.message_type.full_name) == (
        client.number,
        client.message_type.full_name,
    )


def test_a_hosts_step_reaches_the_client_as_the_bytes_it_came_in() -> None:
    data = lease_pb2.SessionActionsRequest(step=_step()).SerializeToString()
    read = host_request(data)
    assert isinstance(read, RawStep)
    assert as_bytes(read) == data
    assert scheduler_pb2.OpenSessionResponse.FromString(as_bytes(read)).step == _step()


def test_a_hosts_step_with_a_field_unknown_here_reaches_the_client_as_the_step_alone() -> None:
    # Field 3 of a newer host's message would be the client's `refused` if passed on as is.
    unknown = scheduler_pb2.OpenSessionResponse(
        refused=scheduler_pb2.ActionRefused(code=3, message="not from the host")
    ).SerializeToString()
    data = lease_pb2.SessionActionsRequest(step=_step()).SerializeToString() + unknown
    response = scheduler_pb2.OpenSessionResponse.FromString(as_bytes(host_request(data)))
    assert response.step == _step()
    assert not response.HasField("refused")


def test_a_hosts_join_is_read_as_the_message_it_is() -> None:
    join = lease_pb2.SessionActionsRequest(join=lease_pb2.SessionJoin(task_id="t", lease_id="l"))
    read = host_request(join.SerializeToString())
    assert isinstance(read, lease_pb2.SessionActionsRequest)
    assert read.join.task_id == "t"
