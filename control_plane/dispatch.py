"""Targeted dispatch: a queued task wakes only parked Acquires that can take it.

Each replica indexes, in memory, the Acquires parked on it (a `Waiter` each: the host and
its idle devices' labels). A queued task becomes an `Offer` (its id and selector); the
index finds a waiter with a matching idle device without walking every host (the posting
list of the selector's rarest label, or of its serial), and wakes that one. No waiter can
take it: nothing is woken and the database is not asked. An offer a woken Acquire could
not use (all its devices took other work, or it ended first) moves on to another waiter;
one it lost to another host is dropped (that host has it). One its idle device fits that
was still queued when it looked was locked by another transaction (a scan that may leave
it): the Acquire keeps it and looks again soon (lease_service). A host that registers
again is woken too: its devices' labels may now match a queued task.

The database stays the judge: a woken Acquire runs the same `amc_acquire` as before, which
takes tasks in priority order. Waking is only ever a hint.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

# Offers remembered for Acquires that were between a query and parking when they came.
RECENT = 1024
# JSON payloads of NOTIFY must stay under 8000 bytes; a selector too big for that travels
# without its labels and wakes any waiter whose serial fits (it then asks the database).
MAX_PAYLOAD = 7000

Label = tuple[str, str]


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
    """One Acquire call parked on this replica, for as long as the call lasts."""

    __slots__ = ("devices", "everything", "host_id", "keys", "offers", "woken")

    def __init__(self, host_id: str) -> None:
        self.host_id = host_id
        # (serial, labels) of the idle devices, as the last query saw them.
        self.devices: Sequence[tuple[str, Mapping[str, str]]] = ()
        self.keys: set[Label] = set()
        self.offers: dict[str, Offer] = {}
        self.woken = asyncio.Event()
        # Woken for anything (the listener reconnected, the replica closes): look again.
        self.everything = False

    def can_take(self, offer: Offer) -> bool:
        for serial, labels in self.devices:
            if offer.serial is not None and offer.serial != serial:
                continue
            if offer.labels is None or all(labels.get(k) == v for k, v in offer.labels.items()):
                return True
        return False

    @property
    def full(self) -> bool:
        """Offered as many tasks as it has idle devices: more would only wait here."""
        return len(self.offers) >= len(self.devices)

    def take(self, offer: Offer) -> None:
        self.offers[offer.task_id] = offer
        self.woken.set()


class Dispatcher:
    """One replica's index of parked Acquires by what their idle devices can match."""

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

    def __len__(self) -> int:
        return len(self._all)

    def acquires_of(self, host_id: str) -> int:
        """The Acquire calls of `host_id` on this replica, indexed or not."""
        return len(self._by_host.get(host_id, ()))

    # -- the Acquire side -------------------------------------------------------------------

    def enter(self, waiter: Waiter) -> None:
        """An Acquire call began (indexed by its idle devices once it has looked)."""
        self._by_host.setdefault(waiter.host_id, set()).add(waiter)

    def park(self, waiter: Waiter, devices: Sequence[tuple[str, Mapping[str, str]]]) -> None:
        """Index `waiter` under its idle devices (as the query that found nothing saw them)."""
        if waiter in self._all and devices == waiter.devices:
            return
        self.leave(waiter)
        waiter.devices = devices
        if not devices:  # nothing idle (offline, busy): nothing to offer it
            waiter.keys = set()
            return
        waiter.keys = {kv for _, labels in devices for kv in labels.items()}
        for kv in waiter.keys:
            self._by_label.setdefault(kv, set()).add(waiter)
        for serial, _ in devices:
            self._by_serial.setdefault(serial, set()).add(waiter)
        self._all[waiter] = None

    def leave(self, waiter: Waiter, *, ended: bool = False) -> None:
        if ended:
            _discard(self._by_host, waiter.host_id, waiter)
        if self._all.pop(waiter, 0) is None:
            for kv in waiter.keys:
                _discard(self._by_label, kv, waiter)
            for serial, _ in waiter.devices:
                _discard(self._by_serial, serial, waiter)

    def missed_since(self, mark: int, waiter: Waiter) -> bool:
        """Offer `waiter` what was queued after `mark` (while it was asking the database and
        not yet indexed); True if any of it fits."""
        if self._recent and self._recent[0][0] > mark + 1:
            waiter.everything = True  # too many to replay: just look again
            waiter.woken.set()
            return True
        found = False
        for seq, offer in reversed(self._recent):
            if seq <= mark:
                break
            if waiter.can_take(offer):
                waiter.take(offer)
                found = True
        return found

    # -- the queue side ---------------------------------------------------------------------

    def offer(self, offer: Offer, *, skip: Waiter | None = None) -> Waiter | None:
        """Wake one parked Acquire that can take `offer`; None if none can."""
        self.offered = next(self._seq)
        self._recent.append((self.offered, offer))
        for waiter in self._candidates(offer):
            self.looked_at += 1
            if waiter is skip or waiter.full or offer.task_id in waiter.offers:
                continue
            if waiter.can_take(offer):
                waiter.take(offer)
                return waiter
        return None

    def offer_again(self, offers: Iterable[Offer], skip: Waiter) -> None:
        """Offers `skip` was woken for and could not use."""
        for offer in offers:
            self.offer(offer, skip=skip)

    def wake_host(self, host_id: str) -> None:
        """A phone of `host_id` was freed (its lease ended): its Acquires look again."""
        for waiter in self._by_host.get(host_id, ()):
            waiter.everything = True
            waiter.woken.set()

    def wake_all(self) -> None:
        """Every Acquire looks again, those with no idle phone indexed too (a phone may have
        been freed by a notification this replica missed)."""
        for waiters in self._by_host.values():
            for waiter in waiters:
                waiter.everything = True
                waiter.woken.set()

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
