"""Leases: Acquire, renewals, reports, releases, and the sweeps that end leases (their
statements in leases.sql, leases.acquire.sql and leases.end.sql, each with the functions
its statements call above them: amc_acquire, amc_renew, amc_report, amc_expire, ...)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from control_plane import errors
from control_plane.domain import (
    Acquired,
    Assignment,
    Expiry,
    LeaseId,
    Recorded,
    Renewal,
    Report,
    TaskId,
)
from control_plane.lifecycle import ReleaseCode, ReportCode
from control_plane.store.database import Aggregate, Database
from control_plane.store.grouped import GroupCommit
from control_plane.store.rows import columns, expiry, task, uuid_or_none

# Renewal statements in flight at once on a replica (PostgreSQL works on both of a small
# machine's cores), and the leases one grouped statement holds at most: the renewals
# arriving meanwhile go as the next group. A renewal of GROUPED_BELOW leases or more goes
# alone, as its own statement at once: its commit is shared by its leases already, and
# hosts of many phones renewing back to back keep PostgreSQL's backends busy side by side.
RENEWALS_IN_FLIGHT = 2
RENEWAL_GROUP_LEASES = 2_000
GROUPED_BELOW = 100


class Leases(Aggregate):
    def __init__(self, db: Database) -> None:
        super().__init__(db)
        self._renewals: GroupCommit[tuple[str, list[str], timedelta], list[Renewal]] = GroupCommit(
            self._renew_hosts,
            in_flight=RENEWALS_IN_FLIGHT,
            size=lambda item: len(item[1]),
            max_size=RENEWAL_GROUP_LEASES,
        )

    async def acquire(
        self, host_id: str, serials: list[str], ttl: timedelta, offered: Sequence[str] = ()
    ) -> Acquired:
        """One Acquire round. With `offered` (the task ids it was woken for), the answer
        also says which of them were queued when the statement began (still one
        statement); ids that are not UUIDs are left out."""
        wanted = [t for t in map(uuid_or_none, offered) if t is not None]
        if wanted:
            rows = await self._db.fetch("acquire_offered", host_id, serials, ttl, wanted)
            queued = frozenset(str(r["queued"]) for r in rows if r["queued"] is not None)
            rows = [r for r in rows if r["queued"] is None]
        else:
            rows = await self._db.fetch("acquire", host_id, serials, ttl)
            queued = frozenset()
        return Acquired(
            [
                Assignment(
                    TaskId(r["task_id"]),
                    r["attempt"],
                    LeaseId(r["lease_id"]),
                    r["device_serial"],
                    bytes(r["spec"]),
                    r["queued_seconds"] or 0.0,
                    r["deadline"],
                )
                for r in rows
                if r["task_id"] is not None
            ],
            [(r["device_serial"], r["labels"]) for r in rows if r["task_id"] is None],
            queued,
        )

    async def renew(self, host_id: str, lease_ids: list[str], ttl: timedelta) -> list[Renewal]:
        """The leases renewed (`lease_ids` as text: as the hosts send them); any other lease
        asked about is a conflict."""
        (answer,) = await self._renew_hosts([(host_id, lease_ids, ttl)])
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def renew_grouped(
        self, host_id: str, lease_ids: list[str], ttl: timedelta
    ) -> list[Renewal]:
        """As renew(), written with the other hosts' renewals arriving on this replica
        meanwhile (a group commit, store/grouped.py: one statement, one commit); answered
        after the commit with this host's leases' own outcomes. One of GROUPED_BELOW
        leases or more is its own statement."""
        if len(lease_ids) >= GROUPED_BELOW:
            return await self.renew(host_id, lease_ids, ttl)
        return await self._renewals((host_id, lease_ids, ttl))

    async def _renew_hosts(
        self, items: Sequence[tuple[str, list[str], timedelta]]
    ) -> list[list[Renewal] | Exception]:
        """Renewals of (host, its leases, TTL) in one statement; each host's leases renewed."""
        ttl = items[0][2]
        if any(t != ttl for _, _, t in items):  # one TTL a statement
            return [a for item in items for a in await self._renew_hosts([item])]
        hosts = [h for h, leases, _ in items for _ in leases]
        leases = [lease for _, ls, _ in items for lease in ls]
        rows = await self._db.fetch("renew_leases", hosts, leases, ttl)
        if len(items) == 1:
            return [[Renewal._make(r[:7]) for r in rows]]
        by_host: dict[str, list[Renewal]] = {}
        for r in rows:
            by_host.setdefault(r["host_id"], []).append(Renewal._make(r[:7]))
        twice = len({h for h, _, _ in items}) < len(items)
        out: list[list[Renewal] | Exception] = []
        for host, asked, _ in items:
            renewed = by_host.get(host, [])
            if twice:  # a host with two renewals in the group: each its own leases
                mine = set(asked)
                renewed = [r for r in renewed if str(r.lease_id) in mine]
            out.append(renewed)
        return out

    async def keep_steps(
        self, task_ids: list[TaskId], attempts: list[int], indexes: list[int], steps: list[bytes]
    ) -> list[TaskId]:
        """Steps of running attempts, a column per field, written in one statement (the
        replica's bulk write of step progress): each kept if its attempt is its task's
        current one and running, once; the tasks that had one kept."""
        rows = await self._db.fetch("keep_steps", task_ids, attempts, indexes, steps)
        return [TaskId(r["task_id"]) for r in rows]

    async def report(self, host_id: str | None, report: Report) -> Recorded:
        """The answer's code is RECORDED or REPEATED; refusals raise."""
        (answer,) = await self.report_many(host_id, [report])
        if isinstance(answer, errors.AmcError):
            raise answer
        return answer

    async def report_many(
        self, host_id: str | None, reports: list[Report]
    ) -> list[Recorded | errors.AmcError]:
        """Results applied in one transaction, each as if alone; per result, in order, the
        answer (code RECORDED or REPEATED) or the refusal."""
        kept = [(i, k) for i, r in enumerate(reports, 1) for k in r.kept]
        rows = await self._db.fetch(
            "report_results",
            host_id,
            *columns(
                reports, "task_id", "attempt", "lease_id", "outcome", "result", "error", "cleans"
            ),
            [i for i, _ in kept],
            *columns(
                [k for _, k in kept],
                *("artifact_id", "step_index", "action_index", "step_name", "kind", "sha256"),
                "data",
            ),
        )
        # A task that does not exist answers no row: not one of its attempts, so foreign.
        answers: list[Recorded | errors.AmcError] = [
            _report_refusal(ReportCode.FOREIGN, r) for r in reports
        ]
        for row in rows:
            if row["code"] is None:
                continue
            i, code = row["ord"] - 1, ReportCode(row["code"])
            if code in (ReportCode.RECORDED, ReportCode.REPEATED):
                answers[i] = Recorded(
                    code,
                    task(row),
                    row["att_cancel_requested_at"],
                    row["att_cancel_delivered_at"],
                    row["att_started_at"],
                )
            else:
                answers[i] = _report_refusal(code, reports[i])
        return answers

    async def mark_cancel_delivered(self, lease_id: LeaseId) -> None:
        await self._db.fetch("mark_cancel_delivered", lease_id)

    async def release(
        self, host_id: str | None, lease_id: LeaseId, reason: str, cleans: bool = False
    ) -> Expiry | None:
        """End the lease now, as its host (None: any); None if its attempt had ended.
        `cleans`: the host cleans the phone next (its condition becomes `cleaning`)."""
        row = await self._db.fetchrow("release_lease", host_id, lease_id, reason, cleans)
        assert row is not None
        code = ReleaseCode(row["code"])
        if code is ReleaseCode.FOREIGN:
            raise errors.LeaseConflict("no such lease for this host")
        return expiry(row) if code is ReleaseCode.RELEASED else None

    async def device_lost(
        self, host_id: str | None, lease_id: LeaseId, detail: str, budget: int, cleans: bool = False
    ) -> Expiry | None:
        """End the lease now because its phone was lost: the task is requeued within
        `budget` infrastructure retries; None if its attempt had ended. `cleans` as
        release's."""
        row = await self._db.fetchrow("device_lost", host_id, lease_id, detail, budget, cleans)
        assert row is not None
        code = ReleaseCode(row["code"])
        if code is ReleaseCode.FOREIGN:
            raise errors.LeaseConflict("no such lease for this host")
        return expiry(row) if code is ReleaseCode.RELEASED else None

    async def expire(self, limit: int = 100) -> list[Expiry]:
        return [expiry(r) for r in await self._db.fetch("expire_leases", limit)]

    async def end_overrun(self, grace: timedelta, limit: int = 100) -> list[Expiry]:
        """End up to `limit` live attempts that ran past their deadline by more than
        `grace` (one statement): the task fails "deadline exceeded" (or is cancelled, if a
        cancel was pending) and the lease ends."""
        return [expiry(r) for r in await self._db.fetch("end_overrun", limit, grace)]


# A report's refusal by its code: the error and its message.
_REFUSALS: dict[ReportCode, tuple[type[errors.AmcError], str]] = {
    ReportCode.FOREIGN: (
        errors.LeaseConflict,
        "lease does not belong to this host and {where}; nothing was recorded",
    ),
    ReportCode.STALE: (
        errors.StaleAttempt,
        "{where} is no longer current (lease expired or replaced); nothing was recorded",
    ),
    ReportCode.DIFFERENT: (
        errors.DifferentReportRecorded,
        "{where} already has a different outcome recorded; it stands",
    ),
    ReportCode.NO_CANCEL: (
        errors.NoCancellationRequested,
        "{where} has no cancellation request, so it cannot end cancelled",
    ),
}


def _report_refusal(code: ReportCode, report: Report) -> errors.AmcError:
    error, message = _REFUSALS[code]
    return error(message.format(where=f"task {report.task_id} attempt {report.attempt}"))
