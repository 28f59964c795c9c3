"""Emulator pools in the chaos run (issue 38): one more host agent, `chaos-e0` (label
pool=emulators), runs a pool of emulator doubles (tests/support/fakes/emulator.py, the
`emulator` program's stand-in: its command line, its console, the device it registers with
a real adb server of the harness's own) with `--emulator AVD@chaos_boot:MIN:MAX`. Each
instance is reset between leases by a load of `chaos_boot` over its console; the workload's
emulator tasks and sessions start from `chaos_boot` (the instance is fresh from it: no load)
or from `chaos_app` (loaded at the lease's start, during the task).

The faults, each on one instance and fired once (set in the double's faults file, cleared
as soon as the double's events file shows it fired, FIRE_WITHIN at most):

    emu_die_in_load       the instance dies during its reset's load (of chaos_boot, between
                          leases): it is started afresh, and its clean passes or fails
    emu_die_in_task_load  the instance dies during the load of a task's start snapshot
                          (chaos_app, at the lease's start; a task pinned to it asks for
                          one): its task is given back as device_lost
    emu_load_fails        a load answers `KO:` (the reset's or a task's)
    emu_load_hang         a load never answers: it fails at --emulator-load-timeout
    emu_agent_kill        the emulator host's agent killed (SIGKILL) and started again: its
                          instances, in sessions of their own, outlive it
    emu_boot_fails        the reset's load fails and the start that follows exits before
                          it boots (as a start does whose disk cannot be opened), and so
                          does every start until its recovery ladder leaves it to an
                          operator: the instance is `down`, its clean fails, it is
                          quarantined; after the fault, an operator releases it

After each, the instance is seen ready again (released by the operator if its ladder left
it waiting for one), as the phone faults' phones are; after emu_agent_kill, the pool's
minimum of new instances.

Invariant 14 (from the database and the double's events file), beside invariant 12 (no
lease on a phone whose last clean failed: chaos_lib/cleaning.py, which reads every host's
cleaning reports, the emulators' among them; their clean's failures are dated by the
double's events, see `clean_commands`):

    a  a task whose emulator died under its attempt was given back (the attempt ended
       `released`, the task's event `device_lost`), not failed, and ended done (a
       session ends failed, "device lost", as invariant 9 wants: its client is attached
       to that phone); a death in a load of the pool's snapshot is a reset's, after
       the run, whose result stands even while it is still being reported (the host
       agent starts the reset as the report goes)
    b  an instance that died, or whose load failed or hung, was started afresh: a new
       process of the same serial registered with adb within RESTART_BOUND (for
       emu_boot_fails: within RESTART_BOUND of the fault's end)
    c  the pool kept its minimum: once MIN instances had registered, the instances alive
       (between a `registered` event and their process's end) were below MIN no longer
       than RESTART_BOUND at a time, but while an emu_boot_fails fault kept one down or
       its agent was away (emu_agent_kill), and MIN of them were ready at the quiesce
    d  the instances a killed agent left running were stopped (their `killed` event)
       within LEFTOVER_BOUND of its start again, not kept beside its new ones
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import fcntl
import json
import os
import random
import secrets
import signal
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import grpc

from amc_common.device_selector import HOST_LABEL as HOST_ID
from amc_testing.emulators import AdbServer, install_double, make_avd
from chaos_lib import phones
from chaos_lib.evidence import Action

HOST = "chaos-e0"
POOL_LABEL = "emulators"  # its `pool` label
AVD = "Chaos_API_34"
BOOT = "chaos_boot"  # the pool's snapshot: every reset loads it
APP = "chaos_app"  # another a task may start from: loaded at its lease's start
MIN, MAX = 2, 3
# Its console/adb ports: one slot of these, held (an exclusive lock) for the run, so runs
# at once on one machine never share a port; below the tests' and the bench's 5600-5682.
PORT_SLOTS = ((5554, 5566), (5568, 5580), (5582, 5594))
LOAD_SECONDS = 0.3
BOOT_SECONDS = 0.3
LOAD_TIMEOUT = 2.0  # --emulator-load-timeout: a hung load fails after it
BOOT_TIMEOUT = 15.0  # --emulator-boot-timeout
IDLE = 20.0  # --emulator-idle: an instance above the minimum idle this long is stopped
# The agent's cleaning profile: a reset (a load, maybe a restart) has this long.
CLEAN_TIMEOUT = 20.0
FIRE_WITHIN = 30.0
# After firing, emu_boot_fails keeps the instance from starting until its recovery ladder
# leaves it to an operator, this long at most.
DOWN_WITHIN = 30.0
READY_WITHIN = 60.0
RESTART_BOUND = 20.0
KINDS = (
    "emu_die_in_load",
    "emu_die_in_task_load",
    "emu_load_fails",
    "emu_load_hang",
    "emu_boot_fails",
    "emu_agent_kill",
)
LEFTOVER_BOUND = 30.0
# What each fault writes for its instance, and the event of the double that says it fired.
ENTRIES: dict[str, tuple[dict[str, Any], str]] = {
    "emu_die_in_load": ({"die_in_load": True, "only": BOOT}, "died"),
    "emu_die_in_task_load": ({"die_in_load": True, "only": APP}, "died"),
    "emu_load_fails": ({"load_fails": "chaos: snapshot file is corrupt"}, "load_failed"),
    "emu_load_hang": ({"hang_load": True}, "hung"),
    "emu_boot_fails": (
        {"load_fails": "chaos: snapshot file is corrupt", "only": BOOT, "boot_fails": "chaos: "
         "cannot open disk"},
        "refused",
    ),
}  # fmt: skip
SELECTOR_KIND = "emulator"  # the workload's `selector` of its emulator tasks


@dataclass
class EmulatorWorld:
    """The emulator host's surroundings: the AVD (two snapshots), the double on PATH, a
    console token, a private adb server, the faults file and the events file."""

    root: Path
    adb: AdbServer
    faults: Path
    events: Path
    env: dict[str, str]
    ports: tuple[int, int] = PORT_SLOTS[0]
    claimed: set[str] = field(default_factory=set)  # serials a fault is on
    _entries: dict[str, dict[str, Any]] = field(default_factory=dict)
    _slot: Any = None  # the open lock file of its ports' slot

    @classmethod
    async def make(cls, workdir: Path) -> EmulatorWorld:
        root = workdir / "emulators"
        home, avds, bin_dir = root / "home", root / "avd", root / "bin"
        home.mkdir(parents=True, exist_ok=True)
        make_avd(avds, AVD, snapshots=(BOOT, APP))
        install_double(bin_dir)
        # A token of its own: another run's agent cannot talk to (or kill) its emulators.
        (home / ".emulator_console_auth_token").write_text(secrets.token_hex(8))
        ports, slot = claim_ports()
        adb = AdbServer(root / "adb")
        await adb.start()
        world = cls(root, adb, root / "faults.json", root / "events.jsonl", {}, ports)
        world._slot = slot
        world.env = {
            "HOME": str(home),
            "ANDROID_AVD_HOME": str(avds),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "AMC_FAKE_EMULATOR_LOAD_SECONDS": str(LOAD_SECONDS),
            "AMC_FAKE_EMULATOR_BOOT_SECONDS": str(BOOT_SECONDS),
            "AMC_FAKE_EMULATOR_FAULTS": str(world.faults),
            "AMC_FAKE_EMULATOR_EVENTS": str(world.events),
        }
        world._write()
        return world

    @property
    def adb_address(self) -> str:
        return f"127.0.0.1:{self.adb.port}"

    def agent_args(self) -> list[str]:
        return [
            "--emulator", f"{AVD}@{BOOT}:{MIN}:{MAX}",
            "--emulator-budget", "0.01,1MB",
            "--emulator-ports", "{}-{}".format(*self.ports),
            "--emulator-load-timeout", f"{LOAD_TIMEOUT:g}s",
            "--emulator-boot-timeout", f"{BOOT_TIMEOUT:g}s",
            "--emulator-idle", f"{IDLE:g}s",
        ]  # fmt: skip

    def set(self, serial: str, entry: dict[str, Any]) -> None:
        self._entries[serial.removeprefix("emulator-")] = entry
        self._write()

    def clear(self, serial: str) -> None:
        self._entries.pop(serial.removeprefix("emulator-"), None)
        self._write()

    def _write(self) -> None:
        scratch = self.faults.with_suffix(".tmp")
        scratch.write_text(json.dumps(self._entries), "utf-8")
        os.replace(scratch, self.faults)  # the double reads whole files only

    def read_events(self) -> list[dict[str, Any]]:
        if not self.events.exists():
            return []
        found = []
        for line in self.events.read_text("utf-8").splitlines():
            with contextlib.suppress(ValueError):
                found.append(json.loads(line))
        return found

    def kill_leftovers(self) -> list[int]:
        """SIGKILL every double the events file says started and that still runs (an agent
        killed hard leaves its emulators behind: they run in sessions of their own)."""
        killed = []
        for pid in {e["pid"] for e in self.read_events() if e["event"] == "started"}:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                if _is_double(pid):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        return killed

    async def close(self) -> None:
        await self.adb.stop()
        if self._slot is not None:
            self._slot.close()  # its lock goes with it


def claim_ports() -> tuple[tuple[int, int], Any]:
    """The first of PORT_SLOTS no other run on this machine holds, and its lock file (held
    until closed, or until this process ends)."""
    for first, last in PORT_SLOTS:
        lock = open(Path(tempfile.gettempdir()) / f"amc-chaos-emulator-ports-{first}.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        return (first, last), lock
    raise RuntimeError(
        f"every emulator port slot {PORT_SLOTS} is held by another chaos run on this machine"
    )


def _is_double(pid: int) -> bool:
    try:
        return "tests.support.fakes.emulator" in Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return False


def write_profile(workdir: Path) -> Path:
    path = workdir / "clean-profile-emulators.yaml"
    path.write_text(f"defaults:\n  timeout: {CLEAN_TIMEOUT:g}s\n", "utf-8")
    return path


# -- the faults -------------------------------------------------------------------------------


async def instances(dsn: str) -> list[tuple[str, str, str | None]]:
    """The emulator host's phones the control plane lists: serial, condition, task."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        rows = await conn.fetch(
            "SELECT serial, CASE WHEN state = 'device' THEN condition ELSE state END AS cond,"
            " task_id::text AS task_id FROM devices WHERE host_id = $1 AND serial LIKE"
            " 'emulator-%' ORDER BY serial",
            HOST,
        )
    finally:
        await conn.close()
    return [(r["serial"], r["cond"], r["task_id"]) for r in rows]


async def pick(kind: str, world: EmulatorWorld, dsn: str, rng: random.Random) -> str | None:
    """An instance for `kind`: one running a task (its reset comes soon), or for a task's
    load an idle ready one (a task pinned to it will ask for chaos_app)."""
    listed = [i for i in await instances(dsn) if i[0] not in world.claimed]
    busy = [s for s, cond, task in listed if task is not None]
    ready = [s for s, cond, task in listed if task is None and cond == "ready"]
    if kind == "emu_die_in_task_load":
        choice = ready or busy
    else:
        choice = busy or ready
    return rng.choice(choice) if choice else None


async def inject(
    fault: Any,
    world: EmulatorWorld,
    operator: phones.Operator,
    rng: random.Random,
    pin: Any,
) -> None:
    """One fault on one instance (see the module docstring); `pin(serial)` submits a task
    pinned to it that starts from chaos_app, and returns its Submitted."""
    serial = None
    deadline = time.monotonic() + FIRE_WITHIN
    while serial is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            serial = await pick(fault.kind, world, operator.dsn, rng)
        if serial is None:
            await asyncio.sleep(0.5)
    if serial is None:
        fault.error = "no emulator to break"
        return
    world.claimed.add(serial)
    try:
        await _on(fault, serial, world, operator, pin)
    finally:
        world.claimed.discard(serial)


async def _on(
    fault: Any,
    serial: str,
    world: EmulatorWorld,
    operator: phones.Operator,
    pin: Any,
) -> None:
    entry, fired_by = ENTRIES[fault.kind]
    fault.detail.update(serial=serial, fault=entry)
    released = operator.released[phones.target(HOST, serial)]
    set_at = time.time()
    world.set(serial, entry)
    try:
        if fault.kind == "emu_die_in_task_load":
            fault.detail["task_id"] = (await pin(serial)).task_id
        fired = await _fired(world, serial, fired_by, set_at, FIRE_WITHIN)
        fault.detail["fired"] = fired is not None
        if fired is not None:
            fault.detail["fired_at"] = fired["at"]
        if fault.kind == "emu_boot_fails" and fired is not None:
            # Its ladder's restart fails too, until the ladder leaves it to an operator.
            fault.detail["waited_for_operator"] = await _waits_for_operator(
                operator, serial, DOWN_WITHIN
            )
    finally:
        world.clear(serial)
    fault.healed_at = time.time()
    if await back_in_service(operator, serial, READY_WITHIN):
        fault.recovered_at = time.time()
        fault.detail["ready_again_s"] = round(fault.recovered_at - fault.healed_at, 3)
    else:
        fault.error = f"not ready within {READY_WITHIN:g}s of the fault's end"
    fault.detail["released"] = operator.released[phones.target(HOST, serial)] - released


async def back_in_service(operator: phones.Operator, serial: str, within: float) -> bool:
    """As phones.Operator.back_in_service, but an instance its ladder left waiting for an
    operator is released whatever adb says of it: one that did not start again is not
    listed by adb (no process registers it), so the control plane has it offline too."""
    deadline = time.monotonic() + within
    released = -phones.RELEASE_AGAIN
    while time.monotonic() < deadline:
        try:
            state, condition, reason = await _condition(operator.dsn, serial)
            if (state, condition) == ("device", "ready"):
                return True
            if (
                condition == "quarantined"
                and reason.endswith("waits for an operator")
                and time.monotonic() - released > phones.RELEASE_AGAIN
            ):
                await operator.release(HOST, serial)
                released = time.monotonic()
                operator.released[phones.target(HOST, serial)] += 1
        except (OSError, asyncpg.PostgresError, grpc.aio.AioRpcError):
            pass  # a replica or the database is down (another fault): look again
        await asyncio.sleep(0.5)
    return False


async def _waits_for_operator(operator: phones.Operator, serial: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            _, _, reason = await _condition(operator.dsn, serial)
            if reason.endswith("waits for an operator"):
                return True
        await asyncio.sleep(0.3)
    return False


async def _condition(dsn: str, serial: str) -> tuple[str, str, str]:
    """The instance's state (adb's, as its host lists it), condition and its reason."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        row = await conn.fetchrow(
            "SELECT state, condition, condition_reason FROM devices"
            " WHERE host_id = $1 AND serial = $2",
            HOST,
            serial,
        )
    finally:
        await conn.close()
    if row is None:
        return "", "", ""
    return row["state"], row["condition"], row["condition_reason"]


async def _fired(
    world: EmulatorWorld, serial: str, kind: str, since: float, within: float
) -> dict[str, Any] | None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        for e in world.read_events():
            if e["event"] == kind and e["serial"] == serial and e["at"] >= since:
                return e
        await asyncio.sleep(0.1)
    return None


async def pool_back(world: EmulatorWorld, dsn: str, since: float, within: float) -> int:
    """After the agent started again: MIN new instances registered with adb, then ready."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        fresh = [e for e in world.read_events() if e["event"] == "registered" and e["at"] > since]
        if len(fresh) >= MIN:
            return await pool_ready(dsn, max(0.0, deadline - time.monotonic()))
        await asyncio.sleep(0.2)
    return 0


async def pool_ready(dsn: str, within: float) -> int:
    """Waits (at the quiesce) until MIN of the pool's instances are ready; how many are."""
    deadline = time.monotonic() + within
    count = 0
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, asyncpg.PostgresError):
            count = sum(1 for _, cond, _ in await instances(dsn) if cond == "ready")
            if count >= MIN:
                return count
        await asyncio.sleep(0.5)
    return count


# -- the workload ----------------------------------------------------------------------------


class EmulatorLoad:
    """Keeps OPEN_TASKS tasks for the pool queued or running (through the workload, so the
    invariants know them), each starting from chaos_boot or chaos_app at random."""

    OPEN_TASKS = 4

    def __init__(self, workload: Any, dsn: str, rng: random.Random) -> None:
        self.workload = workload
        self.dsn = dsn
        self.rng = rng
        self.submitted: list[Any] = []

    async def pin(self, serial: str) -> Any:
        """A task for one instance of the pool that starts from chaos_app."""
        item = await self.workload.submit_emulator(APP, {"pool": POOL_LABEL, HOST_ID: HOST}, serial)
        self.submitted.append(item)
        return item

    async def run_forever(self) -> None:
        conn: asyncpg.Connection | None = None
        try:
            while True:
                try:
                    if conn is None or conn.is_closed():
                        conn = await asyncpg.connect(self.dsn, timeout=5)
                    ids = [s.task_id for s in self.submitted if s.task_id]
                    open_now = await conn.fetchval(
                        "SELECT count(*) FROM tasks WHERE task_id = ANY($1::uuid[])"
                        " AND status IN ('queued', 'assigned', 'dispatched')",
                        ids,
                    )
                    for _ in range(self.OPEN_TASKS - open_now):
                        snapshot = self.rng.choice((BOOT, APP))
                        self.submitted.append(
                            await self.workload.submit_emulator(snapshot, {"pool": POOL_LABEL})
                        )
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
                    conn = None  # the database is away (another fault): look again
                except grpc.aio.AioRpcError:
                    pass  # counted by the workload; submit again at the next look
                await asyncio.sleep(0.5)
        finally:
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close(timeout=2)

    def counts(self) -> dict[str, int]:
        return dict(Counter(s.request.spec.start_snapshot for s in self.submitted if s.request))


# -- invariant 14 -----------------------------------------------------------------------------


@dataclass
class EmulatorVerdict:
    violations: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)
    longest_below_min_s: float = 0.0


def clean_commands(events: list[dict[str, Any]]) -> list[Action]:
    """The double's resets, as invariant 12 reads clean commands (chaos_lib/cleaning.py):
    a load of the pool's snapshot (only a reset loads it) until it ended (loaded, failed,
    died), and each start it refused. The emulator host keeps no action log."""
    made: list[Action] = []
    loading: dict[str, float] = {}
    for e in sorted(events, key=lambda e: e["at"]):
        serial, at = e["serial"], e["at"]
        if e["event"] == "loading" and e.get("snapshot") == BOOT:
            loading[serial] = at
        elif e["event"] in ("loaded", "load_failed", "died", "killed") and serial in loading:
            made.append(Action(HOST, serial, "clean", loading.pop(serial), at, e["event"]))
        elif e["event"] == "refused":
            made.append(Action(HOST, serial, "clean", at, at, "refused"))
    return made


def check(
    events: list[dict[str, Any]],
    tasks: dict[str, dict[str, Any]],
    attempts: dict[tuple[str, int], dict[str, Any]],
    task_events: dict[str, list[dict[str, Any]]],
    faults: list[Any],
    ready_at_end: int,
    run_ended: float,
) -> EmulatorVerdict:
    """Invariant 14 (see the module docstring)."""
    verdict = EmulatorVerdict()
    events = sorted(events, key=lambda e: e["at"])
    for kind in ("started", "registered", "loading", "loaded", "load_failed", "hung", "died"):
        verdict.stats[f"double: {kind}"] = sum(1 for e in events if e["event"] == kind)
    verdict.stats["double: refused to start"] = sum(1 for e in events if e["event"] == "refused")
    _given_back(events, tasks, attempts, task_events, verdict)
    downs = [
        (f.started_at, (f.recovered_at or f.healed_at or run_ended) + RESTART_BOUND)
        for f in faults
        if f.kind in ("emu_boot_fails", "emu_agent_kill")
    ]
    _started_afresh(events, downs, run_ended, verdict)
    _leftovers_stopped(events, faults, verdict)
    _kept_minimum(events, downs, run_ended, verdict)
    verdict.stats["instances ready at the quiesce"] = ready_at_end
    if ready_at_end < MIN:
        verdict.violations.append(
            ("the pool was below its minimum at the quiesce", {"ready": ready_at_end, "min": MIN})
        )
    return verdict


def _given_back(
    events: list[dict[str, Any]],
    tasks: dict[str, dict[str, Any]],
    attempts: dict[tuple[str, int], dict[str, Any]],
    task_events: dict[str, list[dict[str, Any]]],
    verdict: EmulatorVerdict,
) -> None:
    mine = [a for a in attempts.values() if a["host_id"] == HOST]
    loading: dict[str, str] = {}  # the snapshot each instance is loading, if any
    for died in events:
        if died["event"] == "loading":
            loading[died["serial"]] = died.get("snapshot", "")
        elif died["event"] in ("loaded", "load_failed", "killed", "registered"):
            loading.pop(died["serial"], None)
        if died["event"] != "died":
            continue
        if loading.pop(died["serial"], None) == BOOT:
            # A reset's load (only a reset loads the pool's snapshot): after its lease's
            # run, whose result stands, even while that result is still being reported.
            verdict.stats["deaths between leases (in a reset)"] += 1
            continue
        under = [
            a
            for a in mine
            if a["device_serial"] == died["serial"]
            and a["created_at"] <= died["at"]
            and (a["ended_at"] is None or a["ended_at"] >= died["at"])
        ]
        if not under:
            verdict.stats["deaths between leases (in a reset)"] += 1
            continue
        for a in under:
            verdict.stats["deaths under a task's attempt"] += 1
            task_id, t = a["task_id"], tasks.get(a["task_id"])
            if t is not None and "session" in (t.get("metadata") or {}):
                # Its client is attached to that phone: it ends failed, "device lost"
                # (invariant 9 judges how a session ends).
                verdict.stats[f"sessions whose emulator died, then {t['status']}"] += 1
                continue
            lost = any(
                e["kind"] == "device_lost" and e["attempt"] == a["attempt"]
                for e in task_events.get(task_id, [])
            )
            detail = {
                "task_id": task_id,
                "attempt": a["attempt"],
                "serial": died["serial"],
                "died_at": died["at"],
                "attempt_ended": a["state"],
                "status": t and t["status"],
            }
            if not lost or a["state"] != "released":
                why = "an attempt whose emulator died was not given back as device_lost"
                verdict.violations.append((why, detail))
            elif t is None or (t["status"] != "done" and t["cancel_requested_at"] is None):
                verdict.violations.append(("a task whose emulator died did not end done", detail))
            else:
                verdict.stats[f"tasks given back as device_lost, then {t['status']}"] += 1


def _leftovers_stopped(
    events: list[dict[str, Any]], faults: list[Any], verdict: EmulatorVerdict
) -> None:
    for f in faults:
        if f.kind != "emu_agent_kill" or f.healed_at is None:
            continue
        alive: dict[int, str] = {}
        for e in events:
            if e["at"] > f.started_at:
                break
            if e["event"] == "registered":
                alive[e["pid"]] = e["serial"]
            elif e["event"] in ("died", "killed"):
                alive.pop(e["pid"], None)
        for pid, serial in alive.items():
            ended = [
                e["at"] for e in events if e["pid"] == pid and e["event"] in ("died", "killed")
            ]
            verdict.stats["instances a killed agent left running"] += 1
            if not ended or ended[0] > f.healed_at + LEFTOVER_BOUND:
                verdict.violations.append(
                    (
                        "an emulator a killed agent left running was not stopped",
                        {"serial": serial, "pid": pid, "agent_back_at": f.healed_at},
                    )
                )
            else:
                verdict.stats["of those stopped by the agent started again"] += 1


def _alive(events: list[dict[str, Any]]) -> list[tuple[float, int]]:
    """(time, +1/-1) as instances register with adb and their processes end."""
    changes = []
    up: dict[int, bool] = {}
    for e in events:
        pid = e["pid"]
        if e["event"] == "registered" and not up.get(pid):
            up[pid] = True
            changes.append((e["at"], 1))
        elif e["event"] in ("died", "killed") and up.get(pid):
            up[pid] = False
            changes.append((e["at"], -1))
    return changes


def _excused(start: float, end: float, downs: list[tuple[float, float]]) -> bool:
    return any(lo <= end and start <= hi and end <= hi for lo, hi in downs)


def _started_afresh(
    events: list[dict[str, Any]],
    downs: list[tuple[float, float]],
    run_ended: float,
    verdict: EmulatorVerdict,
) -> None:
    registered: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e["event"] == "registered":
            registered[e["serial"]].append(e["at"])
    for e in events:
        # A task's load that failed or hung leaves the instance to its reset (it is given
        # back as device_lost; the reset loads the pool's snapshot or starts it afresh).
        reset = e.get("snapshot") == BOOT
        if e["event"] != "died" and not (e["event"] in ("load_failed", "hung") and reset):
            continue
        verdict.stats[f"instances to start afresh after: {e['event']}"] += 1
        later = registered[e["serial"]]
        i = bisect.bisect_right(later, e["at"])
        again = later[i] if i < len(later) else None
        bound = max([hi for lo, hi in downs if lo <= e["at"] <= hi] + [e["at"] + RESTART_BOUND])
        if again is None and min(bound, run_ended) >= run_ended:
            continue  # the run ended first
        if again is None or again > bound:
            verdict.violations.append(
                (
                    "an emulator that died or whose load failed was not started afresh",
                    {"serial": e["serial"], "event": e["event"], "at": e["at"], "again": again},
                )
            )
        else:
            verdict.stats["instances started afresh"] += 1


def _kept_minimum(
    events: list[dict[str, Any]],
    downs: list[tuple[float, float]],
    run_ended: float,
    verdict: EmulatorVerdict,
) -> None:
    alive, below_since, reached = 0, None, False
    for at, change in _alive(events):
        if at > run_ended:
            break
        alive += change
        reached = reached or alive >= MIN
        if not reached:
            continue
        if alive < MIN and below_since is None:
            below_since = at
        elif alive >= MIN and below_since is not None:
            _below(below_since, at, downs, verdict)
            below_since = None
    if below_since is not None:
        _below(below_since, run_ended, downs, verdict)


def _below(
    start: float, end: float, downs: list[tuple[float, float]], verdict: EmulatorVerdict
) -> None:
    span = end - start
    verdict.stats["spans below the minimum"] += 1
    verdict.longest_below_min_s = max(verdict.longest_below_min_s, round(span, 3))
    if span > RESTART_BOUND and not _excused(start, end, downs):
        verdict.violations.append(
            (
                "the pool stayed below its minimum",
                {"from": start, "to": end, "span_s": round(span, 3), "bound_s": RESTART_BOUND},
            )
        )


def summary(faults: list[Any], verdict: EmulatorVerdict) -> dict[str, Any]:
    mine = [f for f in faults if f.kind in KINDS]
    fired = [f for f in mine if f.detail.get("fired")]
    return {
        "faults": {k: sum(1 for f in mine if f.kind == k) for k in KINDS},
        "fired": {k: sum(1 for f in fired if f.kind == k) for k in KINDS},
        "ready_again_s": sorted(f.detail["ready_again_s"] for f in mine if f.recovered_at),
        "released_by_operator": sum(1 for f in mine if f.detail.get("released")),
        "longest_below_min_s": verdict.longest_below_min_s,
        "details": dict(sorted(verdict.stats.items())),
        "violations": len(verdict.violations),
    }
