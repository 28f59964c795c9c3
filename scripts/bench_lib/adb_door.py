"""The `adb` workload (row 13): an adb door's cost, with the real adb client,
beside the same commands straight to the phone on the same host. The phone is a simulated
one served as adbd on loopback (amc_testing.adbd, in this process); one real adb server
(the adbutils wheel's binary, on a private port and home) reaches it directly (`adb
connect`) and through an `amc adb` door (a subprocess) whose session's host is an agent
process driving that same adb server (`--adb`), so both paths end in the same phone and
the same server:

    direct:  adb client -> adb server -> phone
    door:    adb client -> adb server -> door -> control plane -> agent -> adb server -> phone

`adb shell echo` round trips, alternating direct and door (--adb-shells each), p50 and p99;
then PUSHES pushes of --adb-push-mb MB on each path, direct and door in turn so that a
change in the machine's load falls on both alike, MB/s (the best of each), with the CPU
seconds each process spent on the door's pushes (and its main thread's: its event loop).
Beside them, in the same turns, the same bytes pushed through the door's path with nothing
of AMC in it (bench_lib.relay_floor: a bare grpc.aio relay, the same frames and window),
its MB/s and its three processes' CPU (`push_floor`, bench_lib.adb_floor).
Under --profile, py-spy samples the door, the control plane and the agent during the
door's pushes (`profile` in the results).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import adbutils
import psutil

from amc_testing.adbd import SimulatedAdbd
from amc_testing.database import free_port
from amc_testing.host import SimulatedSource
from bench_lib import adb_floor, profiling, relay_floor
from bench_lib.report import Row, pcts
from bench_lib.stack import AGENT_TOKEN, Stack, cpu_seconds, rss_bytes, spawn
from bench_lib.stats import summarize
from scripts.launch import HostAgentCommand

HOST = "adb-host"
# Pushes on each path, direct and door in turn; the better of them is the figure.
PUSHES = 3
POOL = "adb"
ROOT = Path(__file__).resolve().parents[2]
_CONNECT = re.compile(r"^adb connect (127\.0\.0\.1:\d+)$")


# The processes of AMC's own on a door's path, py-spy'd during its pushes under --profile.
PROFILED = ("door", "control plane", "agent")


@dataclass(frozen=True)
class Options:
    shells: int = 100
    push_mb: int = 100
    # A directory: py-spy each of PROFILED during the door's pushes (bench.py --profile).
    profile: Path | None = None


class Adb:
    """The real adb client against one private adb server."""

    def __init__(self, home: Path) -> None:
        self.path = adbutils.adb_path()
        self.home = home
        self.port = free_port()
        self.pid = 0
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("ANDROID", "ADB"))}
        self.env.update(HOME=str(home), ANDROID_USER_HOME=str(home / ".android"))

    def key(self) -> Path:
        return self.home / ".android" / "adbkey.pub"

    async def __call__(self, *args: str, within: float = 600.0) -> bytes:
        process = await asyncio.create_subprocess_exec(
            self.path,
            "-H",
            "127.0.0.1",
            "-P",
            str(self.port),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        out, err = await asyncio.wait_for(process.communicate(), within)
        if process.returncode:
            raise RuntimeError(f"adb {' '.join(args)}: {err.decode(errors='replace')}")
        return out

    async def connect(self, address: str) -> None:
        deadline = time.monotonic() + 30
        while True:
            await self("connect", address)
            if (await self("-s", address, "get-state")).strip() == b"device":
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{address} never came online")
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def _adb_server(root: Path) -> AsyncIterator[Adb]:
    home = root / "adb-home"
    (home / ".android").mkdir(parents=True, exist_ok=True)
    adb = Adb(home)
    argv = [adb.path, "-P", str(adb.port), "server", "nodaemon"]
    server = spawn("adb server", argv, root / "adb-server.log", adb.env)
    adb.pid = server.pid
    try:
        for _ in range(300):
            with contextlib.suppress(RuntimeError):
                await adb("devices")
                break
            await asyncio.sleep(0.05)
        yield adb
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def _door(stack: Stack, adb: Adb) -> AsyncIterator[tuple[str, int]]:
    """`amc adb` serving the pool's phone: its address and process id."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMC_")}
    # The measured copy of the packages (--pythonpath) first, as for the farm's processes.
    paths = [str(stack.pythonpath)] if stack.pythonpath is not None else []
    env.update(AMC_ADDR=stack.address, PYTHONPATH=os.pathsep.join([*paths, str(ROOT)]))
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "amc_cli",
        "adb",
        "--label",
        f"pool={POOL}",
        "--adb-key",
        str(adb.key()),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        cwd=stack.root,  # not the checkout: `-m` puts the working directory first on its path
    )
    said: list[str] = []
    try:
        assert process.stdout is not None
        while line := await asyncio.wait_for(process.stdout.readline(), 120):
            said.append(line.decode(errors="replace"))
            if found := _CONNECT.match(said[-1].strip()):
                yield found[1], process.pid
                return
        raise RuntimeError(f"amc adb exited before it opened: {''.join(said)}")
    finally:
        if process.returncode is None:
            process.send_signal(2)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), 30)
        if process.returncode is None:
            process.kill()


async def _shells(adb: Adb, serials: dict[str, str], n: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {path: [] for path in serials}
    for serial in serials.values():  # a few untimed first
        for _ in range(3):
            await adb("-s", serial, "shell", "echo", "x")
    for _ in range(n):
        for path, serial in serials.items():
            t0 = time.perf_counter()
            out = await adb("-s", serial, "shell", "echo", "x")
            times[path].append((time.perf_counter() - t0) * 1000)
            if out != b"x\n":
                raise RuntimeError(f"adb shell through {path} printed {out!r}")
    return times


async def _push(adb: Adb, serial: str, source: Path) -> float:
    """Seconds of one push of `source`."""
    t0 = time.perf_counter()
    await adb("-s", serial, "push", str(source), "/sdcard/bench.bin")
    return time.perf_counter() - t0


def _main_thread_seconds(pid: int) -> float:
    """User + system CPU of a process's main thread (its event loop: gRPC's own threads
    are the rest)."""
    try:
        found = [t for t in psutil.Process(pid).threads() if t.id == pid]
    except psutil.Error:
        return 0.0
    return found[0].user_time + found[0].system_time if found else 0.0


@dataclass
class Pushed:
    best: dict[str, float]  # MB/s of the better push on each path
    cpu: dict[str, float]  # CPU seconds of each process over the door's pushes
    main_thread: dict[str, float]  # the same, of its main thread
    profile: dict[str, str]  # PROFILED's raw py-spy stacks over the door's pushes


async def _pushes(
    adb: Adb,
    serials: dict[str, str],
    source: Path,
    mb: int,
    pids: dict[str, int],
    tries: int,
    profile: Path | None,
    floor: tuple[relay_floor.Floor, bytes, adb_floor.Tally] | None = None,
) -> Pushed:
    """The better of `tries` pushes on each path, direct and door in turn (so a change in
    the machine's load falls on both alike), and each process's CPU over the door's; with
    `floor`, a push of the same bytes through it after each pair (counted in its tally)."""
    out = Pushed({path: 0.0 for path in serials}, dict.fromkeys(pids, 0.0), {}, {})
    out.main_thread = dict.fromkeys(pids, 0.0)
    out.profile = dict.fromkeys(PROFILED, "")
    for attempt in range(tries):
        for path, serial in serials.items():
            recordings = []
            if profile is not None and path == "door":
                recordings = [
                    await profiling.start(
                        f"adb-{name}-{attempt}", pids[name], profile, 600, 250, native=True
                    )
                    for name in PROFILED
                ]
            before = {name: cpu_seconds(pid) for name, pid in pids.items()}
            main = {name: _main_thread_seconds(pid) for name, pid in pids.items()}
            seconds = await _push(adb, serial, source)
            out.best[path] = max(out.best[path], mb / seconds)
            if path == "door":
                for name, pid in pids.items():
                    out.cpu[name] += cpu_seconds(pid) - before[name]
                    out.main_thread[name] += _main_thread_seconds(pid) - main[name]
            for name, recording in zip(PROFILED, recordings, strict=False):
                out.profile[name] += await profiling.finish_raw(recording)
        if floor is not None:
            await adb_floor.measured(*floor)
    return out


async def run(stack: Stack, options: Options, say: Callable[[str], None]) -> dict[str, Any]:
    source = SimulatedSource(1, prefix="adb-phone-")
    async with SimulatedAdbd(source, "adb-phone-0") as phone, _adb_server(stack.root) as adb:
        await adb.connect(phone.address)
        command = HostAgentCommand(
            control_plane=stack.address,
            host_id=HOST,
            token=AGENT_TOKEN,
            labels={"pool": POOL},
            adb=f"127.0.0.1:{adb.port}",
            drain_timeout=0,
            log_format=stack.log_format,
        )
        log = stack.root / f"agent-{HOST}.log"
        agent = spawn(f"host agent {HOST}", command.argv(), log, stack.env_of(command))
        try:
            async with _door(stack, adb) as (door, door_pid):
                await adb.connect(door)
                serials = {"direct": phone.address, "door": door}
                say(f"adb: {options.shells} adb shell round trips each, direct and door")
                times = await _shells(adb, serials, options.shells)
                big = stack.root / "push.bin"
                payload = os.urandom(options.push_mb * 1_000_000)
                big.write_bytes(payload)
                say(
                    f"adb: {PUSHES} pushes of {options.push_mb} MB, direct, door and a bare"
                    " grpc.aio relay (bench_lib.relay_floor) in turn"
                )
                assert stack.control_plane is not None
                pids = {
                    "door": door_pid,
                    "control plane": stack.control_plane.pid,
                    "agent": agent.pid,
                    "adb server": adb.pid,
                    "phone (this process)": os.getpid(),
                }
                rss_before = rss_bytes(stack.control_plane.pid)
                tally = adb_floor.Tally()
                async with relay_floor.started() as floor:
                    pushed = await _pushes(
                        adb,
                        serials,
                        big,
                        options.push_mb,
                        pids,
                        PUSHES,
                        options.profile,
                        (floor, payload, tally),
                    )
                rss_after = rss_bytes(stack.control_plane.pid)
                direct_mbs, door_mbs = pushed.best["direct"], pushed.best["door"]
                # Checked while the door's session holds the phone: its clean after the
                # lease removes what was pushed.
                on_phone = source.apps["adb-phone-0"].files.get("/sdcard/bench.bin")
                verified = on_phone == payload
                big.unlink()
        finally:
            agent.stop()
    direct, through = summarize(times["direct"]), summarize(times["door"])
    door_ms = {
        name: 1000 * seconds / (PUSHES * options.push_mb) for name, seconds in pushed.cpu.items()
    }
    result: dict[str, Any] = {
        "shell_direct_ms": direct,
        "shell_door_ms": through,
        "shell_overhead_ms": {k: through[k] - direct[k] for k in ("p50", "p99")},
        "push_mb": options.push_mb,
        "push_direct_mb_s": direct_mbs,
        "push_door_mb_s": door_mbs,
        "push_ratio": door_mbs / direct_mbs if direct_mbs else 0.0,
        # CPU seconds each process spent on the door's pushes (PUSHES of push_mb MB).
        "push_door_cpu_s": pushed.cpu,
        # The same, of each process's main thread (its event loop; the rest is gRPC's).
        "push_door_main_thread_cpu_s": pushed.main_thread,
        # CPU milliseconds each process spent per MB pushed through the door.
        "push_door_cpu_ms_per_mb": door_ms,
        # The same bytes through a bare grpc.aio relay of the door's shape, in the same turns.
        "push_floor": adb_floor.figures(tally, options.push_mb, door_ms, direct_mbs),
        "pushes": PUSHES,
        # The control plane's RSS before the pushes and after them, MB.
        "control_plane_rss_mb": [rss_before / 1e6, rss_after / 1e6],
        # The phone holds exactly the bytes pushed through the door.
        "verified": verified,
    }
    if options.profile is not None:
        result["profile"] = {name: profiling.fold(raw) for name, raw in pushed.profile.items()}
    return result


# The targets: the door's round trip within 10 ms of a direct one at p50; a push
# through it at half the direct speed or more.
SHELL_OVERHEAD_MS = 10.0
PUSH_SHARE = 0.5


def rows(adb: dict[str, Any] | None) -> list[Row]:
    if not adb:
        return []
    name, over = "13 adb door", adb["shell_overhead_ms"]
    return [
        Row(name, "adb shell echo, direct, ms", pcts(adb["shell_direct_ms"])),
        Row(name, "adb shell echo, through the door, ms", pcts(adb["shell_door_ms"])),
        Row(
            name,
            "  the door's own cost (p50 / p99), ms",
            f"{over['p50']:.1f} / {over['p99']:.1f}",
            f"p50 <= {SHELL_OVERHEAD_MS:g}",
            over["p50"] <= SHELL_OVERHEAD_MS,
        ),
        Row(
            name,
            f"push of {adb['push_mb']} MB, MB/s direct / door",
            f"{adb['push_direct_mb_s']:.1f} / {adb['push_door_mb_s']:.1f}"
            f" ({adb['push_ratio']:.0%}){'' if adb['verified'] else '; NOT on the phone'}",
            f">= {PUSH_SHARE:.0%} of direct",
            adb["push_ratio"] >= PUSH_SHARE and adb["verified"],
        ),
        *adb_floor.rows(adb),
    ]
