"""Numbered SQL migrations, applied at start-up under an advisory lock.

Several replicas may start at once: the lock makes one apply while the others wait, then
find nothing left to do.
"""

from __future__ import annotations

from importlib import resources

import asyncpg
import structlog

log = structlog.get_logger(__name__)
LOCK_KEY = 0x414D43  # "AMC"


def migrations() -> list[tuple[int, str, str]]:
    folder = resources.files(__package__).joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            number = int(entry.name.split("_", 1)[0])
            found.append((number, entry.name, entry.read_text("utf-8")))
    return sorted(found)


async def apply(conn: asyncpg.Connection) -> list[str]:
    """Apply what is missing; returns the names applied."""
    applied: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", LOCK_KEY)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        for number, name, text in migrations():
            if number in done:
                continue
            async with conn.transaction():
                await conn.execute(text)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)", number, name
                )
            log.info("migration applied", migration=name)
            applied.append(name)
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)
    return applied
