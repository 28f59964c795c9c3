"""The farm-wide gauges (tasks by status, hosts, devices, the queue by selector and by
fairness key, device conditions, battery and temperature): set from one aggregate query
every few seconds by the replica's database check; the series of selectors and keys that
dropped out of the deepest few are removed."""

from __future__ import annotations

from amc_common.device_conditions import CONDITIONS
from amc_common.device_selector import describe
from control_plane import metrics
from control_plane.config import Settings
from control_plane.domain import KeyLoad
from control_plane.store import Store


def selector_label(serial: str | None, labels: dict[str, str] | None) -> str:
    """A queue group's `selector` label: the selector's text (amc_common's, as a pending
    reason writes it) cut at 120 characters, `any`, or `other` (None, None is the sum of
    the groups past the deepest few)."""
    if serial is None and labels is None:
        return "other"
    return describe(serial, labels or {}, anything="any")[:120]


def top_keys(loads: list[KeyLoad], most: int) -> list[KeyLoad]:
    """The `most` keys with most queued, then running (ties by name), and the rest summed
    as one `other` (its oldest: the oldest of theirs; a key named `other` is among the
    rest); keys with nothing are left out."""
    busy = sorted(
        (k for k in loads if k.queued or k.running), key=lambda k: (-k.queued, -k.running, k.key)
    )
    shown = [k for k in busy if k.key != "other"][:most]
    named = {k.key for k in shown}
    rest = [k for k in busy if k.key not in named]
    if rest:
        ages = [k.oldest_seconds for k in rest if k.oldest_seconds is not None]
        shown.append(
            KeyLoad(
                "other",
                sum(k.queued for k in rest),
                sum(k.running for k in rest),
                max(ages) if ages else None,
            )
        )
    return shown


class FarmGauges:
    def __init__(self, store: Store, settings: Settings) -> None:
        self._store = store
        self._settings = settings
        self._queue_labels: set[str] = set()
        self._key_labels: set[str] = set()

    async def refresh(self) -> None:
        """Read the farm's figures (one query) and set the gauges from them."""
        farm = await self._store.queue.farm_gauges(
            self._settings.lease_ttl, metrics.QUEUE_SELECTORS
        )
        for status in metrics.LIVE_STATUSES:
            metrics.TASKS.labels(str(status)).set(farm.tasks.get(str(status), 0))
        metrics.HOSTS_CONNECTED.set(farm.hosts_connected)
        for state in metrics.DEVICE_STATES:
            for busy, use in ((True, "busy"), (False, "idle")):
                metrics.DEVICES.labels(state, use).set(farm.devices.get((state, busy), 0))
        queue = {selector_label(q.serial, q.labels): q for q in farm.queue}
        for selector in self._queue_labels - queue.keys() - {"any", "other"}:
            metrics.QUEUE_DEPTH.remove(selector)
            metrics.QUEUE_OLDEST.remove(selector)
        for selector in queue.keys() | {"any", "other"}:
            group = queue.get(selector)
            metrics.QUEUE_DEPTH.labels(selector).set(group.count if group else 0)
            metrics.QUEUE_OLDEST.labels(selector).set(group.oldest_seconds if group else 0)
        self._queue_labels = set(queue)
        self._keys(farm.keys)
        if farm.counted_ago is not None:
            metrics.QUEUE_COUNT_AGE.set(farm.counted_ago)
        for condition in CONDITIONS:
            metrics.DEVICE_CONDITIONS.labels(condition).set(farm.conditions.get(condition, 0))
        for gauge, spread in (
            (metrics.BATTERY, farm.battery),
            (metrics.TEMPERATURE, farm.temperature),
        ):
            for stat, value in zip(metrics.SPREAD, spread or (0.0, 0.0, 0.0), strict=True):
                gauge.labels(stat).set(value)

    def _keys(self, loads: list[KeyLoad]) -> None:
        """The per-key gauges: the keys with most queued (then running) by name, the rest
        summed as `other`; series of keys that dropped out are removed."""
        shown = {load.key: load for load in top_keys(loads, metrics.QUEUE_KEYS)}
        for key in self._key_labels - shown.keys() - {"default", "other"}:
            for gauge in (metrics.KEY_QUEUED, metrics.KEY_RUNNING, metrics.KEY_OLDEST):
                gauge.remove(key)
        for key in shown.keys() | {"default", "other"}:
            load = shown.get(key)
            metrics.KEY_QUEUED.labels(key).set(load.queued if load else 0)
            metrics.KEY_RUNNING.labels(key).set(load.running if load else 0)
            metrics.KEY_OLDEST.labels(key).set((load and load.oldest_seconds) or 0)
        self._key_labels = set(shown)
