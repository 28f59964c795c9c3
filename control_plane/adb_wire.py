"""An adb door's data frames as the control plane relays them: kept as the bytes of the
message they came in, never decoded into a message and encoded again
(control_plane.adb_doors, control_plane.adb_door_hosts), as a session's steps are
(control_plane.session_wire).

Every message of a door's two calls holds its frame (`AdbFrame`) as one field: field 2 of
`AdbStreamsRequest`, `AdbStreamsResponse` and `LeaseAdbStreamsRequest`, field 1 of
`LeaseAdbStreamsResponse`. A data frame, as our senders write it, is that field alone:
its tag, its length, then the frame's `stream` (field 1) and `data` (field 4), nothing
else. Such a message is read as a `RawMessage` (its stream number read, its bytes kept);
anything else (an open, an ack, a close; a message of another shape) is decoded as before.
The host's data frames go to the door's client as the same bytes (both field 2); the
door's go to the host with their first byte, the field's tag, changed to field 1's.

Decoding a frame and encoding it again cost the control plane two copies of its bytes,
each a fresh block as large as the frame; relayed as they are, one copy is left, in the
direction whose field differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from amc.v1 import adb_pb2
from control_plane.session_wire import Codec, as_bytes

DOOR = "/amc.v1.Scheduler/AdbStreams"
HOST = "/amc.v1.Lease/AdbStreams"

_FRAME_IN_2 = 0x12  # field 2, length-delimited: the frame of every message but one
_FRAME_IN_1 = 0x0A  # field 1, length-delimited: LeaseAdbStreamsResponse's frame
_STREAM = 0x08  # AdbFrame.stream: field 1, a varint
_DATA = 0x22  # AdbFrame.data: field 4, length-delimited


class RawFrame:
    """A data frame as the bytes of the message it came in (its frame in field 2)."""

    __slots__ = ("data", "stream")

    def __init__(self, data: bytes, stream: int) -> None:
        self.data = data
        self.stream = stream

    def WhichOneof(self, oneof: str) -> str:
        return "data"


# A frame on its way through the replica: decoded, or a data frame as its bytes.
Frame = adb_pb2.AdbFrame | RawFrame


class RawMessage:
    """A request holding a data frame, as its bytes: named as a message names its part."""

    __slots__ = ("frame",)

    def __init__(self, frame: RawFrame) -> None:
        self.frame = frame

    def WhichOneof(self, oneof: str) -> str:
        return "frame"


def _varint(data: bytes, i: int) -> tuple[int, int]:
    """The varint at `i` and where it ends; (-1, i) if it is not one of at most 5 bytes."""
    value, shift = 0, 0
    for j in range(i, min(i + 5, len(data))):
        byte = data[j]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, j + 1
        shift += 7
    return -1, i


def data_frame(data: bytes) -> RawMessage | None:
    """The data frame a request's bytes are, as they are; None if they are anything else
    (or a data frame of another shape than our senders write)."""
    if len(data) < 4 or data[0] != _FRAME_IN_2:
        return None
    length, i = _varint(data, 1)
    if length < 0 or i + length != len(data):
        return None
    stream = 0
    if data[i] == _STREAM:
        stream, i = _varint(data, i + 1)
        if stream < 0 or i >= len(data):
            return None
    if data[i] != _DATA:
        return None
    size, i = _varint(data, i + 1)
    if size < 0 or i + size != len(data):
        return None
    return RawMessage(RawFrame(data, stream))


def _reader(message: Any) -> Any:
    def read(data: bytes) -> Any:
        return data_frame(data) or message.FromString(data)

    return read


def to_client(frame: Any) -> Any:
    """What the door's client is written for a frame from the host (or this replica)."""
    if isinstance(frame, RawFrame):
        return frame.data  # field 2 on both calls: the same bytes
    return adb_pb2.AdbStreamsResponse(frame=frame)


def to_host(frame: Any) -> Any:
    """What the host is written for a frame from the door's client."""
    if isinstance(frame, RawFrame):
        return bytes((_FRAME_IN_1,)) + memoryview(frame.data)[1:]
    return adb_pb2.LeaseAdbStreamsResponse(frame=frame)


def relayed(message: Any) -> bytes:
    """A door's request written to another replica, on the same method: as it came."""
    if isinstance(message, RawMessage):
        return message.frame.data
    return as_bytes(message)


# Per method: the request deserializer and the response serializer (bytes as they are).
CODECS: Mapping[str, Codec] = {
    DOOR: (_reader(adb_pb2.AdbStreamsRequest), as_bytes),
    HOST: (_reader(adb_pb2.LeaseAdbStreamsRequest), as_bytes),
}
