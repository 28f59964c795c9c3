"""adb doors in the chaos run: a few clients that each run `amc adb` (the real
command, a process of its own, on the agents' phones: label pool=agents) against a replica
picked at random, connect to it as an adb server does (amc_testing.adb_client: adb's
transport and AUTH with a key of the harness's own), run shell commands through it, and
end it one of three ways: stop the door (Ctrl-C: its session ends done), cancel its
session (CancelTask while a shell sleeps) or kill the door (the session is abandoned).
Replica and agent kills, freezes and cuts end some another way.

What is held against the evidence (`check`, invariant 13: a door never outlives its lease):

- on the phone: every byte a door wrote to a simulated phone, and every stream it opened
  there, came while the door's attempt held its lease and before its host's stop token
  tripped (the phones' action logs: an `adb` action per stream, with when it was opened
  and when it was last written to);
- at the client: the door hung up on its adb client (the device went offline) no later
  than DOOR_BOUND after its session's task ended;
- its session ended as asked, or for a stop that is not a cancellation (as invariant 9
  says of sessions), and the door's exit code says that end. The run's end kills the
  doors still in use (their sessions abandoned); a door whose end was asked just before
  is given DOOR_BOUND to exit by itself first, so a SIGKILL of the harness's own is never
  read as the exit code of a door that was stopped or cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from amc.v1 import scheduler_pb2
from amc_testing.adb_client import AdbClient, AdbClientKey
from chaos_lib.clients import ClientLoad
from chaos_lib.evidence import Evidence, attempt_at
from chaos_lib.invariants import _lease_end
from chaos_lib.sessions import OTHER_FAILURES

ENDINGS = {"close": 0.5, "cancel": 0.25, "abandon": 0.25}
# How long after its session's task ended a door may still be connected to its client:
# the end reaches it through its own call at once; a replica that died takes the call.
DOOR_BOUND = 5.0
# How late a phone's write may be logged against a trip or lease end (the log's clock).
SLACK = 0.05
EXIT_FOR = {"done": 0, "failed": 8, "cancelled": 9}
# The ends the harness asked of a door (its exit code must then say its session's end).
ASKED = ("closed", "cancel_acked")
ROOT = Path(__file__).resolve().parents[2]
_CONNECT = re.compile(r"^adb connect (127\.0\.0\.1:\d+)$")
_SESSION = re.compile(r"is yours: session ([0-9a-f-]{36})")


@dataclass
class DoorRecord:
    """One door as its client lived it."""

    plan: str
    replica: str
    task_id: str = ""
    opened: bool = False
    commands: int = 0
    # closed, cancelling (its CancelTask unanswered), cancel_acked, killed; or broken
    # (`detail` says how)
    did: str = ""
    detail: str = ""
    hung_up_at: float | None = None  # when the door hung up on its adb client
    exit_code: int | None = None
    at_run_end: bool = False  # its end was asked as the run's end cut the wait for it short


class DoorLoad(ClientLoad[DoorRecord]):
    FAILURES = (*ClientLoad.FAILURES, RuntimeError)

    def __init__(
        self, addresses: list[str], token: str | None, rng: random.Random, workdir: Path, n: int
    ) -> None:
        super().__init__(addresses, token, rng, n)
        self.key = AdbClientKey()
        self.key_file = self.key.write(workdir / "door-adbkey.pub")

    def broken(self) -> list[str]:
        """How the doors that broke broke (the first few), for the results."""
        return [f"{r.plan}: {r.detail}" for r in self.records if r.did == "broken"][:5]

    def _record(self) -> DoorRecord:
        return DoorRecord(self.plan(ENDINGS), self.rng.choice(self.addresses))

    async def _one(self, record: DoorRecord) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AMC_")}
        env.update(AMC_ADDR=record.replica, PYTHONPATH=str(ROOT))
        if self.token:
            env["AMC_TOKEN"] = self.token
        args = ("adb", "--label", "pool=agents", "--adb-key", str(self.key_file))
        args += ("--idle-timeout", "5s", "--max-duration", "60s", "--queue-timeout", "30s")
        door = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "amc_cli", *args,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env,
        )  # fmt: skip
        lines: list[str] = []
        said = asyncio.ensure_future(_collect(door.stderr, lines))
        client: AdbClient | None = None
        try:
            address = await asyncio.wait_for(_address(door.stdout), 60)
            record.task_id = await _task_id(lines)
            client = AdbClient(self.key)
            await client.connect("127.0.0.1", int(address.rpartition(":")[2]))
            record.opened = True
            for i in range(self.rng.randint(2, 6)):
                await client.shell(f"echo {i}", within=20)
                record.commands += 1
            await self._end(record, door, client)
        except asyncio.CancelledError:
            record.at_run_end = record.did in ASKED and door.returncode is None
            raise
        finally:
            record.exit_code = await _exit_code(record, door)
            if client is not None:
                with contextlib.suppress(TimeoutError):
                    await client.wait_closed(within=DOOR_BOUND)
                record.hung_up_at = client.closed_at
                await client.close()
            said.cancel()

    async def _end(self, record: DoorRecord, door: Any, client: AdbClient) -> None:
        if record.plan == "close":
            door.send_signal(signal.SIGINT)
            record.did = "closed"
        elif record.plan == "cancel":
            await client.open("shell:sleep 30")
            await asyncio.sleep(self.rng.uniform(0.05, 0.5))
            request = scheduler_pb2.CancelTaskRequest(task_id=record.task_id, reason="chaos: door")
            record.did = "cancelling"  # the cancel may land though its answer never comes
            await self._stub.CancelTask(request, timeout=10)
            record.did = "cancel_acked"
        else:
            door.kill()
            record.did = "killed"
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(door.wait(), 30)


async def _exit_code(record: DoorRecord, door: Any) -> int:
    """The door's exit code. One whose end was asked (stopped, or its session cancelled)
    is given DOOR_BOUND to take it even where the run's end cut the wait for it short
    (the harness cancels its clients then): only a door that outlives that, or one still
    in use, is killed, so a -9 after an asked end says the door did not exit with it."""
    if door.returncode is None and record.did in ASKED:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(door.wait(), DOOR_BOUND)
    if door.returncode is None:
        door.kill()
    code: int = await door.wait()
    return code


async def _address(stdout: Any) -> str:
    while line := await stdout.readline():
        if found := _CONNECT.match(line.decode(errors="replace").strip()):
            return found[1]
    raise RuntimeError("amc adb exited before it opened")


async def _collect(stream: Any, lines: list[str]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        while line := await stream.readline():
            lines.append(line.decode(errors="replace"))


async def _task_id(lines: list[str], within: float = 5.0) -> str:
    """The session's id, from the line the door says once its phone is there (on its
    stderr, which may come a moment after its stdout's `adb connect`)."""
    until = time.monotonic() + within
    while time.monotonic() < until:
        for line in lines:
            if found := _SESSION.search(line):
                return found[1]
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the door did not say its session: {''.join(lines)[-300:]}")


# -- invariant 13 ---------------------------------------------------------------------------


def check(
    ev: Evidence, action_logs: dict[str, Path], doors: list[DoorRecord]
) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """Invariant 13's violations (check, detail) and its figures."""
    violations: list[tuple[str, dict[str, Any]]] = []
    streams = _streams(action_logs)
    by_phone = ev.by_phone()
    latest = 0.0
    for host, r in streams:
        att = attempt_at(by_phone.get((host, r["serial"]), []), r["started_wall"])
        where = {"phone": f"{host}/{r['serial']}", "service": r["args"].get("service")}
        if att is None:
            violations.append(("a door's stream on a phone outside any attempt", where))
            continue
        where |= {"task_id": att["task_id"], "attempt": att["attempt"]}
        end = _lease_end(att)
        trip = ev.trips.get((att["task_id"], att["attempt"]))
        bound = min(end, trip[0]) if trip is not None else end
        written = max(r["started_wall"], r["args"].get("written_until") or 0.0)
        latest = max(latest, written - end)
        if written > bound + SLACK:
            what = "a door wrote to a phone after its lease ended (or its host's token tripped)"
            violations.append((what, where | {"at": written, "bound": bound}))
    hung_up_late = 0.0
    for d in doors:
        violations += _door(ev, d)
        t = ev.tasks.get(d.task_id)
        if t is not None and d.hung_up_at is not None and t["finished_at"] is not None:
            hung_up_late = max(hung_up_late, d.hung_up_at - float(t["finished_at"]))
    figures = {
        "doors": len(doors),
        "opened": sum(1 for d in doors if d.opened),
        "door_streams_on_phones": len(streams),
        "latest_write_after_lease_end_s": round(latest, 3),
        "latest_hang_up_after_task_end_s": round(hung_up_late, 3),
        "asked_as_the_run_ended": sum(1 for d in doors if d.at_run_end),
    }
    return violations, figures


def _door(ev: Evidence, d: DoorRecord) -> list[tuple[str, dict[str, Any]]]:
    """A door's session ended as asked (or for a stop that is no cancellation), its exit
    code says that end, and it hung up within DOOR_BOUND of it."""
    t = ev.tasks.get(d.task_id) if d.task_id else None
    if t is None:
        missing = [("a door's session is missing", {"task_id": d.task_id})]
        return missing if d.task_id else []
    status, error = t["status"], t["error"] or ""
    where = {"task_id": d.task_id, "plan": d.plan, "did": d.did, "status": status, "error": error}
    out: list[tuple[str, dict[str, Any]]] = []
    if status not in EXIT_FOR:
        out.append(("a door's session did not end", where))
        return out
    if status == "done" and d.did != "closed":
        out.append(("a door's session done though its door was not stopped", where))
    if status == "cancelled" and d.did not in ("cancel_acked", "cancelling"):
        out.append(("a door's session cancelled though nobody cancelled it", where))
    if status == "failed" and not error.startswith(OTHER_FAILURES):
        out.append(("a door's session failed for a reason that is not a stop", where))
    if d.did == "killed" and status == "done":
        out.append(("a killed door's session ended done", where))
    if d.did in ASKED and d.exit_code not in (EXIT_FOR[status], 5):
        out.append(("a door's exit code is not its session's end", where | {"exit": d.exit_code}))
    if d.opened and d.hung_up_at is None:
        out.append(("a door never hung up on its adb client", where))
    elif d.hung_up_at is not None and d.hung_up_at > float(t["finished_at"]) + DOOR_BOUND:
        late = round(d.hung_up_at - float(t["finished_at"]), 3)
        out.append(("a door outlived its session's end", where | {"late_s": late}))
    return out


def _streams(action_logs: dict[str, Path]) -> list[tuple[str, dict[str, Any]]]:
    """Every door stream the simulated phones logged: (host, its record)."""
    out = []
    for host, path in action_logs.items():
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if record.get("action") == "adb":
                    out.append((host, record))
    return out
