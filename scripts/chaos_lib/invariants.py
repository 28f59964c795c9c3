"""The invariants of the chaos run, checked after the quiesce from the evidence.

    1  no task lost: every submitted task is in exactly one state; all end terminal
    2  no duplicate transitions: every terminal state was entered once
    3  `cancelled` only where a cancellation was requested; a task whose cancellation was
       requested in flight ends cancelled, or failed "deadline exceeded" where its deadline
       tripped the host's stop token first, or done (or failed by a step) only where the host
       could not have stopped first: its last step had finished before the request, or the
       request landed during the last step, or the host had not been told yet (which it
       must be by the next renewal, also checked); never after the host saw the request
       and went on to act. A lease-lost or shutdown FAILED accepted meanwhile breaks it.
    4  at most one executor: no two attempts of a task acted in overlapping time windows
       (and no attempt acted outside its lease, or after its host's stop token tripped)
    5  no orphan reservation: no device reserved without an active attempt; all free at end
    6  no stale report or artifact accepted: every accepted report came from the current
       attempt with a live lease; likewise every artifact stored (screenshots, UI dumps),
       and each one is whole (its chunks are exactly its bytes)
    7  no task stranded: no task stays queued longer than a bound while a fleet host sits
       parked (an Acquire in flight) and a phone of it that the task's selector fits is idle
       (dispatch liveness; the bound, what faults excuse, and the two ways to break it,
       offered or not by the parked Acquire: chaos_lib/dispatch.py)
    8  no acknowledged transition lost (failovers): every result a host was told was
       recorded is there, its attempt ended as reported (not expired, not still active)
    9  sessions end as the spec says (chaos_lib/sessions.py): one attempt at most; done only
       where its client closed it; cancelled only where it was cancelled (or withdrawn by a
       client that left before it started); failed only for a stop that is not a
       cancellation (abandoned, relay lost, lease lost, deadline, device lost); and what
       its client was told is what was recorded
   10  phone faults (chaos_lib/phones.py): no task failed for an infrastructure fault while
       its infrastructure-retry budget remained; a sick phone took no new work later than
       one probe interval after its fault; a phone back from one took work again
   11  live screens (chaos_lib/screens.py): a task's viewer is sent only frames captured
       while its phone ran that task's attempt (never before it began, never once the
       phone was given to another attempt), its watch ends within the re-read bound of
       its attempt's end, a viewer of the H.264 stream gets a key frame first and after
       every gap, and watching changes no task's steps or actions
   12  cleaning (chaos_lib/cleaning.py): no lease starts on a phone between a failed clean
       and the next one that passed, and no task acts on a phone while it is cleaned
   13  adb doors (chaos_lib/doors.py): a door never outlives its lease: no byte written to
       a phone and no stream opened there after its attempt's lease ended or its host's
       token tripped, and the door hangs up on its adb client within a bound of its
       session's end, which is the one asked for (or a stop that is not a cancellation)
   14  emulator pools (chaos_lib/emulators.py): a task whose emulator died under it is
       given back as device_lost and ends done; an emulator that died, or whose reset's
       load failed or hung, is started afresh within a bound; the pool is below its
       minimum no longer than that bound (but while a start that never boots keeps one
       down, or its agent is away) and at its minimum at the quiesce; the instances a
       killed agent left running are stopped when it starts again
   15  WebDriver sessions (chaos_lib/webdriver.py): a session never outlives its lease: no
       command reaches its Appium session on the host (Appium's own log) before the lease
       of the attempt on its phone began or after it ended, but the DELETE that ends it; no
       Appium server keeps a session at the run's end; every command answered OK to a
       client was sent while its session's lease was live and before the client was told
       the session ended; a DELETE answered OK found its phone free; and the session ended
       as asked (or for a stop that is not a cancellation)

The action logs do not say which task an action was for, so an action is attributed to the
attempt on its host and device that began last before it (one device runs one attempt at a
time: the agent offers only idle devices, and a device stays reserved until its attempt
ends). Should the log records name their task and attempt, the two are compared. An
action the process was frozen through is counted as the phone saw it: from its
start for the simulated action's duration, not until the process woke up to log it.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from amc_common import statuses
from chaos_lib.dispatch import DispatchCheck
from chaos_lib.evidence import Action, Evidence, last_step_window, task_result
from chaos_lib.monitor import Finding
from chaos_lib.sessions import OTHER_FAILURES, SessionRecord
from chaos_lib.workload import Submitted

NAMES = {
    1: "no task lost",
    2: "no duplicate transitions",
    3: "cancelled only on request; cancel in flight ends cancelled",
    4: "at most one executor",
    5: "no orphan reservation",
    6: "no stale report or artifact accepted",
    7: "no task stranded while a fitting host sat parked",
    8: "no acknowledged transition lost",
    9: "sessions end as the spec says",
    10: "phone faults: infrastructure retries, sick phones idle, recovered ones at work",
    11: "live screens: a task's viewer sees only its attempt's phone; watching changes nothing",
    12: "cleaning: no lease on a phone whose last clean failed, no task during a clean",
    13: "adb doors: a door never outlives its lease",
    14: "emulators: a dead one's task given back and done, restarted, pool at its minimum",
    15: "WebDriver sessions: a session never outlives its lease",
}
TERMINAL = statuses.TERMINAL
# How a session's host reports the end of its relay (host_agent/session.py).
SESSION_STOPS = ("session relay lost", "session relay ended", "session abandoned")
# An attempt the host reported ended in one of these (its state is the Outcome's value).
REPORTED = frozenset(o.value for o in statuses.Outcome)
EXAMPLES = 5
# A renewal whose transaction began this long after the cancel's must have seen it: it
# cannot have been waiting on the cancel's row lock for that long (they take milliseconds).
RENEWAL_SLACK = 0.5


@dataclass
class Violation:
    invariant: int
    check: str
    detail: dict[str, Any]


@dataclass
class Checks:
    evidence: Evidence
    submitted: list[Submitted]
    # host -> [(frozen from, to)] and host -> simulated action duration
    freezes: dict[str, list[tuple[float, float]]]
    delays: dict[str, float]
    lease_ttl: float
    dispatch: DispatchCheck | None = None
    # What each session's client did and saw (chaos_lib/sessions.py), for invariant 9.
    sessions: list[SessionRecord] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    stats: Counter[str] = field(default_factory=Counter)

    def fail(self, invariant: int, check: str, **detail: Any) -> None:
        self.violations.append(Violation(invariant, check, detail))

    def run(self, findings: Iterable[Finding]) -> list[Violation]:
        for f in findings:
            self.fail(f.invariant, f"(while running) {f.check}", at=f.at, **f.row)
        self._attribute()
        for check in (
            self._no_task_lost,
            self._no_duplicate_transitions,
            self._cancelled_only_on_request,
            self._at_most_one_executor,
            self._no_orphan_reservation,
            self._no_stale_report_accepted,
        ):
            check()
        self._no_task_stranded()
        self._no_acknowledged_transition_lost()
        self._sessions_end_as_specified()
        return self.violations

    def _no_acknowledged_transition_lost(self) -> None:
        """Reports a host was answered as recorded are recorded: a failover that lost one
        would leave its attempt active, or expired (and the task run again)."""
        ev = self.evidence
        for e in ev.agent_events:
            if e.event != "result reported":
                continue
            key = (str(e.fields.get("task_id")), int(e.fields.get("attempt") or 0))
            attempt = ev.attempts.get(key)
            state = attempt["state"] if attempt is not None else None
            if state not in REPORTED:
                self.fail(
                    8,
                    "reported result acknowledged to the host, not in the database",
                    task_id=key[0],
                    attempt=key[1],
                    host=e.host,
                    at=e.at,
                    attempt_state=state,
                )

    # -- 9 -----------------------------------------------------------------------------------

    def _sessions_end_as_specified(self) -> None:
        """Each session ended as the spec says, and as its client was told."""
        ev = self.evidence
        records = {r.task_id: r for r in self.sessions if r.task_id}
        for task_id, t in ev.tasks.items():
            if "session" not in (t["metadata"] or {}):
                continue  # a door's session is invariant 13's (chaos_lib/doors.py)
            status, error = t["status"], t["error"]
            r = records.get(task_id)
            did = r.did if r is not None else ""
            self.stats[f"session {t['metadata']['session']}: {did or '?'} -> {status}"] += 1
            where = {"task_id": task_id, "status": status, "error": error, "client": did}
            if t["attempt"] > 1:
                self.fail(9, "session run more than once", attempts=t["attempt"], **where)
            if status == "done" and did != "closed":
                self.fail(9, "session done though its client did not close it", **where)
            elif status == "cancelled" and did not in ("cancel_sent", "cancel_acked"):
                # Withdrawn: its client left before its host joined (sessions.py's reasons).
                withdrawn = (t["cancel_reason"] or "").startswith("session")
                if not withdrawn or (r is not None and r.dispatched):
                    self.fail(9, "session cancelled though nobody cancelled it", **where)
            elif status == "failed" and not error.startswith(OTHER_FAILURES):
                self.fail(9, "session failed for a reason that is not a stop", **where)
            if did == "abandoned" and status != "failed":
                self.fail(9, "session abandoned by its client, not failed", **where)
            if did == "cancel_acked" and status == "done":
                self.fail(9, "session cancelled by its client ended done", **where)
            if r is not None and r.final and r.final != status:
                self.fail(
                    9, "session's client told one end, another recorded", told=r.final, **where
                )
        for r in self.sessions:
            if r.task_id and r.task_id not in ev.tasks:
                self.fail(9, "session acknowledged to its client, missing", task_id=r.task_id)

    # -- attribution -------------------------------------------------------------------------

    def _attribute(self) -> None:
        ev = self.evidence
        by_device: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for att in ev.attempts.values():
            by_device[(att["host_id"], att["device_serial"])].append(att)
        starts = {}
        for key, atts in by_device.items():
            atts.sort(key=lambda a: a["created_at"])
            starts[key] = [a["created_at"] for a in atts]
        for action in ev.actions:
            key = (action.host, action.serial)
            i = bisect.bisect_right(starts.get(key, []), action.start) - 1
            action.effective_end = self._phone_end(action)
            if i < 0:
                self.fail(4, "device action outside any attempt", **_action(action))
                continue
            att = by_device[key][i]
            action.task_id, action.attempt = att["task_id"], att["attempt"]
            if action.logged is not None and action.logged != (action.task_id, action.attempt):
                self.fail(
                    4,
                    "action logged for one attempt, acted in another's time",
                    logged=action.logged,
                    **_action(action),
                )
        self.stats["device actions"] = len(ev.actions)

    def _phone_end(self, action: Action) -> float:
        for frozen_from, frozen_to in self.freezes.get(action.host, ()):
            if action.start < frozen_to and action.end > frozen_from:
                self.stats["actions spanning a freeze"] += 1
                return min(action.end, action.start + self.delays.get(action.host, 0.0) + 0.05)
        return action.end

    # -- 1 -----------------------------------------------------------------------------------

    def _no_task_lost(self) -> None:
        ev = self.evidence
        requests = {s.request_id for s in self.submitted}
        for s in self.submitted:
            if not s.task_id:
                self.fail(1, "submission never acknowledged", request_id=s.request_id)
            elif s.task_id not in ev.tasks:
                self.fail(1, "acknowledged task missing from the database", task_id=s.task_id)
        for task_id, t in ev.tasks.items():
            if t["request_id"] not in requests and not _is_session(t):
                self.fail(1, "task in the database that nobody submitted", task_id=task_id)
            if t["status"] not in TERMINAL:
                self.fail(
                    1, "task not terminal after the quiesce", task_id=task_id, status=t["status"]
                )
            if t["status"] == "failed" and t["error"] == "queue timeout":
                self.stats["failed: queue timeout"] += 1
            elif t["status"] == "failed" and t["error"].startswith("deadline exceeded"):
                self.stats["failed: deadline exceeded"] += 1
            atts = ev.attempts_of(task_id)
            # An attempt that lost its phone (device_lost) counts against the task's
            # infrastructure-retry budget, not max_attempts.
            if len(atts) > t["max_attempts"] + int(t.get("infra_retries") or 0):
                self.fail(1, "more attempts than max_attempts", task_id=task_id, attempts=len(atts))
            if [a["attempt"] for a in atts] != list(range(1, len(atts) + 1)) or (
                atts and atts[-1]["attempt"] != t["attempt"]
            ):
                self.fail(1, "attempt numbers not 1..n ending at the task's", task_id=task_id)

    # -- 2 -----------------------------------------------------------------------------------

    def _no_duplicate_transitions(self) -> None:
        ev = self.evidence
        for task_id, t in ev.tasks.items():
            events = ev.events.get(task_id, [])
            terminal = [
                e
                for e in events
                if e["to_status"] in TERMINAL and e["from_status"] != e["to_status"]
            ]
            wanted = 1 if t["status"] in TERMINAL else 0
            if len(terminal) != wanted:
                self.fail(
                    2,
                    "terminal state entered more than once"
                    if len(terminal) > 1
                    else "terminal status without its transition",
                    task_id=task_id,
                    status=t["status"],
                    transitions=[(e["kind"], e["from_status"], e["to_status"]) for e in terminal],
                )
            self._chain(task_id, t, events)
            self._attempt_events(task_id, events)

    def _chain(self, task_id: str, t: dict[str, Any], events: list[dict[str, Any]]) -> None:
        current: str | None = None
        for e in events:
            if e["kind"] == "submit":
                if current is not None:
                    self.fail(2, "submitted twice", task_id=task_id)
                current = e["to_status"]
                continue
            if current in TERMINAL:
                self.fail(
                    2,
                    "transition after a terminal state",
                    task_id=task_id,
                    event=e["kind"],
                    after=current,
                )
            if e["from_status"] != current:
                self.fail(
                    2,
                    "transition from a status the task was not in",
                    task_id=task_id,
                    event=e["kind"],
                    claimed=e["from_status"],
                    actual=current,
                )
            current = e["to_status"]
        if current != t["status"]:
            self.fail(
                2,
                "status disagrees with the transition log",
                task_id=task_id,
                status=t["status"],
                log=current,
            )

    def _attempt_events(self, task_id: str, events: list[dict[str, Any]]) -> None:
        assigns = Counter(e["attempt"] for e in events if e["kind"] == "assign")
        endings = Counter(
            e["attempt"]
            for e in events
            if e["kind"] in ("report", "expired", "released", "deadline_exceeded", "device_lost")
        )
        numbers = {a["attempt"] for a in self.evidence.attempts_of(task_id)}
        if set(assigns) != numbers or any(n != 1 for n in assigns.values()):
            self.fail(
                2,
                "attempts and assign transitions disagree",
                task_id=task_id,
                attempts=sorted(numbers),
                assigns=dict(assigns),
            )
        for attempt, n in endings.items():
            if n > 1:
                self.fail(2, "attempt ended more than once", task_id=task_id, attempt=attempt)

    # -- 3 -----------------------------------------------------------------------------------

    def _cancelled_only_on_request(self) -> None:
        ev = self.evidence
        for task_id, t in ev.tasks.items():
            events = ev.events.get(task_id, [])
            requested = t["cancel_requested_at"]
            if t["status"] == "cancelled":
                ended = next(
                    (
                        e
                        for e in events
                        if e["to_status"] == "cancelled" and e["from_status"] != "cancelled"
                    ),
                    None,
                )
                if requested is None:
                    self.fail(3, "cancelled without a cancellation request", task_id=task_id)
                elif (
                    ended is not None
                    and ended["kind"] != "cancel"
                    and not any(
                        e["kind"] == "cancel_requested" and e["event_id"] < ended["event_id"]
                        for e in events
                    )
                ):
                    # By the order of the transitions, not their times: `now()` is when a
                    # transaction began, and one may begin, wait for the cancel's lock, and
                    # commit after it.
                    self.fail(3, "cancelled before the request", task_id=task_id)
            in_flight = next((e for e in events if e["kind"] == "cancel_requested"), None)
            if in_flight is not None:
                self._requested_in_flight(task_id, t, events, in_flight)
        self._surfaced()
        self._client_answers()

    def _requested_in_flight(
        self, task_id: str, t: dict[str, Any], events: list[dict[str, Any]], request: dict[str, Any]
    ) -> None:
        status, at = t["status"], t["cancel_requested_at"]
        self.stats[f"cancel in flight -> {status}"] += 1
        if status == "cancelled" or status not in TERMINAL:
            return
        end = next(e for e in events if e["to_status"] == status and e["from_status"] != status)
        where = {"task_id": task_id, "status": status, "requested_at": at}
        if end["kind"] != "report" or end["attempt"] != request["attempt"]:
            self.fail(
                3,
                f"cancel pending, yet ended {status} by {end['kind']}",
                attempt=end["attempt"],
                **where,
            )
            return
        result = task_result(t)
        error = result.error if result is not None else t["error"]
        trip = self.evidence.trips.get((task_id, request["attempt"]))
        if status == "failed" and error.startswith("deadline exceeded"):
            # The task's deadline stopped the run before the host heard of the cancel (the
            # stop token's first trip wins): a FAILED "deadline exceeded" is its outcome.
            if trip is None or trip[1] != "deadline":
                self.fail(
                    3,
                    "cancel pending, yet a deadline-exceeded report was accepted though the"
                    " host's token did not trip on the deadline first",
                    trip=trip,
                    **where,
                )
            else:
                self.stats[f"cancel in flight -> {status}: the deadline stopped it first"] += 1
            return
        if status == "failed" and _is_session(t) and error.startswith(SESSION_STOPS):
            # A session's relay broke (a replica died, its client vanished) before its host
            # heard of the cancel: a stop that is not the cancellation's, so failed. Heard
            # before the run ended on the host, that is, where its log says when (the
            # report may be recorded seconds later: the database was away).
            ended = self.evidence.finished.get((task_id, request["attempt"]), end["at"])
            if trip is not None and trip[1] == "cancelled" and trip[0] < ended:
                self.fail(
                    3,
                    "session cancel seen by its host, yet it reported the relay's end",
                    error=error,
                    trip=trip,
                    **where,
                )
            else:
                self.stats[f"cancel in flight -> {status}: the session's relay ended first"] += 1
            return
        if status == "failed" and not error.startswith("step "):
            self.fail(
                3,
                "cancel pending, yet a failed report was accepted (not a step failure)",
                error=error,
                reported_at=end["at"],
                **where,
            )
            return
        window = last_step_window(result)
        if window is not None and window[1] <= at:
            self.stats[f"cancel in flight -> {status}: last step had finished"] += 1
            return
        if (
            trip is not None
            and trip[1] == "cancelled"
            and window is not None
            and trip[0] < window[0]
        ):
            self.fail(
                3,
                f"host saw the cancellation before the last step, ran it, ended {status}",
                seen_at=trip[0],
                last_step_started=window[0],
                **where,
            )
            return
        # Cooperative cancellation stops at the next boundary: there was none left after the
        # request landed, or the host had not heard of it yet ("not instantaneous": it is due
        # by the next renewal, checked in _surfaced).
        if window is not None and window[0] < at:
            self.stats[f"cancel in flight -> {status}: request landed during the last step"] += 1
        else:
            self.stats[f"cancel in flight -> {status}: host not told before the last step"] += 1

    def _surfaced(self) -> None:
        """A pending cancellation is in the first renewal answer after the request, at the
        latest: so an attempt renewed after the request has it marked delivered by then.
        Times are those of the transactions' starts, hence the slack. The request counts
        from when it was committed, which can be seconds after its transaction started (a
        synchronous commit waits for the standby, which a database fault may have taken
        away): its CancelTask answer bounds that, where the client got one. A delivery
        marked just after the renewal's transaction began is the renewal's too: a push's
        mark (its own transaction, begun later) can take the attempt's row first, and the
        renewal then updates the row after it, keeping that mark and answering
        cancel_pending (its RETURNING reads the row it updated)."""
        acked = {s.task_id: s.cancel_acked_at for s in self.submitted if s.cancel_acked_at}
        acked.update({r.task_id: r.cancel_acked_at for r in self.sessions if r.cancel_acked_at})
        for (task_id, attempt), a in self.evidence.attempts.items():
            requested = a["cancel_requested_at"]
            if requested is None:
                continue
            # Answered: committed by then, if not before; the slack stays for the clocks.
            requested = max(requested, acked.get(task_id, requested) - RENEWAL_SLACK)
            last_renewal = a["lease_expires_at"] - self.lease_ttl
            delivered = a["cancel_delivered_at"]
            if last_renewal > requested + RENEWAL_SLACK and (
                delivered is None or delivered > last_renewal + RENEWAL_SLACK
            ):
                self.fail(
                    3,
                    "cancellation not surfaced by the next renewal",
                    task_id=task_id,
                    attempt=attempt,
                    requested_at=requested,
                    renewed_at=last_renewal,
                    delivered_at=delivered,
                )

    def _client_answers(self) -> None:
        tasks = self.evidence.tasks
        for s in self.submitted:
            t = tasks.get(s.task_id)
            if s.moment is None or t is None:
                continue
            self.stats[
                f"cancel moment {s.moment}: {s.cancel_answer or s.cancel_note or 'not sent'}"
            ] += 1
            if s.cancel_acked and t["cancel_requested_at"] is None:
                self.fail(
                    3,
                    "acknowledged cancellation missing from the database",
                    task_id=s.task_id,
                    answer=s.cancel_answer,
                )
            if s.cancel_answer == "cancelled" and t["status"] != "cancelled":
                self.fail(
                    3, "answered cancelled, ended otherwise", task_id=s.task_id, status=t["status"]
                )
            if s.cancel_answer == "FAILED_PRECONDITION" and (
                t["status"] not in ("done", "failed") or t["cancel_requested_at"] is not None
            ):
                if t["status"] in ("done", "failed") and s.cancel_tries > 1:
                    # An earlier try was recorded but its answer lost; the retry found the
                    # task finished. Rule 3's in-flight checks judge the request itself.
                    self.stats["cancel refused as terminal on a retry; an earlier try landed"] += 1
                    continue
                self.fail(
                    3,
                    "cancel refused as terminal, but the task was not done/failed",
                    task_id=s.task_id,
                    status=t["status"],
                    cancel_tries=s.cancel_tries,
                )

    # -- 4 -----------------------------------------------------------------------------------

    def _at_most_one_executor(self) -> None:
        ev = self.evidence
        by_attempt: dict[tuple[str, int], list[Action]] = defaultdict(list)
        for action in ev.actions:
            if action.task_id:
                by_attempt[(action.task_id, action.attempt)].append(action)
        for key, actions in by_attempt.items():
            att = ev.attempts[key]
            bound = _lease_end(att)
            trip = ev.trips.get(key)
            for action in actions:
                if action.start > bound:
                    self.fail(
                        4,
                        "device action after its attempt's lease ended",
                        attempt_state=att["state"],
                        lease_end=bound,
                        **_action(action),
                    )
                if trip is not None and action.start > trip[0]:
                    invariant = 3 if trip[1] == "cancelled" else 4
                    self.fail(
                        invariant,
                        f"device action after the host's stop token tripped ({trip[1]})",
                        tripped_at=trip[0],
                        **_action(action),
                    )
        per_task: dict[str, dict[int, list[Action]]] = defaultdict(dict)
        for (task_id, attempt), actions in by_attempt.items():
            per_task[task_id][attempt] = actions
        for task_id, attempts in per_task.items():
            self._overlaps(task_id, attempts)
        self.stats["tasks run by more than one attempt"] = sum(
            1 for a in per_task.values() if len(a) > 1
        )

    def _overlaps(self, task_id: str, attempts: dict[int, list[Action]]) -> None:
        numbers = sorted(attempts)
        for i, a in enumerate(numbers):
            for b in numbers[i + 1 :]:
                for x in attempts[a]:
                    for y in attempts[b]:
                        if x.start < y.effective_end and y.start < x.effective_end:
                            self.fail(
                                4,
                                "two attempts of a task acted at the same time",
                                task_id=task_id,
                                first=_action(x),
                                second=_action(y),
                            )
                            return

    # -- 5 -----------------------------------------------------------------------------------

    def _no_orphan_reservation(self) -> None:
        ev = self.evidence
        for d in ev.devices:
            if d["task_id"] is not None:
                self.fail(
                    5,
                    "device still reserved at the end",
                    host_id=d["host_id"],
                    serial=d["serial"],
                    task_id=d["task_id"],
                )
        for (task_id, attempt), a in ev.attempts.items():
            if a["state"] == "active":
                self.fail(5, "attempt still active at the end", task_id=task_id, attempt=attempt)

    # -- 6 -----------------------------------------------------------------------------------

    def _no_stale_report_accepted(self) -> None:
        ev = self.evidence
        for task_id, events in ev.events.items():
            for e in events:
                if e["kind"] == "report":
                    self._accepted_report(task_id, ev.tasks[task_id], e)
        for said in ev.agent_events:
            if said.event == "result reported":
                self._host_told_accepted(said)
            elif said.event == "report refused by the control plane":
                self.stats[f"reports refused ({said.fields.get('code')})"] += 1
        for artifact in ev.artifacts:
            self._stored_artifact(artifact)

    def _stored_artifact(self, a: dict[str, Any]) -> None:
        att = self.evidence.attempts.get((a["task_id"], a["attempt"]))
        where = {"task_id": a["task_id"], "attempt": a["attempt"], "at": a["created_at"]}
        self.stats["artifacts stored"] += 1
        self.stats["artifact bytes stored"] += a["size_bytes"]
        if att is None:
            self.fail(6, "artifact stored for an attempt that does not exist", **where)
        elif a["created_at"] >= att["lease_expires_at"]:
            self.fail(
                6,
                "artifact stored after its lease expired",
                expires=att["lease_expires_at"],
                **where,
            )
        elif att["ended_at"] is not None and a["created_at"] > att["ended_at"] + RENEWAL_SLACK:
            self.fail(6, "artifact stored after its attempt ended", ended=att["ended_at"], **where)
        if not a["whole"]:
            self.fail(6, "artifact stored damaged: its chunks are not its bytes", **where)

    def _accepted_report(self, task_id: str, t: dict[str, Any], e: dict[str, Any]) -> None:
        att = self.evidence.attempts.get((task_id, e["attempt"]))
        where = {"task_id": task_id, "attempt": e["attempt"]}
        self.stats["reports accepted"] += 1
        if att is None:
            self.fail(6, "report accepted for an attempt that does not exist", **where)
        elif att["reported_at"] is None or att["state"] != e["to_status"]:
            self.fail(
                6, "report accepted but the attempt does not record it", state=att["state"], **where
            )
        elif att["reported_at"] >= att["lease_expires_at"]:
            self.fail(
                6,
                "report accepted after the lease expired",
                reported_at=att["reported_at"],
                lease_expires_at=att["lease_expires_at"],
                **where,
            )
        elif e["attempt"] != t["attempt"]:
            self.fail(
                6,
                "report accepted from an attempt that is not the current one",
                current=t["attempt"],
                **where,
            )
        elif e["from_status"] not in ("assigned", "dispatched"):
            self.fail(
                6, "report accepted for a task not in flight", status=e["from_status"], **where
            )

    def _host_told_accepted(self, e: Any) -> None:
        key = (str(e.fields.get("task_id")), int(e.fields.get("attempt") or 0))
        att = self.evidence.attempts.get(key)
        outcome = str(e.fields.get("outcome", "")).removeprefix("OUTCOME_").lower()
        if att is None or att["state"] not in REPORTED or att["outcome"] != outcome:
            self.fail(
                6,
                "host was told its report was accepted; the database disagrees",
                host=e.host,
                task_id=key[0],
                attempt=key[1],
                outcome=outcome,
                attempt_state=att["state"] if att else None,
            )

    # -- 7 -----------------------------------------------------------------------------------

    def _no_task_stranded(self) -> None:
        if self.dispatch is None:
            return
        for s in self.dispatch.run():
            check = (
                "queued while a parked host offered an idle phone it fits"
                if s.offered
                else "queued while a parked host had an idle phone it fits, freed after its "
                "Acquire was sent and not offered"
            )
            self.fail(
                7,
                check + (f" (bound: the Acquire's wait; {s.excused})" if s.excused else ""),
                task_id=s.task_id,
                selector_kind=s.selector,
                host=s.host,
                serial=s.serial,
                overlap=[round(s.start, 3), round(s.end, 3)],
                seconds=round(s.seconds, 3),
                bound_s=round(s.bound, 3),
                **s.detail,
            )


def _lease_end(att: dict[str, Any]) -> float:
    """The last moment the attempt's holder could rightly act."""
    if att["state"] in REPORTED:
        return float(att["reported_at"])
    if att["state"] == "expired":
        return float(att["lease_expires_at"])
    if att["state"] == "released":
        return float(att["ended_at"])
    return float("inf")


def _action(a: Action) -> dict[str, Any]:
    return {
        "host": a.host,
        "serial": a.serial,
        "action": a.action,
        "start": round(a.start, 4),
        "end": round(a.end, 4),
        "task_id": a.task_id,
        "attempt": a.attempt,
    }


def grouped(violations: list[Violation]) -> dict[str, dict[str, Any]]:
    """By invariant number: name, count, counts by check, the first few examples."""
    out: dict[str, dict[str, Any]] = {}
    for n, name in NAMES.items():
        mine = [v for v in violations if v.invariant == n]
        out[str(n)] = {
            "name": name,
            "count": len(mine),
            "by_check": dict(Counter(v.check for v in mine)),
            "examples": [{"check": v.check, **v.detail} for v in mine[:EXAMPLES]],
        }
    return out


def _is_session(t: dict[str, Any]) -> bool:
    """A session's task (chaos_lib/sessions.py marks each in its metadata, `amc adb` its
    door's, the WebDriver endpoint its sessions')."""
    metadata = t["metadata"] or {}
    return "session" in metadata or "door" in metadata or "webdriver" in metadata
