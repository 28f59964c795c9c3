"""A session's messages as the relay passes them on the wire: a host's step kept as the
bytes it came in and written to its client unchanged, with no decoding into a new message
and no encoding again (control_plane.sessions, control_plane.session_hosts).

A host's `SessionActionsRequest` holding a step and a client's `OpenSessionResponse`
holding the same step are the same bytes: in both the step is field 2, a `SessionStep`
(tests/test_session_wire.py holds the protos to it). So the host's call decodes a step only
to check it (`host_request`), and the client's call and a relay to another replica write
such bytes as they are (`as_bytes`, the serializer of the two methods' responses and of a
relayed call's requests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from amc.v1 import lease_pb2, scheduler_pb2

OPEN_SESSION = "/amc.v1.Scheduler/OpenSession"
SESSION_ACTIONS = "/amc.v1.Lease/SessionActions"


class RawStep:
    """A host's step (`SessionActionsRequest.step`) as the bytes it came in, which are also
    an `OpenSessionResponse` holding that step. Named as a message names its part."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def WhichOneof(self, oneof: str) -> str:
        return "step"


def host_request(data: bytes) -> Any:
    """A host's SessionActions message: a step as its bytes (`RawStep`), once decoded to
    check it; anything else decoded (a DecodeError for what is no message: the server's
    DecodeGuard makes it a refusal)."""
    message = lease_pb2.SessionActionsRequest.FromString(data)
    if message.WhichOneof("part") == "step":
        return RawStep(data)
    return message


def as_bytes(message: Any) -> bytes:
    """A message to write, serialized; bytes (a relayed step, or what another replica
    relayed) as they are."""
    if isinstance(message, bytes):
        return message
    if isinstance(message, RawStep):
        return message.data
    data: bytes = message.SerializeToString()
    return data


Codec = tuple[Callable[[bytes], Any] | None, Callable[[Any], bytes] | None]
# Per method: the request deserializer and the response serializer in place of the
# generated ones (None: the generated one).
CODECS: Mapping[str, Codec] = {
    OPEN_SESSION: (None, as_bytes),
    SESSION_ACTIONS: (host_request, as_bytes),
}


class Queued:
    """An OpenSession called in process (the console's Control page): what the session
    writes is queued for its caller, a step's bytes as the response they are."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()

    async def write(self, message: Any) -> None:
        if isinstance(message, bytes | RawStep):
            message = scheduler_pb2.OpenSessionResponse.FromString(as_bytes(message))
        self._queue.put_nowait(message)

    async def until(self, task: asyncio.Task[None]) -> AsyncIterator[Any]:
        """What was written, in order, until `task` (the session) ended."""
        while True:
            if not self._queue.empty():
                yield self._queue.get_nowait()
                continue
            if task.done():
                return
            getter = asyncio.ensure_future(self._queue.get())
            try:
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not getter.done():
                    getter.cancel()
            if getter.done() and not getter.cancelled():
                yield getter.result()
