"""What holds a local farm's ports and data directory: for `make run`'s refusal to start
beside them, and for its stop at once. Each is found by pid, with the program's name, so
the one line that refuses a start can say what to stop."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

WILDCARDS = frozenset({"0.0.0.0", "::"})


@dataclass
class Holder:
    """One process in a farm's way: the addresses it listens on, and whether it is the
    data directory's PostgreSQL or was started on the data directory."""

    pid: int | None  # None: another user's process, whose pid this one may not see
    name: str = "?"
    addresses: list[str] = field(default_factory=list)
    postgres_port: int | None = None  # the PostgreSQL of the data directory
    on_data_dir: bool = False  # started with the data directory on its command line

    def describe(self, data_dir: str) -> str:
        what = list(self.addresses)
        if self.postgres_port is not None:
            what.append(f"the PostgreSQL of {data_dir}, port {self.postgres_port}")
        elif self.on_data_dir:
            what.append(f"started on {data_dir}")
        who = f"pid {self.pid} ({self.name}" if self.pid is not None else "(a pid not shown to you"
        return f"{who}: {', '.join(what)})"


def postmaster(data_dir: Path) -> tuple[int, int | None] | None:
    """The pid and port of the data directory's PostgreSQL when it runs (its
    postmaster.pid names a live process), else None."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError):
        return None
    if not alive(pid):
        return None
    port = lines[3] if len(lines) > 3 else ""
    return pid, int(port) if port.isdigit() else None


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie, dead but not yet reaped, does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def holders(data_dir: Path, addresses: list[str], *, besides: int = 0) -> list[Holder]:
    """Every process that listens on one of `addresses`, runs the data directory's
    PostgreSQL or was started on the data directory (its path on its command line), but
    this one and `besides`; in pid order, the ones whose pid is hidden last."""
    found: dict[int | None, Holder] = {}

    def holder(pid: int | None) -> Holder:
        if pid not in found:
            found[pid] = Holder(pid, _name(pid))
        return found[pid]

    for address, pid in _listeners(addresses):
        holder(pid).addresses.append(address)
    running = postmaster(data_dir)
    if running is not None:
        holder(running[0]).postgres_port = running[1] or 0
    for pid in _started_on(data_dir):
        holder(pid).on_data_dir = True
    for pid in (os.getpid(), besides):
        found.pop(pid, None)
    return sorted(found.values(), key=lambda h: (h.pid is None, h.pid or 0))


def _name(pid: int | None) -> str:
    if pid is None:
        return "?"
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).name()
    return "?"


def _listeners(addresses: list[str]) -> list[tuple[str, int | None]]:
    """(address, pid) for each listening socket on one of the addresses (on its port, at
    its IP or a wildcard); none when nothing answers a connection there."""
    taken = [a for a in addresses if listening(a)]
    if not taken:
        return []
    sockets = [c for c in psutil.net_connections("inet") if c.status == psutil.CONN_LISTEN]
    found = []
    for address in taken:
        host, _, port = address.rpartition(":")
        ips = _ips(host.strip("[]")) | WILDCARDS
        pids = {
            c.pid
            for c in sockets
            if c.laddr.port == int(port) and c.laddr.ip.removeprefix("::ffff:") in ips
        }
        found += [(address, pid) for pid in sorted(pids, key=lambda p: (p is None, p or 0))]
        if not pids:  # it answers, yet no socket of this machine listens: another namespace
            found.append((address, None))
    return found


def _ips(host: str) -> set[str]:
    with contextlib.suppress(ValueError):
        return {str(ipaddress.ip_address(host))}
    with contextlib.suppress(OSError):
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    return set()


def listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
            return True
    except OSError:
        return False


def _started_on(data_dir: Path) -> list[int]:
    """Processes with the data directory on their command line (`-D DIR`, `--data-dir DIR`,
    `--data-dir=DIR`; a relative path read from the process's own directory)."""
    wanted = data_dir.resolve()
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        args = proc.info["cmdline"] or []
        paths = [a.partition("=")[2] if a.startswith("--") else a for a in args[1:]]
        for path in filter(None, paths):
            if path.startswith(("-", "postgres:")) or wanted.name not in path:
                continue
            with contextlib.suppress(OSError, ValueError):
                if Path(proc.info["cwd"] or "/", path).resolve() == wanted:
                    found.append(proc.info["pid"])
                    break
    return found


def stop_postgres(data_dir: Path, within: float = 30) -> int | None:
    """Stops the data directory's PostgreSQL if it runs: a fast shutdown (SIGINT: clients
    are disconnected, the data left consistent), an immediate one (SIGQUIT) if that takes
    longer than `within`. Returns its pid, or None when it did not run."""
    running = postmaster(data_dir)
    if running is None:
        return None
    pid = running[0]
    for sig, wait in ((signal.SIGINT, within), (signal.SIGQUIT, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not alive(pid):
            break
    return pid
