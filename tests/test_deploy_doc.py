"""docs/deploy.md walked as written, in order, on this machine's loopback (its introduction
says what stands in for what): its `sh` blocks run in one bash session, each command
succeeding (or printing what its `# -> ` lines say), with an embedded PostgreSQL primary
and synchronous standby for the database servers (the role `amc` let in by password only,
so the replica must read it from its credential), the wheel installed into a test prefix
for /opt/amc, every unit checked by `systemd-analyze verify` and run as its unit says by
tests/support/systemctl_standin.py, and nginx as the reverse proxy."""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from control_plane.embedded import POSTGRES_BIN_PATH, ReplicatedPostgres
from tests.support.doc_examples import check, fences, run_sh
from tests.support.fakes.real_adb import find_adb
from tests.support.wheel import Dist

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "deploy.md"
STANDIN = ROOT / "tests" / "support" / "systemctl_standin.py"
NEEDED = ("nginx", "curl", "openssl")

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        any(shutil.which(tool) is None for tool in NEEDED),
        reason=f"needs {', '.join(NEEDED)} on this machine (apt-get install nginx curl openssl)",
    ),
]

# What the walk's phone host runs on instead of an adb server's phones.
AGENT_PHONES = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def database() -> Iterator[ReplicatedPostgres]:
    """The primary and its synchronous standby; `amc` may log in with a password only. Not
    under pytest's tmp_path: as root the servers run as another user, and pytest makes that
    tree private to root."""
    root = Path(tempfile.mkdtemp(prefix="amc-deploy-pg-"))
    pair = ReplicatedPostgres(root)
    try:
        pair.start()
        for server in pair.servers:
            hba = server.datadir / "pg_hba.conf"
            hba.write_text(
                "host all amc 127.0.0.1/32 scram-sha-256\nhost all amc ::1/128 scram-sha-256\n"
                + hba.read_text()
            )
            server.sql("SELECT pg_reload_conf()")
        yield pair
    finally:
        pair.stop()
        shutil.rmtree(root, ignore_errors=True)


class Walk:
    """The folders that stand for the hosts' /opt/amc, /etc/amc, /etc/systemd/system and
    /etc/nginx, the ports that stand for the documented ones, and the walk's shell."""

    def __init__(self, home: Path, prefix: Path, database: ReplicatedPostgres) -> None:
        self.home = home
        self.prefix = prefix
        self.etc = home / "etc-amc"
        self.units = home / "etc-systemd-system"
        # Short: it holds the units' notify sockets (an AF_UNIX path is at most 107 bytes).
        self.state = Path(tempfile.mkdtemp(prefix="amc-sd-"))
        # nginx's workers (an unprivileged user) read and write here: not a private tree.
        self.nginx = Path(tempfile.mkdtemp(prefix="amc-deploy-nginx-"))
        self.nginx.chmod(0o755)
        for folder in ("conf.d", "temp"):
            (self.nginx / folder).mkdir()
        (self.nginx / "temp").chmod(0o777)
        self.ports = {name: free_port() for name in ("grpc", "console", "metrics", "https")}
        primary, standby = (f"127.0.0.1:{s.port}" for s in database.servers)
        p = self.ports
        self.replacements = {
            "https://amc.example.internal/": f"https://localhost:{p['https']}/",
            "listen 443 ssl": f"listen 127.0.0.1:{p['https']} ssl",
            "pg-a.example.internal:5432": primary,
            "pg-b.example.internal:5432": standby,
            "0.0.0.0:50051": f"127.0.0.1:{p['grpc']}",
            ":50051": f":{p['grpc']}",
            "127.0.0.1:8443": f"127.0.0.1:{p['console']}",
            "127.0.0.1:9464": f"127.0.0.1:{p['metrics']}",
            "amc-1.example.internal": "localhost",
            "rack1-host3.example.internal": "localhost",
            "amc.example.internal": "localhost",
            "/opt/amc": str(prefix),
            "/etc/amc/": f"{self.etc}/",
            "/etc/systemd/system/": f"{self.units}/",
            "/etc/nginx/": f"{self.nginx}/",
        }
        self.units.mkdir()
        (self.nginx / "nginx.conf").write_text(
            f"pid {self.nginx}/nginx.pid;\n"
            f"error_log {self.nginx}/error.log;\n"
            "events {}\n"
            "http {\n"
            "    access_log off;\n"
            + "".join(
                f"    {kind}_temp_path {self.nginx}/temp/{kind};\n"
                for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
            )
            + f"    include {self.nginx}/conf.d/*.conf;\n"
            "}\n"
        )

    def prelude(self) -> str:
        standin = [
            sys.executable,
            str(STANDIN),
            "--units",
            str(self.units),
            "--state",
            str(self.state),
            "--rewrite",
            f"/opt/amc/={self.prefix}/",
            "--rewrite",
            f"/etc/amc/={self.etc}/",
            "--rewrite",
            f"/usr/bin/adb={find_adb()}",
            "--verify-only",
            "adb.service",
            "--env",
            f"amc-host-agent.service:AMC_SIMULATED_DEVICES={AGENT_PHONES}",
        ]
        nginx = f"command nginx -p {self.nginx}/ -c {self.nginx}/nginx.conf"
        return "\n".join(
            [
                'sudo() { "$@"; }',
                'ssh() { shift; bash -c "$*"; }',
                "apt-get() { :; }",
                f'nginx() {{ {nginx} "$@"; }}',
                "systemctl() {",
                '  case " $* " in',
                f'    *" nginx "*) if [ -s {self.nginx}/nginx.pid ]; then nginx -s reload;'
                " else nginx; fi ;;",
                f'    *) {shlex.join(standin)} -- "$@" ;;',
                "  esac",
                "}",
                "export -f sudo ssh apt-get nginx systemctl",
            ]
        )

    def environment(self) -> dict[str, str]:
        """An operator's shell: the checkout's `amc` and PostgreSQL's `psql` on its PATH,
        no AMC or PostgreSQL setting inherited, a home of its own."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AMC_", "GRPC_", "PG")) and k != "DATABASE_URL"
        }
        path = [str(POSTGRES_BIN_PATH), str(ROOT / ".venv" / "bin"), env.get("PATH", "")]
        return env | {"PATH": os.pathsep.join(path), "HOME": str(self.home)}

    def stop(self) -> None:
        for pidfile in self.state.glob("*.pid"):
            pid = int(pidfile.read_text())
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(pid, sig)
                except ProcessLookupError:
                    break
        pid = self.nginx / "nginx.pid"
        if pid.exists():
            try:
                os.kill(int(pid.read_text()), signal.SIGQUIT)
            except (ProcessLookupError, ValueError):
                pass
        shutil.rmtree(self.nginx, ignore_errors=True)

    def logs(self) -> str:
        text = "".join(
            f"\n--- {log.name}:\n{log.read_text(errors='replace')[-3000:]}"
            for log in sorted(self.state.glob("*.log"))
        )
        shutil.rmtree(self.state, ignore_errors=True)
        return text


async def test_the_deploy_doc_walks_on_loopback_as_written(
    database: ReplicatedPostgres, prefix: Path, dist: Dist, tmp_path: Path
) -> None:
    """THEN every command of every `sh` block of docs/deploy.md, run in order in one
    shell, succeeds and prints what its `# -> ` lines say: the standby synchronous, the
    control plane active on its database as `amc` with the password of its credential,
    the first operator token listed through TLS, the console and the metrics through
    nginx, and the phone host, with the host token minted on the operator's machine,
    connected."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "scripts").symlink_to(ROOT / "scripts")
    shutil.copy(dist.wheel, home)  # the README's `make dist` output, beside the commands
    walk = Walk(home, prefix, database)
    blocks = fences(DOC, "sh")
    assert len(blocks) >= 8
    try:
        ran = await asyncio.to_thread(
            run_sh,
            "\n".join(blocks),
            cwd=home,
            env=walk.environment(),
            address="127.0.0.1:50051",
            replacements=walk.replacements,
            prelude=walk.prelude(),
            timeout=600,
        )
    finally:
        walk.stop()
        logs = walk.logs()
    problems = check(ran)
    assert problems == [], "\n".join(problems) + logs
    assert sum(len(r.command.expected) for r in ran) >= 6
