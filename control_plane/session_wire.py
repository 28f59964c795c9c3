"""A session's messages as the relay passes them on the wire: a host's step kept as the
bytes it came in and written to its client unchanged, with no decoding into a new message
and no encoding again (control_plane.sessions, control_plane.session_hosts).

A host's `SessionActionsRequest` holding a step and a client's `OpenSessionResponse`
holding the same step are the same bytes: in both the step is field 2, a `SessionStep`
(tests/test_session_wire.py holds the protos to it). So the host's call decodes a step
only to check it (`host_request`; a message with more than its step is cut to the step),
and the client's call and a relay to another replica write such bytes as they are
(`as_bytes`, the serializer of the two methods' responses and of a relayed call's
requests). A client's action is relayed by `relay_action`: checked, written to the host's
call, its step read and written to the client's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from amc.v1 import lease_pb2, scheduler_pb2, task_pb2
from control_plane import validate
from control_plane.errors import AmcError
from control_plane.rendezvous import Relay
from control_plane.rpc import check_decoded, code_for

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
    if message.WhichOneof("part") != "step":
        return message
    if _only_step(data):
        return RawStep(data)
    # Something besides the step (a field this version does not know): the step alone.
    return RawStep(lease_pb2.SessionActionsRequest(step=message.step).SerializeToString())


_STEP_TAG = 0x12  # field 2, length-delimited


def _only_step(data: bytes) -> bool:
    """Whether `data` is field 2 alone: its tag, its length, then exactly that many bytes."""
    if not data or data[0] != _STEP_TAG:
        return False
    length, shift, i = 0, 0, 1
    while i < len(data) and i <= 10:
        byte = data[i]
        length |= (byte & 0x7F) << shift
        i += 1
        if byte < 0x80:
            return i + length == len(data)
        shift += 7
    return False


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


def refused(exc: AmcError) -> scheduler_pb2.OpenSessionResponse:
    """The answer to a client message refused: its code and one line; the session goes on."""
    code: int = code_for(exc).value[0]
    return scheduler_pb2.OpenSessionResponse(
        refused=scheduler_pb2.ActionRefused(code=code, message=exc.message)
    )


async def until_close(requests: AsyncIterator[Any], relay: Relay) -> AsyncIterator[Any]:
    """A client's messages up to its `close` (not passed on: `relay.said_close` is set, and
    their end follows at once), or their end."""
    async for message in requests:
        if isinstance(message, scheduler_pb2.OpenSessionRequest) and (
            message.WhichOneof("part") == "close"
        ):
            relay.said_close = True
            return
        yield message


def client_action(message: Any) -> task_pb2.SessionAction:
    """A client's later message as the action it must be (InvalidArgument if it is not)."""
    check_decoded(message)
    return validate.session_action(message)


async def relay_action(relay: Relay, message: Any) -> None:
    """A client's message while the session runs, in the task reading them: an action on
    to the host, and its step back, or refused at once. A host gone meanwhile answers it
    with the session's end."""
    try:
        action = client_action(message)
    except AmcError as exc:
        await relay.client.write(refused(exc))
        relay.answered()
        return
    host, steps = relay.host, relay.steps
    if relay.host_gone.is_set() or host is None or steps is None:
        return
    if not await host.write(lease_pb2.SessionActionsResponse(action=action)):
        return  # its call is over: its end comes by the host's side
    relay.sent += 1
    step = await anext(steps, None)
    if step is None:
        relay.host_left()
        return
    await relay.client.write(step)
    relay.answered()


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
