"""Why a queued task waits (`Task.pending_reason`), computed when the task is read, and the
words for it, which GetQueue's `waiting_because` uses too.

Never stored and never refreshed in the background. GetTask and WatchTask read the task
and what its reason is made of in one statement (`read`); ListTasks reads its page, then
its queued tasks again with their reasons in a second statement, grouped by selector
(`with_reasons`: one scan of the devices per distinct selector, at most MAX_SELECTORS of
them, queued tasks with further selectors on the same page getting no reason; the caps of
the page's fairness keys with their running tasks). Either way a reason comes from the
same snapshot as the status it explains: a phone that took the task after it was read is
never counted busy with it (issue 27). Neither reads the backlog.

One classification for every front: the devices a selector matches are counted by
amc_device_use (store/queue.count.sql: host drained, host cordoned, cordoned, offline,
held by its condition, busy, idle) both here, live, and in the queue's background count
that GetQueue reads (`amc queue`, the console's Queue page), and `explain` words either.
So the same farm reads the same reason through GetTask and GetQueue, GetQueue's only as
old as its count (a few seconds). A fairness key at its cap is a task's reason (`at_cap`),
not its selector's: GetQueue shows caps by key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import timedelta

from amc_common.device_selector import describe
from control_plane import errors
from control_plane.domain import DeviceMatch, KeyCap, Task, TaskId, TaskRead
from control_plane.lifecycle import TaskStatus
from control_plane.store import Store

# Distinct selectors one read explains; a ListTasks page of 500 queued tasks rarely has
# more than a few.
MAX_SELECTORS = 50

Selector = tuple[str | None, tuple[tuple[str, str], ...]]


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def explain(serial: str | None, labels: dict[str, str], m: DeviceMatch) -> str:
    """Why tasks of this selector wait, from the devices it matches (DeviceMatch: each
    counted by the first thing that keeps it from them). The one wording: GetTask's,
    WatchTask's and ListTasks' pending_reason (OpenSession's waiting responses carry the
    task), GetQueue's waiting_because (`amc queue`, the console's Queue page)."""
    if m.total == 0:
        if serial is None and not labels:
            return "no device is registered"
        return f"no registered device matches {describe(serial, labels)}"
    if m.idle > 0:
        return _plural(m.idle, "matching device is idle", "matching devices are idle") + (
            "; its host has not taken the task yet"
        )
    if m.held > 0 and m.busy == 0:
        return held(m)
    if m.busy > 0:
        text = _plural(m.busy, "matching device, busy", "matching devices, all busy")
        return text + _others(m, with_held=True)
    if m.offline == 0 and m.cordoned == 0:
        if m.host_cordoned == 0:
            return "every matching host is drained"
        if m.host_draining == 0:
            return "every matching host is cordoned"
        return (
            f"every matching host is cordoned or drained ({m.host_cordoned} cordoned, "
            f"{m.host_draining} drained)"
        )
    if m.offline == 0:
        on = [
            _plural(n, f"on a {word} host", f"on {word} hosts")
            for n, word in ((m.host_cordoned, "cordoned"), (m.host_draining, "drained"))
            if n
        ]
        return "every matching device is cordoned" + (f" ({', '.join(on)})" if on else "")
    if m.cordoned + m.host_cordoned + m.host_draining == 0:
        return "every matching device is offline"
    return "every matching device is offline or cordoned" + _others(m, with_held=False)


def _others(m: DeviceMatch, *, with_held: bool) -> str:
    """` (1 cleaning, 1 held, 2 offline, 1 cordoned, 1 on a drained host)`: what keeps the
    matching devices that are not named first (a phone its host cleans between leases is
    as good as busy, and said so); '' when nothing does."""
    cleaning = dict(m.held_by).get("cleaning", 0) if with_held else 0
    parts = [
        _plural(n, one, many)
        for n, one, many in (
            (cleaning, "cleaning", "cleaning"),
            (m.held - cleaning if with_held else 0, "held", "held"),
            (m.offline, "offline", "offline"),
            (m.cordoned + m.host_cordoned, "cordoned", "cordoned"),
            (m.host_draining, "on a drained host", "on drained hosts"),
        )
        if n
    ]
    return f" ({', '.join(parts)})" if parts else ""


# How a held device's condition reads in a reason: every condition but `ready`
# (amc_common.device_conditions; tests/test_pending_reason.py holds them to it).
HELD_AS = {
    "charging_hold": "charging (battery low)",
    "too_hot": "too hot",
    "unresponsive": "unresponsive",
    "booting": "booting",
    "recovering": "recovering",
    "quarantined": "quarantined",
    "offline": "offline (its host's probe)",
    "low_storage": "low on storage",
    "cleaning": "cleaning (between leases)",
}


def held(m: DeviceMatch) -> str:
    """`3 matching phones held: 2 charging (battery low), 1 too hot` (and what else keeps
    the rest, when some are offline or cordoned)."""
    kinds = ", ".join(f"{n} {HELD_AS.get(c, c.replace('_', ' '))}" for c, n in m.held_by)
    text = _plural(m.held, "matching phone held", "matching phones held") + f": {kinds}"
    return text + _others(m, with_held=False)


async def read(store: Store, task_id: TaskId, connected_within: timedelta) -> Task:
    """The task, with its pending reason if it is queued: one statement."""
    found = await store.tasks.read_tasks([task_id], connected_within)
    if not found:
        raise errors.TaskNotFound(f"no task {task_id}")
    return _explained(found[0])


async def with_reasons(
    store: Store, tasks: Sequence[Task], connected_within: timedelta
) -> list[Task]:
    """`tasks`, the queued ones with their pending_reason set: one statement (none when no
    task is queued) reads them again with what their reasons are made of; a task no longer
    queued by then gets none."""
    selectors: set[Selector] = set()
    asked: list[TaskId] = []
    for task in tasks:
        if task.status is not TaskStatus.QUEUED:
            continue
        if _key(task) in selectors or len(selectors) < MAX_SELECTORS:
            selectors.add(_key(task))
            asked.append(task.task_id)
    if not asked:
        return list(tasks)
    reasons = {
        r.task.task_id: reason
        for r in await store.tasks.read_tasks(asked, connected_within)
        if (reason := _explained(r).pending_reason)
    }
    return [
        dataclasses.replace(t, pending_reason=reasons[t.task_id]) if t.task_id in reasons else t
        for t in tasks
    ]


def _explained(r: TaskRead) -> Task:
    t = r.task
    if t.status is not TaskStatus.QUEUED or r.match is None:
        return t
    reason = at_cap(t.fairness_key, r.cap, r.match) or explain(
        t.selector_serial, t.selector_labels, r.match
    )
    return dataclasses.replace(t, pending_reason=reason)


def at_cap(key: str, cap: KeyCap | None, m: DeviceMatch) -> str | None:
    """`team qa at its cap of 40 phones`, when the task's fairness key holds as many phones
    as its cap allows and phones that could run the task are there (idle, or busy with
    other work); None otherwise (when every matching phone is offline, cordoned or held by
    its condition, that is the reason, whatever the cap)."""
    if cap is None or cap.running < cap.max_devices:
        return None
    if m.idle + m.busy <= 0:
        return None
    return f"team {key} at its cap of {_plural(cap.max_devices, 'phone', 'phones')}"


def _key(task: Task) -> Selector:
    return task.selector_serial, tuple(sorted(task.selector_labels.items()))
