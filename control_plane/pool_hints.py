"""The emulator pools of the hosts whose renewal streams this replica holds, and how many
queued tasks wait for each: told to each host on its stream (RenewLeasesResponse.wanted)
when a count changes, so that its pools grow toward their maximum (the host agent's
emulator_pool module).

A pool's count is, over the queue's groups as last counted (GetQueue's figures,
queue_group_stats: control_plane.queue_stats), the tasks of the groups whose selector its
labels match (and that name no serial), less the idle phones that match each group: what
no idle phone of the farm takes. A host tells its pools in the first request of each
stream (RenewLeasesRequest.pools). The cost: one read of the small stats table (a row per
selector with tasks queued, never the backlog) per replica every HINT_EVERY seconds,
jittered, and only while a stream here told of pools; the matching is in memory, each
pool compared only with the groups indexed under its own labels (`Wants`), so it grows
with the streams' pools, not with pools x queued selectors (scripts/pool_hints_cost.py).
No database work per task, per host or per renewal.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from control_plane import errors
from control_plane.domain import QueueWait
from control_plane.store import Store

log = structlog.get_logger(__name__)
HINT_EVERY = 2.0
# The queue's groups read: more selectors than any farm has queued at once.
GROUPS = 10_000
_RANDOM = random.Random()

Push = Callable[[dict[str, int]], None]


def wanted(labels: Mapping[str, str], groups: Sequence[QueueWait]) -> int:
    """The queued tasks a phone with `labels` would match, less the idle phones that match
    them (per group)."""
    return sum(
        max(0, g.count - g.match.idle)
        for g in groups
        if g.serial is None and all(labels.get(k) == v for k, v in g.labels.items())
    )


class Wants:
    """The queue's groups that want phones, indexed for `wanted` by pools: each group under
    the one of its labels fewest groups have (a pool without that label cannot match it),
    so a pool is compared with the groups under its own labels, not with every group; the
    same labels are counted once a round."""

    def __init__(self, groups: Sequence[QueueWait]) -> None:
        wanting = [(g, g.count - g.match.idle) for g in groups if g.serial is None]
        wanting = [(g, n) for g, n in wanting if n > 0]
        often: dict[tuple[str, str], int] = {}
        for g, _ in wanting:
            for item in g.labels.items():
                often[item] = often.get(item, 0) + 1
        self._anywhere = sum(n for g, n in wanting if not g.labels)
        self._under: dict[tuple[str, str], list[tuple[Mapping[str, str], int]]] = {}
        for g, n in wanting:
            if g.labels:
                anchor = min(g.labels.items(), key=lambda item: (often[item], item))
                self._under.setdefault(anchor, []).append((g.labels, n))
        self._seen: dict[frozenset[tuple[str, str]], int] = {}

    def wanted(self, labels: Mapping[str, str]) -> int:
        """As `wanted(labels, groups)`."""
        key = frozenset(labels.items())
        found = self._seen.get(key)
        if found is None:
            found = self._anywhere + sum(
                n
                for item in labels.items()
                for wants, n in self._under.get(item, ())
                if all(labels.get(k) == v for k, v in wants.items())
            )
            self._seen[key] = found
        return found


@dataclass
class _Told:
    host_id: str
    pools: list[tuple[str, dict[str, str]]]
    push: Push
    last: dict[str, int] = field(default_factory=dict)


class PoolHints:
    """Which streams here told of pools (wire-free: each pushes through its own callback)."""

    def __init__(self) -> None:
        self._told: dict[int, _Told] = {}
        self._ids = itertools.count()

    def __bool__(self) -> bool:
        return bool(self._told)

    @contextlib.contextmanager
    def told(
        self, host_id: str, pools: list[tuple[str, dict[str, str]]], push: Push
    ) -> Iterator[None]:
        """While the block runs, the stream's pools are counted and `push` is handed their
        counts when they change (at once, if tasks wait already)."""
        key = next(self._ids)
        self._told[key] = _Told(host_id, pools, push)
        try:
            yield
        finally:
            self._told.pop(key, None)

    def update(self, groups: Sequence[QueueWait]) -> None:
        """The queue as counted now: each stream whose counts changed is told them."""
        wants = Wants(groups)
        for told in list(self._told.values()):
            counts = {name: wants.wanted(labels) for name, labels in told.pools}
            if counts != told.last and (told.last or any(counts.values())):
                told.last = counts
                told.push(counts)


async def keep_pools_told(store: Store, hints: PoolHints, every: float = HINT_EVERY) -> None:
    """Read the queue's last count every `every` s (jittered) while streams here told of
    pools, and tell them what changed."""
    while True:
        await asyncio.sleep(every * _RANDOM.uniform(0.5, 1.0))
        if not hints:
            continue
        try:
            groups, _, _ = await store.queue.groups(GROUPS)
        except (errors.DatabaseUnavailable, errors.Contended) as error:
            log.warning("emulator pools not told: the queue was not read", error=error.message)
            continue
        hints.update(groups)
