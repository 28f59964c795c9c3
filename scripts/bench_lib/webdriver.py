"""The `webdriver` workload (row 17): what the WebDriver endpoint adds to Appium, measured
beside the same Appium straight. A real Appium server with its fake driver
(amc_testing.appium) runs twice on this machine: one that a host agent process starts for
its simulated phone (`--appium`), reached through a control-plane replica serving
`/wd/hub` on HTTP, and one the bench starts itself, reached directly:

    direct:  HTTP client -> Appium
    farm:    HTTP client -> control plane (/wd/hub) -> host agent -> Appium

- new session: --webdriver-sessions of each, alternating (each deleted before the next;
  one untimed through the farm first, which starts the agent's Appium): the farm's new
  session is queue -> lease -> host joined -> Appium's session created, so its p50 less the
  direct one's is what the farm adds to Appium's own session start;
- requests: in one session of each, --webdriver-requests `GET /source` alternating: p50
  and p99 of each path and of the farm's own part, and the CPU the control plane and the
  agent spent per proxied request.

Both paths use one keep-alive HTTP client (aiohttp), so the figures are the endpoint's and
not a WebDriver client library's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from amc_testing.appium import NAME, Unreachable, fake_caps, install
from amc_testing.database import free_port
from bench_lib.report import Row, pcts
from bench_lib.stack import AGENT_TOKEN, Stack, cpu_seconds, spawn
from bench_lib.stats import summarize
from scripts.launch import HostAgentCommand

HOST = "wd-host"
POOL = "webdriver"
ROOT = Path(__file__).resolve().parents[2]
# Shared with the tests' install (tests/support/appium.py): one download for both.
CACHE = ROOT / ".pytest_cache" / "d" / NAME


@dataclass(frozen=True)
class Options:
    sessions: int = 20
    requests: int = 200


async def _post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, Any]:
    async with http.post(url, json=body) as answer:
        return answer.status, await answer.json()


async def _new_session(http: aiohttp.ClientSession, base: str, caps: dict[str, Any]) -> str:
    status, doc = await _post(http, f"{base}/session", {"capabilities": {"alwaysMatch": caps}})
    if status != 200:
        raise RuntimeError(f"new session at {base}: {status} {json.dumps(doc)[:300]}")
    return str(doc["value"]["sessionId"])


async def _delete(http: aiohttp.ClientSession, base: str, session: str) -> None:
    async with http.delete(f"{base}/session/{session}") as answer:
        if answer.status != 200:
            raise RuntimeError(f"delete at {base}: {answer.status} {await answer.text()}")


async def _source(http: aiohttp.ClientSession, base: str, session: str) -> str:
    async with http.get(f"{base}/session/{session}/source") as answer:
        doc = await answer.json()
        if answer.status != 200:
            raise RuntimeError(f"source at {base}: {answer.status} {json.dumps(doc)[:300]}")
        return str(doc["value"])


@contextlib.asynccontextmanager
async def _appium(stack: Stack, program: Path, http: aiohttp.ClientSession) -> AsyncIterator[str]:
    """The bench's own Appium server: its URL."""
    port = free_port()
    argv = [str(program), "--address", "127.0.0.1", "--port", str(port), "--log-level", "warn"]
    server = spawn("appium (direct)", argv, stack.root / "appium-direct.log", {})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(f"{url}/status") as answer:
                    if answer.status == 200:
                        break
            if time.monotonic() > deadline:
                raise RuntimeError("the direct Appium server never answered")
            await asyncio.sleep(0.1)
        yield url
    finally:
        server.stop()


async def run(stack: Stack, options: Options, say: Callable[[str], None]) -> dict[str, Any]:
    say(f"webdriver: Appium and its fake driver (npm, once) in {CACHE}")
    try:
        program = await asyncio.to_thread(install, CACHE)
    except Unreachable as exc:
        say(f"webdriver: skipped: {exc}")
        return {"skipped": str(exc)}
    port = free_port()
    replica = await stack.start_replica(
        "control-plane-webdriver", stack.lease_ttl, http_listen=f"127.0.0.1:{port}"
    )
    farm = f"http://127.0.0.1:{port}/wd/hub"
    command = HostAgentCommand(
        control_plane=replica.address,
        host_id=HOST,
        token=AGENT_TOKEN,
        labels={"pool": POOL},
        simulated_devices=1,
        sim_delay=0,
        drain_timeout=0,
        log_format=stack.log_format,
        appium=program,
        appium_caps=json.dumps(fake_caps(program)),
    )
    log = stack.root / f"agent-{HOST}.log"
    agent = spawn(f"host agent {HOST}", command.argv(), log, command.env())
    farm_caps = {
        "platformName": "Android",
        "appium:automationName": "Fake",
        "amc:labels": {"pool": POOL},
        "amc:queueTimeout": 60,
    }
    direct_caps = {**fake_caps(program), "appium:automationName": "Fake"}
    timeout = aiohttp.ClientTimeout(total=120)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as http,
            _appium(stack, program, http) as direct,
        ):
            say("webdriver: one untimed session through the farm (its Appium starts)")
            await _delete(http, farm, await _new_session(http, farm, farm_caps))
            await _delete(http, direct, await _new_session(http, direct, direct_caps))
            say(f"webdriver: {options.sessions} new sessions each, direct and through the farm")
            starts: dict[str, list[float]] = {"direct": [], "farm": []}
            paths = (("direct", direct, direct_caps), ("farm", farm, farm_caps))
            for _ in range(options.sessions):
                for path, base, caps in paths:
                    t0 = time.perf_counter()
                    session = await _new_session(http, base, caps)
                    starts[path].append((time.perf_counter() - t0) * 1000)
                    await _delete(http, base, session)
            say(f"webdriver: {options.requests} GET /source each, direct and through the farm")
            sessions = {
                "direct": (direct, await _new_session(http, direct, direct_caps)),
                "farm": (farm, await _new_session(http, farm, farm_caps)),
            }
            for base, session in sessions.values():  # a few untimed first
                for _ in range(5):
                    await _source(http, base, session)
            assert replica.child is not None
            pids = {"control plane": replica.child.pid, "agent": agent.pid}
            times: dict[str, list[float]] = {"direct": [], "farm": []}
            # The two processes do nothing for a direct request: their CPU over the whole
            # loop is the farm's requests' (read once: the clock ticks are 10 ms).
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            verified = True
            for _ in range(options.requests):
                for path, (base, session) in sessions.items():
                    t0 = time.perf_counter()
                    source = await _source(http, base, session)
                    times[path].append((time.perf_counter() - t0) * 1000)
                    verified = verified and "Hello, farm" in source
            cpu = {name: cpu_seconds(pid) - before[name] for name, pid in pids.items()}
            for base, session in sessions.values():
                await _delete(http, base, session)
            farm_session = sessions["farm"][1]
            async with http.get(f"{farm}/session/{farm_session}/source") as answer:
                verified = verified and answer.status == 404  # ended with its DELETE
    finally:
        agent.stop()
        replica.child.stop()
    start_direct, start_farm = summarize(starts["direct"]), summarize(starts["farm"])
    direct_ms, farm_ms = summarize(times["direct"]), summarize(times["farm"])
    return {
        "start_direct_ms": start_direct,
        "start_farm_ms": start_farm,
        "start_overhead_ms": start_farm["p50"] - start_direct["p50"],
        "request_direct_ms": direct_ms,
        "request_farm_ms": farm_ms,
        "request_overhead_ms": {k: farm_ms[k] - direct_ms[k] for k in ("p50", "p99")},
        # CPU per proxied request, microseconds, of each process.
        "request_cpu_us": {n: s / options.requests * 1e6 for n, s in cpu.items()},
        "verified": verified,
    }


# The targets: a new session within 1 s of Appium's own start at p50; a request within
# 3 ms of a direct one at p50.
START_OVERHEAD_MS = 1000.0
REQUEST_OVERHEAD_MS = 3.0


def rows(wd: dict[str, Any] | None) -> list[Row]:
    if not wd:
        return []
    if "skipped" in wd:
        return [Row("17 webdriver", "skipped", wd["skipped"][:200])]
    name, over = "17 webdriver", wd["request_overhead_ms"]
    cpu = " / ".join(f"{n} {us:.0f}" for n, us in wd["request_cpu_us"].items())
    return [
        Row(name, "new session, Appium direct, ms", pcts(wd["start_direct_ms"])),
        Row(name, "new session through the farm (lease, Appium), ms", pcts(wd["start_farm_ms"])),
        Row(
            name,
            "  the farm's own part (p50), ms",
            f"{wd['start_overhead_ms']:.0f}",
            f"<= {START_OVERHEAD_MS:g}",
            wd["start_overhead_ms"] <= START_OVERHEAD_MS,
        ),
        Row(name, "GET /source, Appium direct, ms", pcts(wd["request_direct_ms"])),
        Row(name, "GET /source through the farm, ms", pcts(wd["request_farm_ms"])),
        Row(
            name,
            "  the farm's own part (p50 / p99), ms",
            f"{over['p50']:.2f} / {over['p99']:.1f}"
            f"{'' if wd['verified'] else '; answers NOT as Appium gave them'}",
            f"p50 <= {REQUEST_OVERHEAD_MS:g}",
            over["p50"] <= REQUEST_OVERHEAD_MS and wd["verified"],
        ),
        Row(name, "  CPU per proxied request, us", cpu),
    ]
