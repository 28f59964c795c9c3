"""`--profile`: where the CPU goes while a workload runs. py-spy samples the control plane
and one agent (on-CPU samples only, 100 Hz), and pg_stat_statements (with track=all, so the
statements inside the PL/pgSQL functions count too) says what PostgreSQL spent its time on.
Profiling costs throughput: figures from a --profile run are not the benchmark's figures.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

PG_SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
}
_LOCATION = re.compile(r" \(([^()]*?):\d+\)$")


def py_spy() -> str:
    found = shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if found is None:
        raise SystemExit("--profile needs py-spy: .venv/bin/pip install py-spy")
    return found


@dataclass
class Recording:
    name: str
    path: Path
    proc: asyncio.subprocess.Process


async def start(
    name: str, pid: int, workdir: Path, seconds: float, rate: int = 100, native: bool = False
) -> Recording:
    """py-spy recording `pid`; `native`: with C frames (gRPC's core, protobuf, malloc), which
    py-spy reads only by pausing the process at each sample (it costs the process more)."""
    path = workdir / f"profile-{name}.txt"
    extra = ["--native"] if native else ["--nonblocking"]
    proc = await asyncio.create_subprocess_exec(
        py_spy(), "record", "--pid", str(pid), "--format", "raw", "--output", str(path),
        "--rate", str(rate), "--duration", str(max(1, round(seconds))), *extra,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    return Recording(name, path, proc)


async def finish(recording: Recording) -> dict[str, Any]:
    """Stop early if the workload ended first (SIGINT makes py-spy write what it has)."""
    raw = await finish_raw(recording)
    return fold(raw) if raw else {}


async def finish_raw(recording: Recording) -> str:
    """The recording's raw stacks ("" if none), stopped early if still running."""
    if recording.proc.returncode is None:
        recording.proc.send_signal(2)
    await recording.proc.wait()
    if not recording.path.exists():
        return ""
    return recording.path.read_text()


def _frame(raw: str) -> str:
    """`func (path/to/module.py:123)` -> `func (module.py)`: lines of one function merged."""
    match = _LOCATION.search(raw)
    if not match:
        return raw
    return f"{raw[: match.start()]} ({Path(match[1]).name})"


def fold(raw: str, top: int = 30) -> dict[str, Any]:
    """Self and inclusive shares of on-CPU samples, by function."""
    total = 0
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        frames = [_frame(f) for f in stack.split(";")]
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n

    def shares(counter: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(100 * n / total, 1)) for f, n in counter.most_common(top)]

    return {"samples": total, "self_pct": shares(own), "inclusive_pct": shares(inclusive)}


class WaitSampler:
    """What PostgreSQL's client backends are doing, sampled every 20 ms from
    pg_stat_activity: on CPU, waiting for a lock (and in which statement), on I/O, or idle."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.samples = 0
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> WaitSampler:
        conn = await asyncpg.connect(self.dsn)
        self._task = asyncio.create_task(self._run(conn))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self, conn: asyncpg.Connection) -> None:
        try:
            while True:
                rows = await conn.fetch(
                    """
                    SELECT coalesce(wait_event_type, 'CPU') AS type,
                           coalesce(wait_event, '') AS event,
                           left(regexp_replace(query, '\\s+', ' ', 'g'), 60) AS query
                    FROM pg_stat_activity
                    WHERE backend_type = 'client backend' AND state <> 'idle'
                      AND pid <> pg_backend_pid()
                    """
                )
                self.samples += 1
                for r in rows:
                    self.counts[(r["type"], r["event"], r["query"])] += 1
                await asyncio.sleep(0.02)
        finally:
            await conn.close()

    def summary(self, top: int = 15) -> dict[str, Any]:
        """Average number of backends in each state (backends x time / time)."""
        n = self.samples or 1
        return {
            "samples": self.samples,
            "active_backends": [
                {"wait": f"{t}:{e}" if e else t, "query": q, "avg": round(c / n, 2)}
                for (t, e, q), c in self.counts.most_common(top)
            ],
        }


async def reset_statements(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        await conn.execute("SELECT pg_stat_statements_reset()")
    finally:
        await conn.close()


async def top_statements(dsn: str, limit: int = 15) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            """
            SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 160) AS query, toplevel, calls,
                   round(total_exec_time::numeric, 1) AS total_ms,
                   round(mean_exec_time::numeric, 3) AS mean_ms, rows,
                   shared_blks_hit + shared_blks_read AS blocks, wal_records
            FROM pg_stat_statements
            WHERE query NOT ILIKE '%pg_stat_statements%'
            ORDER BY total_exec_time DESC LIMIT $1
            """,
            limit,
        )
        return [{k: (float(v) if k.endswith("_ms") else v) for k, v in r.items()} for r in rows]
    finally:
        await conn.close()
