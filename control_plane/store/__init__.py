"""PostgreSQL access, one aggregate per module over one pool.

`Store` opens the pool (`database.Database`: asyncpg's errors become domain errors there,
a rolled-back transaction is run again, a read-only server's connections are dropped) and
exposes one object per aggregate: `store.tasks.cancel(...)`, `store.leases.renew(...)`.

- `tasks` — submit, cancel, the queue-timeout sweep, the reads of tasks;
- `leases` — Acquire, renewals, reports, releases, the sweeps that end leases;
- `queue` — the queue's counts, fair shares, the farm's gauges;
- `hosts` — hosts and devices: registration, health, cordons, removal, events;
- `replicas` — replicas' heartbeats and presence, session relays, screen sources;
- `tokens`, `artifacts`, `retention` (its batches), `notifications` (LISTEN/NOTIFY);
- `library` — the app library's apps and files, their bytes kept once by sha256.

Where the SQL is: each module `store/<aggregate>.py` sends the statements of
`store/<aggregate>.sql`, by the name under `-- name:` (store/sql.py loads them all; a name
is used once). A transition that locks several rows is one PL/pgSQL function `amc_<verb>`,
which its statement calls, written at the top of the same file (above the statements);
every other transition is its statement. An aggregate's SQL that would pass 400 lines
goes on in `store/<aggregate>.<part>.sql` (leases.acquire.sql, leases.end.sql), still
sent by `store/<aggregate>.py`. `schema.py` brings a database to the schema at start-up:
`control_plane/schema.sql` (tables, indexes), then those functions (with `migrations/`
for an older database's tables).

Every hot call (acquire, renew, report) is one statement, so one round trip. This package
is the only one that imports asyncpg (an import-linter contract holds it).
"""

from __future__ import annotations

from control_plane.store.artifacts import Artifacts
from control_plane.store.database import Database, connect_pool, database_error, migrate
from control_plane.store.hosts import Hosts
from control_plane.store.leases import Leases
from control_plane.store.library import Library
from control_plane.store.notifications import Listener, Notifications
from control_plane.store.queue import Queue
from control_plane.store.replicas import Replicas
from control_plane.store.retention import Retention
from control_plane.store.tasks import Tasks
from control_plane.store.tokens import Tokens

__all__ = ["Listener", "Store", "database_error", "migrate"]


class Store:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.tasks = Tasks(db)
        self.leases = Leases(db)
        self.queue = Queue(db)
        self.hosts = Hosts(db)
        self.replicas = Replicas(db)
        self.tokens = Tokens(db)
        self.artifacts = Artifacts(db)
        self.library = Library(db)
        self.retention = Retention(db)
        self.notifications = Notifications(db)

    @classmethod
    async def open(cls, dsn: str, **pool_options: int) -> Store:
        return cls(Database(await connect_pool(dsn, **pool_options)))

    async def close(self, timeout: float = 10.0) -> None:
        await self.db.close(timeout)

    async def ping(self) -> None:
        """The database answers, and writably (else DatabaseUnavailable)."""
        await self.db.ping()
