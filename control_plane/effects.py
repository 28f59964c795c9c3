"""What follows a committed transition, written once: tell the hub (watchers, dispatch of
queued work, the other replicas), count it, log it. Every transition of every service and
of the expiry sweep goes through here, after its transaction committed."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, assert_never

import structlog

from control_plane import metrics
from control_plane.dispatch import Offer
from control_plane.domain import (
    Assignment,
    CancelNotice,
    Expiry,
    FairShare,
    Principal,
    Recorded,
    Renewal,
    Report,
    Task,
    TaskId,
)
from control_plane.errors import AmcError
from control_plane.hub import Hub
from control_plane.lifecycle import (
    CancelCode,
    Event,
    HostEventKind,
    Outcome,
    ReportCode,
    TaskStatus,
)

log = structlog.get_logger(__name__)


class Effects:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def submitted(self, tasks: Sequence[Task]) -> None:
        """New tasks, queued."""
        if not tasks:
            return
        for task in tasks:
            self.hub.task_changed(task.task_id)
        self.hub.queued(
            [Offer(str(t.task_id), t.selector_serial, t.selector_labels) for t in tasks]
        )
        metrics.TRANSITIONS.labels(Event.SUBMIT, TaskStatus.QUEUED).inc(len(tasks))
        if len(tasks) == 1:
            (task,) = tasks
            log.info(
                "task submitted",
                task_id=str(task.task_id),
                priority=task.priority,
                request_id=task.request_id,
            )
        else:
            log.info("tasks submitted", count=len(tasks), task_ids=[str(t.task_id) for t in tasks])

    def host_changed(
        self, host_id: str, kind: HostEventKind, actor: Principal, reason: str, **fields: Any
    ) -> None:
        """An operator cordoned, uncordoned or drained the host or one of its devices
        (`serial` in fields): its Acquires look again, here and on the other replicas (a
        cordoned one is then offered nothing; an uncordoned one takes queued work at once),
        and a drain, or the uncordon that ends it, is pushed to its stream."""
        self.hub.devices_freed({host_id})
        if kind is HostEventKind.DRAIN:
            self.hub.drain_changed(host_id, True)
        elif kind is HostEventKind.UNCORDON and "serial" not in fields:
            self.hub.drain_changed(host_id, False)
        self.host_logged(host_id, kind, actor, reason, **fields)

    def device_released(self, host_id: str, serial: str, actor: Principal, reason: str) -> None:
        """An operator released the device from quarantine: its host's stream, wherever it
        is open, tells the agent (which probes it and reports its condition)."""
        self.hub.device_released(host_id, serial)
        self.host_logged(host_id, HostEventKind.RELEASE, actor, reason, serial=serial)

    def host_logged(
        self, host_id: str, kind: HostEventKind, actor: Principal, reason: str, **fields: Any
    ) -> None:
        log.info(
            f"host {kind}",
            host_id=host_id,
            by=actor.caller,
            by_name=actor.name,
            reason=reason,
            **fields,
        )

    def fair_share_set(
        self,
        share: FairShare,
        actor: Principal,
        reason: str,
        heads: Sequence[tuple[TaskId, str | None, dict[str, str]]],
    ) -> None:
        """An operator set a fairness key's share. A cap raised or removed lets some of the
        key's queued tasks start: `heads`, the first of them, are offered to the parked
        Acquires here and on the other replicas, as if just queued (an Acquire that finds
        nothing queued skips them, as it skips any offer it cannot use)."""
        if heads:
            self.hub.queued(
                [Offer(str(task_id), serial, labels) for task_id, serial, labels in heads]
            )
        log.info(
            "fair share set",
            fairness_key=share.fairness_key,
            weight=share.weight,
            max_devices=share.max_devices,
            offered=len(heads),
            by=actor.caller,
            by_name=actor.name,
            reason=reason,
        )

    def assigned(self, host_id: str, assignments: Sequence[Assignment]) -> None:
        for a in assignments:
            self.hub.task_changed(a.task_id)
            metrics.ASSIGNMENT_LATENCY.observe(a.queued_seconds)
            metrics.TRANSITIONS.labels(Event.ASSIGN, TaskStatus.ASSIGNED).inc()
            log.info(
                "task assigned",
                **_attempt(a.task_id, a.attempt, a.lease_id, host_id),
                device=a.device_serial,
            )

    def renewed(self, host_id: str, asked: int, renewals: Sequence[Renewal]) -> None:
        """A renewal answered: acknowledgements among it, cancels it delivered. (The steps
        it carried are the hub's progress to write: control_plane/progress.py.)"""
        for r in renewals:
            if r.acknowledged:
                self.hub.task_changed(r.task_id)
                metrics.TRANSITIONS.labels(Event.ACKNOWLEDGE, TaskStatus.DISPATCHED).inc()
                if r.pickup_seconds is not None:
                    metrics.PICKUP.observe(r.pickup_seconds)
                log.debug("task dispatched", **_attempt(r.task_id, r.attempt, r.lease_id, host_id))
            if r.delivery_seconds is not None:
                metrics.CANCEL_DELIVERY.labels("renewal").observe(r.delivery_seconds)
        metrics.RENEWAL_BATCH.observe(asked)
        metrics.RENEWALS.labels("renewed").inc(len(renewals))
        metrics.RENEWALS.labels("conflict").inc(asked - len(renewals))

    def reported(self, host_id: str | None, report: Report, answer: Recorded) -> None:
        """A result answered: recorded now, or the same one recorded before (repeated)."""
        task = answer.task
        if answer.code is ReportCode.RECORDED:
            self.hub.task_changed(report.task_id)
            metrics.TRANSITIONS.labels(Event.REPORT, report.outcome).inc()
            delivered, finished = answer.cancel_delivered_at, task.finished_at
            if report.outcome is Outcome.CANCELLED and delivered and finished:
                metrics.CANCEL_STOP.observe(max(0.0, (finished - delivered).total_seconds()))
            if answer.started_at and finished:
                run = max(0.0, (finished - answer.started_at).total_seconds())
                metrics.RUN_SECONDS.labels(str(report.outcome)).observe(run)
            for kept in report.kept:
                metrics.ARTIFACT_UPLOADS.labels("with_report").inc()
                if kept.data:
                    metrics.ARTIFACT_BYTES.labels("stored").inc(len(kept.data))
        log.info(
            f"result {answer.code}",
            **_attempt(report.task_id, report.attempt, report.lease_id, task.host_id or host_id),
            outcome=str(report.outcome),
        )

    def refused(self, host_id: str | None, report: Report, refusal: AmcError) -> None:
        """A result of a batch refused (a lone ReportResult's refusal is its error reply)."""
        log.info(
            "result refused",
            **_attempt(report.task_id, report.attempt, report.lease_id, host_id),
            outcome=str(report.outcome),
            error=refusal.message,
        )

    def cancelled(self, code: CancelCode, task: Task, notice: CancelNotice | None = None) -> None:
        """A cancel answered: CANCELLED (it was queued), REQUESTED (the host is told: its
        `notice` pushed onto the host's stream, here or on the replica holding it) or
        UNCHANGED (nothing new)."""
        match code:
            case CancelCode.CANCELLED:
                event, said = Event.CANCEL, "cancellation done"
            case CancelCode.REQUESTED:
                event, said = Event.CANCEL_REQUESTED, "cancellation requested"
            case CancelCode.UNCHANGED:
                return
            case CancelCode.TERMINAL | CancelCode.NOT_FOUND:
                raise ValueError(f"{code} is a refusal")
            case _:
                assert_never(code)
        if notice is not None:
            self.hub.cancel_requested(notice)
        self.hub.task_changed(task.task_id)
        metrics.TRANSITIONS.labels(event, task.status).inc()
        log.info(
            said,
            task_id=str(task.task_id),
            attempt=task.attempt,
            host_id=task.host_id,
            status=str(task.status),
        )

    def timed_out(self, tasks: Sequence[Task]) -> None:
        """Queued tasks failed by the sweep: their queue timeout ran out."""
        for task in tasks:
            self.hub.task_changed(task.task_id)
            metrics.TRANSITIONS.labels(Event.QUEUE_TIMEOUT, task.status).inc()
            log.info(
                "task failed: queue timeout",
                task_id=str(task.task_id),
                queue_timeout=str(task.queue_timeout),
            )

    def ended(self, how: Event, ended: Sequence[Expiry]) -> None:
        """Leases ended by the host (how: RELEASED, or DEVICE_LOST: its phone was lost), by
        running out (EXPIRED), or by the sweep because the run overran its deadline
        (DEADLINE_EXCEEDED)."""
        offers = []
        for e in ended:
            self.hub.task_changed(e.task_id)
            if e.to_status is TaskStatus.QUEUED:
                offers.append(Offer(str(e.task_id), e.selector_serial, e.selector_labels))
                metrics.REQUEUES.labels(f"lease_{how}").inc()
            if how is Event.DEADLINE_EXCEEDED or how is Event.DEVICE_LOST:
                metrics.TRANSITIONS.labels(how, e.to_status).inc()
            else:
                metrics.EXPIRED.labels(e.to_status).inc()
            log.info(
                f"lease {how}",
                **_attempt(e.task_id, e.attempt, e.lease_id, e.host_id),
                to=str(e.to_status),
            )
        if offers:
            self.hub.queued(offers)
        self.hub.devices_freed({e.host_id for e in ended})


def _attempt(
    task_id: uuid.UUID, attempt: int, lease_id: uuid.UUID, host_id: str | None
) -> dict[str, Any]:
    """The log fields that name an attempt and its lease."""
    return {
        "task_id": str(task_id),
        "attempt": attempt,
        "lease_id": str(lease_id),
        "host_id": host_id,
    }
