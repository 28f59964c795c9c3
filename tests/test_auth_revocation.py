"""The token cache (auth.Authenticator): a valid token costs no database read per call, and
a revocation is refused at once on every replica, also one whose LISTEN connection
reconnected since (its notification may have been lost)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable

import grpc
import pytest

from amc.v1 import admin_pb2, scheduler_pb2
from control_plane import auth
from control_plane.domain import Role, TokenInfo
from tests.conftest import FAST
from tests.support import Clients, Farm, eventually

# Well under auth.CACHE_SECONDS: only a notification (or a reconnect) can explain it.
AT_ONCE = 5.0
# The LISTEN connections: their heartbeat's query, or the LISTENs before the first one
# (not the tests' connections, whose last query may be this one).
LISTENERS = (
    "FROM pg_stat_activity WHERE datname = current_database()"
    " AND query NOT LIKE '%pg_stat_activity%'"
    " AND (query LIKE 'LISTEN %' OR query LIKE '%pg_listening_channels%')"
)


@pytest.fixture
async def pair(database_url: str) -> AsyncIterator[tuple[Farm, Farm]]:
    """Two in-process replicas on one database."""
    a, b = Farm(database_url, FAST), Farm(database_url, FAST)
    await a.start()
    try:
        await b.start()
        # Both listeners beat once: each cleared its cache on connecting, before that.
        assert a.db is not None
        db = a.db
        sql = f"SELECT count(*) {LISTENERS} AND query LIKE '%pg_listening_channels%'"
        await eventually(lambda: _at_least(db.fetchval(sql), 2), timeout=15, what="the listeners")
        yield a, b
    finally:
        await b.stop()
        await a.stop()


async def _accepted(clients: Clients) -> bool:
    """The call went through (True) or was refused as unauthenticated (False)."""
    try:
        await clients.scheduler.ListTasks(scheduler_pb2.ListTasksRequest(page_size=1))
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.UNAUTHENTICATED, exc
        return False
    return True


async def _at_least(count: Awaitable[int], n: int) -> bool:
    return await count >= n


def _token_id(token: str) -> uuid.UUID:
    return uuid.UUID(hex=token.split("_")[1])


def test_the_cache_is_a_safety_net_only() -> None:
    assert auth.CACHE_SECONDS >= 60


async def test_a_token_revoked_through_one_replica_is_refused_by_the_other_at_once(
    pair: tuple[Farm, Farm],
) -> None:
    a, b = pair
    token = await a.token(Role.CLIENT)
    on_b = b.clients(token)
    assert await _accepted(on_b)  # cached on b
    operator = await a.operator()
    started = time.monotonic()
    await operator.admin.RevokeToken(admin_pb2.RevokeTokenRequest(token_id=str(_token_id(token))))
    await eventually(
        lambda: _refused(on_b),
        timeout=AT_ONCE,
        what="the other replica to refuse the revoked token",
    )
    assert time.monotonic() - started < AT_ONCE


async def _refused(clients: Clients) -> bool:
    return not await _accepted(clients)


async def test_a_valid_token_is_not_read_from_the_database_on_every_call(
    pair: tuple[Farm, Farm], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, b = pair
    assert b.plane is not None
    tokens = b.plane.store.tokens
    real = tokens.get_token
    reads: list[uuid.UUID] = []

    async def counted(token_id: uuid.UUID) -> TokenInfo | None:
        reads.append(token_id)
        return await real(token_id)

    monkeypatch.setattr(tokens, "get_token", counted)
    token = await b.token(Role.CLIENT)
    on_b = b.clients(token)
    for _ in range(20):
        assert await _accepted(on_b)
    assert reads == [_token_id(token)]

    # An unknown token id is read each time, never cached as valid.
    unknown = f"{auth.PREFIX}{uuid.uuid4().hex}_secret"
    stranger = b.clients(unknown)
    for _ in range(3):
        assert not await _accepted(stranger)
    assert reads.count(_token_id(unknown)) == 3
    assert _token_id(unknown) not in b.plane.auth._cache


async def test_a_revocation_missed_while_the_listener_was_down_is_refused_after_it_reconnects(
    pair: tuple[Farm, Farm],
) -> None:
    """The revocation's notification never reached the replica (here: the row changed
    with no NOTIFY, as when it was sent while the replica's LISTEN connection was down).
    The replica still trusts its cache until its listener reconnects, then reads the token
    again and refuses it."""
    _, b = pair
    assert b.db is not None
    token = await b.token(Role.CLIENT)
    on_b = b.clients(token)
    assert await _accepted(on_b)
    await b.db.execute("UPDATE tokens SET revoked_at = now() WHERE token_id = $1", _token_id(token))
    assert await _accepted(on_b)  # the notification is lost: the cache still holds it
    killed = await b.db.fetchval(f"SELECT count(pg_terminate_backend(pid)) {LISTENERS}")
    assert killed == 2  # both replicas' LISTEN connections
    await eventually(
        lambda: _refused(on_b), timeout=AT_ONCE, what="the refusal after the reconnect"
    )


async def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Least recently used token ids go first past CACHE_SIZE."""
    from datetime import UTC, datetime

    monkeypatch.setattr(auth, "CACHE_SIZE", 3)

    class Tokens:
        async def get_token(self, token_id: uuid.UUID) -> TokenInfo:
            return TokenInfo(token_id, "t", Role.CLIENT, None, b"", datetime.now(UTC), None, "")

    class Store:
        tokens = Tokens()

    authenticator = auth.Authenticator(Store())  # type: ignore[arg-type]
    ids = [uuid.uuid4() for _ in range(5)]

    for token_id in (ids[0], ids[1], ids[2], ids[0], ids[3], ids[4]):
        await authenticator._lookup(token_id)
    assert list(authenticator._cache) == [ids[0], ids[3], ids[4]]
