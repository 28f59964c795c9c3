"""One MCP client's phone sessions (`ClientSessions`): each opened by open_session, named by
its id (its task's) in the tools that act on it, ended by close_session, and never replaced
behind the agent's back.

A tool that names no session acts on the client's one open session; naming none while it
holds several is refused with their ids, and so is an id that is not the client's. Over
stdio (`Defaults.implicit`), an action of a client that never opened a session opens one
with the server's defaults, as the server always did. A client holds at most
`Defaults.limit` sessions at once: with a limit of 1, open_session while one is open
answers that one (the server's behaviour over stdio).

Tool calls arrive at once (an MCP client runs each request in its own task): bookkeeping
takes turns (a condition), openings run side by side (counted against the limit while
they wait for a phone), and actions take turns on each phone (Phone's own lock). A session
that ended by itself (its idle timeout, a cancel, its lease lost, its longest duration)
stays the client's until close_session: its actions raise how it ended. A client that left
(`leave`) has its sessions closed done, one that vanished (`abandon`) failed ("session
abandoned"); an opening still waiting then is abandoned as it completes.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from amc.v1 import task_pb2
from amc_client.errors import AmcClientError, SessionRefused
from amc_client.farm import Farm
from amc_client.mcp_text import said
from amc_client.opening import unmatched
from amc_client.phone import Phone

# The session's metadata: what opened it (as the console's Control says `control:
# console`), and the MCP client's name and version from its initialize request.
CONTROL = "mcp"
# Metadata values are at most this long (the control plane's limit is above it).
MAX_CLIENT_NAME = 200
# How many sessions a client closed (or that were let go) are remembered, so that a call
# naming one says how it ended rather than that it is unknown.
REMEMBERED = 32


@dataclass(frozen=True)
class Defaults:
    """What the server's command line sets for every client's sessions."""

    labels: Mapping[str, str] = field(default_factory=dict)
    serial: str = ""
    idle_timeout: float = 300.0
    queue_timeout: float | None = 30.0
    # Sessions a client may hold at once.
    limit: int = 1
    # An action naming no session of a client that never opened one opens it (stdio).
    implicit: bool = False


@dataclass(frozen=True)
class _Opening:
    """What one open_session asked for."""

    labels: Mapping[str, str] | None
    serial: str
    queue_timeout: float | None
    client: str
    apps: Sequence[task_pb2.InstallApp]
    start_snapshot: str


class NoSession(AmcClientError):
    """No session to act on: none open, an id that is not the client's, or several open
    and none named."""


class TooManySessions(AmcClientError):
    """The client holds as many sessions as it may."""


class ClientGone(AmcClientError):
    """The client left (or vanished) while a call of its was under way."""


class ClientSessions:
    """The sessions of one MCP client, on `farm` (opened with the client's own token)."""

    def __init__(self, farm: Farm, defaults: Defaults) -> None:
        self.farm = farm
        self.defaults = defaults
        self._held: dict[str, Phone] = {}  # by session id, oldest first
        self._let_go: OrderedDict[str, str] = OrderedDict()  # id -> how it ended
        self._opening = 0
        self._opened_any = False
        self._gone = ""
        self._changed = asyncio.Condition()

    @property
    def held(self) -> list[Phone]:
        """The client's sessions, open or ended by themselves, oldest first."""
        return list(self._held.values())

    def live(self) -> list[Phone]:
        return [p for p in self._held.values() if p.end is None]

    async def open(
        self,
        labels: Mapping[str, str] | None = None,
        serial: str = "",
        queue_timeout: float | None = None,
        *,
        client: str = "",
        apps: Sequence[task_pb2.InstallApp] = (),
        start_snapshot: str = "",
    ) -> tuple[Phone, bool]:
        """A new session's phone, with `apps` installed first (on an emulator loaded from
        `start_snapshot` first); True when this call opened it. With a limit of 1, the
        open session's (False) if there is one."""
        async with self._changed:
            while True:
                self._check_gone()
                live = self.live()
                if self.defaults.limit == 1 and live:
                    return live[0], False
                if len(live) + self._opening < self.defaults.limit:
                    break
                if self._opening == 0:
                    raise TooManySessions(
                        f"you hold {len(live)} sessions, as many as this server lets a client"
                        f" hold ({_ids(live)}): close_session one first"
                    )
                await self._changed.wait()  # an opening under way may fail: see then
            self._opening += 1
        opening = _Opening(labels, serial, queue_timeout, client, apps, start_snapshot)
        return await self._opened(opening), True

    async def _opened(self, opening: _Opening) -> Phone:
        phone = None
        try:
            phone = await self._open_phone(opening)
        finally:
            async with self._changed:
                self._opening -= 1
                self._changed.notify_all()
                if phone is not None:
                    self._opened_any = True
                    if self._gone:
                        phone.abandon()
                        raise ClientGone(f"{self._gone}: session {phone.task_id} abandoned")
                    self._held[phone.task_id] = phone
        return phone

    async def _open_phone(self, o: _Opening) -> Phone:
        d, labels, serial, client = self.defaults, o.labels, o.serial, o.client
        chosen = dict(labels or {}) if labels or serial else dict(d.labels)
        metadata = {"control": CONTROL}
        if client:
            metadata["mcp_client"] = client[:MAX_CLIENT_NAME]
        return await self.farm.open_session(
            labels=chosen,
            serial=serial or ("" if labels else d.serial),
            idle_timeout=d.idle_timeout,
            queue_timeout=d.queue_timeout if o.queue_timeout is None else o.queue_timeout,
            metadata=metadata,
            on_wait=_refuse_unmatched,
            apps=o.apps,
            start_snapshot=o.start_snapshot,
        )

    async def phone(self, session: str = "", client: str = "") -> Phone:
        """The session to act on: the one named, or else the client's one open session
        (the newest that ended, when none is open: its actions say how it ended); over
        stdio, the first session, opened now, for a client that never opened one."""
        while True:
            async with self._changed:
                self._check_gone()
                if session:
                    return self._named(session)
                live = self.live()
                if len(live) == 1:
                    return live[0]
                if live:
                    raise NoSession(
                        f"you hold {len(live)} open sessions ({_ids(live)}): name one as `session`"
                    )
                if self._held:
                    return self.held[-1]
                if not self.defaults.implicit or self._opened_any:
                    raise NoSession("no session is open: open_session first")
                if self._opening:
                    await self._changed.wait()  # the first session is opening: take it
                    continue
                self._opening += 1
            return await self._opened(_Opening(None, "", None, client, (), ""))

    def _named(self, session: str) -> Phone:
        phone = self._held.get(session.strip())
        if phone is not None:
            return phone
        ended = self._let_go.get(session.strip())
        if ended is not None:
            raise NoSession(ended)
        yours = f"yours are {_ids(self.held)}" if self._held else "you hold none"
        raise NoSession(f"no session {session!r} of yours ({yours})")

    async def close(self, session: str = "") -> task_pb2.Task | None:
        """End a session (done, after its action in flight): the one named, or else the
        client's one open session (the newest that ended, if none is open); its finished
        task (how it ended, if it had ended by itself), or None when it held none."""
        phone: Phone | None
        async with self._changed:
            if session:
                phone = self._named(session)
            else:
                live = self.live()
                if len(live) > 1:
                    raise NoSession(
                        f"you hold {len(live)} open sessions ({_ids(live)}): name the one to"
                        " close as `session`"
                    )
                phone = live[0] if live else (self.held[-1] if self._held else None)
            if phone is None:
                return None
            del self._held[phone.task_id]
            self._remember(phone.task_id, f"session {phone.task_id} was closed")
        task = await phone.close()
        self._remember(phone.task_id, f"session {phone.task_id} is over: {said(task)}")
        return task

    async def leave(self, patience: float) -> list[tuple[task_pb2.Task, bool]]:
        """The client left as it should (it closed its MCP session, or its stdin): each
        session closed done, after its action in flight; one whose action outlasts
        `patience` seconds is abandoned. Each session's task, and whether it closed."""
        phones = self._go("the MCP client closed its session")
        return list(await asyncio.gather(*(_close_within(p, patience) for p in phones)))

    def abandon(self, why: str) -> list[task_pb2.Task]:
        """The client vanished (`why`): each open session ends failed ("session
        abandoned"). Their tasks as last seen."""
        abandoned = []
        for phone in self._go(why):
            if phone.end is None:
                phone.abandon()
                abandoned.append(phone.task)
        return abandoned

    def _go(self, why: str) -> list[Phone]:
        self._gone = self._gone or why
        phones, self._held = self.held, {}
        return phones

    def _check_gone(self) -> None:
        if self._gone:
            raise ClientGone(self._gone)

    def _remember(self, session: str, how: str) -> None:
        self._let_go[session] = how
        self._let_go.move_to_end(session)
        while len(self._let_go) > REMEMBERED:
            self._let_go.popitem(last=False)


async def _close_within(phone: Phone, patience: float) -> tuple[task_pb2.Task, bool]:
    try:
        async with asyncio.timeout(patience):
            return await phone.close(), True
    except TimeoutError:
        phone.abandon()
        return phone.task, False
    except Exception:  # its call broke as it closed: it is over, however it ended
        phone.abandon()
        return phone.ended or phone.task, False


def _ids(phones: Sequence[Phone]) -> str:
    return ", ".join(f"{p.task_id} on {p.serial}" for p in phones)


def _refuse_unmatched(task: task_pb2.Task) -> None:
    """Stop waiting at once for a phone no registered device could be."""
    if unmatched(task):
        raise SessionRefused(
            f"no phone can take this session: {task.pending_reason}; nothing was opened"
            " (list_phones shows the phones there are)",
            task,
        )
