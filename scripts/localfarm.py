#!/usr/bin/env python3
"""`make run`: a whole farm on this machine, in one terminal.

An embedded PostgreSQL (data kept in .amc/pgdata), one control plane on 127.0.0.1:50051 with
authentication off (--insecure: loopback only), and one host agent: on the phones of the
local adb server when it answers and has some, otherwise on 2 simulated phones. Ctrl-C stops
the agent first (it drains and gives its leases back), then the control plane, then
PostgreSQL, so the data directory is left consistent. A second Ctrl-C during that stops
everything at once: the agent and the control plane are killed, PostgreSQL gets its fast
shutdown, and no process or port is left behind.

A farm holds `<data-dir>.lock` (its pid and addresses) while it runs. Before starting
anything, a second `make run` looks for a farm already there (that lock, its data
directory's PostgreSQL, a process started on its data directory, a listener on one of its
ports) and, if it finds one, says so in one line naming every pid in the way and how to
stop them, and exits 1; it says "ready" only once its own control plane answers and its
agent has registered.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NoReturn

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc
from amc_testing.host import duration
from scripts.farm_holders import Holder, holders, stop_postgres
from scripts.launch import ControlPlaneCommand, HostAgentCommand

ROOT = Path(__file__).resolve().parent.parent
HOST_ID = "local"
# The exit code of a start refused: a farm of this data directory already runs, or something
# else holds one of its ports or its data directory.
REFUSED = 1
# The programs of a farm: one of them on a farm's port is a farm's part left running.
AMC = frozenset({"control-plane", "host-agent"})


def say(message: str) -> None:
    print(
        f"\033[1mlocalfarm:\033[0m {message}" if sys.stdout.isatty() else f"localfarm: {message}",
        flush=True,
    )


def adb_phones(address: str) -> list[str]:
    """Serials in `device` state on the local adb server; none when it does not answer."""
    from amc_testing.host import AdbSource

    host, _, port = address.rpartition(":")

    async def look() -> list[str]:
        source = AdbSource(host, int(port), call_timeout=3.0)
        try:
            return [d.serial for d in await source.inventory() if d.state == "device"]
        except Exception:
            return []
        finally:
            await source.close()

    return asyncio.run(look())


# -- a farm already here? -------------------------------------------------------------------


class InTheWay(Exception):
    """Something stops this farm from starting; the message says what and what to do."""


def take_lock(data_dir: Path, addresses: dict[str, str]) -> IO[str] | dict[str, object]:
    """`<data-dir>.lock`, held (flock) for as long as this process lives, with its pid and
    addresses inside; or, when another farm holds it, what that farm wrote there. Children
    do not inherit it."""
    path = data_dir.parent / f"{data_dir.name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = _holder(lock.read())
        lock.close()
        return holder
    lock.truncate(0)
    lock.write(json.dumps({"pid": os.getpid(), **addresses}) + "\n")
    lock.flush()
    return lock


def _holder(text: str) -> dict[str, object]:
    try:
        found = json.loads(text)
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def already_running(farm: dict[str, object], data_dir: Path, listeners: dict[str, str]) -> str:
    """The line for a farm of this data directory that runs: its pid, where it serves, how
    to stop it, and every process of it that holds a port or the data directory."""
    pid = farm.get("pid", "?")
    besides = pid if isinstance(pid, int) else 0
    where = f"control plane {farm.get('listen', '?')}, console http://{farm.get('http', '?')}/"
    parts = holders(data_dir, list(listeners.values()), besides=besides)
    held = f"; it holds {_listed(parts, data_dir)}" if parts else ""
    return (
        f"a farm is already running here (pid {pid}; {where}): use it, or stop it with "
        f"Ctrl-C in its terminal or `kill {pid}`{held}"
    )


def in_the_way(data_dir: Path, listeners: dict[str, str]) -> None:
    """InTheWay naming every process that listens on one of the farm's addresses, runs
    its data directory's PostgreSQL or was started on its data directory (a farm whose
    launcher was killed, a control plane started by hand, another program on a port)."""
    parts = holders(data_dir, list(listeners.values()))
    if not parts:
        return
    shown = _shown(data_dir)
    ours = [h for h in parts if h.postgres_port is not None or h.on_data_dir or h.name in AMC]
    others = [h for h in parts if h not in ours]
    advice = []
    if ours:
        pids = " ".join(str(h.pid) for h in ours if h.pid is not None)
        advice.append(
            f"left over from a farm that was killed, or started by hand on {shown}: stop "
            f"them with `kill -INT {pids}`"
        )
    taken = [f for f, a in listeners.items() if any(a in h.addresses for h in others)]
    if taken:
        ports = " ".join(f"{flag} {listeners[flag].rpartition(':')[0]}:PORT" for flag in taken)
        advice.append(
            f"stop what listens there, or give this farm other ports: make run ARGS='{ports}'"
        )
    raise InTheWay(
        f"cannot start, its ports or data directory are held: {_listed(parts, data_dir)}: "
        + "; ".join(advice)
    )


def _listed(parts: list[Holder], data_dir: Path) -> str:
    return ", ".join(h.describe(_shown(data_dir)) for h in parts)


def _shown(path: Path) -> str:
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(Path.cwd()))
    return str(path)


# -- starting ----------------------------------------------------------------------------------


def wait_serving(address: str, proc: subprocess.Popen[bytes], within: float = 60) -> None:
    """Until the control plane this farm started answers its health check (the ports were
    free and the lock is held, so it is this one that answers)."""
    deadline = time.monotonic() + within
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"localfarm: the control plane exited ({proc.returncode})")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=1).status == 1:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise SystemExit("localfarm: the control plane did not come up in time")


def wait_registered(address: str, proc: subprocess.Popen[bytes], within: float = 60) -> None:
    """Until the agent this farm started is a connected host (ListHosts: no token needed
    against an --insecure control plane)."""
    deadline = time.monotonic() + within
    with grpc.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SystemExit(f"localfarm: the host agent exited ({proc.returncode})")
            with contextlib.suppress(grpc.RpcError):
                hosts = stub.ListHosts(scheduler_pb2.ListHostsRequest(), timeout=2).hosts
                if any(h.host_id == HOST_ID and h.connected for h in hosts):
                    return
            time.sleep(0.2)
    raise SystemExit("localfarm: the host agent did not register in time")


# -- stopping ----------------------------------------------------------------------------------


class Hurry(BaseException):
    """A second Ctrl-C (or SIGTERM): stop everything at once."""


@dataclass
class Parts:
    """What this farm started, as it starts them; a stop stops what is here."""

    data_dir: Path
    plane: subprocess.Popen[bytes] | None = None
    agent: subprocess.Popen[bytes] | None = None
    hurried: bool = False


PARTS: Parts | None = None


def _interrupt(signum: int, frame: object) -> NoReturn:
    # From the first Ctrl-C on, the next one is a hurry: no moment is left in which it
    # would break off the stop with a traceback and leave the parts running.
    signal.signal(signal.SIGINT, _hurry)
    signal.signal(signal.SIGTERM, _hurry)
    raise KeyboardInterrupt


def _hurry(signum: int, frame: object) -> NoReturn:
    # Once: a third Ctrl-C must not break off the stop at once either.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if PARTS is not None:
        PARTS.hurried = True
    raise Hurry


def stop(proc: subprocess.Popen[bytes], name: str, within: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(within)
        except subprocess.TimeoutExpired:
            say(f"{name} did not stop in {within:.0f}s; killing it")
            kill(proc)


def kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the process and to all it started in its session (its own process group:
    it was started with a session of its own)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def shut_down(parts: Parts) -> None:
    """In order: the agent (it drains and gives its leases back), the control plane (it
    stops its PostgreSQL), then the data directory's PostgreSQL if it still runs (a control
    plane killed for not stopping leaves it). A second Ctrl-C or SIGTERM, before or during
    this, stops everything at once: the agent and the control plane killed, PostgreSQL's
    fast shutdown (the data directory stays consistent; running tasks' leases run out)."""
    try:
        if not parts.hurried:
            if parts.agent is not None:
                stop(parts.agent, "host agent", 60)
            if parts.plane is not None:
                stop(parts.plane, "control plane", 60)
    except Hurry:
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if parts.hurried:
        say("stopping at once: killing the host agent and the control plane, then PostgreSQL")
        for proc in (parts.agent, parts.plane):
            if proc is not None:
                kill(proc)
    stop_postgres(parts.data_dir)


# -- the farm ------------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--listen", default="127.0.0.1:50051")
    p.add_argument("--http-listen", default="127.0.0.1:8080", help="the console in the browser")
    p.add_argument("--metrics-listen", default="127.0.0.1:9464", help="the control plane's")
    p.add_argument("--agent-metrics-listen", default="127.0.0.1:9465", help="the agent's")
    p.add_argument("--data-dir", default=str(ROOT / ".amc" / "pgdata"))
    p.add_argument("--adb", default=os.environ.get("AMC_ADB_ADDR", "127.0.0.1:5037"))
    p.add_argument(
        "--simulated-devices",
        type=int,
        default=None,
        help="force N simulated phones (default: 2 when adb has no phones)",
    )
    p.add_argument("--drain-timeout", type=duration, default="10s")
    args = p.parse_args()
    # Ctrl-C and `kill` stop the farm in order, even when it was started in the background
    # (where a shell leaves SIGINT ignored).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    data_dir = Path(args.data_dir)
    listeners = {
        "--listen": args.listen,
        "--http-listen": args.http_listen,
        "--metrics-listen": args.metrics_listen,
        "--agent-metrics-listen": args.agent_metrics_listen,
    }
    try:
        lock = take_lock(data_dir, {"listen": args.listen, "http": args.http_listen})
        if isinstance(lock, dict):
            say(already_running(lock, data_dir, listeners))
            return REFUSED
        with lock:
            try:
                in_the_way(data_dir, listeners)
            except InTheWay as exc:
                say(str(exc))
                return REFUSED
            return run(args)
    except (KeyboardInterrupt, Hurry):  # before anything was started
        return 130


def run(args: argparse.Namespace) -> int:
    global PARTS
    parts = PARTS = Parts(Path(args.data_dir))
    code = 1
    try:
        try:
            start(args, parts)
            while all(p.poll() is None for p in (parts.plane, parts.agent) if p is not None):
                time.sleep(0.5)
            say("a component exited on its own; stopping the rest")
        except KeyboardInterrupt:
            code = 0
            say(
                "stopping: host agent (draining), then the control plane; Ctrl-C again stops "
                "everything at once"
            )
    except Hurry:  # the second Ctrl-C came before the stop began
        code = 0
    finally:
        shut_down(parts)
        say("stopped")
    return code


def start(args: argparse.Namespace, parts: Parts) -> None:
    """Starts the control plane and the agent into `parts`; returns once they are ready."""
    say(f"control plane on {args.listen} with authentication OFF (--insecure; loopback only)")
    plane_command = ControlPlaneCommand(
        listen=args.listen,
        data_dir=Path(args.data_dir),
        insecure=True,
        metrics_listen=args.metrics_listen,
        http_listen=args.http_listen,
    )
    parts.plane = subprocess.Popen(
        plane_command.argv(), cwd=ROOT, env=plane_command.env(), start_new_session=True
    )
    wait_serving(args.listen, parts.plane)
    phones = [] if args.simulated_devices is not None else adb_phones(args.adb)
    simulated = None
    if phones:
        say(f"host agent on the adb server at {args.adb}: {', '.join(phones)}")
    else:
        simulated = args.simulated_devices if args.simulated_devices is not None else 2
        say(f"no phones at adb server {args.adb}: host agent with {simulated} simulated phones")
    agent_command = HostAgentCommand(
        control_plane=args.listen,
        host_id=HOST_ID,
        insecure=True,
        adb=args.adb,
        simulated_devices=simulated,
        drain_timeout=args.drain_timeout,
        metrics_listen=args.agent_metrics_listen,
    )
    parts.agent = subprocess.Popen(
        agent_command.argv(), cwd=ROOT, env=agent_command.env(), start_new_session=True
    )
    wait_registered(args.listen, parts.agent)
    say(f"console: http://{args.http_listen}/")
    say("ready: open the console, try `amc hosts`, or the README's tour; Ctrl-C stops all")


if __name__ == "__main__":
    sys.exit(main())
