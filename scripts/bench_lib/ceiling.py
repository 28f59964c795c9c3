"""Workload 5, the ceiling: what this PostgreSQL server commits per second when every
transaction is one single-row UPDATE (pgbench, 1 and 8 clients), on the same server and
in the same run as the AMC figures it is set beside. In its own database, `pgbench`.

Also the same UPDATE with a NOTIFY in its transaction, 8 clients: a notifying transaction
holds a database-wide lock from its commit until after its WAL flush, so such commits
cannot share an fsync. AMC's transitions notify (triggers on `tasks`); this is their
ceiling."""

from __future__ import annotations

import asyncio
import re
import urllib.parse
from pathlib import Path
from typing import Any

import asyncpg

from amc_testing.database import postgres_binary as binary
from bench_lib.stats import over_reps

DATABASE = "pgbench"
SCRIPT = """\\set aid random(1, 100000 * :scale)
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
"""
NOTIFY_SCRIPT = """\\set aid random(1, 100000 * :scale)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;
SELECT pg_notify('pgbench', '');
COMMIT;
"""
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)


async def _pgbench(dsn: str, *args: str) -> str:
    url = urllib.parse.urlparse(dsn)
    argv = [
        str(binary("pgbench")),
        "-h",
        url.hostname or "127.0.0.1",
        "-p",
        str(url.port or 5432),
        "-U",
        url.username or "postgres",
        *args,
        DATABASE,
    ]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"pgbench {' '.join(args)} failed:\n{text[-2000:]}")
    return text


async def prepare(dsn: str, workdir: Path) -> tuple[Path, Path]:
    conn = await asyncpg.connect(dsn)
    try:
        if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE):
            await conn.execute(f"CREATE DATABASE {DATABASE}")
    finally:
        await conn.close()
    await _pgbench(dsn, "-i", "-s", "1", "-q")
    script, notify = workdir / "single-row-update.sql", workdir / "update-notify.sql"
    script.write_text(SCRIPT)
    notify.write_text(NOTIFY_SCRIPT)
    return script, notify


async def tps(dsn: str, script: Path, clients: int, seconds: float) -> float:
    threads = min(clients, 2)
    text = await _pgbench(
        dsn,
        "-n",
        "-f",
        str(script),
        "-c",
        str(clients),
        "-j",
        str(threads),
        "-T",
        str(max(1, round(seconds))),
    )
    match = _TPS.search(text)
    if match is None:
        raise RuntimeError(f"no tps in pgbench's output:\n{text[-2000:]}")
    return float(match[1])


async def run_once(dsn: str, scripts: tuple[Path, Path], seconds: float) -> dict[str, Any]:
    update, notify = scripts
    return {
        "tps_1_client": await tps(dsn, update, 1, seconds),
        "tps_8_clients": await tps(dsn, update, 8, seconds),
        "tps_8_clients_with_notify": await tps(dsn, notify, 8, seconds),
    }


def aggregate(reps: list[dict[str, Any]]) -> dict[str, Any]:
    return {k: over_reps([r[k] for r in reps]) for k in reps[0]} | {"reps": reps}
