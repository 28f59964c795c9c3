#!/usr/bin/env python3
"""`make run`: a whole farm on this machine, in one terminal.

An embedded PostgreSQL (data kept in .amc/pgdata), one control plane on 127.0.0.1:50051 with
authentication off (--insecure: loopback only), and one host agent: on the phones of the
local adb server when it answers and has some, otherwise on 2 simulated phones. Ctrl-C stops
the agent first (it drains and gives its leases back), then the control plane, then
PostgreSQL, so the data directory is left consistent.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from host_agent.config import duration
from scripts.launch import ControlPlaneCommand, HostAgentCommand

ROOT = Path(__file__).resolve().parent.parent


def say(message: str) -> None:
    print(
        f"\033[1mlocalfarm:\033[0m {message}" if sys.stdout.isatty() else f"localfarm: {message}",
        flush=True,
    )


def adb_phones(address: str) -> list[str]:
    """Serials in `device` state on the local adb server; none when it does not answer."""
    from host_agent.adb import AdbSource

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


def wait_serving(address: str, proc: subprocess.Popen[bytes], within: float = 60) -> None:
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

    say(f"control plane on {args.listen} with authentication OFF (--insecure; loopback only)")
    plane_command = ControlPlaneCommand(
        listen=args.listen,
        data_dir=Path(args.data_dir),
        insecure=True,
        metrics_listen="127.0.0.1:9464",
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
            host_id="local",
            insecure=True,
            adb=args.adb,
            simulated_devices=simulated,
            drain_timeout=args.drain_timeout,
            metrics_listen="127.0.0.1:9465",
        )
        agent = subprocess.Popen(
            agent_command.argv(), cwd=ROOT, env=agent_command.env(), start_new_session=True
        )
        say(f"console: http://{args.http_listen}/")
        say("ready: open the console, try `amc hosts`, or the README's tour; Ctrl-C stops all")
        signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
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
