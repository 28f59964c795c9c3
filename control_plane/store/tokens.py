"""API tokens: created, read, revoked, listed (tokens.sql)."""

from __future__ import annotations

import uuid

import asyncpg

from control_plane import errors
from control_plane.domain import Role, TokenInfo
from control_plane.store.database import Aggregate


class Tokens(Aggregate):
    async def create_token(
        self,
        token_id: uuid.UUID,
        name: str,
        role: Role,
        host_id: str | None,
        secret_hash: bytes,
        team: str = "",
    ) -> TokenInfo:
        row = await self._db.fetchrow(
            "create_token", token_id, name, str(role), host_id, secret_hash, team
        )
        assert row is not None
        return _token(row)

    async def get_token(self, token_id: uuid.UUID) -> TokenInfo | None:
        row = await self._db.fetchrow("get_token", token_id)
        return _token(row) if row else None

    async def revoke_token(self, token_id: uuid.UUID) -> TokenInfo:
        row = await self._db.fetchrow("revoke_token", token_id)
        if row is None:
            raise errors.NotFound(f"no token {token_id}")
        return _token(row)

    async def list_tokens(self) -> list[TokenInfo]:
        return [_token(r) for r in await self._db.fetch("list_tokens")]


def _token(row: asyncpg.Record) -> TokenInfo:
    return TokenInfo(
        token_id=row["token_id"],
        name=row["name"],
        role=Role(row["role"]),
        host_id=row["host_id"],
        secret_hash=bytes(row["secret_hash"]),
        created_at=row["created_at"],
        revoked_at=row["revoked_at"],
        team=row["team"],
    )
