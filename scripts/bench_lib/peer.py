"""Workload 6, the peer: ../shared/bench/peers/run-pgqueuer (pgqueuer on its own fresh
embedded PostgreSQL, default durability), run in this same run so that AMC / pgqueuer is a
ratio of figures taken on the same machine minutes apart. It makes its own virtualenv on
first use. Its output is one JSON line per measurement."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from bench_lib.stack import save
from bench_lib.stats import over_reps


def find(peer_dir: Path) -> Path | None:
    script = peer_dir / "run-pgqueuer"
    return script if script.is_file() else None


async def run(script: Path, reps: int, jobs: int, trials: int, log: Path) -> dict[str, Any]:
    argv = [str(script), "--reps", str(reps), "--n", str(jobs), "--trials", str(trials)]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=script.parent
    )
    out, err = await proc.communicate()
    save(log, err)  # its progress lines
    if proc.returncode != 0:
        tail = err.decode(errors="replace")[-2000:]
        raise RuntimeError(f"{script} failed ({proc.returncode}):\n{tail}")
    records = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    return summarize(records)


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    drains: dict[str, list[float]] = {}
    for r in records:
        if r["kind"] == "throughput":
            drains.setdefault(r["variant"], []).append(r["drain_per_s"])
    latency = [r for r in records if r["kind"] == "latency"]
    out: dict[str, Any] = {
        "version": next((r.get("version") for r in records), None),
        "drain_per_s": {variant: over_reps(values) for variant, values in drains.items()},
        "verified": all(r.get("verified", True) for r in records if r["kind"] == "throughput"),
        "commits_per_job": {
            r["variant"]: r["drain_cost"]["commits_per_job"]
            for r in records
            if r["kind"] == "throughput"
        },
    }
    for name in ("pickup_ms", "cancel_ms", "cancel_scope_ms"):
        if latency:
            out[name] = over_reps([r[name].get("median") for r in latency])
            out[name + "_p90"] = over_reps([r[name].get("p90") for r in latency])
    out["records"] = records
    return out
