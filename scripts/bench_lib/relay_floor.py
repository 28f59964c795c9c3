"""The `adb` workload's floor for a push through a door: the door's path with nothing of
AMC in it, the same shape and the same frames, so that what grpc.aio itself costs a MB
relayed this way on this machine is measured beside what AMC's three processes cost.

Three processes, each this file run as a script (no AMC code, no protobuf, no logging):

    bench -> sender ==gRPC==> relay ==gRPC==> receiver -> bench
             (amc adb)       (control plane)  (host agent)

- the **sender** (as `amc adb`) listens on loopback for the bench's connection (as the
  door for the adb server's), reads its bytes (a StreamReader with room for a 1 MiB
  packet, as the door's) and writes them as messages of CHUNK bytes on one bidi call to
  the relay (bytes as they are: identity serializers), at most WINDOW of them not
  acknowledged; one task writes the call's messages from a queue, another reads its acks;
- the **relay** (as the control plane) is a grpc.aio server for both calls: each call's
  messages are read by a task of their own into a mailbox of MAILBOX and written, as
  they came, on the other call by its handler (an async generator, as the replica's);
- the **receiver** (as the host agent) dials the relay, as the agent dials the control
  plane, reads the frames, joins the ones waiting up to JOINED, writes them to a loopback
  connection it opened to the bench (as the agent to its adb server), and acknowledges
  once ACK_EVERY bytes were written (amc_common.adb_carriage's constants).

A push is a connection to the sender; its end, an empty message, closes the receiver's
connection, so the bench has every byte once it reads that connection's end.
`started(relay_dials=True)` is the other shape: the receiver a grpc.aio server, and the
relay holding a call to it (the relay's `--receiver`); the bench uses AMC's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import socket
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

# amc_common.adb_carriage's: the frame, the window (frames), the ack and the joined write.
CHUNK = 127 * 1024
WINDOW = 20 * CHUNK
ACK_EVERY = WINDOW // 4
JOINED = 1 << 20
READ_LIMIT = JOINED + 24  # the door's StreamReader: a 1 MiB adb packet and its header
MAILBOX = 8  # control_plane.adb_doors': frames waiting between the two calls, each way
END = b""  # a push's end (the close of a door's stream)
SEND = "/floor.Relay/Send"  # the sender's call (Scheduler.AdbStreams)
JOIN = "/floor.Relay/Join"  # the receiver's call (Lease.AdbStreams)
TAKE = "/floor.Receiver/Take"  # the relay's call to the receiver (relay_dials)
NAMES = ("sender", "relay", "receiver")


def _same(data: bytes) -> bytes:
    return data


def _call(channel: grpc.aio.Channel, method: str) -> Any:
    return channel.stream_stream(method, request_serializer=_same, response_deserializer=_same)()


def _handlers(methods: dict[str, Callable[..., AsyncIterator[bytes]]]) -> Any:
    service = next(iter(methods)).lstrip("/").partition("/")[0]
    return grpc.method_handlers_generic_handler(
        service,
        {
            path.rpartition("/")[2]: grpc.stream_stream_rpc_method_handler(
                handler, request_deserializer=_same, response_serializer=_same
            )
            for path, handler in methods.items()
        },
    )


async def _server(methods: dict[str, Callable[..., AsyncIterator[bytes]]]) -> grpc.aio.Server:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([_handlers(methods)])
    print(server.add_insecure_port("127.0.0.1:0"), flush=True)
    await server.start()
    return server


async def _orphaned() -> None:
    """Exit once the bench that started this process is gone (its stdin's end closed)."""
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.buffer.read)
    os._exit(0)


async def _sender(relay: str) -> None:
    call = _call(grpc.aio.insecure_channel(relay), SEND)
    outgoing: asyncio.Queue[bytes] = asyncio.Queue()
    room = asyncio.Event()
    unacked = 0

    async def push(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal unacked
        unacked = 0
        try:
            while True:
                try:
                    chunk = await reader.readexactly(CHUNK)
                except asyncio.IncompleteReadError as short:
                    chunk = short.partial
                if chunk:
                    while unacked and unacked + len(chunk) > WINDOW:
                        room.clear()
                        await room.wait()
                    unacked += len(chunk)
                    outgoing.put_nowait(chunk)
                if len(chunk) < CHUNK:
                    break
            outgoing.put_nowait(END)
        finally:
            writer.close()

    async def write() -> None:
        while True:
            await call.write(await outgoing.get())

    async def acks() -> None:
        nonlocal unacked
        while (ack := await call.read()) is not grpc.aio.EOF:
            unacked = max(0, unacked - int.from_bytes(ack, "little"))
            room.set()

    listening = await asyncio.start_server(push, "127.0.0.1", 0, limit=READ_LIMIT)
    print(listening.sockets[0].getsockname()[1], flush=True)
    await asyncio.gather(write(), acks())


async def _relay(receiver: str | None) -> None:
    to_receiver: asyncio.Queue[bytes] = asyncio.Queue(MAILBOX)
    to_sender: asyncio.Queue[bytes] = asyncio.Queue(MAILBOX)

    async def pump(messages: AsyncIterator[bytes], into: asyncio.Queue[bytes]) -> None:
        async for message in messages:
            await into.put(message)

    async def send(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        task = asyncio.create_task(pump(requests, to_receiver))
        try:
            while True:
                yield await to_sender.get()
        finally:
            task.cancel()

    async def join(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        task = asyncio.create_task(pump(requests, to_sender))
        try:
            while True:
                yield await to_receiver.get()
        finally:
            task.cancel()

    async def dialed(call: Any) -> None:
        async def acks() -> None:
            while (ack := await call.read()) is not grpc.aio.EOF:
                await to_sender.put(ack)

        reading = asyncio.create_task(acks())
        try:
            while True:
                await call.write(await to_receiver.get())
        finally:
            reading.cancel()

    server = await _server({SEND: send, JOIN: join})
    if receiver is None:
        await server.wait_for_termination()
    else:
        await dialed(_call(grpc.aio.insecure_channel(receiver), TAKE))


@dataclass
class _Inbox:
    """The frames the receiver was sent, waiting to be written to the bench."""

    frames: deque[bytes] = field(default_factory=deque)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.arrived.set()

    async def get(self) -> bytes:
        """The next frame, with the data frames waiting behind it, up to JOINED."""
        frames = self.frames
        while not frames:
            self.arrived.clear()
            await self.arrived.wait()
        data = frames.popleft()
        if not data or not frames or not frames[0] or len(data) + len(frames[0]) > JOINED:
            return data
        parts, size = [data], len(data)
        while frames and frames[0] and size + len(frames[0]) <= JOINED:
            size += len(frames[0])
            parts.append(frames.popleft())
        return b"".join(parts)


async def _deliver(inbox: _Inbox, sink: int, acks: asyncio.Queue[bytes]) -> None:
    """Each push's frames written to a connection of its own to the bench, acknowledged."""
    writer: asyncio.StreamWriter | None = None
    delivered = 0
    while True:
        data = await inbox.get()
        if not data:  # END: the push's connection closed (opened first if it had no bytes)
            if writer is None:
                _, writer = await asyncio.open_connection("127.0.0.1", sink)
            writer.close()
            await writer.wait_closed()
            writer, delivered = None, 0
            continue
        if writer is None:
            _, writer = await asyncio.open_connection("127.0.0.1", sink)
        writer.write(data)
        await writer.drain()
        delivered += len(data)
        if delivered >= ACK_EVERY:
            acks.put_nowait(delivered.to_bytes(8, "little"))
            delivered = 0


async def _receiver(sink: int, relay: str | None) -> None:
    inbox, acks = _Inbox(), asyncio.Queue[bytes]()
    delivering = asyncio.create_task(_deliver(inbox, sink, acks))
    if relay is None:  # relay_dials: a server, the relay's call its only one

        async def take(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
            async def frames() -> None:
                async for frame in requests:
                    inbox.put(frame)

            task = asyncio.create_task(frames())
            try:
                while True:
                    yield await acks.get()
            finally:
                task.cancel()

        server = await _server({TAKE: take})
        await server.wait_for_termination()
        return
    call = _call(grpc.aio.insecure_channel(relay), JOIN)

    async def write() -> None:
        while True:
            await call.write(await acks.get())

    writing = asyncio.create_task(write())
    print(0, flush=True)
    while (frame := await call.read()) is not grpc.aio.EOF:
        inbox.put(frame)
    writing.cancel()
    delivering.cancel()


# -- the bench's side ----------------------------------------------------------------------


@dataclass
class Floor:
    """The three processes running, the sender's port and the bench's listening socket."""

    pids: dict[str, int]
    port: int
    sink: socket.socket


async def _spawn(*args: str) -> tuple[asyncio.subprocess.Process, int]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 60)
    if not line:
        raise RuntimeError(f"relay floor's {args[0]} exited before it was ready")
    return process, int(line)


@contextlib.asynccontextmanager
async def started(relay_dials: bool = False) -> AsyncIterator[Floor]:
    """The floor's three processes, with one small push through them already done."""
    sink = socket.socket()
    sink.bind(("127.0.0.1", 0))
    sink.listen(4)
    sink.setblocking(False)
    sink_port = str(sink.getsockname()[1])
    processes: list[asyncio.subprocess.Process] = []
    try:
        if relay_dials:
            receiver, port = await _spawn("receiver", "--sink", sink_port)
            relay, relay_port = await _spawn("relay", "--receiver", f"127.0.0.1:{port}")
            processes += [receiver, relay]
        else:
            relay, relay_port = await _spawn("relay")
            processes.append(relay)
            receiver, _ = await _spawn(
                "receiver", "--sink", sink_port, "--relay", f"127.0.0.1:{relay_port}"
            )
            processes.append(receiver)
        sender, port = await _spawn("sender", "--relay", f"127.0.0.1:{relay_port}")
        processes.append(sender)
        floor = Floor(
            {"sender": sender.pid, "relay": relay.pid, "receiver": receiver.pid}, port, sink
        )
        first = os.urandom(1 << 20)
        if (await push(floor, first, digest=True))[1] != hashlib.sha256(first).hexdigest():
            raise RuntimeError("the relay floor's first push did not come out as it went in")
        yield floor
    finally:
        for process in reversed(processes):  # the sender first: no call breaks under another
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            await process.wait()
        sink.close()


async def _drain(loop: asyncio.AbstractEventLoop, sink: socket.socket, digest: bool) -> Any:
    """What one connection to the bench carried: its size, or its sha256."""
    connection, _ = await loop.sock_accept(sink)
    buffer = bytearray(JOINED)
    view, size, hashed = memoryview(buffer), 0, hashlib.sha256()
    with connection:
        while n := await loop.sock_recv_into(connection, buffer):
            size += n
            if digest:
                hashed.update(view[:n])
    return hashed.hexdigest() if digest else size


async def push(floor: Floor, data: bytes, digest: bool = False) -> tuple[float, Any]:
    """One push of `data` through the floor: its seconds, and the size (or the sha256) of
    what came out of the receiver's connection."""
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    draining = asyncio.create_task(_drain(loop, floor.sink, digest))
    source = socket.socket()
    source.setblocking(False)
    with source:
        await loop.sock_connect(source, ("127.0.0.1", floor.port))
        await loop.sock_sendall(source, data)
        source.shutdown(socket.SHUT_WR)
        got = await asyncio.wait_for(draining, 600)
    return time.perf_counter() - t0, got


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("role", choices=NAMES)
    parser.add_argument("--relay", help="the relay's address (sender; receiver: dial it)")
    parser.add_argument("--receiver", help="the receiver's address (relay: dial it)")
    parser.add_argument("--sink", type=int, help="the bench's port (receiver)")
    args = parser.parse_args(argv)

    async def run() -> None:
        watch = asyncio.create_task(_orphaned())
        if args.role == "sender":
            await _sender(args.relay)
        elif args.role == "relay":
            await _relay(args.receiver)
        else:
            await _receiver(args.sink, args.relay)
        watch.cancel()

    asyncio.run(run())


if __name__ == "__main__":
    main(sys.argv[1:])
