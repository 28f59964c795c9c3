"""The replica's cyclic garbage collector, kept from stopping the event loop on a big fleet.

Every connected host keeps two long calls open on its replica (the renewal stream and a
parked Acquire): over a hundred objects the collector tracks (grpc.aio's and our
coroutines, tasks, futures, contexts). At 5,000 hosts that is some 600,000 objects, and
CPython's full collection (generation 2) walks all of them with the event loop stopped:
0.6-0.8 s, every 10-30 s under load in `make bench`'s fleet workload, so a pickup or a
cancel push now and then waited that long.

So what survives a collection of the older generations (1 and 2) is frozen (`gc.freeze()`:
kept where the collector no longer looks), and each collection walks only what is newer:
a few milliseconds. Frozen objects are still freed by reference counting the moment nothing
refers to them; only reference cycles among them stay. To reclaim those too, every
`unfreeze_every` (10 minutes) everything is unfrozen and collected at once: the one long
walk of the whole heap, once per interval instead of several times a minute.

`amc_gc_pause_seconds{generation}` shows every pause; `amc_event_loop_lag_seconds` how
late a timer of the loop ran (a collection, a long callback, or the process waiting for a
core), and a lag over `STALL` is logged as "event loop stalled".

A loop that stands still for `stuck_exit` seconds (`--stuck-exit`: a deadlock, a callback
that never returns) ends the process: the standard library's faulthandler writes every
thread's stack to stderr and exits with status 1, from a C thread that needs neither the
loop nor the GIL. Such a replica is worse than a dead one: gRPC's own threads still answer
its connections' keepalive pings, so its hosts' calls time out for ever instead of
reconnecting to another replica; dead, its connections drop, its hosts move, and its
supervisor starts it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import sys
import time
from typing import Any

import structlog

from control_plane import metrics

log = structlog.get_logger(__name__)

UNFREEZE_EVERY = 600.0
# The loop's lag is read this often (how late a sleep of this length wakes), and a lag
# over STALL is logged.
LAG_EVERY = 0.25
STALL = 0.2
# How often (at most; a quarter of --stuck-exit if less) the stuck-loop exit is pushed
# back while the loop runs: each push starts the faulthandler's timer anew.
REARM_EVERY = 1.0


class Heap:
    """Installed once per process by the replica's entry point (`control-plane serve`), not
    by in-process replicas, which share their process with other code."""

    def __init__(
        self, unfreeze_every: float = UNFREEZE_EVERY, stuck_exit: float | None = None
    ) -> None:
        self.unfreeze_every = unfreeze_every
        self.stuck_exit = stuck_exit
        self._started = 0.0
        # Resolved once: the callback takes no metric-wide lock (a collection may start
        # while this thread holds one of those), only the values' own.
        self._pauses = [metrics.GC_PAUSE.labels(str(g)) for g in range(3)]

    def install(self) -> None:
        """Freeze what start-up made (modules, settings, pools) and watch each collection."""
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._on_collection)

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._on_collection)
        gc.unfreeze()

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collector, on whichever thread allocated last; no collection
        # starts within it. gc.freeze() moves lists; nothing here walks the heap.
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        self._pauses[generation].observe(time.perf_counter() - self._started)
        if generation >= 1:
            gc.freeze()

    def collect_all(self) -> None:
        """Unfreeze and collect everything now (the callback freezes the survivors again)."""
        gc.unfreeze()
        gc.collect()

    async def run(self) -> None:
        """`collect_all` every `unfreeze_every`, so cycles among old objects go too; and
        the loop's lag measured every LAG_EVERY."""
        loop = asyncio.get_running_loop()
        unfreeze_at = loop.time() + self.unfreeze_every
        armed_at = -1.0
        rearm = min(REARM_EVERY, (self.stuck_exit or 0) / 4)
        try:
            while True:
                if self.stuck_exit and loop.time() - armed_at >= rearm:
                    # Re-armed while the loop runs; never, once it stands still.
                    faulthandler.dump_traceback_later(self.stuck_exit, exit=True, file=sys.stderr)
                    armed_at = loop.time()
                asleep = loop.time()
                await asyncio.sleep(LAG_EVERY)
                lag = max(0.0, loop.time() - asleep - LAG_EVERY)
                metrics.LOOP_LAG.observe(lag)
                if lag > STALL:
                    log.warning("event loop stalled", seconds=round(lag, 3))
                if loop.time() >= unfreeze_at:
                    self.collect_all()
                    unfreeze_at = loop.time() + self.unfreeze_every
        finally:
            if self.stuck_exit:
                faulthandler.cancel_dump_traceback_later()
