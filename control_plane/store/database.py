"""The connection pool, and what every aggregate's calls share: asyncpg's errors turned
into domain errors, a rolled-back transaction run again, a read-only server left."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import asyncpg
import structlog
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from control_plane import errors, metrics
from control_plane.store.schema import apply
from control_plane.store.sql import QUERIES as Q

log = structlog.get_logger(__name__)

T = TypeVar("T")

# SQLSTATE classes that mean "the database is not there right now": connection exceptions,
# operator intervention (shutdown, starting up), insufficient resources.
_UNAVAILABLE_CLASSES = ("08", "57", "53")
# Serialization failure and deadlock: the transaction was rolled back and may simply be run
# again. Every transition takes its rows in one order (schema.sql's lock order), so
# these should not happen; if they do, they are retried here, never reported as an outage.
_RETRIED_STATES = ("40001", "40P01")
# A write refused because the server is read-only: a standby, or a primary demoted by a
# failover. The connections there are dropped (Database) and the next ones find the primary.
READ_ONLY = "25006"
RETRIES = 5
# What a connection asks of the server it lands on when the URL names several hosts (or
# one behind a moving address): writable, so never a standby. A URL that says otherwise
# (its own target_session_attrs) is obeyed.
SESSION_ATTRS = "read-write"


@contextlib.contextmanager
def translated() -> Iterator[None]:
    try:
        yield
    except asyncpg.PostgresError as exc:
        state = getattr(exc, "sqlstate", "") or ""
        if state in _RETRIED_STATES:
            raise errors.Contended() from exc
        if state[:2] in _UNAVAILABLE_CLASSES or state == READ_ONLY:
            raise errors.DatabaseUnavailable() from exc
        if state[:2] == "22":  # data exception: a value PostgreSQL cannot hold
            raise errors.InvalidArgument("request", "a value cannot be stored") from exc
        raise
    except (
        OSError,
        asyncpg.InterfaceError,
        # No host is writable (mid-failover: TargetServerAttributeNotMatched), or a
        # connection was left in a state asyncpg cannot go on from (its backend terminated
        # in the middle of a call): the call may be made again.
        asyncpg.InternalClientError,
        TimeoutError,
    ) as exc:
        raise errors.DatabaseUnavailable() from exc


def read_only(error: BaseException) -> bool:
    """Whether `error` (or what it was raised from) is a write refused by a read-only server."""
    cause = error.__cause__ if isinstance(error, errors.DatabaseUnavailable) else error
    return getattr(cause, "sqlstate", None) == READ_ONLY


def database_error(error: BaseException) -> bool:
    """Whether `error` is the database's: unavailable, or an error PostgreSQL answered."""
    return isinstance(error, errors.DatabaseUnavailable | asyncpg.PostgresError)


def session_attrs(dsn: str) -> dict[str, str]:
    """The connect options that make a connection land on the writable server only: none
    when the URL chooses for itself."""
    return {} if "target_session_attrs" in dsn else {"target_session_attrs": SESSION_ATTRS}


async def retried(operation: Callable[[], Awaitable[T]]) -> T:
    """Run one statement or transaction; a deadlock or serialization failure (rolled back,
    so nothing happened) runs it again, a few times, with jitter. Each call is made anew."""
    try:
        with translated():
            return await operation()
    except errors.Contended:
        pass
    async for attempt in AsyncRetrying(
        retry=retry_if_exception_type(errors.Contended),
        stop=stop_after_attempt(RETRIES - 1),
        wait=wait_random_exponential(multiplier=0.005, max=0.2),
        reraise=True,
    ):
        with attempt, translated():
            return await operation()
    raise AssertionError("unreachable")  # pragma: no cover


async def _init_connection(conn: asyncpg.Connection) -> None:
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


async def _keep_session(conn: asyncpg.Connection) -> None:
    """No RESET ALL / UNLISTEN * / CLOSE ALL round trip on every release."""


async def connect_pool(dsn: str, *, min_size: int = 2, max_size: int = 20) -> asyncpg.Pool:
    with translated():
        return await asyncpg.create_pool(
            dsn,
            **session_attrs(dsn),
            min_size=min_size,
            max_size=max_size,
            init=_init_connection,
            reset=_keep_session,
            # An idle connection stays (asyncpg closes one idle for 5 minutes by default):
            # opening one again costs its caller a connect, the jsonb codec's look-up and
            # a prepare of every statement it sends, on the hot path of the next burst.
            max_inactive_connection_lifetime=0,
            command_timeout=30,
            timeout=10,
        )


async def migrate(dsn: str) -> list[str]:
    """Bring the database to schema.sql (store/schema.py); what was applied, in order."""
    with translated():
        conn = await asyncpg.connect(dsn, timeout=10, **session_attrs(dsn))
        try:
            return await apply(conn)
        finally:
            await conn.close()


class Database:
    """The pool, and the statements of store/*.sql sent through it by name."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        # Connections were dropped for a read-only server and no ping found it writable yet.
        self.reconnecting = False

    async def close(self, timeout: float = 10.0) -> None:
        """Close the connections once released; past `timeout`, cut them: a stop must not
        hang on a connection that never comes back."""
        try:
            await asyncio.wait_for(self.pool.close(), timeout)
        except TimeoutError:
            self.pool.terminate()

    async def fetch(self, name: str, *args: Any) -> list[asyncpg.Record]:
        return await self.checked(lambda: self._on_connection(_fetch, Q[name], args))

    async def fetchrow(self, name: str, *args: Any) -> asyncpg.Record | None:
        return await self.checked(lambda: self._on_connection(_fetchrow, Q[name], args))

    async def _on_connection(
        self,
        call: Callable[[asyncpg.Connection, str, tuple[Any, ...]], Awaitable[T]],
        query: str,
        args: tuple[Any, ...],
    ) -> T:
        """One statement on a connection of the pool; how long it waited for one is
        amc_database_pool_wait_seconds (a pool too small for the load, or statements that
        hold their connections long, show there first)."""
        asked = time.monotonic()
        async with self.pool.acquire() as conn:
            metrics.POOL_WAIT.observe(time.monotonic() - asked)
            return await call(conn, query, args)

    async def checked(self, operation: Callable[[], Awaitable[T]]) -> T:
        try:
            return await retried(operation)
        except errors.DatabaseUnavailable as exc:
            if read_only(exc):
                await self.drop_connections()
            elif isinstance(exc.__cause__, asyncpg.InternalClientError):
                await self.pool.expire_connections()  # that one may be in the pool still
            raise

    async def drop_connections(self) -> None:
        """The server these connections reach is read-only (a demoted primary): each is
        closed when next released or idle, and the next ones find the writable server."""
        if not self.reconnecting:
            log.warning("database is read-only (failed over?); reconnecting")
        self.reconnecting = True
        await self.pool.expire_connections()

    async def ping(self) -> None:
        """The database answers, and writably: a read-only answer (the server became a
        standby) drops the connections, and the database counts as unavailable."""
        row = await self.fetchrow("ping")
        if row is not None and row["read_only"]:
            await self.drop_connections()
            raise errors.DatabaseUnavailable()
        self.reconnecting = False


async def _fetch(conn: asyncpg.Connection, query: str, args: tuple[Any, ...]) -> Any:
    return await conn.fetch(query, *args)


async def _fetchrow(conn: asyncpg.Connection, query: str, args: tuple[Any, ...]) -> Any:
    return await conn.fetchrow(query, *args)


class Aggregate:
    """Base of the store's aggregates (store/<aggregate>.py): each sends its statements
    through the store's one Database."""

    def __init__(self, db: Database) -> None:
        self._db = db
