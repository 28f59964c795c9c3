"""The MCP server's one session at a time (`PhoneLender`): opened by open_session (or by
the first action, for the first session only), ended by close_session, and never replaced
behind the agent's back.

Tool calls arrive at once (an MCP client runs each request in its own task), so opening
and closing take turns (a lock), and actions take turns on the phone (Phone's own lock):
two calls with no session open share the one session the first opens; calls racing
close_session find the session closed. A session that ended by itself (its idle timeout,
a cancel, its lease lost, its longest duration) stays ended: every action raises how it
ended until open_session opens another, perhaps on another phone, which the agent then
knows. A selector no registered phone fits is refused at once (the control plane's
pending reason), not waited on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from amc.v1 import task_pb2
from amc_client.errors import AmcClientError, SessionRefused
from amc_client.farm import Farm
from amc_client.opening import unmatched
from amc_client.phone import Phone

# The session's metadata: what opened it (as the console's Control says `control:
# console`), and the MCP client's name and version from its initialize request.
CONTROL = "mcp"
# Metadata values are at most this long (the control plane's limit is above it).
MAX_CLIENT_NAME = 200


class NoSession(AmcClientError):
    """No session is open for an action: close_session ended the last one."""


class PhoneLender:
    """At most one open session, for the tools to act on."""

    def __init__(
        self,
        farm: Farm,
        labels: Mapping[str, str] | None = None,
        idle_timeout: float = 300.0,
        serial: str = "",
        queue_timeout: float | None = 30.0,
    ) -> None:
        self.farm = farm
        self.labels = dict(labels or {})
        self.serial = serial
        self.idle_timeout = idle_timeout
        self.queue_timeout = queue_timeout
        self._turn = asyncio.Lock()
        self._phone: Phone | None = None
        self._opened = False

    @property
    def phone(self) -> Phone | None:
        """The current session's phone (perhaps ended), if there is one."""
        return self._phone

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
        """The open session's phone, or a new session's (an ended one is let go), with
        `apps` installed first (from the emulator snapshot `start_snapshot`, if set); True
        when this call opened it."""
        async with self._turn:
            if self._phone is not None and self._phone.end is None:
                return self._phone, False
            if self._phone is not None:
                await self._phone.close()  # ended already: its end is read, nothing sent
            self._phone = None
            opened = await self._open(labels, serial, queue_timeout, client, apps, start_snapshot)
            return opened, True

    async def current(self, client: str = "") -> Phone:
        """The phone to act on: the open session's (perhaps ended, which its next action
        says), or the first session's, opened now if none was ever opened."""
        async with self._turn:
            if self._phone is not None:
                return self._phone
            if self._opened:
                raise NoSession("no session is open (close_session ended it): open_session first")
            return await self._open(None, "", None, client)

    async def _open(
        self,
        labels: Mapping[str, str] | None,
        serial: str,
        queue_timeout: float | None,
        client: str,
        apps: Sequence[task_pb2.InstallApp] = (),
        start_snapshot: str = "",
    ) -> Phone:
        chosen = dict(labels or {}) if labels or serial else self.labels
        metadata = {"control": CONTROL}
        if client:
            metadata["mcp_client"] = client[:MAX_CLIENT_NAME]
        self._phone = await self.farm.open_session(
            labels=chosen,
            serial=serial or ("" if labels else self.serial),
            idle_timeout=self.idle_timeout,
            queue_timeout=self.queue_timeout if queue_timeout is None else queue_timeout,
            metadata=metadata,
            on_wait=_refuse_unmatched,
            apps=apps,
            start_snapshot=start_snapshot,
        )
        self._opened = True
        return self._phone

    async def close(self) -> task_pb2.Task | None:
        """End the session (done, after its action in flight); its finished task (how it
        ended, if it had ended by itself), or None when none was open."""
        async with self._turn:
            phone, self._phone = self._phone, None
            if phone is None:
                return None
            return await phone.close()

    def abandon(self) -> task_pb2.Task | None:
        """Leave the session without closing it (its task ends failed, "session
        abandoned"): what a client that vanished gets. Its task as last seen, or None when
        no session was open (or it had ended by itself)."""
        phone, self._phone = self._phone, None
        if phone is None or phone.end is not None:
            return None
        phone.abandon()
        return phone.task


def _refuse_unmatched(task: task_pb2.Task) -> None:
    """Stop waiting at once for a phone no registered device could be."""
    if unmatched(task):
        raise SessionRefused(
            f"no phone can take this session: {task.pending_reason}; nothing was opened"
            " (list_phones shows the phones there are)",
            task,
        )
