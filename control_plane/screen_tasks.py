"""A task's live screen: who may watch it, and the attempt its watch is bound to.

Who: operators; the token that submitted the task; a token of the submitter's team (the
team its token was given; a token without a team is a team of its own). A console
Control session (a session task whose metadata says `control: console`) is an operator's
hands on a phone: only operators may watch it. Anyone else is refused PERMISSION_DENIED.

Bound: a watch by task_id is resolved once to the task's current attempt (its number,
host and serial) and shows that phone only while that attempt is the task's current one.
Each replica keeps one `Followed` fact per task watched on it, shared by its watches: the
task's current attempt as last read (one indexed read: screen_attempt). It is read again
when the task changes (the hub's task notification, which also comes after a LISTEN
reconnect) and at least every `watch_refresh` (jittered; a notification may be lost).
From a notification until the read after it the fact is unsure, and no frame is sent;
after a failed read too, until a read succeeds (tried again every RETRY). So a frame is
sent only while the last read, at most about `watch_refresh` ago, said the attempt is
current and no change was heard since. Nothing is read per frame. A watch whose attempt
is no longer current ends ABORTED (TaskMoved: watch again, the task is on another phone
or waits for one), or OK once the task finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import structlog

from control_plane.domain import Principal, Role
from control_plane.errors import AmcError, PermissionDenied, TaskMoved

log = structlog.get_logger(__name__)

RUNNING = ("assigned", "dispatched")
# Seconds between reads of a watched task while they fail (the database away).
RETRY = 1.0
# The metadata a console Control session is submitted with (control_plane.console.control).
CONTROL_KEY, CONTROL_VALUE = "control", "console"


def authorize(
    who: Principal, task_id: uuid.UUID, source: dict[str, Any], what: str = "watch its screen"
) -> None:
    """May `who` watch the task's screen, or read its phone's log (`what`), by the same
    rule (`source`: screen_source's row)? Else PermissionDenied."""
    if who.role is None or who.role is Role.OPERATOR:
        return
    if source["control"] == CONTROL_VALUE:
        raise PermissionDenied(
            f"task {task_id} is an operator's Control session: only operators may {what}"
        )
    if who.token_id is not None and str(who.token_id) == source["caller"]:
        return
    if who.team and who.team == source["team"]:
        return
    raise PermissionDenied(
        f"task {task_id} was submitted by a token of another team: only its team and"
        f" operators may {what}"
    )


@dataclass(frozen=True)
class Attempt:
    """A task's attempt: its number and its phone; with the task's status when read."""

    attempt: int
    host_id: str | None
    serial: str | None
    status: str = "dispatched"

    @classmethod
    def of(cls, row: dict[str, Any]) -> Attempt:
        return cls(row["attempt"], row["host_id"], row["serial"], row["task_status"])


# The task's current attempt (screen_attempt's row), or None when the task is gone.
Reader = Callable[[uuid.UUID], Awaitable[dict[str, Any] | None]]
# What `Followed.check` says of a frame: send it, wait for the next read, or end the watch
# normally (the task finished).
SEND, WAIT, FINISHED = "send", "wait", "finished"


class Followed:
    """One task watched on this replica: its current attempt as last read, and whether a
    change was heard since (`sure`). Unsure until its first read, and after a failed one."""

    def __init__(self, task_id: uuid.UUID, heard: asyncio.Event) -> None:
        self.task_id = task_id
        self.current: Attempt | None = None
        # Set by the hub when the task changed: unsure until the next read.
        self._heard = heard
        self._heard.set()
        self._reading = False
        # The last read succeeded.
        self._read = False
        self.watchers = 0
        self.refresher: asyncio.Task[None] | None = None
        # Replaced (and the old one set) after each read: wakes the viewers.
        self.settled = asyncio.Event()
        # Set after each read too: the viewers' own events (`waking`).
        self._wakes: set[asyncio.Event] = set()

    @property
    def sure(self) -> bool:
        return self._read and not self._heard.is_set() and not self._reading

    def join(self, bound: Attempt) -> None:
        """A watch bound to `bound` joins: a fact that says otherwise is read again first
        (its notification may have been lost)."""
        if self.current is None or _phone(self.current) != _phone(bound):
            self._heard.set()

    @contextlib.contextmanager
    def waking(self, event: asyncio.Event) -> Iterator[None]:
        """`event` is set after each read while in the block: a viewer's own event, so that
        it waits on that one alone for its next frame or the task's change (waiting on two
        events is two tasks and an `asyncio.wait` a frame: ~9 us, at 30 frames a second)."""
        self._wakes.add(event)
        try:
            yield
        finally:
            self._wakes.discard(event)

    def check(self, bound: Attempt) -> str:
        """SEND while `bound` is the task's current attempt and no change was heard since
        the read that said so; WAIT while unsure (until `settled`); FINISHED once the task
        ended. Raises TaskMoved once `bound` is not current."""
        if not self.sure:
            return WAIT
        now = self.current
        if now is None or now.status not in (*RUNNING, "queued"):
            return FINISHED
        if now.status not in RUNNING or _phone(now) != _phone(bound):
            raise TaskMoved(_moved(self.task_id, bound, now))
        return SEND

    async def refresh(self, read: Reader, every: float) -> None:
        """Read the task again whenever a change is heard, and at least every `every`
        seconds (jittered), while watched here."""
        while True:
            if not self._heard.is_set():
                pause = every if self._read else RETRY
                heard = asyncio.ensure_future(self._heard.wait())
                try:
                    await asyncio.wait([heard], timeout=pause * random.uniform(0.8, 1.2))
                finally:
                    heard.cancel()
            self._reading = True
            self._heard.clear()
            try:
                row = await read(self.task_id)
                self.current = Attempt.of(row) if row is not None else None
                self._read = True
            except AmcError as exc:
                self._read = False
                log.info("watched task not read", task_id=str(self.task_id), error=exc.message)
            finally:
                self._reading = False
                settled, self.settled = self.settled, asyncio.Event()
                settled.set()
                for event in self._wakes:
                    event.set()


def _phone(a: Attempt) -> tuple[int, str | None, str | None]:
    return a.attempt, a.host_id, a.serial


def _moved(task_id: uuid.UUID, bound: Attempt, now: Attempt) -> str:
    where = (
        f"attempt {now.attempt} runs on {now.host_id}/{now.serial}"
        if now.status in RUNNING and now.host_id
        else "it waits for another phone"
    )
    return (
        f"task {task_id} moved to another phone: its attempt {bound.attempt} on"
        f" {bound.host_id}/{bound.serial} ended ({where}); watch it again"
    )


class Following:
    """The tasks watched on this replica, each read once for all its watches here."""

    def __init__(self, heard: Callable[[uuid.UUID], contextlib.AbstractContextManager[Any]]):
        # The hub's `watch`: an event set whenever the task changes.
        self._heard = heard
        self._tasks: dict[uuid.UUID, tuple[Followed, contextlib.ExitStack]] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    @contextlib.contextmanager
    def follow(self, task_id: uuid.UUID, read: Reader, every: float) -> Iterator[Followed]:
        """The task's fact, read now (when new here) and kept while any watch follows it."""
        entry = self._tasks.get(task_id)
        if entry is None:
            stack = contextlib.ExitStack()
            followed = Followed(task_id, stack.enter_context(self._heard(task_id)))
            followed.refresher = asyncio.get_running_loop().create_task(
                followed.refresh(read, every), name=f"watched task {task_id}"
            )
            entry = self._tasks[task_id] = (followed, stack)
        followed = entry[0]
        followed.watchers += 1
        try:
            yield followed
        finally:
            followed.watchers -= 1
            if not followed.watchers and self._tasks.get(task_id) is entry:
                del self._tasks[task_id]
                if followed.refresher is not None:
                    followed.refresher.cancel()
                entry[1].close()
