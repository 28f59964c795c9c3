"""The wake-up protocol, in one place: a queued task wakes only parked Acquires that can
take it, and an Acquire call waits here between its looks at the database.

Each replica indexes, in memory, the Acquires parked on it (a `Waiter` each: the host and
its idle devices' labels). A queued task becomes an `Offer` (its id and selector); the
index finds a waiter with a matching idle device without walking every host (the posting
list of the selector's rarest label, or of its serial), and wakes that one. No waiter can
take it: nothing is woken and the database is not asked. Offers travel to the other
replicas as NOTIFY payloads (`Offer.to_payload`, heard by `Dispatcher.heard`).

An Acquire call is `Dispatcher.wait_for_work`: it asks the database, parks under the idle
devices the answer listed, and asks again when woken or when its wait ends. Offers made
while it was asking (not yet indexed) are replayed to it when it parks. An offer a woken
Acquire could not use (all its devices took other work, or it ended first) moves on to
another waiter; one it lost to another host is dropped (that host has it). One its idle
device fits that was still queued when it looked was locked by another transaction (a
scan that may leave it): the Acquire keeps it and looks again soon. A host that registers
again, or whose phone a lease freed behind its back, is woken too (`wake_host`).

The database stays the judge: a woken Acquire runs the same `amc_acquire` as before, which
takes tasks in priority order. Waking is only ever a hint. Only this module changes a
waiter's state; the services call `wait_for_work`, the hub `queued`, `heard`, `wake_host`,
`wake_all` and `close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from control_plane import errors, metrics
from control_plane.domain import Acquired, Assignment

# Offers remembered for Acquires that were between a query and parking when they came.
RECENT = 1024
# JSON payloads of NOTIFY must stay under 8000 bytes; a selector too big for that travels
# without its labels and wakes any waiter whose serial fits (it then asks the database).
MAX_PAYLOAD = 7000
# An Acquire whose offered task was locked when it looked (it could take it) looks again
# after this long, doubling up to the second figure, while the task stays queued.
LOCKED_RETRY = (0.05, 1.0)
# How often a parked Acquire whose database went away looks again (if not woken sooner).
OUTAGE_RETRY = 1.0

Label = tuple[str, str]
Devices = Sequence[tuple[str, Mapping[str, str]]]
# One look at the database for an Acquire, given the ids of the tasks offered to it.
Ask = Callable[[list[str]], Awaitable[Acquired]]


@dataclass(frozen=True)
class Offer:
    task_id: str
    serial: str | None = None
    # None: not known here (too big to send); any labels may match.
    labels: Mapping[str, str] | None = field(default_factory=dict)

    def to_payload(self, replica: str) -> str:
        body = {"r": replica, "t": self.task_id, "s": self.serial, "l": self.labels}
        payload = json.dumps(body, separators=(",", ":"))
        if len(payload.encode()) > MAX_PAYLOAD:
            body["l"] = None
            payload = json.dumps(body, separators=(",", ":"))
        return payload

    @staticmethod
    def from_payload(payload: str) -> tuple[str, Offer]:
        """(sending replica, offer); ValueError if it is not one."""
        try:
            body = json.loads(payload)
            labels = body["l"]
            if labels is not None and not isinstance(labels, dict):
                raise ValueError("labels")
            return str(body["r"]), Offer(str(body["t"]), body["s"], labels)
        except (KeyError, TypeError, json.JSONDecodeError) as exc:
            raise ValueError(payload) from exc


class Waiter:
    """One Acquire call on this replica, for as long as the call lasts. Its state is the
    dispatcher's to change; others only read it."""

    __slots__ = (
        "_devices",
        "_everything",
        "_keys",
        "_looking",
        "_offers",
        "_taken",
        "_woken",
        "host_id",
    )

    def __init__(self, host_id: str) -> None:
        self.host_id = host_id
        # (serial, labels) of the idle devices, as the last query saw them.
        self._devices: Devices = ()
        self._keys: set[Label] = set()
        self._offers: dict[str, Offer] = {}
        # The offers its query under way was given; the tasks its last query took.
        self._looking: dict[str, Offer] = {}
        self._taken: set[str] = set()
        self._woken = asyncio.Event()
        # Woken for anything (the listener reconnected, the replica closes): look again.
        self._everything = False

    @property
    def offered(self) -> list[str]:
        """The ids of the tasks offered since its last look."""
        return list(self._offers)

    @property
    def woken(self) -> bool:
        return self._woken.is_set()

    @property
    def everything(self) -> bool:
        """Woken to look again for anything, not for offers."""
        return self._everything

    def can_take(self, offer: Offer) -> bool:
        for serial, labels in self._devices:
            if offer.serial is not None and offer.serial != serial:
                continue
            if offer.labels is None or all(labels.get(k) == v for k, v in offer.labels.items()):
                return True
        return False

    @property
    def full(self) -> bool:
        """Offered as many tasks as it has idle devices: more would only wait here."""
        return len(self._offers) >= len(self._devices)

    def _take(self, offer: Offer) -> None:
        self._offers[offer.task_id] = offer
        self._woken.set()

    def _wake(self) -> None:
        self._everything = True
        self._woken.set()

    def _begin_look(self) -> list[str]:
        """The offers go with the query about to start; a wake from now on is a new one."""
        self._looking, self._offers = {**self._looking, **self._offers}, {}
        self._woken.clear()
        self._everything = False
        return list(self._looking)

    def _looked(self, acquired: Acquired) -> list[Offer]:
        """What the query found; the offers it missed (not taken), kept no longer."""
        looked, self._looking = self._looking, {}
        self._taken = {str(a.task_id) for a in acquired.assignments}
        return [o for o in looked.values() if o.task_id not in self._taken]

    def _unused(self) -> list[Offer]:
        """Offers held when the call ends: someone else may take them."""
        held = {**self._looking, **self._offers}
        return [o for o in held.values() if o.task_id not in self._taken]

    async def _wait(self, timeout: float) -> bool:
        """Woken within `timeout` seconds. (asyncio.timeout, not wait_for: no Task of its own
        for each wait of each parked Acquire.)"""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._woken.wait()
        return self._woken.is_set()


class Dispatcher:
    """One replica's parked Acquires, indexed by what their idle devices can match."""

    def __init__(self) -> None:
        self._by_label: dict[Label, set[Waiter]] = {}
        self._by_serial: dict[str, set[Waiter]] = {}
        self._all: dict[Waiter, None] = {}
        # Every Acquire on this replica by host, indexed or not (none of its phones idle
        # yet): a phone freed behind the host's back (a lease expired) wakes them.
        self._by_host: dict[str, set[Waiter]] = {}
        self._recent: deque[tuple[int, Offer]] = deque(maxlen=RECENT)
        self._seq = itertools.count(1)
        self.offered = 0  # the sequence number of the last offer
        # How many waiters the last offers looked at, for the metrics and the bench.
        self.looked_at = 0
        # The replica shuts down: Acquires return at once (their hosts go elsewhere).
        self.closing = False

    def __len__(self) -> int:
        return len(self._all)

    def acquires_of(self, host_id: str) -> int:
        """The Acquire calls of `host_id` on this replica, indexed or not."""
        return len(self._by_host.get(host_id, ()))

    # -- an Acquire call ----------------------------------------------------------------

    async def wait_for_work(self, host_id: str, ask: Ask, deadline: float) -> list[Assignment]:
        """Ask the database (`ask`); if nothing is there, park (indexed by the idle devices'
        labels) until an offer fits or `deadline` (the loop's clock) passes, and ask again."""
        waiter = Waiter(host_id)
        loop = asyncio.get_running_loop()
        pause = LOCKED_RETRY[0]
        parked = False
        self.enter(waiter)
        try:
            while True:
                mark = self.offered
                metrics.ACQUIRE_QUERIES.inc()
                try:
                    acquired = await ask(waiter._begin_look())
                except errors.DatabaseUnavailable:
                    # A parked call woken while the database fails over stays parked (its
                    # host would only ask again): it looks again when the database is back
                    # (every Acquire is woken then) or soon, until its wait ends.
                    remaining = deadline - loop.time()
                    if not parked or remaining <= 0 or self.closing:
                        raise
                    await waiter._wait(min(remaining, OUTAGE_RETRY))
                    continue
                parked = True
                locked = self._looked(waiter, acquired)
                if acquired.assignments:
                    return acquired.assignments
                remaining = deadline - loop.time()
                if remaining <= 0 or self.closing:
                    return []
                self.missed_since(mark, waiter)
                if locked:
                    remaining = min(remaining, pause)
                    pause = min(pause * 2, LOCKED_RETRY[1])
                else:
                    pause = LOCKED_RETRY[0]
                woken = await waiter._wait(remaining)
                if not woken and loop.time() >= deadline and not waiter._offers:
                    # Its wait ran out with nothing offered that fits: nothing to ask the
                    # database. The host asks again at once, and that Acquire's first
                    # query looks (so a re-poll costs one query, not two).
                    return []
                if self.closing:
                    return []
        finally:
            self.leave(waiter, ended=True)
            self.offer_again(waiter._unused(), skip=waiter)

    def _looked(self, waiter: Waiter, acquired: Acquired) -> bool:
        """Index `waiter` under what its query found idle and settle the offers it was
        given; True if it keeps one that was locked when it looked."""
        missed = waiter._looked(acquired)
        self.park(waiter, acquired.idle)
        # Offers it had no room for go on to another host.
        self.offer_again([o for o in missed if not waiter.can_take(o)], skip=waiter)
        # One an idle device here fits was not there to take: gone (another host has it,
        # or it was cancelled) unless still queued, i.e. locked by another transaction
        # when the query passed it (a scan that may leave it). That one it keeps, and
        # looks again soon, until it takes it or it is gone. (An offer without its
        # labels, too big to send, may only seem to fit: not kept.)
        locked = [
            o
            for o in missed
            if o.labels is not None and waiter.can_take(o) and o.task_id in acquired.queued
        ]
        for o in locked:
            waiter._offers.setdefault(o.task_id, o)
        return bool(locked)

    # -- the index ----------------------------------------------------------------------

    def enter(self, waiter: Waiter) -> None:
        """An Acquire call began (indexed by its idle devices once it has looked)."""
        self._by_host.setdefault(waiter.host_id, set()).add(waiter)

    def park(self, waiter: Waiter, devices: Devices) -> None:
        """Index `waiter` under its idle devices (as the query that found nothing saw them)."""
        if waiter in self._all and devices == waiter._devices:
            return
        self.leave(waiter)
        waiter._devices = devices
        if not devices:  # nothing idle (offline, busy): nothing to offer it
            waiter._keys = set()
            return
        waiter._keys = {kv for _, labels in devices for kv in labels.items()}
        for kv in waiter._keys:
            self._by_label.setdefault(kv, set()).add(waiter)
        for serial, _ in devices:
            self._by_serial.setdefault(serial, set()).add(waiter)
        self._all[waiter] = None

    def leave(self, waiter: Waiter, *, ended: bool = False) -> None:
        if ended:
            _discard(self._by_host, waiter.host_id, waiter)
        if self._all.pop(waiter, 0) is None:
            for kv in waiter._keys:
                _discard(self._by_label, kv, waiter)
            for serial, _ in waiter._devices:
                _discard(self._by_serial, serial, waiter)

    def missed_since(self, mark: int, waiter: Waiter) -> bool:
        """Offer `waiter` what was queued after `mark` (while it was asking the database and
        not yet indexed); True if any of it fits."""
        if self._recent and self._recent[0][0] > mark + 1:
            waiter._wake()  # too many to replay: just look again
            return True
        found = False
        for seq, offer in reversed(self._recent):
            if seq <= mark:
                break
            if waiter.can_take(offer):
                waiter._take(offer)
                found = True
        return found

    # -- the queue side -----------------------------------------------------------------

    def queued(self, offer: Offer) -> Waiter | None:
        """A task entered the queue (committed here, or heard from another replica): wake
        one parked Acquire that can take it, counted in the offers' metric."""
        woken = self.offer(offer)
        metrics.OFFERS.labels("unmatched" if woken is None else "woken").inc()
        return woken

    def heard(self, payload: str, replica: str) -> None:
        """An `amc_queued` notification, as replica `replica` (this one) heard it."""
        try:
            sender, offer = Offer.from_payload(payload)
        except ValueError:
            # Not an offer (a replica of an older release): anyone may take it.
            self.wake_all()
            return
        if sender != replica:  # this replica offered its own already
            self.queued(offer)

    def offer(self, offer: Offer, *, skip: Waiter | None = None) -> Waiter | None:
        """Wake one parked Acquire that can take `offer`; None if none can."""
        self.offered = next(self._seq)
        self._recent.append((self.offered, offer))
        for waiter in self._candidates(offer):
            self.looked_at += 1
            if waiter is skip or waiter.full or offer.task_id in waiter._offers:
                continue
            if waiter.can_take(offer):
                waiter._take(offer)
                return waiter
        return None

    def offer_again(self, offers: Iterable[Offer], skip: Waiter) -> None:
        """Offers `skip` was woken for and could not use."""
        for offer in offers:
            self.offer(offer, skip=skip)

    def wake_host(self, host_id: str) -> None:
        """A phone of `host_id` was freed (its lease ended): its Acquires look again."""
        for waiter in self._by_host.get(host_id, ()):
            waiter._wake()

    def wake_all(self) -> None:
        """Every Acquire looks again, those with no idle phone indexed too (a phone may have
        been freed by a notification this replica missed)."""
        for waiters in self._by_host.values():
            for waiter in waiters:
                waiter._wake()

    def close(self) -> None:
        """The replica shuts down: every Acquire returns what it has."""
        self.closing = True
        self.wake_all()

    def _candidates(self, offer: Offer) -> Iterator[Waiter]:
        """The smallest posting list that every match is in."""
        lists: list[Iterable[Waiter]] = []
        if offer.serial is not None:
            lists.append(self._by_serial.get(offer.serial, ()))
        if offer.labels:
            lists.extend(self._by_label.get(kv, ()) for kv in offer.labels.items())
        if not lists:
            yield from self._all
            return
        yield from min(lists, key=len)  # type: ignore[arg-type]


def _discard(
    index: dict[str, set[Waiter]] | dict[Label, set[Waiter]], key: object, waiter: Waiter
) -> None:
    members = index.get(key)  # type: ignore[call-overload]
    if members is not None:
        members.discard(waiter)
        if not members:
            del index[key]  # type: ignore[arg-type]
