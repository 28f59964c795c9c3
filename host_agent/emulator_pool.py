"""The emulators this host runs, a pool per AVD: each instance started `-read-only
-no-window` on a console/adb port pair of its own (console N, adb N+1, serial
`emulator-N`), kept at its pool's minimum, grown toward its maximum when the control plane
says tasks wait for it (`want`, pushed on the renewal stream), within the host's CPUs and
memory (a budget per instance), shrunk to the minimum after an idle period, and started
afresh when its process dies or a snapshot load fails.

    starting ──(adb lists it, booted; its console answers)──▶ up ──(idle past --emulator-idle,
       ▲                                                      │    above the minimum: retired
       └──────────── restarting ◀── its process died, ────────┘    first, so no Acquire
                         │          or a load failed                offers it; then killed)
                         └─(it did not start: once, no retry)──▶ down: quarantined, the
                             recovery ladder's reboot is the next restart (host_agent.recovery)

The phone's own life (ready, leased, cleaning) is host_agent.device_life's; the pool asks
it (`PoolHost`): whether an instance is ready (idle), to retire one before it is stopped,
to stop the task on one whose process died (given back as device_lost) before it is
started again, and to clean a fresh one before its first lease. Every instance is one
process of the `emulator` program with ANDROID_ADB_SERVER_PORT set to the agent's adb
server, which it registers with (`host:emulator:<adb port>`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import structlog

from host_agent.devices import DeviceError, DeviceLost, DeviceUnresponsive, PoolHost
from host_agent.emulator_config import EmulatorSettings, PoolSpec, available_memory
from host_agent.emulator_console import Console, KeptConsole

log = structlog.get_logger(__name__)

# How often the pools are looked at (jittered), and the most a failing pool waits to try
# again; how long a killed emulator has to exit before it is killed harder.
TICK = 1.0
RETRY_CAP = 60.0
EXIT_GRACE = 5.0
CONSOLE_TIMEOUT = 10.0
CONSOLE_PROBE = 2.0  # a leftover's console, asked its AVD's name at start
ANSWER_POLL = 0.1


@dataclass(eq=False)
class Instance:
    pool: PoolSpec
    port: int
    console: KeptConsole  # its console's connection, kept while its process runs
    state: str = "starting"  # starting, up, restarting, down, retiring
    process: asyncio.subprocess.Process | None = None
    snapshots: tuple[str, ...] = ()
    fresh_from: str | None = None  # what its last reset loaded, while no lease began since
    ready_since: float | None = None
    restarting: asyncio.Task[str] | None = None
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=20))

    @property
    def serial(self) -> str:
        return f"emulator-{self.port}"


class Emulators:
    """Every pool of this host (see the module docstring); `answers(serial)` says whether
    adb lists the phone online and booted."""

    def __init__(
        self,
        settings: EmulatorSettings,
        answers: Callable[[str], Awaitable[bool]],
        labels: Mapping[str, str] = {},
    ) -> None:
        self.settings = settings
        self._answers = answers
        self._labels = dict(labels)
        self.instances: dict[str, Instance] = {}
        self._host: PoolHost | None = None
        self._grow: dict[str, int] = {}
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Future[Any]] = set()

    # -- what the agent asks --------------------------------------------------------------

    def advertised(self) -> list[tuple[str, dict[str, str]]]:
        return [(p.name, self._labels | p.device_labels()) for p in self.settings.pools]

    def want(self, wanted: Mapping[str, int]) -> None:
        """The control plane's count of the tasks that wait for each pool: each grows by
        that many less those it is starting (edge-triggered: once per count pushed)."""
        for pool in self.settings.pools:
            self._grow[pool.name] = max(0, wanted.get(pool.name, 0))
        self._wake.set()

    def instance(self, serial: str) -> Instance | None:
        return self.instances.get(serial)

    def shown(self, serial: str) -> bool:
        """Whether the phone is listed in the inventory (up, or restarting); an emulator on
        the pools' ports that is not one of their instances never is (a leftover)."""
        found = self.instances.get(serial)
        return found is not None and found.state in ("up", "restarting", "down")

    def on_our_ports(self, serial: str) -> bool:
        port = serial.removeprefix("emulator-")
        first, last = self.settings.ports
        return port.isdigit() and first <= int(port) <= last

    async def run(self, host: PoolHost) -> None:
        """Keep the pools until cancelled; the instances run on until `close()` (the
        agent's cleans are cancelled first, so none fails for an instance stopped under it)."""
        self._host = host
        try:
            await self._stop_leftovers()
            while True:
                self._tick(host)
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TICK * random.uniform(0.8, 1.2)):
                        await self._wake.wait()
        finally:
            self._host = None
            await self._unwatch()

    # -- the pools ---------------------------------------------------------------------------

    def _tick(self, host: PoolHost) -> None:
        now = time.monotonic()
        for pool in self.settings.pools:
            mine = [i for i in self.instances.values() if i.pool is pool and i.state != "retiring"]
            for i in mine:
                ready = i.state == "up" and host.ready(i.serial)
                i.ready_since = (i.ready_since or now) if ready else None
            starting = sum(1 for i in mine if i.state == "starting")
            more = max(pool.low - len(mine), self._grow.get(pool.name, 0) - starting)
            if more > 0 and now >= self._retry_at.get(pool.name, 0.0):
                self._grow.pop(pool.name, None)
                for _ in range(min(more, pool.high - len(mine))):
                    if not self._start(pool):
                        break
            elif len(mine) > pool.low:
                self._retire_one(host, mine, now)

    async def _stop_leftovers(self) -> None:
        """Instances of the pools' AVDs that an earlier process of this agent left running
        (killed hard, it could not stop them: they run in sessions of their own) are told
        to `kill` before any instance starts: they would hold ports and memory the pools
        count on, and be offered as phones no pool resets."""
        avds = {pool.avd for pool in self.settings.pools}
        first, last = self.settings.ports
        for port in range(first + first % 2, last + 1, 2):
            if _free(port):
                continue
            console = Console(port, self.settings.token_file)
            with contextlib.suppress(DeviceError):
                named = await console.command("avd name", CONSOLE_PROBE)
                if named and named[0].strip() in avds:
                    log.warning("emulator left running by an earlier agent: stopping it", port=port)
                    await console.kill(CONSOLE_PROBE)

    def _retire_one(self, host: PoolHost, mine: list[Instance], now: float) -> None:
        idle = [i for i in mine if i.ready_since and now - i.ready_since >= self.settings.idle]
        if idle:
            oldest = min(idle, key=lambda i: i.ready_since or now)
            if host.retire(oldest.serial):
                oldest.state = "retiring"
                self._spawn(self._stop_for_good(oldest))

    def _start(self, pool: PoolSpec) -> bool:
        """One more instance of `pool`, if the host has room and a free port pair."""
        if not self._room():
            log.info("emulator pool at the host's budget", pool=pool.name)
            return False
        port = self._free_port()
        if port is None:
            log.warning("no free console/adb port pair for an emulator", pool=pool.name)
            return False
        console = KeptConsole(port, self.settings.token_file)
        instance = self.instances[f"emulator-{port}"] = Instance(pool, port, console)
        self._spawn(self._bring_up(instance))
        return True

    def _room(self) -> bool:
        budget = self.settings.budget
        cpus = (len(self.instances) + 1) * budget.cpus
        return cpus <= (os.cpu_count() or 1) and budget.memory <= available_memory()

    def _free_port(self) -> int | None:
        first, last = self.settings.ports
        taken = {i.port for i in self.instances.values()}
        for port in range(first + first % 2, last + 1, 2):
            if port not in taken and _free(port) and _free(port + 1):
                return port
        return None

    async def _bring_up(self, instance: Instance) -> None:
        pool, host = instance.pool, self._host
        try:
            await self._launch(instance)
        except DeviceError as exc:
            failures = self._failures[pool.name] = self._failures.get(pool.name, 0) + 1
            pause = min(RETRY_CAP, 2.0**failures)
            self._retry_at[pool.name] = time.monotonic() + pause
            log.warning("emulator did not start", pool=pool.name, error=str(exc), retry_in=pause)
            await self._kill(instance)
            self.instances.pop(instance.serial, None)
            return
        self._failures.pop(pool.name, None)
        instance.state = "up"
        log.info("emulator up", pool=pool.name, serial=instance.serial)
        if host is not None:
            host.fresh(instance.serial)
            await host.changed()

    async def _launch(self, instance: Instance) -> None:
        """Start the process and wait until adb lists it booted and its console answers."""
        s, pool = self.settings, instance.pool
        argv = [str(s.binary), "-avd", pool.avd, "-read-only", "-no-window", "-no-audio"]
        argv += ["-no-boot-anim", "-port", str(instance.port), "-snapshot", pool.snapshot]
        argv += ["-no-snapshot-save"]
        env = {**os.environ, "ANDROID_ADB_SERVER_PORT": str(s.adb_port)}
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise DeviceError(f"{s.binary}: {exc.strerror or exc}") from None
        instance.process = process
        instance.tail.clear()
        self._spawn(self._follow(instance, process))
        try:
            async with asyncio.timeout(s.boot_timeout):
                while not await self._answers(instance.serial):
                    if process.returncode is not None:
                        said = " | ".join(instance.tail) or "no output"
                        raise DeviceLost(f"emulator exited {process.returncode}: {said}")
                    await asyncio.sleep(ANSWER_POLL)
        except TimeoutError:
            raise DeviceUnresponsive(f"not booted within {s.boot_timeout:g}s") from None
        instance.snapshots = tuple(await instance.console.snapshots(CONSOLE_TIMEOUT))
        instance.fresh_from = pool.snapshot

    async def _follow(self, instance: Instance, process: asyncio.subprocess.Process) -> None:
        """Its output (the last lines kept, for a start that failed), then its exit: a
        process that died unasked is started afresh."""
        assert process.stdout is not None
        while line := await process.stdout.readline():
            instance.tail.append(line.decode(errors="replace").rstrip())
        code = await process.wait()
        if instance.process is process and instance.state == "up":
            log.warning("emulator died; starting it afresh", serial=instance.serial, exit=code)
            why = f"its process exited ({code})"
            try:
                await self.restart(instance.serial, why, lost=True)
            except DeviceError as exc:  # it would not start again: the ladder has it
                if self._host is not None:
                    self._host.broken(instance.serial, f"{why}; {exc}")

    # -- resets and restarts ---------------------------------------------------------------------

    async def reset(self, serial: str, snapshot: str, *, heal: bool) -> str:
        """Load `snapshot` over the console and see the phone answer after it: what was
        done. A load that fails (or a phone that does not answer after it) starts the
        instance afresh when `heal` (between leases), else raises DeviceLost, at once while it
        is started afresh (a restart after a death waits for the lease's task to end)."""
        instance = self._alive(serial)
        if instance.restarting is not None and not instance.restarting.done():
            if not heal:  # a lease's load: its instance is started afresh under it
                raise DeviceLost(f"device lost: {serial}: it is being started afresh")
            await asyncio.shield(instance.restarting)
        began = time.monotonic()
        try:
            await self._load(instance, snapshot)
        except DeviceError as exc:
            if not heal:
                raise DeviceLost(f"device lost: {serial}: {exc}") from None
            why = f"load of {snapshot} failed: {exc}"
            started = await self.restart(serial, why)
            if snapshot != instance.pool.snapshot:
                await self._load(instance, snapshot)
            instance.fresh_from = snapshot
            return f"{why}; {started}"
        instance.fresh_from = snapshot
        return f"loaded {snapshot} in {time.monotonic() - began:.2f}s"

    async def _load(self, instance: Instance, snapshot: str) -> None:
        instance.fresh_from = None
        await instance.console.load(snapshot, self.settings.load_timeout)
        if not await self._answers(instance.serial):
            raise DeviceUnresponsive(f"{instance.serial} did not answer after the load")

    def begin_lease(self, serial: str) -> str | None:
        """A lease begins: the snapshot the instance is fresh from (None: none)."""
        instance = self._alive(serial)
        fresh, instance.fresh_from = instance.fresh_from, None
        return fresh

    async def restart(self, serial: str, why: str, *, lost: bool = False) -> str:
        """Start the instance afresh, once (one restart at a time: a second call waits for
        the first); `lost`: its process died, so its task is stopped first. What was done;
        DeviceLost when it did not start (the instance is then `down`, its process gone:
        the caller hands it to the recovery ladder, whose reboot is another restart)."""
        instance = self._alive(serial)
        if instance.restarting is None or instance.restarting.done():
            instance.restarting = asyncio.create_task(self._restart(instance, why, lost))
            self._tasks.add(instance.restarting)
            instance.restarting.add_done_callback(self._tasks.discard)
        return await asyncio.shield(instance.restarting)

    async def _restart(self, instance: Instance, why: str, lost: bool) -> str:
        began = time.monotonic()
        instance.state = "restarting"
        if lost and self._host is not None:
            await self._host.lost(instance.serial, why)
        await self._kill(instance)
        try:
            await self._launch(instance)
        except DeviceError as exc:
            log.warning("emulator restart failed", serial=instance.serial, error=str(exc))
            await self._kill(instance)
            instance.state = "down"
            raise DeviceLost(f"device lost: {instance.serial} did not start again: {exc}") from None
        instance.state = "up"
        if self._host is not None:
            await self._host.changed()
        return f"started afresh in {time.monotonic() - began:.1f}s"

    def _alive(self, serial: str) -> Instance:
        instance = self.instances.get(serial)
        if instance is None or instance.state in ("starting", "retiring"):
            raise DeviceLost(f"device lost: {serial}: no emulator runs as it")
        return instance

    async def _stop_for_good(self, instance: Instance) -> None:
        log.info("emulator idle: stopping it", serial=instance.serial)
        await self._kill(instance)
        self.instances.pop(instance.serial, None)
        if self._host is not None:
            await self._host.changed()

    async def _kill(self, instance: Instance) -> None:
        """`kill` over its console, then SIGTERM, then SIGKILL, until its process is gone."""
        instance.console.close()  # never carried over to the instance started next
        process = instance.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(DeviceError):
            await Console(instance.port, self.settings.token_file).kill(2.0)
        for signal_it in (process.terminate, process.kill):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process.wait(), EXIT_GRACE)
                return
            with contextlib.suppress(ProcessLookupError):
                signal_it()
        await process.wait()

    def _spawn(self, work: Awaitable[object]) -> None:
        task: asyncio.Future[Any] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _unwatch(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        """Stop every instance (the agent has stopped)."""
        await self._unwatch()
        for instance in list(self.instances.values()):
            instance.state = "retiring"
        await asyncio.gather(*(self._kill(i) for i in self.instances.values()))
        self.instances.clear()


def _free(port: int) -> bool:
    with socket.socket() as probe:
        # As the emulator's listening socket binds: a closed connection's TIME_WAIT does not
        # keep the port.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
