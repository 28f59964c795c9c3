"""A fleet process of the chaos run: many hosts in one process, each the real host agent.

    python scripts/chaos_lib/fleet.py CONFIG.json

Every host is a `host_agent.agent.Agent` of its own, as `host-agent` builds it: its own
host id and host token, its own gRPC channel (to its own TCP proxy, so that one host can be
cut off), its own simulated phones with serials of its own (`f07-0`...) and action log, its
own labels (`pool=fleet`, its `rack`, its `row`), its own renewal stream and its own parked
Acquire. Only the process is shared: 50+ agent processes would not fit the two cores the
run has, and a process per host adds nothing the API sees. Killing or stopping the process
takes a whole row of hosts down at once (a rack losing power, a frozen hypervisor).

Besides the agents' own JSON log (stderr; every line names its host_id), the process
writes one JSON line per Acquire call to `acquire_log`: host, the idle serials it offered,
when it was sent and answered (wall clock), the answer's code and the tasks it brought.
That is what the dispatch check (invariant 7) knows of who was parked with what.

Exit status: 0 after a clean drain (SIGTERM), 1 if an agent could not go on.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import grpc
import structlog

from amc.v1 import lease_pb2
from amc_common import logs
from amc_common.channel import WrappedChannel, aio_channel
from amc_testing.host import RECONNECT, Agent, AgentSettings, SimulatedSource

ACQUIRE = "/amc.v1.Lease/Acquire"
log = structlog.get_logger("chaos.fleet")


class AcquireLog:
    """One JSON line per finished Acquire call, flushed at once (the process may be killed)."""

    def __init__(self, path: Path) -> None:
        self._out: TextIO = path.open("a", encoding="utf-8", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._out.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        self._out.close()


class RecordingChannel(WrappedChannel):
    """The agent's channel, recording its Acquire calls; every other call passes through."""

    def __init__(self, channel: grpc.aio.Channel, host_id: str, out: AcquireLog) -> None:
        super().__init__(channel)
        self._host_id = host_id
        self._out = out

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        call = super().unary_unary(method, *args, **kwargs)
        return _RecordedAcquire(call, self._host_id, self._out) if method == ACQUIRE else call


class _RecordedAcquire:
    def __init__(self, call: Any, host_id: str, out: AcquireLog) -> None:
        self._call = call
        self._host_id = host_id
        self._out = out

    def __call__(self, request: lease_pb2.AcquireRequest, **kwargs: Any) -> Any:
        return self._record(request, self._call(request, **kwargs))

    async def _record(self, request: lease_pb2.AcquireRequest, call: Any) -> Any:
        sent = time.time()
        code, took = "OK", []
        try:
            response = await call
            took = [a.task_id for a in response.assignments]
            return response
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            raise
        except asyncio.CancelledError:
            code = "CANCELLED"
            raise
        finally:
            self._out.write(
                {
                    "host": self._host_id,
                    "serials": list(request.idle_serials),
                    "wait": request.wait.seconds + request.wait.nanos / 1e9,
                    "sent": sent,
                    "ended": time.time(),
                    "code": code,
                    "took": took,
                }
            )


async def serve(config: dict[str, Any]) -> int:
    out = AcquireLog(Path(config["acquire_log"]))
    agents: list[Agent] = []
    closing: list[Any] = []
    for h in config["hosts"]:
        source = SimulatedSource(
            h["devices"], delay=h["sim_delay"], prefix=h["prefix"], action_log=h["action_log"]
        )
        inner = aio_channel(h["address"], h["token"], options=RECONNECT)
        channel = RecordingChannel(inner, h["host_id"], out)
        settings = AgentSettings(
            host_id=h["host_id"],
            labels=h["labels"],
            drain_timeout=config["drain_timeout"],
            acquire_wait=config["acquire_wait"],
            report_timeout=config["report_timeout"],
        )
        agents.append(Agent(settings, source, channel))
        closing += [channel, source]
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for agent in agents:
            agent.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    log.info("fleet starting", hosts=[a.settings.host_id for a in agents])
    failed = 0

    async def run(agent: Agent) -> None:
        nonlocal failed
        try:
            await agent.run()
        except Exception as exc:
            failed += 1
            log.error("host agent failed", host_id=agent.settings.host_id, error=repr(exc)[:500])
            stop()  # one host that cannot go on ends the process: the harness sees it

    try:
        await asyncio.gather(*(run(a) for a in agents))
    finally:
        for thing in closing:
            await thing.close()
        out.close()
    return 1 if failed else 0


def main() -> int:
    config = json.loads(Path(sys.argv[1]).read_text())
    logs.configure("json", "INFO")
    if config.get("nice"):
        os.nice(config["nice"])
    return asyncio.run(serve(config))


if __name__ == "__main__":
    sys.exit(main())
