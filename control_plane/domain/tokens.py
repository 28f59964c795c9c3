"""Who calls: roles, principals and the API tokens they hold."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass
from datetime import datetime


class Role(enum.StrEnum):
    CLIENT = "client"
    OPERATOR = "operator"
    HOST = "host"


@dataclass(frozen=True)
class Principal:
    """Who is calling. `token_id` is None when auth is off (--insecure)."""

    role: Role | None
    host_id: str | None = None
    token_id: uuid.UUID | None = None
    # The token's name, as its creator gave it (recorded with what an operator does).
    name: str = ""
    # The token's team: its tasks' fairness key unless they name one ("": 'default').
    team: str = ""
    # Another replica of the farm, relaying a call for its own viewers (control_plane.auth).
    replica: bool = False

    @property
    def caller(self) -> str:
        return str(self.token_id) if self.token_id else "anonymous"


ANONYMOUS = Principal(role=None)


@dataclass(frozen=True)
class Act:
    """Who changed something from the centre (the caller's token id and name, or a host
    for its own), why and when: what host_events and fair_share_events record of each."""

    actor: str
    actor_name: str
    reason: str
    at: datetime


@dataclass(frozen=True)
class TokenInfo:
    token_id: uuid.UUID
    name: str
    role: Role
    host_id: str | None
    secret_hash: bytes
    created_at: datetime
    revoked_at: datetime | None
    team: str = ""
