"""An adb door's data frames cross the control plane as the bytes they came in: the messages
that carry a frame must keep it where control_plane.adb_wire reads and writes it, and
whatever is not a plain data frame is decoded as before."""

from __future__ import annotations

import os

import pytest
from google.protobuf.message import DecodeError

from amc.v1 import adb_pb2
from amc_common.adb_carriage import CHUNK
from control_plane.adb_wire import CODECS, DOOR, HOST, RawMessage, relayed, to_client, to_host

read_door, write_door = CODECS[DOOR]
read_host, write_host = CODECS[HOST]
assert read_door is not None and write_door is not None
assert read_host is not None and write_host is not None


def test_each_door_message_holds_its_frame_where_the_relay_reads_and_writes_it() -> None:
    fields = {
        message: message.DESCRIPTOR.fields_by_name["frame"].number
        for message in (
            adb_pb2.AdbStreamsRequest,
            adb_pb2.AdbStreamsResponse,
            adb_pb2.LeaseAdbStreamsRequest,
            adb_pb2.LeaseAdbStreamsResponse,
        )
    }
    assert list(fields.values()) == [2, 2, 2, 1]


@pytest.mark.parametrize("stream", [1, 300, 2**32 - 1])
def test_a_doors_data_frame_reaches_the_host_as_its_bytes_with_the_hosts_field(
    stream: int,
) -> None:
    frame = adb_pb2.AdbFrame(stream=stream, data=os.urandom(CHUNK))
    data = adb_pb2.AdbStreamsRequest(frame=frame).SerializeToString()
    read = read_door(data)
    assert isinstance(read, RawMessage)
    assert read.WhichOneof("part") == "frame"
    assert read.frame.WhichOneof("part") == "data"
    assert read.frame.stream == stream
    written = write_host(to_host(read.frame))
    assert written[1:] == data[1:]
    assert adb_pb2.LeaseAdbStreamsResponse.FromString(written).frame == frame


def test_a_hosts_data_frame_reaches_the_door_as_the_same_bytes() -> None:
    frame = adb_pb2.AdbFrame(stream=3, data=b"from the phone")
    data = adb_pb2.LeaseAdbStreamsRequest(frame=frame).SerializeToString()
    read = read_host(data)
    assert isinstance(read, RawMessage)
    assert write_door(to_client(read.frame)) is data
    assert adb_pb2.AdbStreamsResponse.FromString(data).frame == frame


def test_a_door_call_relayed_to_another_replica_carries_its_messages_as_they_came() -> None:
    opening = adb_pb2.AdbStreamsRequest(open=adb_pb2.AdbDoorOpen(task_id="t"))
    frame = adb_pb2.AdbFrame(stream=1, data=b"x")
    data = adb_pb2.AdbStreamsRequest(frame=frame).SerializeToString()
    assert relayed(opening) == opening.SerializeToString()
    assert relayed(read_door(data)) is data


@pytest.mark.parametrize(
    "frame",
    [
        adb_pb2.AdbFrame(stream=1, open="shell:ls"),
        adb_pb2.AdbFrame(stream=1, ack=4096),
        adb_pb2.AdbFrame(stream=1, close="done"),
    ],
    ids=["open", "ack", "close"],
)
def test_a_frame_that_is_not_data_is_decoded_and_relayed_as_before(
    frame: adb_pb2.AdbFrame,
) -> None:
    read = read_door(adb_pb2.AdbStreamsRequest(frame=frame).SerializeToString())
    assert isinstance(read, adb_pb2.AdbStreamsRequest)
    assert adb_pb2.LeaseAdbStreamsResponse.FromString(write_host(to_host(read.frame))).frame == (
        frame
    )


def test_a_hosts_message_with_a_field_unknown_here_reaches_the_door_as_its_frame_alone() -> None:
    frame = adb_pb2.AdbFrame(stream=2, data=b"bytes")
    # A newer host's field 3: not the frame, so never passed on to the door as is.
    data = adb_pb2.LeaseAdbStreamsRequest(frame=frame).SerializeToString() + b"\x1a\x03new"
    read = read_host(data)
    assert isinstance(read, adb_pb2.LeaseAdbStreamsRequest)
    written = write_door(to_client(read.frame))
    assert written == adb_pb2.AdbStreamsResponse(frame=frame).SerializeToString()


@pytest.mark.parametrize(
    "data",
    [
        b"\x12\x05\x08\x01\x22\x09abc",  # the frame's data says 9 bytes, 3 follow
        b"\x12\x7f\x08\x01\x22\x01a",  # the frame says 127 bytes, 5 follow
        b"\x12\x04\x08\xff\xff\xff",  # a stream number that never ends
    ],
    ids=["data cut short", "frame cut short", "endless varint"],
)
def test_bytes_that_are_no_message_are_not_taken_for_a_data_frame(data: bytes) -> None:
    with pytest.raises(DecodeError):
        read_door(data)
