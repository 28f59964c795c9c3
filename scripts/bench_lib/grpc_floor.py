"""The `screen` workload's floor for its viewers' rows: what grpc.aio itself spends to
write one message of a server-streaming call, and to receive one of a client stream, with
nothing of AMC around it.

A bare grpc.aio server, in a process of its own (this file run as a script), streams the
same bytes (a frame of the stream's size) to every call open on it, 30 times a second,
each call's handler woken by an asyncio.Event as a viewer of AMC's is; the bench opens 1
and then 10 calls on one channel and reads the server's CPU over a window of each. Ten
calls' cores less one's, over the 9 more calls' messages, is the cost of one message to
one call: below it, no relay that writes one message per frame to each viewer can go.
Then the bench sends the server the same bytes on one client stream, 30 a second (as a
host sends a phone's frames): the server's cores over those messages is what receiving
one costs.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import grpc

FPS = 30
PAYLOAD = b"\0" * 240
METHOD = "/floor.Floor/Watch"
TAKE = "/floor.Floor/Take"


def _same(data: bytes) -> bytes:
    return data


async def _serve() -> None:
    waiting: set[asyncio.Event] = set()

    async def watch(_request: bytes, _context: Any) -> Any:
        ready = asyncio.Event()
        waiting.add(ready)
        try:
            while True:
                await ready.wait()
                ready.clear()
                yield PAYLOAD
        finally:
            waiting.discard(ready)

    handler = grpc.unary_stream_rpc_method_handler(
        watch, request_deserializer=_same, response_serializer=_same
    )

    async def take(requests: Any, _context: Any) -> bytes:
        async for _ in requests:
            pass
        return b""

    taker = grpc.stream_unary_rpc_method_handler(
        take, request_deserializer=_same, response_serializer=_same
    )
    server = grpc.aio.server()
    service, _, name = METHOD.lstrip("/").partition("/")
    _, _, take_name = TAKE.lstrip("/").partition("/")
    handlers = grpc.method_handlers_generic_handler(service, {name: handler, take_name: taker})
    server.add_generic_rpc_handlers([handlers])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    while True:
        await asyncio.sleep(1 / FPS)
        for ready in waiting:
            ready.set()


async def _window(channel: grpc.aio.Channel, pid: int, count: int, seconds: float) -> float:
    """The server's cores while `count` calls read for `seconds`."""
    from bench_lib.stack import cpu_seconds

    open_call = channel.unary_stream(METHOD, request_serializer=_same, response_deserializer=_same)
    calls = [open_call(b"") for _ in range(count)]

    async def read(call: Any, until: float) -> None:
        while time.perf_counter() < until:
            await call.read()

    try:
        await asyncio.gather(*(read(c, time.perf_counter() + 1.0) for c in calls))
        cpu0, started = cpu_seconds(pid), time.perf_counter()
        await asyncio.gather(*(read(c, started + seconds) for c in calls))
        return (cpu_seconds(pid) - cpu0) / (time.perf_counter() - started)
    finally:
        for c in calls:
            c.cancel()


async def _receiving(channel: grpc.aio.Channel, pid: int, seconds: float) -> float:
    """The server's cores while it receives FPS messages a second on one client stream."""
    from bench_lib.stack import cpu_seconds

    window: list[float] = []

    async def frames() -> Any:
        until = time.perf_counter() + 1.0 + seconds
        while time.perf_counter() < until:
            await asyncio.sleep(1 / FPS)
            if not window and time.perf_counter() > until - seconds:
                window.extend((cpu_seconds(pid), time.perf_counter()))
            yield PAYLOAD
        window.extend((cpu_seconds(pid), time.perf_counter()))

    take = channel.stream_unary(TAKE, request_serializer=_same, response_deserializer=_same)
    await take(frames())
    cpu0, started, cpu1, ended = window
    return (cpu1 - cpu0) / (ended - started)


async def measure(seconds: float) -> dict[str, float]:
    """The bare server's cores for 1 and 10 calls and its CPU per further message; its
    cores receiving one stream, and per message received."""
    server = await asyncio.create_subprocess_exec(
        sys.executable, __file__, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        port = int(await server.stdout.readline())
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            one = await _window(channel, server.pid, 1, seconds)
            ten = await _window(channel, server.pid, 10, seconds)
            receiving = await _receiving(channel, server.pid, seconds)
    finally:
        server.terminate()
        await server.wait()
    return {
        "one_cores": one,
        "ten_cores": ten,
        "us_per_message": (ten - one) / (9 * FPS) * 1e6,
        "receiving_cores": receiving,
        "us_per_message_received": receiving / FPS * 1e6,
    }


if __name__ == "__main__":
    asyncio.run(_serve())
