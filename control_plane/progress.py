"""Step progress kept where it is cheapest: in the memory of the replica holding the host's
renewal stream, written to PostgreSQL in bulk.

A renewal that carries steps answers its leases as one without: the steps of the leases it
renewed wait here (`Progress.add`), and every `progress_every` (1 s, jittered) the replica
writes all of them, of every host whose stream it holds, in one statement that commits
without waiting for its WAL flush (`keep_steps`: progress is not the record, the terminal
report is). Their tasks' watchers, here and on the other replicas, are then told by a few
notifications (`Hub.progress_kept`: up to PROGRESS_CHUNK task ids each), and every replica
reads the steps from the database as before. So a step shows on GetTask, WatchTask and the
console of any replica within one renew interval of its end (the agent sends it with its
next renewal) plus `progress_every`.

What is lost: the steps that wait here when the replica dies (at most one `progress_every`
of them; a replica that stops writes them first). The terminal report carries every step,
so only a running task's view can miss them until it ends. While the database is away they
wait, up to MAX_PENDING_BYTES; past it the newest are dropped and counted.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from control_plane import errors, metrics
from control_plane.config import Settings
from control_plane.domain import Renewal, StepProgress, TaskId

if TYPE_CHECKING:  # the hub holds a replica's Progress
    from control_plane.hub import Hub
    from control_plane.store import Store

log = structlog.get_logger(__name__)
# Jitter from a generator of its own: drawing from the global one would change the state
# that other code in the process (tests, libraries) relies on.
_RANDOM = random.Random()

# What one replica keeps waiting for its write, at most (the steps' bytes): past it, while
# the database is away, steps are dropped (amc_step_progress_total{result="dropped"}). A
# second of 1,000 steps is well under 1 MiB (a step's output and error are cut at 4 KiB
# each by the host, and most say far less).
MAX_PENDING_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Steps:
    """Steps to write: a column per field, as `keep_steps` takes them."""

    task_ids: list[TaskId]
    attempts: list[int]
    indexes: list[int]
    steps: list[bytes]

    def __len__(self) -> int:
        return len(self.task_ids)


class Progress:
    """The steps this replica was sent and has not written yet, by (task, attempt, index):
    a step sent twice waits once."""

    def __init__(self) -> None:
        self._pending: dict[tuple[TaskId, int, int], bytes] = {}
        self._bytes = 0
        # One write at a time: a write that returns has written what waited when it began,
        # whether it took it or the write before it did.
        self.writing = asyncio.Lock()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, renewals: Sequence[Renewal], steps: Sequence[StepProgress]) -> int:
        """The steps of the leases among `renewals` (those renewed) wait for the next
        write; how many. The others (a stale attempt's, another host's) are refused."""
        renewed = {str(r.lease_id): r for r in renewals}
        kept = dropped = 0
        for s in steps:
            r = renewed.get(s.lease_id)
            if r is None:
                continue
            kept += 1
            if not self._wait((r.task_id, r.attempt, s.index), s.step):
                dropped += 1
        metrics.STEP_PROGRESS.labels("kept").inc(kept - dropped)
        metrics.STEP_PROGRESS.labels("refused").inc(len(steps) - kept)
        if dropped:
            metrics.STEP_PROGRESS.labels("dropped").inc(dropped)
        return kept - dropped

    def take(self) -> Steps:
        """Everything waiting (in task order: the order the write reads the tasks in), and
        nothing left waiting."""
        pending, self._pending, self._bytes = self._pending, {}, 0
        keys = sorted(pending)
        return Steps(
            [k[0] for k in keys], [k[1] for k in keys], [k[2] for k in keys],
            [pending[k] for k in keys],
        )  # fmt: skip

    def give_back(self, steps: Steps) -> None:
        """Steps whose write failed wait again, within MAX_PENDING_BYTES (a step sent again
        meanwhile waits once)."""
        columns = zip(steps.task_ids, steps.attempts, steps.indexes, steps.steps, strict=True)
        dropped = sum(not self._wait((t, a, i), step) for t, a, i, step in columns)
        if dropped:
            metrics.STEP_PROGRESS.labels("dropped").inc(dropped)

    def _wait(self, key: tuple[TaskId, int, int], step: bytes) -> bool:
        """The step waits (once per key), unless that would pass MAX_PENDING_BYTES."""
        if key in self._pending:
            return True
        if self._bytes + len(step) > MAX_PENDING_BYTES:
            return False
        self._pending[key] = step
        self._bytes += len(step)
        return True


async def write_once(store: Store, hub: Hub) -> int:
    """Write what waits in `hub.progress` (one statement) and tell the watchers of the
    tasks with a step kept; how many steps it took (those of tasks that ended meanwhile are
    not kept). Nothing waiting: no statement. A write that fails leaves the steps waiting
    and raises."""
    async with hub.progress.writing:
        steps = hub.progress.take()
        if not steps:
            return 0
        try:
            tasks = await store.leases.keep_steps(
                steps.task_ids, steps.attempts, steps.indexes, steps.steps
            )
        except BaseException:
            hub.progress.give_back(steps)
            raise
    hub.progress_kept(tasks)
    return len(steps)


async def keep_progress_written(store: Store, hub: Hub, settings: Settings) -> None:
    """Every `progress_every` (jittered: replicas that started together do not write
    together), what waits is written."""
    every = settings.progress_every.total_seconds()
    while True:
        await asyncio.sleep(every * _RANDOM.uniform(0.8, 1.0))
        try:
            await write_once(store, hub)
        except (errors.DatabaseUnavailable, errors.Contended) as error:
            log.warning("step progress not written; trying again", error=error.message)
