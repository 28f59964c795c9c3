"""One PostgreSQL server per test session (embedded, or DATABASE_URL's), the schema built
once into a template, and a fresh database per test made from it."""

from __future__ import annotations

import os

# The tests fork (pg_ctl, adb, the agent) while gRPC threads run; gRPC's fork handlers only
# get in the way of children that exec at once. Must be set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path

import asyncpg
import pytest

from control_plane.config import Settings
from control_plane.embedded import EmbeddedPostgres
from control_plane.store import migrate
from tests.support import Farm
from tests.support.wheel import dist, prefix  # noqa: F401  (session fixtures, shared)

TEMPLATE = f"amc_template_{os.getpid()}"


def _with_database(url: str, name: str) -> str:
    base, _, _ = url.rpartition("/")
    query = ""
    if "?" in url:
        query = "?" + url.split("?", 1)[1]
    return f"{base}/{name}{query}"


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    external = os.environ.get("DATABASE_URL")
    if external:
        yield external
        return
    # Not under pytest's tmp_path: pytest makes that tree private to root, and the server
    # runs as an unprivileged user when the tests run as root.
    root = Path(tempfile.mkdtemp(prefix="amc-test-pg-"))
    server = EmbeddedPostgres(root / "data", durable=False)
    url = server.start()
    try:
        yield url
    finally:
        server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def template_url(pg_url: str) -> Iterator[str]:
    async def build() -> None:
        conn = await asyncpg.connect(pg_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
            await conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
        finally:
            await conn.close()
        await migrate(_with_database(pg_url, TEMPLATE))

    async def drop() -> None:
        conn = await asyncpg.connect(pg_url)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')
        finally:
            await conn.close()

    asyncio.run(build())
    yield _with_database(pg_url, TEMPLATE)
    asyncio.run(drop())


@pytest.fixture
async def database_url(pg_url: str, template_url: str) -> AsyncIterator[str]:
    name = f"amc_test_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')
    finally:
        await conn.close()
    yield _with_database(pg_url, name)
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


FAST = Settings(
    lease_ttl=timedelta(seconds=15),
    sweep_interval=timedelta(seconds=0.05),
    watch_refresh=timedelta(seconds=1),
    queue_count_every=timedelta(seconds=0.2),
    progress_every=timedelta(seconds=0.05),
)


@pytest.fixture
async def farm(database_url: str) -> AsyncIterator[Farm]:
    f = Farm(database_url, FAST)
    await f.start()
    try:
        yield f
    finally:
        await f.stop()
