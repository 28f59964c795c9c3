"""The `install` workload: one APK of --install-mb MB onto --install-phones simulated phones
on --install-hosts host agents (each with an app cache of its own), one install_app task
pinned to each phone, all submitted at once. Figures: the bytes the control plane sent to
hosts for it (`amc_library_fetch_bytes_total`: each host fetches the APK once and installs
it on its phones from its cache, so the APK's size times the hosts, never times the
phones), and each install's time, the lease's creation to its end.

The APK is a real, signed one (Appium's settings app, from the npm registry, as
scripts/fetch_example_apk.py fetches it) with a stored entry of random bytes added to make
up the size: its manifest is the app's, what the library and the phones read.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
import tarfile
import time
import urllib.request
import zipfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from amc.v1 import library_pb2, library_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc, task_pb2
from bench_lib import promtext
from bench_lib.pgstats import Db
from bench_lib.stack import AGENT_TOKEN, Stack, spawn
from bench_lib.stats import summarize
from scripts.fetch_example_apk import MEMBER, TARBALL_SHA1, URL
from scripts.launch import HostAgentCommand

POOL = "install"
CHUNK = 256 * 1024  # as amc apps upload sends it
FETCH_BYTES = "amc_library_fetch_bytes_total"


@dataclass(frozen=True)
class Options:
    megabytes: int = 50
    phones: int = 100
    hosts: int = 5


def _apk(root: Path, megabytes: int) -> Path:
    """The settings app, padded to `megabytes` MB."""
    base = root / "settings.apk"
    if not base.exists():
        with urllib.request.urlopen(URL, timeout=60) as response:
            tarball = response.read()
        if hashlib.sha1(tarball).hexdigest() != TARBALL_SHA1:
            raise RuntimeError(f"{URL} is not the tarball the registry published")
        with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
            member = archive.extractfile(MEMBER)
            if member is None:
                raise RuntimeError(f"{URL} has no {MEMBER}")
            base.write_bytes(member.read())
    big = root / f"settings-{megabytes}mb.apk"
    big.write_bytes(base.read_bytes())
    with zipfile.ZipFile(big, "a", compression=zipfile.ZIP_STORED) as apk:
        padding = megabytes * (1 << 20) - big.stat().st_size
        apk.writestr("assets/bench-padding.bin", os.urandom(max(0, padding)))
    return big


async def _upload(channel: grpc.aio.Channel, path: Path) -> library_pb2.App:
    data = await asyncio.to_thread(path.read_bytes)
    header = library_pb2.UploadHeader(
        file_name=path.name, size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest()
    )

    async def parts() -> AsyncIterator[library_pb2.UploadAppRequest]:
        yield library_pb2.UploadAppRequest(header=header)
        for i in range(0, len(data), CHUNK):
            yield library_pb2.UploadAppRequest(chunk=data[i : i + CHUNK])

    app: library_pb2.App = await library_pb2_grpc.LibraryStub(channel).UploadApp(parts())
    return app


async def _phones(db: Db, hosts: list[str], n: int, within: float = 120.0) -> list[Any]:
    """The hosts' phones, once all n are registered and ready."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        rows = await db.conn.fetch(
            "SELECT host_id, serial FROM devices WHERE host_id = ANY ($1::text[])"
            " AND state = 'device' AND condition = 'ready' ORDER BY host_id, serial",
            hosts,
        )
        if len(rows) >= n:
            return list(rows)
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the {n} phones of {len(hosts)} hosts were not all ready in {within:.0f}s")


async def _done(db: Db, tasks: list[str], within: float = 600.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        left = await db.conn.fetchval(
            "SELECT count(*) FROM tasks WHERE task_id = ANY ($1::uuid[])"
            " AND status NOT IN ('done', 'failed', 'cancelled')",
            tasks,
        )
        if left == 0:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"{left} of the {len(tasks)} installs had not ended in {within:.0f}s")


async def run(stack: Stack, options: Options, say: Callable[[str], None]) -> dict[str, Any]:
    per_host = -(-options.phones // options.hosts)
    hosts = [f"install-{i}" for i in range(options.hosts)]
    for host in hosts:
        command = HostAgentCommand(
            control_plane=stack.address,
            host_id=host,
            token=AGENT_TOKEN,
            labels={"pool": POOL},
            simulated_devices=per_host,
            sim_delay=0.0,
            drain_timeout=0,
            log_format=stack.log_format,
            app_cache_dir=stack.root / f"app-cache-{host}",
        )
        log = stack.root / f"agent-{host}.log"
        stack.agents[host] = spawn(f"host agent {host}", command.argv(), log, command.env())
    apk = await asyncio.to_thread(_apk, stack.root, options.megabytes)
    size = apk.stat().st_size
    channel = grpc.aio.insecure_channel(stack.address)
    db = await Db.connect(stack.dsn)
    try:
        say(f"install: a {size / (1 << 20):.0f} MB APK uploaded")
        app = await _upload(channel, apk)
        phones = (await _phones(db, hosts, options.phones))[: options.phones]
        sent0 = promtext.value(await promtext.scrape(stack.metrics_url), FETCH_BYTES)
        say(f"install: onto {len(phones)} phones of {len(hosts)} hosts, all at once")
        spec = task_pb2.TaskSpec(
            actions=task_pb2.ActionList(
                actions=[task_pb2.Action(install_app=task_pb2.InstallApp(app=app.app_id))]
            )
        )
        requests = [
            scheduler_pb2.SubmitTaskRequest(
                spec=spec,
                selector=task_pb2.DeviceSelector(
                    serial=p["serial"], labels={"host_id": p["host_id"]}
                ),
            )
            for p in phones
        ]
        started = time.perf_counter()
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        submitted = await stub.SubmitTasks(scheduler_pb2.SubmitTasksRequest(tasks=requests))
        tasks = [t.task_id for t in submitted.tasks]
        await _done(db, tasks)
        elapsed = time.perf_counter() - started
        sent = promtext.value(await promtext.scrape(stack.metrics_url), FETCH_BYTES) - sent0
        rows = await db.conn.fetch(
            "SELECT t.status, extract(epoch FROM a.ended_at - a.created_at) AS took"
            " FROM tasks t JOIN attempts a USING (task_id)"
            " WHERE t.task_id = ANY ($1::uuid[]) AND a.attempt = t.attempt",
            tasks,
        )
    finally:
        await db.close()
        await channel.close()
        for host in hosts:
            child = stack.agents.pop(host, None)
            if child is not None:
                child.stop()
    done = sum(1 for r in rows if r["status"] == "done")
    out = {
        "apk_bytes": size,
        "phones": len(phones),
        "hosts": len(hosts),
        "seconds": elapsed,
        "sent_bytes": sent,
        "sent_times_apk": sent / size,
        "install_ms": summarize([float(r["took"]) * 1000 for r in rows if r["took"] is not None]),
        "installed": done,
        "verified": done == len(phones),
    }
    say(f"  sent {out['sent_times_apk']:.2f}x the APK; {done} of {len(phones)} installed")
    return out
