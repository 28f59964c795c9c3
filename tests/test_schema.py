"""One schema: control_plane/schema.sql is what every database ends in, whether migrated from
empty or upgraded from the releases before it (their migrations 001-006, kept as they
shipped in tests/fixtures/old_migrations/); the kinds and codes the SQL writes are the
lifecycle module's enums.

Schemas are compared as `pg_dump --schema-only` prints them, without comments, settings and
blank lines."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest

from control_plane.embedded import binary
from control_plane.lifecycle import CancelCode, Event, ReleaseCode, ReportCode
from control_plane.store import Store, schema

OLD_MIGRATIONS = Path(__file__).parent / "fixtures" / "old_migrations"
SCHEMA = schema.schema()
# What pg_dump prints besides the schema itself: comments (with its version), settings, the
# random key of its \restrict guard.
NOISE = re.compile(r"^\s*(--|SET |SELECT pg_catalog\.set_config|\\restrict |\\unrestrict )")

NewDatabase = Callable[[], Awaitable[str]]


def _pg_dump() -> str:
    if not os.environ.get("DATABASE_URL"):
        return str(binary("pg_dump"))
    found = shutil.which("pg_dump")
    if found is None:
        pytest.skip("DATABASE_URL is set and no pg_dump is on PATH to dump its schemas")
    return found


def dump(url: str) -> str:
    """The schema of the database at `url`, as pg_dump prints it, less its noise."""
    done = subprocess.run(
        [
            _pg_dump(),
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            "--exclude-table=schema_migrations",
            "--dbname",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [line.rstrip() for line in done.stdout.splitlines()]
    return "\n".join(line for line in lines if line and not NOISE.match(line))


@pytest.fixture
async def new_database(pg_url: str) -> AsyncIterator[NewDatabase]:
    """Makes empty databases on the test server; drops them afterwards."""
    made: list[str] = []
    base = pg_url.rpartition("/")[0]
    query = "?" + pg_url.split("?", 1)[1] if "?" in pg_url else ""

    async def make() -> str:
        name = f"amc_schema_{uuid.uuid4().hex[:12]}"
        conn = await asyncpg.connect(pg_url)
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        made.append(name)
        return f"{base}/{name}{query}"

    yield make
    conn = await asyncpg.connect(pg_url)
    try:
        for name in made:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def _execute(url: str, *scripts: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        for script in scripts:
            await conn.execute(script)
    finally:
        await conn.close()


async def _old_release(url: str, upto: int = 6) -> None:
    """The database as the releases before schema.sql left it: their migrations applied
    and recorded the way their migrate.py did."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for path in sorted(OLD_MIGRATIONS.glob("*.sql"))[:upto]:
            async with conn.transaction():
                await conn.execute(path.read_text("utf-8"))
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                    int(path.name.split("_", 1)[0]),
                    path.name,
                )
    finally:
        await conn.close()


async def _versions(url: str) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT version FROM schema_migrations ORDER BY version")
    finally:
        await conn.close()
    return [r["version"] for r in rows]


async def _migrate(url: str) -> list[str]:
    conn = await asyncpg.connect(url)
    try:
        return await schema.apply(conn)
    finally:
        await conn.close()


async def test_a_database_migrated_from_empty_matches_schema_sql(new_database: NewDatabase) -> None:
    """THEN its schema is schema.sql's, every migration is recorded, and a second run (two
    replicas starting at once) applies nothing."""
    migrated, reference = await new_database(), await new_database()
    first, second = await asyncio.gather(_migrate(migrated), _migrate(migrated))
    assert sorted([first, second]) == [[], ["schema.sql"]]
    await _execute(reference, SCHEMA)
    assert dump(migrated) == dump(reference)
    assert await _versions(migrated) == [number for number, _, _ in schema.migrations()]


async def test_a_database_of_the_previous_release_is_upgraded_to_schema_sql(
    new_database: NewDatabase,
) -> None:
    """THEN its schema is schema.sql's, its rows are kept, and a lease it had given out can
    be released with today's functions."""
    old, reference = await new_database(), await new_database()
    await _old_release(old)
    lease = await _old_release_assigns_a_task(old)
    applied = await _migrate(old)
    assert applied == [name for _, name, _ in schema.migrations()] + [
        "schema.sql",
        "012_queue_groups.sql (after schema.sql)",
    ]
    await _execute(reference, SCHEMA)
    assert dump(old) == dump(reference)
    assert await _versions(old) == [1, 2, 3, 4, 5, 6, *(n for n, _, _ in schema.migrations())]
    assert await _migrate(old) == []

    store = await Store.open(old, min_size=1, max_size=1)
    try:
        ended = await store.leases.release("h1", lease, "upgraded")
    finally:
        await store.close()
    assert ended is not None and ended.to_status == "queued"
    conn = await asyncpg.connect(old)
    try:
        kinds = await conn.fetch("SELECT kind FROM task_events ORDER BY event_id")
    finally:
        await conn.close()
    assert [r["kind"] for r in kinds] == ["submit", "assign", "released"]


async def _old_release_assigns_a_task(url: str) -> uuid.UUID:
    """A host, a queued task and its assignment, made with the old release's own SQL."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "INSERT INTO hosts (host_id) VALUES ('h1');"
            "INSERT INTO devices (host_id, serial, state) VALUES ('h1', 's1', 'device');"
            "INSERT INTO tasks (task_id, caller, status, spec, max_attempts)"
            " VALUES (gen_random_uuid(), 'c', 'queued', '', 2);"
            "INSERT INTO task_events (task_id, attempt, kind, to_status)"
            " SELECT task_id, 0, 'submit', 'queued' FROM tasks"
        )
        lease = await conn.fetchval(
            "SELECT lease_id FROM amc_acquire_idle('h1', '{s1}', '1 minute')"
            " WHERE task_id IS NOT NULL"
        )
    finally:
        await conn.close()
    assert isinstance(lease, uuid.UUID)
    return lease


async def test_devices_registered_before_the_host_id_label_carry_it_after_the_upgrade(
    new_database: NewDatabase,
) -> None:
    """THEN every device of an older database is labelled host_id = its host's id (over
    any host_id it had), its other labels kept, before its host registers again."""
    old = await new_database()
    await _old_release(old)
    await _execute(
        old,
        "INSERT INTO hosts (host_id) VALUES ('h1'), ('h2');"
        "INSERT INTO devices (host_id, serial, state, labels) VALUES"
        " ('h1', 's1', 'device', '{\"rack\": \"r1\"}'),"
        " ('h2', 's1', 'device', '{\"host_id\": \"other\"}');",
    )
    await _migrate(old)
    conn = await asyncpg.connect(old)
    try:
        rows = await conn.fetch("SELECT host_id, labels FROM devices ORDER BY host_id")
    finally:
        await conn.close()
    assert [(r["host_id"], json.loads(r["labels"])) for r in rows] == [
        ("h1", {"rack": "r1", "host_id": "h1"}),
        ("h2", {"host_id": "h2"}),
    ]


async def test_a_database_older_than_the_previous_release_is_refused(
    new_database: NewDatabase,
) -> None:
    """THEN migrate says which version it found and which it needs, and changes nothing."""
    old = await new_database()
    await _old_release(old, upto=4)
    before = dump(old)
    with pytest.raises(schema.SchemaTooOld, match=r"at version 4; .* from version 6"):
        await _migrate(old)
    assert dump(old) == before
    assert await _versions(old) == [1, 2, 3, 4]


async def test_the_database_accepts_exactly_the_lifecycle_events_as_kinds(
    database_url: str,
) -> None:
    """THEN task_events.kind's check lists every lifecycle.Event and nothing else."""
    conn = await asyncpg.connect(database_url)
    try:
        check = await conn.fetchval(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conname = 'task_events_kind_check'"
        )
    finally:
        await conn.close()
    assert set(re.findall(r"'(\w+)'", check)) == {str(e) for e in Event}


@pytest.mark.parametrize(
    ("function", "codes"),
    [("amc_cancel", CancelCode), ("amc_report", ReportCode), ("amc_give_back", ReleaseCode)],
)
def test_the_codes_a_transition_function_answers_are_its_enum(
    function: str, codes: type[CancelCode | ReportCode | ReleaseCode]
) -> None:
    """THEN every code schema.sql's function assigns is a member, and every member is one."""
    body = re.search(rf"FUNCTION {function}\(.*?\nEND \$\$;", SCHEMA, re.DOTALL)
    assert body is not None, f"{function} is not in schema.sql"
    assigned = re.findall(r"\b(?:v_)?code := (.*);", body.group(0))
    assert {c for line in assigned for c in re.findall(r"'(\w+)'", line)} == {str(c) for c in codes}


SCHEMA_BEFORE_QUEUE_GROUPS = Path(__file__).parent / "fixtures" / "schema_011.sql"


async def test_a_queue_of_the_release_before_queue_groups_is_kept_in_its_order(
    new_database: NewDatabase,
) -> None:
    """THEN a database of the release before queue groups (migration 012), holding queued
    tasks of several selectors and priorities and one running, is upgraded to schema.sql;
    every task in flight is in its selector's group, and Acquire hands the queued ones out
    in the order that release would have (priority, then age); the running one, given back,
    is queued again and taken first among its priority."""
    old, reference = await new_database(), await new_database()
    await _execute(old, SCHEMA_BEFORE_QUEUE_GROUPS.read_text("utf-8"))
    await _execute(
        old,
        "CREATE TABLE schema_migrations (version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now());"
        "INSERT INTO schema_migrations (version, name)"
        " SELECT n, 'before' FROM generate_series(6, 11) n;"
        "INSERT INTO hosts (host_id, labels) VALUES ('h1', '{\"rack\": \"r1\"}');"
        "INSERT INTO devices (host_id, serial, state, labels)"
        " VALUES ('h1', 's1', 'device', '{\"rack\": \"r1\"}');",
    )
    conn = await asyncpg.connect(old)
    try:
        selectors = [({}, 0), ({"rack": "r1"}, 0), ({}, 5), ({"rack": "r1"}, 5), ({}, 0)]
        queued = []
        for i, (labels, priority) in enumerate(selectors):
            queued.append(
                await conn.fetchval(
                    "INSERT INTO tasks (task_id, caller, status, spec, max_attempts,"
                    " selector_labels, priority, created_at)"
                    " VALUES (gen_random_uuid(), 'c', 'queued', '', 2, $1::jsonb, $2,"
                    " now() - $3 * interval '1 minute') RETURNING task_id",
                    json.dumps(labels),
                    priority,
                    10 - i,
                )
            )
        running = await conn.fetchval(
            "SELECT lease_id FROM amc_acquire('h1', '{s1}', '1 minute') WHERE task_id IS NOT NULL"
        )
    finally:
        await conn.close()
    applied = await _migrate(old)
    assert applied == [name for n, name, _ in schema.migrations() if n >= 12] + [
        "schema.sql",
        "012_queue_groups.sql (after schema.sql)",
    ]
    await _execute(reference, SCHEMA)
    assert dump(old) == dump(reference)

    conn = await asyncpg.connect(old)
    try:
        ungrouped = await conn.fetchval(
            "SELECT count(*) FROM tasks WHERE status <> 'done' AND group_id IS NULL"
        )
        assert ungrouped == 0
        # The old release took the oldest of priority 5 first; given back, it goes first.
        first = queued[2]
        assert await conn.fetchval("SELECT task_id FROM attempts WHERE lease_id = $1", running) == (
            first
        )
        await conn.fetchval("SELECT to_status FROM amc_release('h1', $1, 'upgrade')", running)
        order = []
        for _ in range(len(queued)):
            task_id = await conn.fetchval(
                "SELECT task_id FROM amc_acquire('h1', '{s1}', '1 minute')"
                " WHERE task_id IS NOT NULL"
            )
            order.append(task_id)
            await conn.execute(
                "UPDATE devices SET task_id = NULL; UPDATE tasks SET status = 'done'"
                " WHERE status = 'assigned'; UPDATE attempts SET state = 'done'"
            )
    finally:
        await conn.close()
    assert order == [queued[2], queued[3], queued[0], queued[1], queued[4]]
