"""glibc's malloc, set for a replica that runs for weeks.

A replica's live memory stays flat under a steady load (measured with memray: what is
allocated after the first minutes is freed again), yet with glibc's defaults its RSS kept
rising: +6 % in 15 minutes with no fault. That memory is the allocator's, not ours: blocks
freed in the middle of its heaps that it cannot give back. Two of glibc's defaults do it
here:

- The mmap threshold moves. A block of 128 KiB or more starts out as its own mapping, given
  back when freed; but each such free raises the threshold to that block's size (up to
  32 MiB), so from then on big blocks (a message of a large batch, a screen frame, an
  upload's chunk) come from the heap, where what is freed around them stays. A fixed
  threshold keeps big blocks in mappings of their own.
- An arena per thread, up to eight per core: gRPC's threads each fill and fragment one. Two
  are enough for the few threads a replica has.

The threshold is fixed at 128 KiB (glibc's own first value), not lower: a mapping is
faulted in page by page, zeroed, and unmapped when freed, so a block that is one costs
every page of it each time. gRPC reads a socket into blocks of 64 KiB and a page, and an
adb door relays its streams' bytes in frames below 128 KiB (amc_common.adb_carriage.CHUNK):
these are recycled in the heap. At 64 KiB each of them was a mapping, and a push through
a door cost the replica 5.7 ms of CPU a MB, four fifths of it the kernel's (about 2 ms now).
The heap's free top is given back beyond 1 MiB, not at every free of a block near it.

With two arenas, a threshold fixed at 64 KiB and a trim threshold of 128 KiB (the same as
MALLOC_ARENA_MAX=2 MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=131072 in the
environment) the growth under the same steady load was less than half (+2.6 % against
+6.0 %, as with jemalloc); what the soak's faults add is not this. docs/performance.md
"Soak" has the figures. An operator's own setting of one of them in the environment (or
GLIBC_TUNABLES) is kept: that one is left as they set it. Nothing happens on a C library
other than glibc.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Mapping

# What tune() set in this process: the replica's "control plane serving" line shows it.
applied: dict[str, int] = {}

# mallopt(3) parameters, and the environment variables glibc reads for the same.
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8

# A block this size or larger is a mapping of its own; the heap's free top beyond this is
# given back.
MMAP_THRESHOLD = 128 * 1024
TRIM_THRESHOLD = 1 << 20

SETTINGS = (
    ("arena_max", M_ARENA_MAX, "MALLOC_ARENA_MAX", "glibc.malloc.arena_max", 2),
    (
        "mmap_threshold",
        M_MMAP_THRESHOLD,
        "MALLOC_MMAP_THRESHOLD_",
        "glibc.malloc.mmap_threshold",
        MMAP_THRESHOLD,
    ),
    (
        "trim_threshold",
        M_TRIM_THRESHOLD,
        "MALLOC_TRIM_THRESHOLD_",
        "glibc.malloc.trim_threshold",
        TRIM_THRESHOLD,
    ),
)


def tune(env: Mapping[str, str] = os.environ) -> dict[str, int]:
    """Set the replica's malloc parameters, before its threads start; returns those set
    (none: not glibc). A parameter the environment sets already is left as it is."""
    applied.update(_tune(env))
    return dict(applied)


def _tune(env: Mapping[str, str]) -> dict[str, int]:
    if platform.libc_ver()[0] != "glibc":
        return {}
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return {}
    tunables = env.get("GLIBC_TUNABLES", "")
    done = {}
    for name, parameter, variable, tunable, value in SETTINGS:
        if variable in env or tunable in tunables:
            continue
        if mallopt(ctypes.c_int(parameter), ctypes.c_int(value)) == 1:
            done[name] = value
    return done
