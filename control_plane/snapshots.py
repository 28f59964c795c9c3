"""A task's start snapshot (TaskSpec.start_snapshot, SessionOpen.start_snapshot) at the
gRPC edge: refused when no host's emulators can load it (one index lookup, and only when
a spec names one), and asked of the phone as the label each emulator carries for each
snapshot it can load (`snapshot/<name>=yes`), so the queue, its groups and every Acquire
match it as any other label."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from amc.v1 import task_pb2
from amc_common.device_selector import SNAPSHOT_YES, snapshot_label
from control_plane.errors import SnapshotNotFound
from control_plane.store import Store


async def check_snapshots(store: Store, specs: Sequence[tuple[str, task_pb2.TaskSpec]]) -> None:
    """Every snapshot the specs start from is one some host's emulators can load, or
    SnapshotNotFound naming the first that is not (its field, as `specs` names each)."""
    named = [(f"{field}.start_snapshot", s.start_snapshot) for field, s in specs]
    named = [(field, name) for field, name in named if name]
    if not named:
        return
    found = await store.hosts.known_snapshots(sorted({name for _, name in named}))
    for field, name in named:
        if name not in found:
            raise SnapshotNotFound(
                f"{field}: no emulator of the farm has a snapshot named {name}; nothing was queued"
            )


def selector_labels(labels: Mapping[str, str], snapshot: str) -> dict[str, str]:
    """A selector's labels, with the label of the phones that can load `snapshot` (if
    any) added."""
    made = dict(labels)
    if snapshot:
        made[snapshot_label(snapshot)] = SNAPSHOT_YES
    return made
