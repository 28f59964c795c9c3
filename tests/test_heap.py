"""The replica's garbage-collector policy (control_plane/heap.py): what survives an older
generation's collection is frozen out of the next walks, every pause is measured, and a
periodic full collection still reclaims cycles among frozen objects."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from collections.abc import Iterator

import pytest
import structlog

from control_plane import metrics
from control_plane.heap import Heap
from tests.support import eventually


def _pauses(generation: int) -> float:
    value = metrics.GC_PAUSE.labels(str(generation))._sum.get()  # type: ignore[attr-defined]
    return float(value)


@pytest.fixture
def heap() -> Iterator[Heap]:
    policy = Heap()
    policy.install()
    yield policy
    policy.uninstall()


class Node:
    """An object in a reference cycle: only the cyclic collector can free it."""

    def __init__(self) -> None:
        self.me = self


def test_survivors_of_a_full_collection_are_frozen_and_the_pause_is_measured(
    heap: Heap,
) -> None:
    """THEN after a full collection its survivors are frozen (the next walk skips them)
    and amc_gc_pause_seconds{generation="2"} grew."""
    before = _pauses(2)
    kept = [Node() for _ in range(1000)]
    gc.collect()
    assert gc.get_freeze_count() >= len(kept)
    assert all(gc.is_tracked(n) for n in kept)
    assert _pauses(2) > before


def test_a_cycle_frozen_while_alive_is_reclaimed_by_the_periodic_full_collection(
    heap: Heap,
) -> None:
    """THEN a cycle that died after it was frozen survives ordinary collections and is
    freed by collect_all (the unfreeze every few minutes)."""
    node = Node()
    gone = weakref.ref(node)
    gc.collect()  # node survives: frozen
    del node
    gc.collect()
    assert gone() is not None, "a frozen cycle is out of the collector's sight"
    heap.collect_all()
    assert gone() is None


def test_uninstall_leaves_the_collector_as_it_was(heap: Heap) -> None:
    """THEN nothing stays frozen and no callback stays behind."""
    heap.uninstall()
    assert gc.get_freeze_count() == 0
    assert heap._on_collection not in gc.callbacks


def _lag() -> tuple[float, float]:
    count = sum(s.value for s in metrics.LOOP_LAG.collect()[0].samples if s.name.endswith("_count"))
    total = sum(s.value for s in metrics.LOOP_LAG.collect()[0].samples if s.name.endswith("_sum"))
    return count, total


async def test_a_blocked_event_loop_is_measured_and_logged_and_collections_go_on() -> None:
    """THEN a callback holding the loop for 0.5 s shows as lag (amc_event_loop_lag_seconds:
    at least 0.25 s, its sleep having begun at most 0.25 s before) and an "event loop
    stalled" log line, and the periodic full collection still runs."""
    heap = Heap(unfreeze_every=0.3)
    runs = 0
    real = heap.collect_all

    def counted() -> None:
        nonlocal runs
        runs += 1
        real()

    heap.collect_all = counted  # type: ignore[method-assign]
    count0, sum0 = _lag()
    with structlog.testing.capture_logs() as logged:
        watching = asyncio.create_task(heap.run())
        try:
            await asyncio.sleep(0.3)
            time.sleep(0.5)  # noqa: ASYNC251 (holding the loop is the point)
            await eventually(lambda: _lag()[1] - sum0 >= 0.24 and runs >= 2, what="lag, runs")
        finally:
            watching.cancel()
    count, total = _lag()
    assert count > count0 and total - sum0 >= 0.24, (count0, sum0, count, total)
    stalls = [e for e in logged if e["event"] == "event loop stalled"]
    assert stalls and max(e["seconds"] for e in stalls) >= 0.24, logged
    assert runs >= 2
