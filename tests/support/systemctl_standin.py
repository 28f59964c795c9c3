"""`systemctl` for a walk of docs/deploy.md where there is no systemd to start units: each
unit named is checked with `systemd-analyze verify`, then (unless it is only verified) its
`ExecStart` is run as systemd would run it, with the unit's `Environment=` lines, its
`EnvironmentFile=` on top, its `LoadCredential=` files copied into a credentials folder
(`%d`), and for `Type=notify` a NOTIFY_SOCKET it must say READY=1 on before the command
returns. The started process keeps running in a session of its own; its pid and log are
kept in the state folder, where the test finds them to stop it.

    systemctl_standin.py --units DIR --state DIR [--rewrite OLD=NEW]... [--verify-only U]...
        [--env UNIT:NAME=VALUE]... -- daemon-reload | enable --now U... | start U... |
        stop U... | is-active U

`--rewrite` turns the documented paths in a unit (/opt/amc/, /etc/amc/) into the test's.
Standard library only: it runs in the walk's shell, outside pytest.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

READY_WITHIN = 90.0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--units", type=Path, required=True)
    p.add_argument("--state", type=Path, required=True)
    p.add_argument("--rewrite", action="append", default=[])
    p.add_argument("--verify-only", action="append", default=[])
    p.add_argument("--env", action="append", default=[])
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    command = [a for a in args.command if a != "--"]
    verb, rest = command[0], [a for a in command[1:] if not a.startswith("--")]
    names = [u if "." in u else f"{u}.service" for u in rest]
    args.state.mkdir(parents=True, exist_ok=True)
    if verb == "daemon-reload":
        return 0
    if verb == "is-active":
        active = all(_running(args.state, name) for name in names)
        print("active" if active else "inactive")
        return 0 if active else 3
    if verb == "stop":
        for name in names:
            stop(args.state, name)
        return 0
    if verb in ("enable", "start", "restart"):
        if verb == "enable" and "--now" not in command:
            return 0
        for name in names:
            text = _rewritten((args.units / name).read_text(), args.rewrite)
            unit = args.state / name
            unit.write_text(text)
            verify(unit)
            if name not in args.verify_only:
                if verb == "restart":
                    stop(args.state, name)
                mine = [e.removeprefix(f"{name}:") for e in args.env if e.startswith(f"{name}:")]
                extra = dict(e.split("=", 1) for e in mine)
                start(unit, args.state, extra)
        return 0
    print(f"systemctl stand-in: {verb} is not done here", file=sys.stderr)
    return 1


def _rewritten(text: str, rewrites: list[str]) -> str:
    for rewrite in rewrites:
        old, _, new = rewrite.partition("=")
        text = text.replace(old, new)
    return text


def verify(unit: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    if done.returncode != 0 or done.stderr.strip():
        raise SystemExit(f"systemd-analyze verify {unit.name}: {done.stderr.strip()}")


def service(unit: Path) -> list[tuple[str, str]]:
    """The [Service] section's settings, in order."""
    found, section = [], ""
    for line in unit.read_text().splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.append((key, value))
    return found


def start(unit: Path, state: Path, extra: dict[str, str]) -> None:
    settings = service(unit)
    credentials = state / f"{unit.name}.credentials"
    shutil.rmtree(credentials, ignore_errors=True)
    credentials.mkdir(mode=0o700)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": os.environ.get("LANG", "C.UTF-8")}
    files: dict[str, str] = {}
    exec_start, notify = "", False
    for key, value in settings:
        value = value.replace("%d", str(credentials))
        if key == "ExecStart":
            exec_start = value
        elif key == "Type":
            notify = value == "notify"
        elif key == "Environment":
            name, _, val = value.partition("=")
            env[name] = val
        elif key == "EnvironmentFile":
            files.update(_environment_file(Path(value.lstrip("-"))))
        elif key == "LoadCredential":
            name, _, path = value.partition(":")
            shutil.copyfile(path, credentials / name)
            (credentials / name).chmod(0o400)
    env |= files | extra
    log = (state / f"{unit.name}.log").open("ab")
    sock, path = None, str(state / f"{unit.name}.notify")
    if notify:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(path)
        sock.settimeout(0.2)
        env["NOTIFY_SOCKET"] = path
    proc = subprocess.Popen(
        exec_start.split(),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
        cwd="/",
    )
    (state / f"{unit.name}.pid").write_text(f"{proc.pid}\n")
    if sock is None:
        return
    deadline = time.monotonic() + READY_WITHIN
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = (state / f"{unit.name}.log").read_text(errors="replace")[-3000:]
                raise SystemExit(f"{unit.name} exited {proc.returncode} before READY=1:\n{tail}")
            try:
                if "READY=1" in sock.recv(4096).decode().split("\n"):
                    return
            except TimeoutError:
                continue
        raise SystemExit(f"{unit.name}: no READY=1 within {READY_WITHIN:.0f}s")
    finally:
        sock.close()


def _environment_file(path: Path) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";")) and "=" in line:
            key, _, value = line.partition("=")
            found[key.strip()] = value.strip().strip('"')
    return found


def _running(state: Path, name: str) -> bool:
    pidfile = state / f"{name}.pid"
    if not pidfile.exists():
        return False
    try:
        os.kill(int(pidfile.read_text()), 0)
    except ProcessLookupError:
        return False
    return True


def stop(state: Path, name: str, within: float = 60.0) -> None:
    pidfile = state / f"{name}.pid"
    if not pidfile.exists():
        return
    pid = int(pidfile.read_text())
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    pidfile.unlink()


def _alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its parent (init) to reap it."""
    try:
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return status != "Z"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
