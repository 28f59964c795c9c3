"""What list_phones says: the farm's phones (Scheduler.ListHosts), one a line, each free,
busy (whose: the agent's own session, or another task), held (why: cordoned, its host
draining or cordoned, its health: charging, too hot, unresponsive, booting, recovering,
quarantined, low on storage, being cleaned) or offline (why), under a line that counts
them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping

import grpc

from amc.v1 import scheduler_pb2
from amc_client.farm import Farm

# The most phones listed: a model reads every line. The count line still counts them all.
MAX_LISTED = 100
READY = (scheduler_pb2.DEVICE_CONDITION_UNSPECIFIED, scheduler_pb2.DEVICE_CONDITION_READY)
HELD = {
    scheduler_pb2.DEVICE_CONDITION_CHARGING_HOLD: "charging (battery low)",
    scheduler_pb2.DEVICE_CONDITION_TOO_HOT: "too hot",
    scheduler_pb2.DEVICE_CONDITION_UNRESPONSIVE: "not answering its host",
    scheduler_pb2.DEVICE_CONDITION_BOOTING: "booting",
    scheduler_pb2.DEVICE_CONDITION_RECOVERING: "being recovered by its host",
    scheduler_pb2.DEVICE_CONDITION_QUARANTINED: "quarantined until an operator looks",
    scheduler_pb2.DEVICE_CONDITION_OFFLINE: "not reachable by adb",
    scheduler_pb2.DEVICE_CONDITION_LOW_STORAGE: "low on storage",
    scheduler_pb2.DEVICE_CONDITION_CLEANING: "being cleaned after its last lease",
}
OPERATORS_ONLY = (
    "listing phones needs an operator's token; open_session with labels instead (it says"
    " at once when no phone could ever match them)"
)


def use(
    host: scheduler_pb2.Host, device: scheduler_pb2.Device, mine: Collection[str] = ()
) -> tuple[str, str]:
    """What a phone is now (free, busy, held or offline) and why, in a few words."""
    if not host.connected:
        return "offline", f"its host {host.host_id} is not connected"
    if device.state == scheduler_pb2.DEVICE_STATE_UNAUTHORIZED:
        return "offline", "not authorized for adb on its host"
    if device.state != scheduler_pb2.DEVICE_STATE_DEVICE:
        return "offline", "adb sees it offline"
    if device.task_id:
        whose = "your session" if device.task_id in mine else "task"
        return "busy", f"{whose} {device.task_id}"
    if device.condition not in READY:
        why = HELD.get(device.condition, "not ready")
        reason = f" ({device.condition_reason})" if device.condition_reason else ""
        return "held", f"{why}{reason}"
    if device.cordoned:
        return "held", "cordoned by an operator"
    if host.draining:
        return "held", f"its host {host.host_id} is draining"
    if host.cordoned:
        return "held", f"its host {host.host_id} is cordoned"
    return "free", ""


async def phones_text(
    farm: Farm, labels: Mapping[str, str] | None = None, mine: Collection[str] = ()
) -> str:
    """The farm's phones with `labels` (those gone from their host left out): a line
        counting them by state, then one line each, `serial  busy: task ID  k=v,…` (the labels
    a selector matches: model, sdk, abi… and the farm's own),
        free ones first. `mine`: the asking agent's sessions. Listing hosts takes an operator
        token; a client's is told so in the answer."""
    try:
        hosts = (await farm.scheduler.ListHosts(scheduler_pb2.ListHostsRequest())).hosts
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            return OPERATORS_ONLY
        raise
    rows: list[tuple[int, str]] = []
    counts: Counter[str] = Counter()
    order = {"free": 0, "busy": 1, "held": 2, "offline": 3}
    for host in hosts:
        for d in host.devices:
            wanted = all(d.labels.get(k) == v for k, v in (labels or {}).items())
            if not wanted or d.state == scheduler_pb2.DEVICE_STATE_GONE:
                continue
            state, why = use(host, d, mine)
            counts[state] += 1
            tags = ",".join(f"{k}={v}" for k, v in sorted(d.labels.items()))
            said = f"{state}: {why}" if why else state
            rows.append((order[state], f"{d.serial}  {said}  {tags}".rstrip()))
    if not rows:
        return "no phone is registered" + (" with those labels" if labels else "")
    rows.sort(key=lambda r: r[0])
    total = sum(counts.values())
    head = f"{total} phone{'s' if total != 1 else ''}: " + ", ".join(
        f"{counts[s]} {s}" for s in order if counts[s]
    )
    lines = [head, *(line for _, line in rows[:MAX_LISTED])]
    if len(rows) > MAX_LISTED:
        lines.append(f"… {len(rows) - MAX_LISTED} more not listed: narrow with labels")
    return "\n".join(lines)
