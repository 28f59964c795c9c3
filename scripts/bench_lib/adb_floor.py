"""The `adb` workload's figures of its floor (bench_lib.relay_floor: the door's push path
as a bare grpc.aio relay, pushed after each pair of direct and door pushes) and their rows:

- the floor's best MB/s, and its share of the direct push's best;
- CPU ms a MB of its sender, relay and receiver (and their sum) beside AMC's door,
  control plane and agent (theirs over the door's pushes), each in the other's place;
- the ceiling each implies: the machine's cores (1,000 ms of CPU a second each) over the
  CPU ms a MB of the door's path with those three in its middle and the adb server's
  (both its passes) and the phone's own at its ends, as the door's pushes measured them.
  The MB/s no scheduling of those processes on those cores could beat, and its share of
  the direct push's: at best, since it counts no CPU of the adb client's (not measured)
  and no wait in the pipeline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from bench_lib.relay_floor import NAMES, Floor, push
from bench_lib.report import Row
from bench_lib.stack import cpu_seconds

AMC = ("door", "control plane", "agent")  # their places on the door's path
ENDS = ("adb server", "phone (this process)")  # the door's path's own, beside the three
BENCH = "bench (its ends)"


@dataclass
class Tally:
    """The floor's pushes so far: the best MB/s, each process's CPU seconds over them."""

    mb_s: float = 0.0
    pushes: int = 0
    delivered: bool = True
    cpu: dict[str, float] = field(default_factory=lambda: dict.fromkeys((*NAMES, BENCH), 0.0))


async def measured(floor: Floor, data: bytes, tally: Tally) -> None:
    """One push of `data`, counted in `tally` (the bench's own CPU as BENCH)."""
    pids = {**floor.pids, BENCH: os.getpid()}
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    seconds, size = await push(floor, data)
    for name, pid in pids.items():
        tally.cpu[name] += cpu_seconds(pid) - before[name]
    tally.mb_s = max(tally.mb_s, len(data) / 1e6 / seconds)
    tally.pushes += 1
    tally.delivered = tally.delivered and size == len(data)


def figures(tally: Tally, mb: int, door: dict[str, float], direct_mb_s: float) -> dict[str, Any]:
    """The floor's figures beside the door's (`door`: its CPU ms a MB by process). The
    ceiling: the machine's cores (CPU ms a second) over the CPU ms a MB of the door's
    path with the floor's three (or AMC's) in the middle, the adb server's and the
    phone's as the door's pushes had them: the MB/s no scheduling could beat."""
    ms = {name: 1000 * s / (max(1, tally.pushes) * mb) for name, s in tally.cpu.items()}
    ends = sum(door.get(name, 0.0) for name in ENDS)
    sums = {"floor": sum(ms[n] for n in NAMES), "amc": sum(door.get(n, 0.0) for n in AMC)}
    cores = os.cpu_count() or 1
    ceiling = {k: 1000 * cores / (v + ends) if v + ends else 0.0 for k, v in sums.items()}
    share = 1 / direct_mb_s if direct_mb_s else 0.0
    return {
        "mb_s": tally.mb_s,
        "share": tally.mb_s * share,
        "pushes": tally.pushes,
        "delivered": tally.delivered,
        "cpu_ms_per_mb": ms,
        "sum_ms_per_mb": sums,
        "cores": cores,
        "ceiling_mb_s": ceiling,
        "ceiling_share": {k: v * share for k, v in ceiling.items()},
    }


def rows(adb: dict[str, Any]) -> list[Row]:
    """The floor's rows under the adb workload's (none before it was measured)."""
    f = adb.get("push_floor")
    if not f:
        return []
    ms, door, sums = f["cpu_ms_per_mb"], adb["push_door_cpu_ms_per_mb"], f["sum_ms_per_mb"]
    three = " / ".join(f"{ms[n]:.2f}" for n in NAMES)
    amc = " / ".join(f"{door[n]:.2f}" for n in AMC)
    lost = "" if f["delivered"] else "; BYTES LOST"
    up, share = f["ceiling_mb_s"], f["ceiling_share"]
    cores = f["cores"]
    return [
        Row(
            "13 adb door",
            "  bare grpc.aio relay, same frames: MB/s; CPU ms a MB (sum)",
            f"{f['mb_s']:.1f} ({f['share']:.0%}); {three} ({sums['floor']:.2f})"
            f" against AMC's {amc} ({sums['amc']:.2f}){lost}",
        ),
        Row(
            "13 adb door",
            f"  at best on {cores} cores: {1000 * cores:,} / (three + adb server + phone) ms a MB",
            f"{up['floor']:.0f} MB/s ({share['floor']:.0%}) with the floor's three,"
            f" {up['amc']:.0f} ({share['amc']:.0%}) with AMC's",
        ),
    ]
