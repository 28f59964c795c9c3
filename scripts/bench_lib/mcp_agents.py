"""The `mcp` workload: many AI agents on one MCP server. One host agent with
--mcp-clients simulated phones (actions answer at once), one `amc mcp --http` process, and
as many agents, spread over --mcp-processes processes of their own (as agents are), each
opening a session on a phone of its own and then tapping --mcp-actions times, pausing a
random 0.5 to 1.5 x --mcp-think seconds before each tap (an agent thinks between actions).

Each agent runs twice with the same pauses: through MCP (the `mcp` SDK's own client, its
own HTTP session and bearer token) and through the client library (`amc_client`, a Phone
of a Farm per process). Every MCP answer is checked to be its own: its text names the
tap's own coordinates, its `_meta` the agent's own session and phone and the step its tap
was (another agent's answer, or another of its own, would show another session, phone or
step); a call that raised is a lost answer. The difference of the two round trips' p50 is
what MCP costs an action (target: within 5 ms). The taps are timed and their CPU counted
between two barriers (every agent's session open before, none closed yet after): the MCP
server's CPU per action, and the agents' own (the SDK's client beside the library). Every
session's task must end done with all its taps.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import Implementation

from amc.v1 import task_pb2
from amc_client import Farm, actions
from amc_testing.database import free_port
from bench_lib.report import Row, _num, pcts
from bench_lib.stack import AgentSpec, Child, Stack, cpu_seconds, spawn
from bench_lib.stats import summarize

HOST = "mcp-host"
POOL = "mcp"
WORKLOAD = "14 mcp"
# The most p50 the MCP server may add to an action, ms.
TARGET_MS = 5.0
STEP_PATIENCE = 600.0
SCRIPTS = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Options:
    clients: int = 100
    actions: int = 20
    think: float = 0.5
    processes: int = 4


@dataclass
class Tally:
    """What one process's agents saw."""

    rtts: list[float] = field(default_factory=list)
    lost: int = 0
    crossed: int = 0
    examples: list[str] = field(default_factory=list)

    def wrong(self, what: str, lost: bool = False) -> None:
        if lost:
            self.lost += 1
        else:
            self.crossed += 1
        self.examples = [*self.examples[:4], what]


# -- a process of agents (python -m bench_lib.mcp_agents MODE TARGET FIRST COUNT ...) -----


def _pauses(i: int, actions_each: int, think: float) -> list[float]:
    """Agent i's pauses before each action: the same in both runs."""
    rnd = random.Random(i)
    return [think * rnd.uniform(0.5, 1.5) for _ in range(actions_each)]


@dataclass
class _Cue:
    """When every agent of a process moves on: its sessions opened, the taps, the close."""

    go: asyncio.Event = field(default_factory=asyncio.Event)
    close: asyncio.Event = field(default_factory=asyncio.Event)
    opened: dict[int, tuple[str, str]] = field(default_factory=dict)
    all_open: asyncio.Event = field(default_factory=asyncio.Event)
    all_tapped: asyncio.Event = field(default_factory=asyncio.Event)
    count: int = 0
    done: int = 0

    def said_open(self, i: int, session: str, serial: str) -> None:
        self.opened[i] = session, serial
        if len(self.opened) == self.count:
            self.all_open.set()

    def tapped(self) -> None:
        """An agent is through its taps."""
        self.done += 1
        if self.done == self.count:
            self.all_tapped.set()


async def _taps(
    i: int, k: int, think: float, cue: _Cue, tally: Tally, tap: Callable[[int], Any]
) -> None:
    await cue.go.wait()
    for step, pause in enumerate(_pauses(i, k, think)):
        await asyncio.sleep(pause)
        t0 = time.perf_counter()
        try:
            await tap(step)
        except Exception as exc:  # a lost answer, counted
            tally.wrong(f"agent {i} tap {step}: {exc!r}", lost=True)
            continue
        tally.rtts.append((time.perf_counter() - t0) * 1000)
    cue.tapped()
    await cue.close.wait()


async def _library_agent(farm: Farm, i: int, k: int, think: float, cue: _Cue, tally: Tally) -> None:
    """Agent i through the client library: a Phone of the process's Farm."""
    phone = await farm.open_session(
        labels={"pool": POOL}, idle_timeout=300, queue_timeout=STEP_PATIENCE
    )
    cue.said_open(i, phone.task_id, phone.serial)

    async def tap(step: int) -> None:
        answer = await phone.act(actions.tap(i, step))
        if answer.step.index != step or answer.step.status != task_pb2.STEP_STATUS_OK:
            tally.wrong(f"library agent {i}: step {answer.step.index} for tap {step}")

    await _taps(i, k, think, cue, tally, tap)
    await phone.close()


async def _mcp_agent(url: str, i: int, k: int, think: float, cue: _Cue, tally: Tally) -> None:
    """Agent i through MCP: the SDK's client, its own HTTP session and bearer token; its
    MCP session ended as the SDK's client ends it (DELETE) once it closed its session."""
    headers = {"Authorization": f"Bearer bench-agent-{i}"}
    info = Implementation(name=f"bench-agent-{i}", version="1")
    async with httpx2.AsyncClient(headers=headers, timeout=STEP_PATIENCE) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode="legacy", client_info=info) as mcp:
            opened = await mcp.call_tool("open_session", {"queue_timeout": STEP_PATIENCE})
            said = opened.content[0].text if opened.content else ""
            if opened.is_error or not said.startswith("session "):
                raise RuntimeError(f"agent {i} got no session: {said}")
            session, serial = said.split()[1], said.split()[-1]
            cue.said_open(i, session, serial)

            async def tap(step: int) -> None:
                answer = await mcp.call_tool("tap", {"x": i, "y": step})
                text = answer.content[0].text if answer.content else ""
                mine = {"amc/session": session, "amc/phone": serial, "amc/step": step}
                meta = dict(answer.meta or {})
                if answer.is_error or text != f"tap {i},{step}: ok" or meta != mine:
                    tally.wrong(f"agent {i} tap {step}: {text!r} {meta}")

            await _taps(i, k, think, cue, tally, tap)
            await mcp.call_tool("close_session", {})


async def _agents(mode: str, target: str, first: int, count: int, k: int, think: float) -> None:
    """One process's agents: open, say so, taps on `go`, say them, close on `close`."""
    lines = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(lines), sys.stdin)
    cue, tally = _Cue(count=count), Tally()
    ids = range(first, first + count)
    async with contextlib.AsyncExitStack() as stack:
        if mode == "mcp":
            lives = [_mcp_agent(target, i, k, think, cue, tally) for i in ids]
        else:
            farm = await stack.enter_async_context(Farm(target, token="bench-library"))
            lives = [_library_agent(farm, i, k, think, cue, tally) for i in ids]
        agents = asyncio.ensure_future(asyncio.gather(*lives))
        await _until(cue.all_open, agents)
        print(json.dumps({"opened": list(cue.opened.values())}), flush=True)
        await lines.readline()  # go
        cpu = time.process_time()
        cue.go.set()
        await _until(cue.all_tapped, agents)
        cpu = time.process_time() - cpu
        print(json.dumps({**tally.__dict__, "cpu": cpu}), flush=True)
        await lines.readline()  # close
        cue.close.set()
        await agents
    print(json.dumps({"closed": True}), flush=True)


async def _until(event: asyncio.Event, agents: asyncio.Future[Any]) -> None:
    """Until `event`, or the agents' end (a failure: raised)."""
    waiting = asyncio.ensure_future(event.wait())
    await asyncio.wait({agents, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if agents.done():
        agents.result()


# -- the workload ------------------------------------------------------------------------


async def _line(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    assert proc.stdout is not None
    async with asyncio.timeout(STEP_PATIENCE):
        line = await proc.stdout.readline()
    if not line:
        raise RuntimeError(f"an agents' process ended early (exit {await proc.wait()})")
    said: dict[str, Any] = json.loads(line)
    return said


async def _run_agents(
    mode: str, target: str, options: Options, server: Child | None
) -> dict[str, Any]:
    """Every agent once through `mode`: their tally, sessions, and the CPU of the taps."""
    n, per = options.clients, -(-options.clients // options.processes)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPTS), str(SCRIPTS.parent)])}
    env = {k: v for k, v in env.items() if not k.startswith("AMC_")}
    procs = [
        await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "bench_lib.mcp_agents", mode, target),
            *(str(first), str(min(per, n - first)), str(options.actions), str(options.think)),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        for first in range(0, n, per)
    ]
    try:
        opened = [s for p in procs for s in (await _line(p))["opened"]]
        cpu0 = cpu_seconds(server.pid) if server else 0.0
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"go\n")
        tallies = [await _line(p) for p in procs]
        server_cpu = (cpu_seconds(server.pid) - cpu0) if server else 0.0
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(b"close\n")
        for p in procs:
            await _line(p)
    finally:
        for p in procs:
            if p.returncode is None:
                p.kill()
            await p.wait()
    rtts = [r for t in tallies for r in t["rtts"]]
    return {
        "opened": opened,
        "rtts": rtts,
        "lost": sum(t["lost"] for t in tallies),
        "crossed": sum(t["crossed"] for t in tallies),
        "examples": [e for t in tallies for e in t["examples"]][:5],
        "agents_cpu_us_per_action": sum(t["cpu"] for t in tallies) / max(1, len(rtts)) * 1e6,
        "server_cpu_us_per_action": server_cpu / max(1, len(rtts)) * 1e6,
    }


def _serve(stack: Stack) -> tuple[Child, str]:
    """`amc mcp --http` on a free port, on the stack's control plane; its URL."""
    port = free_port()
    argv = [
        sys.executable,
        *("-m", "amc_cli", "--addr", stack.address, "mcp"),
        *("--http", f"127.0.0.1:{port}", "--label", f"pool={POOL}", "--idle-timeout", "5m"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMC_")}
    child = spawn("amc mcp --http", argv, stack.root / "amc-mcp.log", env)
    return child, f"http://127.0.0.1:{port}/mcp"


async def _serving(child: Child, within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        child.check_alive()
        if b"serving MCP at" in child.log.read_bytes():
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"amc mcp --http did not serve within {within:.0f}s")


async def _all_done(address: str, ids: list[str], steps: int) -> bool:
    async with Farm(address, token="bench-library") as farm:
        tasks = await asyncio.gather(*(farm.get(i) for i in ids))
    return all(
        t.status == task_pb2.TASK_STATUS_DONE and len(t.result.steps) == steps for t in tasks
    )


async def run(stack: Stack, options: Options, say: Callable[[str], None]) -> dict[str, Any]:
    stack.start_agent(AgentSpec(HOST, options.clients, 0.0, POOL))
    server, url = _serve(stack)
    n, k, p = options.clients, options.actions, options.processes
    try:
        await _serving(server)
        say(f"mcp: {n} agents in {p} processes x {k} taps, ~{options.think:g}s apart, library")
        lib = await _run_agents("library", stack.address, options, None)
        say(f"mcp: the same {n} agents through amc mcp --http, each its own MCP client")
        mcp = await _run_agents("mcp", url, options, server)
        ids = [session for session, _ in mcp["opened"] + lib["opened"]]
        done = await _all_done(stack.address, ids, k)
    finally:
        server.stop()
        child = stack.agents.pop(HOST, None)
        if child is not None:
            child.stop()
    through, alone = summarize(mcp["rtts"]), summarize(lib["rtts"])
    out = {
        "clients": n,
        "actions_each": k,
        "think_s": options.think,
        "processes": p,
        "mcp_ms": through,
        "library_ms": alone,
        "overhead_ms": {q: through[q] - alone[q] for q in ("p50", "p99")} if through["n"] else {},
        "lost": mcp["lost"] + lib["lost"],
        "crossed": mcp["crossed"] + lib["crossed"],
        "wrong_examples": mcp["examples"] + lib["examples"],
        "sessions": len({s for s, _ in mcp["opened"]}),
        "phones": len({serial for _, serial in mcp["opened"]}),
        "tasks_done": done,
        "mcp_server_cpu_us_per_action": mcp["server_cpu_us_per_action"],
        "mcp_agents_cpu_us_per_action": mcp["agents_cpu_us_per_action"],
        "library_agents_cpu_us_per_action": lib["agents_cpu_us_per_action"],
        "loadavg": os.getloadavg(),
    }
    out["verified"] = bool(
        out["lost"] == 0 and out["crossed"] == 0 and done and out["sessions"] == n == out["phones"]
    )
    if through["n"]:
        say(
            f"  through MCP p50 {through['p50']:.2f} ms, the library's {alone['p50']:.2f} ms;"
            f" lost {out['lost']}, crossed {out['crossed']}"
        )
    return out


def rows(results: dict[str, Any] | None) -> list[Row]:
    if not results:
        return []
    n, k = results["clients"], results["actions_each"]
    over = results.get("overhead_ms", {})
    p50 = over.get("p50")
    cpu = (
        f"{_num(results['mcp_server_cpu_us_per_action'])} / "
        f"{_num(results['mcp_agents_cpu_us_per_action'])} / "
        f"{_num(results['library_agents_cpu_us_per_action'])}"
    )
    return [
        Row(WORKLOAD, f"{n} MCP clients x {k} taps: round trip through amc mcp --http, ms",
            pcts(results["mcp_ms"], 2)),
        Row(WORKLOAD, f"{n} agents:   the same taps through the client library, ms",
            pcts(results["library_ms"], 2)),
        Row(WORKLOAD, f"{n} agents:   what MCP adds (p50 / p99), ms",
            f"{_num(p50, 2)} / {_num(over.get('p99'), 2)}", f"p50 <= {TARGET_MS:g}",
            None if p50 is None else p50 <= TARGET_MS),
        Row(WORKLOAD, f"{n} agents:   answers lost / crossed",
            f"{results['lost']} / {results['crossed']}", "0 / 0",
            results["lost"] == 0 and results["crossed"] == 0),
        Row(WORKLOAD, f"{n} agents:   CPU per tap: amc mcp / MCP agents / library agents, us",
            cpu),
    ]  # fmt: skip


if __name__ == "__main__":
    mode, target, first, count, each, think = sys.argv[1:7]
    asyncio.run(_agents(mode, target, int(first), int(count), int(each), float(think)))
