"""One replica's side of LISTEN/NOTIFY: hands queued work and freed phones to the
wake-up protocol (control_plane.dispatch, which owns the parked Acquires), pushes recorded
cancellations, drains and releases to the renewal streams this replica holds, holds the
step progress they were sent until it is written (control_plane.progress), and tells
watchers that a task changed (amc_progress: many tasks' steps at once). NOTIFY reaches
every replica, so whichever holds a host's stream or parked Acquire acts on it; what a
replica missed while it was not listening is read again (control_plane.listener) and
pushed (`restate`)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Iterator

import structlog

from control_plane.dispatch import Dispatcher, Offer
from control_plane.domain import (
    CancelNotice,
    DrainNotice,
    LeaseId,
    LogsNotice,
    Notice,
    ReleaseNotice,
    ScreenNotice,
    StreamState,
    TaskId,
)
from control_plane.frames import Screens
from control_plane.log_tails import Tails
from control_plane.pool_hints import PoolHints
from control_plane.presence import Presence
from control_plane.progress import Progress
from control_plane.rendezvous import Sessions
from control_plane.screen_tasks import Following

log = structlog.get_logger(__name__)

OUTBOX_LIMIT = 10_000
OUTBOX_RETRY = 0.2
CHANNELS = (
    "amc_queued",
    "amc_cancel",
    "amc_task",
    "amc_progress",
    "amc_freed",
    "amc_drain",
    "amc_release",
)
# Task ids per amc_progress notification (a payload holds up to 8,000 bytes).
PROGRESS_CHUNK = 180
# Called with a notice to push, or with None when the replica is closing the stream.
PushCallback = Callable[[Notice | None], None]


class Hub:
    def __init__(self) -> None:
        # Acquires parked on this replica, indexed by what their idle devices can take.
        self.dispatcher = Dispatcher()
        # Sessions whose client is connected here, for their hosts to join.
        self.sessions = Sessions()
        # Phones watched on this replica and the hosts' screen feeds (control_plane.screens);
        # a host asked for its feed is asked on its renewal streams here.
        self.screens = Screens(lambda host_id: self._push(ScreenNotice(host_id)))
        # The tasks whose screens are watched here, each task's current attempt read once
        # for all its watches here, again when it changes (control_plane.screen_tasks).
        self.following = Following(self.watch)
        # Attempts' logs followed on this replica and the hosts' log feeds
        # (control_plane.logs); a host asked for its feed is asked on its streams here.
        self.tails = Tails(lambda host_id: self._push(LogsNotice(host_id)))
        # The emulator pools of the hosts whose streams are here, told how many tasks wait
        # for them (control_plane.pool_hints).
        self.pools = PoolHints()
        # The steps of running tasks this replica was sent, until written (progress.py).
        self.progress = Progress()
        # Set when the replica shuts down: long polls and streams end at once, so that
        # clients reconnect to another replica instead of waiting out the grace period.
        self.closing = False
        self.closed = asyncio.Event()
        self._streams: dict[str, set[PushCallback]] = defaultdict(set)
        self._watchers: dict[uuid.UUID, set[asyncio.Event]] = defaultdict(set)
        # Notifications for the other replicas, sent after the commits that caused them.
        self.replica = uuid.uuid4().hex
        self.presence = Presence(self.replica)
        self._outbox: dict[tuple[str, str], None] = {}
        self._outbox_ready = asyncio.Event()
        # Told of every notification after the hub acted on it (the console's live pages).
        self._listeners: set[Callable[[str, str], None]] = set()

    def publish(self, channel: str, payload: str = "") -> None:
        """A change this replica committed: act on it here at once, tell the others soon."""
        self.notify(channel, payload)
        self._send(channel, payload)

    def _send(self, channel: str, payload: str) -> None:
        self._outbox[(channel, payload)] = None
        self._outbox_ready.set()

    def task_changed(self, task_id: uuid.UUID | str) -> None:
        """After committing a transition of the task (its watchers re-read it): here at
        once, and on the other replicas by a notification that names this one, so that its
        echo here is not a second change (each wake of a watcher is a read)."""
        self.notify("amc_task", str(task_id))
        self._send("amc_task", f"{task_id} {self.replica}")

    def progress_kept(self, task_ids: list[TaskId]) -> None:
        """After writing steps of these running tasks: their watchers, here and on the other
        replicas, read them again (one notification per PROGRESS_CHUNK tasks)."""
        for i in range(0, len(task_ids), PROGRESS_CHUNK):
            self.publish("amc_progress", " ".join(map(str, task_ids[i : i + PROGRESS_CHUNK])))

    def cancel_requested(self, notice: CancelNotice) -> None:
        """After committing a cancellation request of a running task: pushed onto its
        host's renewal stream, here or on the replica holding it, when the notification
        comes back (every replica hears it once, this one too: acted on here at once as
        well, it would be pushed twice)."""
        self._send(
            "amc_cancel",
            f"{notice.host_id} {notice.lease_id} {notice.task_id} {notice.attempt} "
            f"{notice.requested_epoch!r}",
        )

    def queued(self, offers: list[Offer]) -> None:
        """After committing tasks into the queue: offered here at once, and to the other
        replicas' parked Acquires by one notification each (sent in one batch)."""
        for offer in offers:
            self.dispatcher.queued(offer)
            self._send("amc_queued", offer.to_payload(self.replica))

    def devices_freed(self, host_ids: set[str]) -> None:
        """After committing the end of leases not by their host's report (expiry, release):
        the host's parked Acquires, here and on the other replicas, look again (a phone
        they listed may have been held by the lease when they looked)."""
        for host_id in host_ids:
            self.publish("amc_freed", host_id)

    def host_registered(self, host_id: str) -> None:
        """After committing a host's registration: its devices' labels or states may have
        changed, so its parked Acquires, here and on the other replicas, look again (they
        are indexed under what they had, and a queued task the host now matches woke
        nobody). One notification per registration; agents register on a change."""
        self.publish("amc_freed", host_id)

    def drain_changed(self, host_id: str, drain: bool) -> None:
        """After committing a drain of the host (or the uncordon that ends one): its
        renewal stream, wherever it is open, reads the host's drain again and tells its
        agent (renewals.StreamDrain: the later state wins, in any order of notices)."""
        self.publish("amc_drain", f"{host_id} {int(drain)}")

    def device_released(self, host_id: str, serial: str) -> None:
        """After committing an operator's release of the host's quarantined device: its
        renewal stream, wherever it is open, tells its agent."""
        self.publish("amc_release", f"{host_id} {serial}")

    async def send_outbox(self, send: Callable[[list[tuple[str, str]]], Awaitable[None]]) -> None:
        while True:
            await self._outbox_ready.wait()
            self._outbox_ready.clear()
            batch, self._outbox = list(self._outbox), {}
            try:
                await send(batch)
            except Exception as error:  # never die here
                # Sent again with what comes meanwhile (a duplicate wake is harmless); past
                # OUTBOX_LIMIT the oldest go, and the other replicas' Acquires find that
                # work when their wait ends.
                kept = [*batch, *self._outbox][-OUTBOX_LIMIT:]
                self._outbox = dict.fromkeys(kept)
                log.warning("notifications not sent; retrying", count=len(batch), error=str(error))
                await asyncio.sleep(OUTBOX_RETRY)
                self._outbox_ready.set()

    # -- what the listener connection calls --------------------------------------------------

    def notify(self, channel: str, payload: str) -> None:
        if channel == "amc_queued":
            self.dispatcher.heard(payload, self.replica)
        elif channel == "amc_cancel":
            self._push_cancel(payload)
        elif channel == "amc_freed":
            self.dispatcher.wake_host(payload)
        elif channel == "amc_task":
            payload, _, sender = payload.partition(" ")
            if sender == self.replica:
                return  # its own: acted on as it was committed
            self._wake_watchers(payload)
        elif channel == "amc_progress":
            # Listeners hear each task as changed (amc_task), as they heard each step.
            tasks = payload.split()
            for task_id in tasks:
                self._wake_watchers(task_id)
            for listener in list(self._listeners):
                for task_id in tasks:
                    listener("amc_task", task_id)
            return
        elif channel == "amc_drain":
            self._push_drain(payload)
        elif channel == "amc_release":
            self._push_release(payload)
        for listener in list(self._listeners):
            listener(channel, payload)

    def wake_all(self) -> None:
        """After the listener reconnects: anything may have been missed, so look again."""
        self.dispatcher.wake_all()
        for events in self._watchers.values():
            for event in events:
                event.set()

    def close(self) -> None:
        self.closing = True
        self.closed.set()
        self.screens.close()
        self.tails.close()
        self.dispatcher.close()
        self.wake_all()
        for callbacks in list(self._streams.values()):
            for callback in list(callbacks):
                callback(None)

    # -- what the services use -------------------------------------------------------------

    @contextlib.contextmanager
    def host_stream(self, host_id: str, callback: PushCallback) -> Iterator[None]:
        self._streams[host_id].add(callback)
        self.presence.opened(host_id)
        try:
            yield
        finally:
            self.presence.closed(host_id)
            self._streams[host_id].discard(callback)
            if not self._streams[host_id]:
                del self._streams[host_id]

    @contextlib.contextmanager
    def watch(self, task_id: uuid.UUID) -> Iterator[asyncio.Event]:
        event = asyncio.Event()
        self._watchers[task_id].add(event)
        try:
            yield event
        finally:
            self._watchers[task_id].discard(event)
            if not self._watchers[task_id]:
                del self._watchers[task_id]

    @contextlib.contextmanager
    def listening(self, listener: Callable[[str, str], None]) -> Iterator[None]:
        """`listener(channel, payload)` hears every notification while inside."""
        self._listeners.add(listener)
        try:
            yield
        finally:
            self._listeners.discard(listener)

    def held_hosts(self) -> list[str]:
        """The hosts with a renewal stream open on this replica."""
        return list(self._streams)

    def restate(self, states: Iterable[StreamState]) -> None:
        """What a read of the database (after notices may have been lost) says the hosts'
        streams should have been pushed: onto each stream of each host open here."""
        for state in states:
            self._push(state)

    def streams(self) -> int:
        return sum(len(s) for s in self._streams.values())

    def connected(self, host_id: str) -> bool:
        """The host holds a renewal stream on this replica."""
        return host_id in self._streams

    # -- internals -------------------------------------------------------------------------

    def _push_cancel(self, payload: str) -> None:
        try:
            host_id, lease, task, attempt, epoch = payload.split(" ")
            notice = CancelNotice(
                host_id,
                LeaseId(uuid.UUID(lease)),
                TaskId(uuid.UUID(task)),
                int(attempt),
                float(epoch),
            )
        except ValueError:
            log.warning("malformed cancel notification", payload=payload)
            return
        self._push(notice)

    def _push_drain(self, payload: str) -> None:
        host_id, _, drain = payload.rpartition(" ")
        self._push(DrainNotice(host_id, drain == "1"))

    def _push_release(self, payload: str) -> None:
        host_id, _, serial = payload.partition(" ")
        self._push(ReleaseNotice(host_id, serial))

    def _push(self, notice: Notice) -> None:
        """Onto each renewal stream of the notice's host open on this replica."""
        for callback in list(self._streams.get(notice.host_id, ())):
            callback(notice)

    def _wake_watchers(self, payload: str) -> None:
        try:
            task_id = uuid.UUID(payload)
        except ValueError:
            return
        for event in self._watchers.get(task_id, ()):
            event.set()
