"""The queue for people: `amc queue`'s tables by selector and by fairness key, and a
key's share (`amc queue set`, `amc queue show`)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from amc.v1 import admin_pb2, scheduler_pb2
from amc_cli.render import console, operator_events, selector_text, waited, when


def cap_text(share: admin_pb2.FairShare) -> str:
    return str(share.max_devices) if share.HasField("max_devices") else "-"


def queue_tables(
    queue: scheduler_pb2.GetQueueResponse, shares: admin_pb2.ListFairSharesResponse
) -> None:
    """`amc queue`: the queue by selector, then by fairness key, as last counted."""
    out = console()
    if queue.groups:
        table = Table(show_edge=False)
        for name in ("selector", "queued", "oldest wait", "devices idle/busy/other", "why"):
            table.add_column(name)
        for g in queue.groups:
            devices = f"{g.devices_idle}/{g.devices_busy}/{g.devices_unavailable}"
            table.add_row(
                Text(selector_text(g.selector)),
                str(g.count),
                waited(g.oldest_queued_at),
                devices,
                Text(g.waiting_because),
            )
        out.print(table)
    else:
        out.print("nothing queued")
    out.print()
    table = Table(show_edge=False)
    for name in ("fairness key", "queued", "running", "cap", "weight", "oldest wait"):
        table.add_column(name, no_wrap=name == "fairness key")
    for share in shares.shares:
        table.add_row(
            Text(share.fairness_key),
            str(share.queued),
            str(share.running),
            cap_text(share),
            str(share.weight),
            waited(share.oldest_queued_at),
        )
    out.print(table if shares.shares else "no fairness key has tasks or a share set")
    counted = (
        f"counted {when(queue.counted_at)}" if queue.HasField("counted_at") else "not counted yet"
    )
    out.print(Text(f"{queue.total} queued in all; {counted} (every few seconds)", style="dim"))


def fair_share_line(share: admin_pb2.FairShare) -> str:
    """`fairness key qa: weight 3, cap 40 phones; 12 queued, 40 running`."""
    if share.HasField("max_devices"):
        cap = f"cap {share.max_devices} phone{'s' * (share.max_devices != 1)}"
    else:
        cap = "no cap"
    return (
        f"fairness key {share.fairness_key}: weight {share.weight}, {cap}; "
        f"{share.queued} queued, {share.running} running"
    )


def fair_share_detail(response: admin_pb2.GetFairShareResponse) -> None:
    """`amc queue show KEY`: the key's share and tasks, then who changed its share and why."""
    console().print(Text(fair_share_line(response.share)))
    operator_events(
        response.events,
        "no operator has set its share",
        ("weight", "cap"),
        lambda e: [str(e.weight), str(e.max_devices) if e.HasField("max_devices") else "-"],
    )
