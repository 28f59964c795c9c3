"""The replica's garbage-collector policy (control_plane/heap.py): what survives an older
generation's collection is frozen out of the next walks, every pause is measured, and a
periodic full collection still reclaims cycles among frozen objects."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from control_plane import metrics
from control_plane.heap import Heap


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
