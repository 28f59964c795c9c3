"""The schema, applied at start-up: `control_plane/schema.sql` (the tables and indexes)
and the functions at the top of store/<aggregate>.sql (`schema()` joins them; below,
"schema.sql" means all of it); `control_plane/migrations/` brings the tables of an older
database to it.

- An empty database gets schema.sql, and every migration is recorded as applied (schema.sql
  has them all).
- A database of an earlier release gets the numbered migrations it has not recorded
  (`migrations/NNN_name.sql`: they change its tables and drop the functions schema.sql
  cannot replace in place), then schema.sql again: its statements are idempotent, so it
  creates what is missing (a new table is schema.sql's alone, never written again in a
  migration) and replaces every function. The part of a migration below its line
  `-- after schema.sql` runs last: it moves data into the tables schema.sql created.

All of it is one transaction, under a transaction-scoped advisory lock: several replicas
may start at once; one applies while the others wait, then find nothing left to do.
"""

from __future__ import annotations

from importlib import resources

import asyncpg
import structlog

log = structlog.get_logger(__name__)
LOCK_KEY = 0x414D43  # "AMC"
# The oldest schema this release upgrades: the last migration of the releases before
# schema.sql squashed them (006_dispatch.sql; migrations/007_one_schema.sql follows it).
OLDEST = 6


class SchemaTooOld(Exception):
    """The database's schema is older than this release can upgrade."""


# The aggregates whose store/<aggregate>.sql defines functions, in the order they are
# created (a LANGUAGE sql function is checked against those it calls when created).
FUNCTIONS = (
    "queue",
    "queue.count",
    "tasks",
    "leases",
    "leases.acquire",
    "leases.end",
    "hosts",
    "artifacts",
    "library",
)


def schema() -> str:
    """schema.sql (the tables and indexes), then each aggregate's functions: the part of
    its store/<aggregate>.sql above its first named statement."""
    store = resources.files(__package__)
    parts = [resources.files("control_plane").joinpath("schema.sql").read_text("utf-8")]
    for aggregate in FUNCTIONS:
        parts.append(functions(store.joinpath(f"{aggregate}.sql").read_text("utf-8")))
    return "\n".join(parts)


def functions(text: str) -> str:
    """The DDL of a store/<aggregate>.sql file: what comes before its first statement."""
    return text.split("\n-- name: ", 1)[0]


AFTER_SCHEMA = "\n-- after schema.sql"


def migrations() -> list[tuple[int, str, str]]:
    folder = resources.files("control_plane").joinpath("migrations")
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            number = int(entry.name.split("_", 1)[0])
            found.append((number, entry.name, entry.read_text("utf-8")))
    return sorted(found)


def split(text: str) -> tuple[str, str]:
    """A migration's two parts: what runs before schema.sql, and what after (its text
    below the line `-- after schema.sql`; empty for most)."""
    before, marked, after = text.partition(AFTER_SCHEMA)
    return before, after.partition("\n")[2] if marked else ""


async def apply(conn: asyncpg.Connection) -> list[str]:
    """Bring the database to schema.sql; returns what was applied, in order."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_KEY)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}
        pending = [m for m in migrations() if m[0] not in done]
        if not pending:
            return []
        applied = []
        if done:
            if max(done) < OLDEST:
                raise SchemaTooOld(
                    f"the database schema is at version {max(done)}; this release upgrades"
                    f" from version {OLDEST} on: run the release before it once first"
                )
            for _, name, text in pending:
                await conn.execute(split(text)[0])
                applied.append(name)
        await conn.execute(schema())
        applied.append("schema.sql")
        if done:
            for _, name, text in pending:
                if after := split(text)[1]:
                    await conn.execute(after)
                    applied.append(f"{name} (after schema.sql)")
        await conn.executemany(
            "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
            [(number, name) for number, name, _ in pending],
        )
    log.info("schema applied", applied=applied)
    return applied
