#!/usr/bin/env python3
"""`make run`: a whole farm on this machine, in one terminal.

An embedded PostgreSQL (data kept in .amc/pgdata), one control plane on 127.0.0.1:50051 with
authentication off (--insecure: loopback only), and one host agent: on the phones of the
local adb server when it answers and has some, otherwise on 2 simulated phones. Ctrl-C stops
the agent first (it drains and gives its leases back), then the control plane, then
PostgreSQL, so the data directory is left consistent.

A farm holds `<data-dir>.lock` (its pid and addresses) while it runs. Before starting
anything, a second `make run` looks for a farm already there (that lock, its data
directory's PostgreSQL, a listener on one of its ports) and, if it finds one, says so and
how to stop it in one line; it says "ready" only once its own control plane answers and its
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
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, NoReturn

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from amc.v1 import scheduler_pb2, scheduler_pb2_grpc
from amc_testing.host import duration
from scripts.launch import ControlPlaneCommand, HostAgentCommand

ROOT = Path(__file__).resolve().parent.parent
HOST_ID = "local"
# Exit codes: a farm of this data directory already runs (nothing to do); something else
# is in the way (a port taken, the data directory's PostgreSQL held by another program).
ALREADY_RUNNING = 0
IN_THE_WAY = 1


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

    def __init__(self, message: str, code: int = IN_THE_WAY) -> None:
        super().__init__(message)
        self.code = code


def take_lock(data_dir: Path, addresses: dict[str, str]) -> IO[str]:
    """`<data-dir>.lock`, held (flock) for as long as this process lives, with its pid and
    addresses inside; InTheWay when another farm holds it. Children do not inherit it."""
    path = data_dir.parent / f"{data_dir.name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = path.open("a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = _holder(lock.read())
        lock.close()
        raise InTheWay(_running_message(holder), ALREADY_RUNNING) from None
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


def _running_message(holder: dict[str, object]) -> str:
    pid = holder.get("pid", "?")
    where = f"control plane {holder.get('listen', '?')}, console http://{holder.get('http', '?')}/"
    return (
        f"a farm is already running here (pid {pid}; {where}): use it, or stop it with "
        f"Ctrl-C in its terminal or `kill {pid}`"
    )


def postgres_in_use(data_dir: Path) -> None:
    """InTheWay when the data directory's PostgreSQL runs though no farm holds the lock: a
    control plane started by hand on it, or left over from a farm that was killed."""
    pidfile = data_dir / "postmaster.pid"
    try:
        lines = pidfile.read_text().splitlines()
        pid = int(lines[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return
    port = lines[3] if len(lines) > 3 else "?"
    raise InTheWay(
        f"the PostgreSQL of {_shown(data_dir)} already runs (pid {pid}, port {port}) but no "
        "farm holds it: a control plane started on it by hand, or left over from a farm that "
        f"was killed; stop that control plane, or the server with `kill -INT {pid}`"
    )


def ports_in_use(listeners: dict[str, str]) -> None:
    """InTheWay naming the first address (and its flag) something already listens on."""
    for flag, address in listeners.items():
        if not _listening(address):
            continue
        what = "an AMC control plane answers there" if _answers_grpc(address) else "in use"
        raise InTheWay(
            f"{address} is taken ({what}): stop what listens there, or give this farm "
            f"another port: make run ARGS='{flag} {address.rpartition(':')[0]}:PORT'"
        )


def _listening(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=1):
            return True
    except OSError:
        return False


def _answers_grpc(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
    return True


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


def _interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def stop(proc: subprocess.Popen[bytes], name: str, within: float) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(within)
        except subprocess.TimeoutExpired:
            say(f"{name} did not stop in {within:.0f}s; killing it")
            proc.kill()
            proc.wait()


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
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
    except InTheWay as exc:
        say(str(exc))
        return exc.code
    with lock:
        try:
            postgres_in_use(data_dir)
            ports_in_use(listeners)
        except InTheWay as exc:
            say(str(exc))
            return exc.code
        return run(args)


def run(args: argparse.Namespace) -> int:
    say(f"control plane on {args.listen} with authentication OFF (--insecure; loopback only)")
    plane_command = ControlPlaneCommand(
        listen=args.listen,
        data_dir=Path(args.data_dir),
        insecure=True,
        metrics_listen=args.metrics_listen,
        http_listen=args.http_listen,
    )
    plane = subprocess.Popen(
        plane_command.argv(), cwd=ROOT, env=plane_command.env(), start_new_session=True
    )
    agent = None
    try:
        wait_serving(args.listen, plane)
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
        agent = subprocess.Popen(
            agent_command.argv(), cwd=ROOT, env=agent_command.env(), start_new_session=True
        )
        wait_registered(args.listen, agent)
        say(f"console: http://{args.http_listen}/")
        say("ready: open the console, try `amc hosts`, or the README's tour; Ctrl-C stops all")
        while plane.poll() is None and agent.poll() is None:
            time.sleep(0.5)
        say("a component exited on its own; stopping the rest")
        return 1
    except KeyboardInterrupt:
        say("stopping: host agent (draining), then the control plane")
        return 0
    finally:
        if agent is not None:
            stop(agent, "host agent", 60)
        stop(plane, "control plane", 60)
        say("stopped")


if __name__ == "__main__":
    sys.exit(main())
