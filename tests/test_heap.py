"""The replica's garbage-collector policy (control_plane/heap.py): what survives an older
generation's collection is frozen out of the next walks, every pause is measured, and a
periodic full collection still reclaims cycles among frozen objects."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
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


STUCK = """
import asyncio, sys, time
from control_plane.heap import Heap

async def main() -> None:
    watching = asyncio.create_task(Heap(stuck_exit=1.0).run())
    await asyncio.sleep(float(sys.argv[1]))  # the loop runs: the exit is pushed back
    if sys.argv[2] == "block":
        time.sleep(20)  # the loop stands still
    watching.cancel()
    await asyncio.gather(watching, return_exceptions=True)

asyncio.run(main())
"""


def test_a_loop_that_stands_still_ends_the_process_with_every_stack_written() -> None:
    """THEN with --stuck-exit 1 a loop that runs for 2.5 s lives on (and ends as it
    likes), while one that stands still for longer than 1 s is ended (status 1) with its
    threads' stacks on stderr, long before its 20-second block is over."""
    alive = subprocess.run(
        [sys.executable, "-c", STUCK, "2.5", "run"], capture_output=True, text=True, timeout=60
    )
    assert alive.returncode == 0, alive.stderr
    began = time.monotonic()
    stuck = subprocess.run(
        [sys.executable, "-c", STUCK, "0.3", "block"], capture_output=True, text=True, timeout=60
    )
    assert stuck.returncode == 1, stuck.stderr
    assert time.monotonic() - began < 15
    assert "Timeout (0:00:01)!" in stuck.stderr and "in main" in stuck.stderr, stuck.stderr


def test_stuck_exit_is_30_seconds_by_default_0_switches_it_off_and_a_bad_value_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """THEN `serve` gets 30 s (or $AMC_STUCK_EXIT), 0 is off, and a negative or
    non-number is refused naming the flag."""
    from control_plane.flags import parser

    assert parser({}).parse_args(["serve"]).stuck_exit == 30.0
    assert parser({"AMC_STUCK_EXIT": "45"}).parse_args(["serve"]).stuck_exit == 45.0
    assert parser({}).parse_args(["serve", "--stuck-exit", "0"]).stuck_exit == 0.0
    for bad, why in (("-1", "is negative"), ("soon", "is not a duration"), ("inf", "is not")):
        with pytest.raises(SystemExit):
            parser({}).parse_args(["serve", "--stuck-exit", bad])
        assert f"argument --stuck-exit: '{bad}' {why}" in capsys.readouterr().err
