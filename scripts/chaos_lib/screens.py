"""Live-screen viewers in the chaos run: a few clients that keep watching running tasks'
screens by task_id (Scheduler.WatchScreen) through the replica and agent kills. Each
reaches the replicas through gRPC's round-robin over their addresses, so about half the
watches are made on a replica other than the one holding the phone's host (relayed
between replicas). A viewer follows its task when it moves (ABORTED: it watches again)
for a few seconds, then picks another running task. What each saw is kept for invariant
11 (`check`):

- every frame a task's viewer was sent was captured while its phone ran that task: the
  frame says which attempt (ScreenFrame.running: every agent of this release says it),
  and the database agrees: that attempt of the task ran on the frame's phone, began
  before the frame was captured, and the phone was not yet given to another attempt (of
  any task) when it was. (A frame captured after its attempt ended in the database and
  before the phone's next attempt began is the host still running it, not knowing yet:
  counted, not a violation.)
- a task's watch ended soon after its attempt did: no frame reached a viewer later than
  the watched task's re-read bound (watch_refresh 5 s, +20 % jitter) after its attempt
  ended, with NOTICE_SLACK for the harness's own event loop under load.
- a viewer of the stream (half the watches ask codec "h264") can decode what it was sent:
  its first frame of the stream in a watch is a key frame, and so is every one after a
  gap in the phone's frame numbers (a viewer that fell behind, or a frame held back as
  another attempt's, goes on from a key frame, never mid-group).
- watching changed nothing of a task: a watched task that ended done has exactly its
  spec's steps, and its phone's action log exactly its plan's device actions for that
  attempt (a capture is no action; the leases are invariants 4 and 6's, for every task).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import asyncpg
import grpc

from amc.v1 import scheduler_pb2
from chaos_lib.clients import replicas
from chaos_lib.evidence import Evidence, task_result
from chaos_lib.workload import Submitted

# The control plane's default watch_refresh and its jitter: how long a lost notification
# of a task's move can leave its watch open.
REFRESH_BOUND = 5.0 * 1.2
# Seconds for the frame's way to the harness and its event loop under load.
NOTICE_SLACK = 5.0
CODECS = ("image", "h264")
RUNNING = "SELECT task_id::text FROM tasks WHERE status = 'dispatched' ORDER BY random() LIMIT 1"


@dataclass(frozen=True)
class FrameSeen:
    """One frame a viewer of `task_id` was sent (its image not kept)."""

    task_id: str
    host_id: str
    serial: str
    seq: int
    captured_at: float  # the host's clock, seconds
    received_at: float  # the harness's clock (the same machine's)
    # What the frame says the phone ran during its capture; None: it says nothing.
    running: tuple[str, int] | None
    # Which watch it came on (an index of ScreenLoad.watches), its kind, a key frame.
    watch: int = -1
    mime: str = "image/png"
    key_frame: bool = False


@dataclass
class WatchRecord:
    task_id: str
    started_at: float
    ended_at: float = 0.0
    # OK (the task finished), ABORTED (it moved), another gRPC code, "left" (the viewer
    # stopped watching), or "stopped" (the run's faults ended while it watched).
    code: str = "stopped"
    detail: str = ""
    frames: int = 0
    # "image" or "h264" (WatchScreenRequest.codec).
    codec: str = "image"


@dataclass
class ScreenLoad:
    addresses: list[str]
    token: str | None
    dsn: str
    rng: random.Random
    concurrent: int = 3
    frames: list[FrameSeen] = field(default_factory=list)
    watches: list[WatchRecord] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stopping = asyncio.Event()
        self._channel, self._stub = replicas(self.addresses, self.token)
        self._db: asyncpg.Connection | None = None

    async def run_forever(self) -> None:
        await asyncio.gather(*(self._viewer() for _ in range(self.concurrent)))

    def stop(self) -> None:
        self._stopping.set()

    async def close(self) -> None:
        await self._channel.close()
        if self._db is not None:
            with contextlib.suppress(Exception):
                await self._db.close()

    async def _viewer(self) -> None:
        while not self._stopping.is_set():
            task_id = await self._running_task()
            if task_id is None:
                await asyncio.sleep(0.5)
                continue
            until = time.monotonic() + self.rng.uniform(3.0, 12.0)
            while not self._stopping.is_set() and time.monotonic() < until:
                record = WatchRecord(task_id, time.time(), codec=self.rng.choice(CODECS))
                self.watches.append(record)
                await self._watch(record, until)
                if record.code not in ("ABORTED", "FAILED_PRECONDITION", "UNAVAILABLE"):
                    break  # it finished, or the viewer left; else follow the task
                await asyncio.sleep(0.5)

    async def _running_task(self) -> str | None:
        """A task running now, at random (None: none, or the database is away)."""
        try:
            if self._db is None or self._db.is_closed():
                self._db = await asyncpg.connect(self.dsn, timeout=5)
            return await self._db.fetchval(RUNNING, timeout=5)  # type: ignore[no-any-return]
        except (OSError, asyncpg.PostgresError, TimeoutError, asyncpg.InterfaceError):
            if self._db is not None:
                self._db.terminate()
                self._db = None
            return None

    async def _watch(self, record: WatchRecord, until: float) -> None:
        fps = self.rng.choice([2, 5, 10])
        request = scheduler_pb2.WatchScreenRequest(
            task_id=record.task_id, max_fps=fps, codec=record.codec
        )
        call = self._stub.WatchScreen(request)
        index = len(self.watches) - 1
        try:
            async with asyncio.timeout(max(0.1, until - time.monotonic())):
                async for frame in call:
                    record.frames += 1
                    running = (
                        (frame.running.task_id, frame.running.attempt)
                        if frame.HasField("running")
                        else None
                    )
                    self.frames.append(
                        FrameSeen(
                            record.task_id,
                            frame.host_id,
                            frame.serial,
                            frame.seq,
                            frame.captured_at_ms / 1000,
                            time.time(),
                            running,
                            index,
                            frame.mime,
                            frame.key_frame,
                        )
                    )
            record.code = "OK"
        except TimeoutError:
            record.code = "left"
        except grpc.aio.AioRpcError as exc:
            record.code, record.detail = exc.code().name, exc.details() or ""
        finally:
            record.ended_at = time.time()
            call.cancel()


def check(
    ev: Evidence, frames: list[FrameSeen], watches: list[WatchRecord], submitted: list[Submitted]
) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """Invariant 11's violations (check, detail) and its figures, from what the viewers
    saw (ScreenLoad's `frames` and `watches`)."""
    violations: list[tuple[str, dict[str, Any]]] = []
    stats: Counter[str] = Counter()
    by_phone: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in ev.attempts.values():
        by_phone[(row["host_id"], row["device_serial"])].append(row["created_at"])
    for starts in by_phone.values():
        starts.sort()
    lateness = 0.0
    for f in frames:
        where = {"task_id": f.task_id, "phone": f"{f.host_id}/{f.serial}", "seq": f.seq}
        if f.running is None or f.running[0] != f.task_id:
            what = "a frame not captured during the watched task"
            violations.append((what, {**where, "running": f.running}))
            continue
        att: dict[str, Any] | None = ev.attempts.get((f.task_id, f.running[1]))
        if att is None or (att["host_id"], att["device_serial"]) != (f.host_id, f.serial):
            violations.append(("a frame of a phone the attempt did not run on", where))
            continue
        starts = by_phone[(f.host_id, f.serial)]
        following = starts[bisect.bisect_right(starts, att["created_at"]) :]
        if f.captured_at < att["created_at"]:
            violations.append(("a frame captured before its attempt began", where))
        elif following and f.captured_at >= following[0]:
            violations.append(
                ("a frame captured after its phone was given to another attempt", where)
            )
        ended = att.get("ended_at")
        if ended is not None and f.captured_at > ended:
            stats["frames captured after the attempt ended (its host not knowing yet)"] += 1
        if ended is not None and f.received_at > ended + REFRESH_BOUND + NOTICE_SLACK:
            violations.append(
                (
                    "a frame sent long after its attempt ended",
                    {**where, "late_s": round(f.received_at - ended, 2)},
                )
            )
        if ended is not None:
            lateness = max(lateness, f.received_at - ended)
    violations += _decodable(frames, stats)
    violations += _nothing_changed(ev, watches, submitted, stats)
    ends = Counter(w.code for w in watches)
    figures = {
        "watches": len(watches),
        "stream_watches": sum(1 for w in watches if w.codec == "h264"),
        "tasks_watched": len({w.task_id for w in watches}),
        "frames": len(frames),
        "watches_by_end": dict(sorted(ends.items())),
        # Relays a replica made to the one holding a watched phone's host (one per phone
        # and replica while watched there).
        "relays_between_replicas": sum(1 for r in ev.replica_lines if r.event == "screen relayed"),
        "latest_frame_after_attempt_end_s": round(lateness, 2),
        **{k: v for k, v in sorted(stats.items())},
    }
    return violations, figures


def _decodable(frames: list[FrameSeen], stats: Counter[str]) -> list[tuple[str, dict[str, Any]]]:
    """A viewer of the stream was sent a key frame first and after every gap."""
    out: list[tuple[str, dict[str, Any]]] = []
    last: dict[int, int] = {}  # watch -> the seq of its last frame of the stream
    for f in frames:
        if f.mime != "video/h264":
            continue
        stats["frames of the stream"] += 1
        before = last.get(f.watch)
        last[f.watch] = f.seq
        if before is not None and f.seq == before + 1:
            continue
        if before is not None:
            stats["skips to a key frame"] += 1
        if not f.key_frame:
            where = {"task_id": f.task_id, "seq": f.seq, "after": before}
            out.append(("a stream's viewer was sent a frame it cannot decode", where))
    return out


def _nothing_changed(
    ev: Evidence, watches: list[WatchRecord], submitted: list[Submitted], stats: Counter[str]
) -> list[tuple[str, dict[str, Any]]]:
    """A watched task that ended done has its spec's steps, and its done attempt's phone
    logged its plan's device actions, no more."""
    out: list[tuple[str, dict[str, Any]]] = []
    watched = {w.task_id for w in watches if w.frames}
    plans = {s.task_id: s.plan for s in submitted if s.task_id}
    actions: Counter[tuple[str, int]] = Counter(
        (a.task_id, a.attempt) for a in ev.actions if a.task_id
    )
    # A host of adb phones (the emulator pool's) keeps no action log: its tasks' actions
    # are not counted.
    logging = {a.host for a in ev.actions}
    for task_id in watched:
        task, plan = ev.tasks.get(task_id), plans.get(task_id)
        if task is None or plan is None or task["status"] != "done":
            continue
        stats["watched tasks done"] += 1
        result = task_result(task)
        spec = plan.spec
        want = (
            [s.name for s in spec.workflow.steps]
            if spec.HasField("workflow")
            else [a.WhichOneof("kind") for a in spec.actions.actions]
        )
        got = [s.name for s in result.steps] if result is not None else []
        if got != want:
            detail: dict[str, Any] = {"task_id": task_id, "steps": got, "spec": want}
            out.append(("a watched task's steps are not its spec's", detail))
        logged = actions[(task_id, task["attempt"])]
        attempt = ev.attempts.get((task_id, task["attempt"]))
        if attempt is not None and attempt["host_id"] not in logging:
            stats["watched tasks done on a host without an action log"] += 1
        elif logged != plan.device_actions:
            detail = {"task_id": task_id, "logged": logged, "plan": plan.device_actions}
            out.append(("a watched task's phone did other than its plan's actions", detail))
    return out
