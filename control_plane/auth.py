"""Bearer tokens and who may call what.

A token reads `amc_<token id>_<secret>`; only sha256(secret) is stored. Roles:
`client` (Scheduler, except ListHosts and GetQueue; Library), `operator` (all of
Scheduler, Admin, Library), `host` (Lease only, as the one host id the token is bound
to). Health and reflection are open to everyone: they say nothing about tasks.

A replica relaying a call to another proves it is one with `authorization: Replica
<secret>` (REPLICA_SCHEME): the secret every replica of the farm reads from the database
at start-up (`replica_secret`), which no token holds. It is accepted on the calls a
replica relays (REPLICA_METHODS: a screen's frames from the replica holding the phone's
host, a running attempt's log lines likewise) and on no other; the viewer (the reader)
was authorized where it watches.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable

from control_plane import errors
from control_plane.domain import ANONYMOUS, Principal, Role, TokenInfo
from control_plane.store import Store

CLIENTS = frozenset({Role.CLIENT, Role.OPERATOR})
OPERATORS = frozenset({Role.OPERATOR})
HOSTS = frozenset({Role.HOST})

# Every RPC has a row; the server refuses to start when one is missing.
POLICY: dict[str, frozenset[Role]] = {
    "/amc.v1.Scheduler/SubmitTask": CLIENTS,
    "/amc.v1.Scheduler/SubmitTasks": CLIENTS,
    "/amc.v1.Scheduler/GetTask": CLIENTS,
    "/amc.v1.Scheduler/ListTasks": CLIENTS,
    "/amc.v1.Scheduler/CancelTask": CLIENTS,
    "/amc.v1.Scheduler/WatchTask": CLIENTS,
    "/amc.v1.Scheduler/ListHosts": OPERATORS,
    "/amc.v1.Scheduler/ListTaskEvents": CLIENTS,
    "/amc.v1.Scheduler/GetQueue": OPERATORS,
    "/amc.v1.Lease/RegisterHost": HOSTS,
    "/amc.v1.Lease/Acquire": HOSTS,
    "/amc.v1.Lease/RenewLeases": HOSTS,
    "/amc.v1.Lease/ReportResult": HOSTS,
    "/amc.v1.Lease/ReportResults": HOSTS,
    "/amc.v1.Lease/ReleaseLease": HOSTS,
    "/amc.v1.Admin/CreateToken": OPERATORS,
    "/amc.v1.Admin/RevokeToken": OPERATORS,
    "/amc.v1.Admin/ListTokens": OPERATORS,
    "/amc.v1.Lease/UploadArtifact": HOSTS,
    "/amc.v1.Lease/ReportDeviceHealth": HOSTS,
    "/amc.v1.Scheduler/ListArtifacts": CLIENTS,
    "/amc.v1.Scheduler/GetArtifact": CLIENTS,
    "/amc.v1.Scheduler/OpenSession": CLIENTS,
    "/amc.v1.Lease/SessionActions": HOSTS,
    # A session's adb door: its own session's (checked in the call); which services a
    # client may open there is judged in the call too (amc_common.adb_services).
    "/amc.v1.Scheduler/AdbStreams": CLIENTS,
    "/amc.v1.Lease/AdbStreams": HOSTS,
    # By task for clients; by device for operators only (checked in the call).
    "/amc.v1.Scheduler/WatchScreen": CLIENTS,
    "/amc.v1.Lease/ScreenFrames": HOSTS,
    # A task's phone log: its team's and operators' (checked in the call).
    "/amc.v1.Scheduler/StreamLogs": CLIENTS,
    "/amc.v1.Lease/LogLines": HOSTS,
    "/amc.v1.Admin/CordonHost": OPERATORS,
    "/amc.v1.Admin/UncordonHost": OPERATORS,
    "/amc.v1.Admin/CordonDevice": OPERATORS,
    "/amc.v1.Admin/UncordonDevice": OPERATORS,
    "/amc.v1.Admin/ReleaseDevice": OPERATORS,
    "/amc.v1.Admin/DrainHost": OPERATORS,
    "/amc.v1.Admin/RemoveHost": OPERATORS,
    "/amc.v1.Admin/GetHost": OPERATORS,
    "/amc.v1.Admin/SetFairShare": OPERATORS,
    "/amc.v1.Admin/ListFairShares": OPERATORS,
    "/amc.v1.Admin/GetFairShare": OPERATORS,
    # The app library: clients and operators upload and read; who may remove what is
    # checked in the call (operators anything, clients their own and their team's).
    "/amc.v1.Library/UploadApp": CLIENTS,
    "/amc.v1.Library/GetApp": CLIENTS,
    "/amc.v1.Library/ListApps": CLIENTS,
    "/amc.v1.Library/DeleteApp": CLIENTS,
    "/amc.v1.Library/UploadFile": CLIENTS,
    "/amc.v1.Library/ListFiles": CLIENTS,
    "/amc.v1.Library/DeleteFile": CLIENTS,
    "/amc.v1.Lease/FindApp": HOSTS,
    "/amc.v1.Lease/FetchFile": HOSTS,
}

# What a replica's proof may call (it watches a phone by device, or follows an attempt's
# log, for its own viewers and readers).
REPLICA_METHODS = frozenset({"/amc.v1.Scheduler/WatchScreen", "/amc.v1.Scheduler/StreamLogs"})
REPLICA_SCHEME = "Replica"
REPLICA = Principal(role=Role.OPERATOR, name="replica", replica=True)

PREFIX = "amc_"
# A valid token is read again after this long: a safety net only, revocations are heard.
CACHE_SECONDS = 300.0
# Token ids cached at most (the least recently used go first); tokens are few.
CACHE_SIZE = 50_000
# The NOTIFY channel a committed revocation is announced on (store/tokens.sql), with the
# token id as its payload.
REVOKED_CHANNEL = "amc_revoked"


def hash_secret(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def new_token() -> tuple[uuid.UUID, str, bytes]:
    """(token id, the token to hand out, the hash to store)."""
    token_id = uuid.uuid4()
    secret = secrets.token_urlsafe(32)
    return token_id, f"{PREFIX}{token_id.hex}_{secret}", hash_secret(secret)


def parse(token: str) -> tuple[uuid.UUID, str]:
    if not token.startswith(PREFIX):
        raise errors.Unauthenticated("malformed token", "malformed")
    token_hex, _, secret = token[len(PREFIX) :].partition("_")
    try:
        token_id = uuid.UUID(hex=token_hex)
    except ValueError:
        raise errors.Unauthenticated("malformed token", "malformed") from None
    if not secret:
        raise errors.Unauthenticated("malformed token", "malformed")
    return token_id, secret


def _replica_proof(metadata: Iterable[tuple[str, str | bytes]] | None) -> str | None:
    """The secret of an `authorization: Replica <secret>`, else None."""
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            scheme, _, proof = text.partition(" ")
            return proof.strip() if scheme == REPLICA_SCHEME else None
    return None


def bearer(metadata: Iterable[tuple[str, str | bytes]] | None) -> str:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode(errors="replace") if isinstance(value, bytes) else value
            scheme, _, token = text.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise errors.Unauthenticated("authorization must be 'Bearer <token>'", "malformed")
            return token.strip()
    raise errors.Unauthenticated("missing authorization metadata: 'Bearer <token>'", "missing")


class Authenticator:
    """Checks tokens against the store, caching what it read of a token for CACHE_SECONDS so
    that calls cost no database round trip. Revocation takes effect at once on every
    replica: it is announced on REVOKED_CHANNEL in its transaction, and each replica's
    listener drops the token (`revoked`); after the listener reconnects (notifications may
    have been lost) the whole cache goes (`clear`). The cache holds at most CACHE_SIZE
    token ids, least recently used out first, and never an unknown one."""

    def __init__(self, store: Store, *, enabled: bool = True) -> None:
        self.store = store
        self.enabled = enabled
        self._cache: OrderedDict[uuid.UUID, tuple[TokenInfo, float]] = OrderedDict()
        # Bumped by each drop: a read that began before one is not cached (it may predate
        # the revocation that caused it).
        self._drops = 0
        # The farm's replica secret, hex (read at start-up: `know_replicas`).
        self._replica_secret = ""

    async def know_replicas(self) -> None:
        """Read the farm's replica secret (made now if this is the first replica)."""
        secret = await self.store.replicas.replica_secret(secrets.token_bytes(32))
        self._replica_secret = secret.hex()

    def replica_proof(self) -> str:
        """What this replica's relayed calls carry as their `authorization`."""
        return f"{REPLICA_SCHEME} {self._replica_secret}"

    async def principal(
        self, metadata: Iterable[tuple[str, str | bytes]] | None, method: str = ""
    ) -> Principal:
        """Who calls `method` (a full method name; "" for the console's own routes). A
        replica's proof is checked with authentication off too: it marks a relayed call."""
        proof = _replica_proof(metadata)
        if proof is not None:
            return self._replica(proof, method)
        if not self.enabled:
            return ANONYMOUS
        token_id, secret = parse(bearer(metadata))
        info = await self._lookup(token_id)
        if info is None or not hmac.compare_digest(info.secret_hash, hash_secret(secret)):
            raise errors.Unauthenticated("unknown token")
        if info.revoked_at is not None:
            raise errors.Unauthenticated("token revoked", "revoked")
        return Principal(
            role=info.role,
            host_id=info.host_id,
            token_id=info.token_id,
            name=info.name,
            team=info.team,
        )

    def _replica(self, proof: str, method: str) -> Principal:
        if not self._replica_secret or not hmac.compare_digest(proof, self._replica_secret):
            raise errors.Unauthenticated("not this farm's replica credential")
        if method not in REPLICA_METHODS:
            raise errors.PermissionDenied(
                "a replica's credential is for relayed screens and logs only"
            )
        return REPLICA

    async def _lookup(self, token_id: uuid.UUID) -> TokenInfo | None:
        cached = self._cache.get(token_id)
        if cached and time.monotonic() - cached[1] < CACHE_SECONDS:
            self._cache.move_to_end(token_id)
            return cached[0]
        drops = self._drops
        info = await self.store.tokens.get_token(token_id)
        if info is None or drops != self._drops:
            self._cache.pop(token_id, None)
            return info
        self._cache[token_id] = (info, time.monotonic())
        self._cache.move_to_end(token_id)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return info

    def forget(self, token_id: uuid.UUID) -> None:
        self._drops += 1
        self._cache.pop(token_id, None)

    def revoked(self, channel: str, payload: str) -> None:
        """A REVOKED_CHANNEL notification: the token id it carries is read again."""
        try:
            token_id = uuid.UUID(payload)
        except ValueError:  # not ours: read every token again rather than trust one
            self.clear()
            return
        self.forget(token_id)

    def clear(self) -> None:
        """After the listener reconnects: a revocation may have gone unheard."""
        self._drops += 1
        self._cache.clear()


def authorize(principal: Principal, method: str) -> None:
    if principal.role is None:  # auth is off
        return
    if principal.role not in POLICY[method]:
        raise errors.PermissionDenied(
            f"role '{principal.role}' may not call {method.rsplit('/', 1)[-1]}"
        )


def check_host(principal: Principal, host_id: str) -> None:
    """A host token acts only as its own host."""
    if principal.role is Role.HOST and principal.host_id != host_id:
        raise errors.PermissionDenied(
            f"this token is for host '{principal.host_id}', not '{host_id}'"
        )
