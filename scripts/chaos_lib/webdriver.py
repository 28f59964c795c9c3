"""WebDriver sessions in the chaos run: the agents run a real Appium (npm's `appium` with
its `@appium/fake-driver`, installed as the tests install it: amc_testing.appium) behind
`--appium`, and a few clients each open a session through the WebDriver endpoint of a
replica picked at random (plain HTTP, `POST /wd/hub/session` with the client token), send a
few commands (find an element, click it, read an attribute and the page source), and end
it one of three ways: DELETE (its session ends done, its phone free once DELETE answers),
cancel its task (CancelTask) or abandon it (no more commands: the idle timeout ends it).
Replica and agent kills, freezes and cuts end some another way. After its end each client
sends one more command, which must be refused (`invalid session id`).

Each agent's `appium` is a script of the run's own (`program`) that starts that Appium
with its log at info level, time-stamped to the millisecond, into a file per server: the
host-side evidence of what Appium served, and when.

What is held against the evidence (`check`, invariant 15: a WebDriver session never
outlives its lease):

- on the host: no command reached an Appium session (the Appium log's `-->` line) before
  the lease of the attempt on its phone began or after that lease ended, except the
  DELETE that ends the Appium session (the host's, after the farm's session ended);
- at the run's end every Appium server still running has no session left (its own list,
  GET /appium/sessions);
- at the client: every command answered OK was sent while its session's lease was live
  (the session's id is its task's id); none is answered OK once the client was told the
  session ended; a DELETE answered OK found its task finished and its phone's attempt
  ended (the phone free); the session ended as asked, or for a stop that is not a
  cancellation (as invariant 9 says of sessions).

Where Appium cannot be installed (the npm registry unreachable) the run says so in one
line and runs without WebDriver sessions, reported as skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from amc.v1 import scheduler_pb2
from chaos_lib.clients import ClientLoad
from chaos_lib.evidence import Evidence, attempt_at
from chaos_lib.invariants import _lease_end
from chaos_lib.sessions import OTHER_FAILURES

ENDINGS = {"delete": 0.5, "cancel": 0.25, "abandon": 0.25}
IDLE_TIMEOUT = 3.0
QUEUE_TIMEOUT = 30.0
# How late an Appium log line (milliseconds, Node's event loop) or a client's clock may be
# against the database's lease end.
SLACK = 0.1
# How long a client keeps asking after its session's end before it is refused.
END_BOUND = 10.0
_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d):(\d{3}) (?:\[[^\]]*\])*\[HTTP\] (-->|<--) "
    r"(GET|POST|DELETE) /session/([0-9a-f-]{36})(\S*)(?: (\d{3}))?"
)
_UDID = re.compile(r'"appium:udid":"([^"]+)"')
_CREATED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d):(\d{3}) .*Session created with session id: ([0-9a-f-]{36})"
)
_STARTED = "appium server started"
# The ends that are stops but no cancellation: a session's (invariant 9's) and its idle
# timeout (the WebDriver endpoint's own words for it).
STOPS = (*OTHER_FAILURES, "idle timeout")


@dataclass(frozen=True)
class Appium:
    """The run's Appium: the installed program, the fake driver's capabilities, the logs."""

    installed: Path
    caps: str  # JSON, the agents' --appium-caps
    logs: Path

    def program(self, host: str) -> Path:
        """The `appium` an agent runs: Appium, logging to a file per server."""
        self.logs.mkdir(parents=True, exist_ok=True)
        path = self.logs.parent / f"appium-{host}"
        log = self.logs / f"{host}-$$.log"
        path.write_text(
            f"#!/bin/sh\nexec '{self.installed}' \"$@\" --log-level info --log-timestamp"
            f' --log-no-colors --log "{log}"\n'
        )
        path.chmod(0o755)
        return path


def prepare(root: Path, workdir: Path) -> tuple[Appium | None, str]:
    """Appium installed (into the tests' cache directory), or None and why not (one line)."""
    from amc_testing.appium import NAME, Unreachable, fake_caps, install

    try:
        program = install(root / ".pytest_cache" / "d" / NAME)
    except (Unreachable, RuntimeError, OSError) as exc:
        return None, str(exc).splitlines()[0][:300]
    return Appium(program, json.dumps(fake_caps(program)), workdir / "appium-logs"), ""


@dataclass
class Command:
    method: str
    path: str
    sent: float
    answered: float = 0.0
    status: int = 0  # 0: no answer (the connection broke)
    error: str = ""


@dataclass
class WdRecord:
    """One WebDriver session as its client lived it."""

    plan: str
    url: str
    task_id: str = ""
    commands: list[Command] = field(default_factory=list)
    # created, deleted, cancelling, cancel_acked, abandoned; refused (not created); broken
    did: str = ""
    detail: str = ""
    told_ended_at: float | None = None  # the first `invalid session id` it was answered


_CAPS = {
    "platformName": "Android",
    "appium:automationName": "Fake",
    "amc:labels": {"pool": "agents"},
    "amc:queueTimeout": QUEUE_TIMEOUT,
    "amc:idleTimeout": IDLE_TIMEOUT,
}


class WebDriverLoad(ClientLoad[WdRecord]):
    FAILURES = (*ClientLoad.FAILURES, aiohttp.ClientError)

    def __init__(
        self,
        urls: list[str],
        addresses: list[str],
        token: str | None,
        rng: random.Random,
        n: int,
    ) -> None:
        super().__init__(addresses, token, rng, n)
        self.urls = urls
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=QUEUE_TIMEOUT + 20)
        )

    async def close(self) -> None:
        await super().close()
        await self._http.close()

    def broken(self) -> list[str]:
        return [f"{r.plan}: {r.detail}" for r in self.records if r.detail][:5]

    def _record(self) -> WdRecord:
        return WdRecord(self.plan(ENDINGS), self.rng.choice(self.urls))

    async def _send(
        self, record: WdRecord, method: str, path: str, body: Any = None
    ) -> tuple[int, Any]:
        """One command, recorded with when it was sent and answered."""
        command = Command(method, path, time.time())
        record.commands.append(command)
        url = f"{record.url}/session" + (f"/{record.task_id}{path}" if record.task_id else "")
        try:
            async with self._http.request(method, url, json=body) as answer:
                data = await answer.json(content_type=None)
                command.status = answer.status
        finally:
            command.answered = time.time()
        value = data.get("value") if isinstance(data, dict) else None
        if command.status >= 400 and isinstance(value, dict):
            command.error = str(value.get("error", ""))
            if command.error == "invalid session id" and record.told_ended_at is None:
                record.told_ended_at = command.answered
        return command.status, value

    async def _one(self, record: WdRecord) -> None:
        status, value = await self._send(
            record, "POST", "", {"capabilities": {"alwaysMatch": _CAPS, "firstMatch": [{}]}}
        )
        if status != 200:
            record.did = "refused"
            record.detail = f"{status} {str(value)[:150]}"
            return
        record.task_id = str(value["sessionId"])
        record.did = "created"
        status, value = await self._send(record, "POST", "/element", {"using": "id", "value": "go"})
        if status != 200:
            return
        element = next(iter(value.values()))
        for _ in range(self.rng.randint(1, 5)):
            what = self.rng.choice(["click", "attribute", "source"])
            if what == "click":
                status, _ = await self._send(record, "POST", f"/element/{element}/click", {})
            elif what == "attribute":
                path = f"/element/{element}/attribute/clicks"
                status, _ = await self._send(record, "GET", path)
            else:
                status, _ = await self._send(record, "GET", "/source")
            if status != 200:
                return
        await self._end(record)

    async def _end(self, record: WdRecord) -> None:
        if record.plan == "delete":
            status, _ = await self._send(record, "DELETE", "")
            record.did = "deleted" if status == 200 else f"delete {status}"
        elif record.plan == "cancel":
            request = scheduler_pb2.CancelTaskRequest(
                task_id=record.task_id, reason="chaos: webdriver"
            )
            record.did = "cancelling"
            await self._stub.CancelTask(request, timeout=10)
            record.did = "cancel_acked"
        else:
            record.did = "abandoned"
            await asyncio.sleep(IDLE_TIMEOUT + 1.5)
        # The end holds: the session is refused within the bound (kept asking; an abandoned
        # one at most once per idle timeout, as each command it answers starts that again).
        gap = IDLE_TIMEOUT + 1.5 if record.plan == "abandon" else 0.5
        until = time.monotonic() + END_BOUND + (gap if record.plan == "abandon" else 0)
        while record.told_ended_at is None and time.monotonic() < until:
            await self._send(record, "GET", "/source")
            if record.told_ended_at is None:
                await asyncio.sleep(gap)


# -- host-side evidence ---------------------------------------------------------------------


@dataclass
class AppiumCall:
    at: float
    method: str
    path: str  # under the session: '' for the session itself


@dataclass
class AppiumSession:
    host: str
    serial: str
    session: str
    calls: list[AppiumCall] = field(default_factory=list)

    @property
    def created(self) -> float:
        return self.calls[0].at if self.calls else 0.0


def appium_sessions(logs: Path) -> list[AppiumSession]:
    """Every Appium session the servers' logs show, with the calls they received."""
    out: dict[str, AppiumSession] = {}
    if not logs.is_dir():
        return []
    for path in sorted(logs.glob("*.log")):
        host = path.stem.rpartition("-")[0]
        serial = ""
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if not serial and (found := _UDID.search(line)):
                serial = found[1]
            if created := _CREATED.match(line):
                s = out.setdefault(created[3], AppiumSession(host, serial, created[3]))
                s.calls.append(AppiumCall(_when(created[1], created[2]), "POST", "(created)"))
                continue
            m = _LINE.match(line)
            if m is None or m[3] != "-->":
                continue
            s = out.setdefault(m[5], AppiumSession(host, serial, m[5]))
            s.calls.append(AppiumCall(_when(m[1], m[2]), m[4], m[6]))
    return list(out.values())


def _when(seconds: str, millis: str) -> float:
    """An Appium log time stamp (UTC) as seconds since the epoch."""
    at = datetime.strptime(seconds, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
    return at.timestamp() + int(millis) / 1000


async def left_open(agent_logs: dict[str, Path]) -> list[dict[str, Any]]:
    """The sessions the agents' Appium servers still running hold (GET /appium/sessions;
    the servers from the agents' logs): at the run's end, none may."""
    ports: dict[str, tuple[str, int]] = {}
    for host, path in agent_logs.items():
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if _STARTED in line:
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    record = json.loads(line)
                    ports[f"{host}/{record['serial']}/{record['port']}"] = (host, record["port"])
    out: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        for name, (_, port) in ports.items():
            try:
                async with http.get(f"http://127.0.0.1:{port}/appium/sessions") as answer:
                    value = (await answer.json(content_type=None)).get("value") or []
            except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
                continue  # that server is gone (its agent was killed or restarted)
            out += [{"server": name, "session": s.get("id")} for s in value]
    return out


# -- invariant 15 ---------------------------------------------------------------------------


def check(
    ev: Evidence, sessions: list[AppiumSession], records: list[WdRecord], leftover: list[Any]
) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """Invariant 15's violations (check, detail) and its figures."""
    violations: list[tuple[str, dict[str, Any]]] = []
    by_phone = ev.by_phone()
    latest = float("-inf")
    calls = 0
    for s in sessions:
        att = attempt_at(by_phone.get((s.host, s.serial), []), s.created + SLACK)
        where = {"phone": f"{s.host}/{s.serial}", "appium_session": s.session}
        if att is None:
            violations.append(("an Appium session on a phone outside any attempt", where))
            continue
        where |= {"task_id": att["task_id"], "attempt": att["attempt"]}
        begun, end = float(att["created_at"]), _lease_end(att)
        for c in s.calls:
            if c.method == "DELETE" and not c.path:
                continue  # the end of the Appium session
            calls += 1
            latest = max(latest, c.at - end)
            if c.at < begun - SLACK or c.at > end + SLACK:
                what = "Appium served a command outside its session's lease"
                violations.append((what, where | {"call": f"{c.method} {c.path}", "at": c.at}))
    violations += [("an Appium session left open after the run", x) for x in leftover]
    ok_after = float("-inf")
    for r in records:
        found, late = _record(ev, r, by_phone)
        violations += found
        ok_after = max(ok_after, late)
    figures = {
        "sessions": len(records),
        "created": sum(1 for r in records if r.task_id),
        "commands_answered_ok": sum(1 for r in records for c in r.commands if c.status == 200),
        "appium_sessions_on_hosts": len(sessions),
        "appium_commands_on_hosts": calls,
        "latest_appium_command_after_lease_end_s": round(latest, 3) if calls else None,
        "latest_ok_answer_after_lease_end_s": round(ok_after, 3) if ok_after > -1e9 else None,
    }
    return violations, figures


def _record(
    ev: Evidence, r: WdRecord, by_phone: dict[tuple[str, str], list[dict[str, Any]]]
) -> tuple[list[tuple[str, dict[str, Any]]], float]:
    """A client's session: its OK answers within its lease, none after it was told the
    session ended, a DELETE's phone free, and its end the one asked (or a stop)."""
    if not r.task_id:
        return [], float("-inf")
    t = ev.tasks.get(r.task_id)
    where = {"task_id": r.task_id, "plan": r.plan, "did": r.did}
    if t is None:
        return [("a WebDriver session's task is missing", where)], float("-inf")
    status, error = t["status"], t["error"] or ""
    where |= {"status": status, "error": error}
    out: list[tuple[str, dict[str, Any]]] = []
    atts = [a for (task, _), a in ev.attempts.items() if task == r.task_id]
    if len(atts) != 1:
        out.append(("a WebDriver session had other than one attempt", where | {"n": len(atts)}))
        return out, float("-inf")
    end = _lease_end(atts[0])
    late = float("-inf")
    for c in r.commands[1:]:
        if c.status != 200:
            continue
        late = max(late, c.sent - end)
        if c.sent > end + SLACK:
            out.append(("a command was answered OK after its session's lease ended", where))
        if r.told_ended_at is not None and c.sent > r.told_ended_at:
            out.append(("a command was answered OK after the session was said ended", where))
        if c.method == "DELETE" and not c.path and end > c.answered + SLACK:
            what = "DELETE answered before its session's phone was free"
            out.append((what, where | {"lease_end": end, "answered": c.answered}))
    if status not in ("done", "failed", "cancelled"):
        out.append(("a WebDriver session did not end", where))
    elif status == "done" and r.did != "deleted":
        out.append(("a WebDriver session done though its client did not DELETE it", where))
    elif status == "cancelled" and r.did not in ("cancelling", "cancel_acked"):
        out.append(("a WebDriver session cancelled though nobody cancelled it", where))
    elif status == "failed" and not error.startswith(STOPS):
        out.append(("a WebDriver session failed for a reason that is not a stop", where))
    return out, late
