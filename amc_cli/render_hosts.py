"""Hosts, devices and tokens for people: `amc hosts` (and `hosts show`), the line after
a host operation, `amc tokens`."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table
from rich.text import Text

from amc.v1 import admin_pb2, scheduler_pb2
from amc_cli.render import console, enum_name, operator_events, when


def hosts_table(response: scheduler_pb2.ListHostsResponse) -> None:
    out = console()
    if not response.hosts:
        out.print("no hosts have registered")
        return
    table = Table(show_edge=False)
    columns = ("host", "connected", "work", "last seen", "device", "state", "model", "sdk")
    for name in (*columns, "condition", "battery", "temp", "task"):
        table.add_column(name, no_wrap=name in ("device", "task"))
    devices = busy = 0
    for host in response.hosts:
        connected = Text("yes", style="green") if host.connected else Text("no", style="red")
        first: list[Text | str] = [
            Text(host.host_id),
            connected,
            host_work(host),
            when(host.last_seen_at),
        ]
        for device in host.devices or [None]:
            if device is None:
                table.add_row(*first, "-", "-", "-", "-", "-", "-", "-", "-")
                break
            devices += 1
            busy += bool(device.task_id)
            state = enum_name("DEVICE_STATE_", scheduler_pb2.DeviceState.Name(device.state))
            shown = Text(state, style="green" if state == "device" else "yellow")
            if device.cordoned:
                shown.append(" cordoned", style="magenta")
            table.add_row(
                *first,
                Text(device.serial),
                shown,
                Text(device.model or "-"),
                str(device.sdk or "-"),
                *device_health(device),
                device.task_id or Text("idle", style="dim"),
            )
            first = ["", "", "", ""]
        table.add_section()
    out.print(table)
    connected_count = sum(h.connected for h in response.hosts)
    cordoned = sum(h.cordoned for h in response.hosts)
    out.print(
        Text(
            f"{len(response.hosts)} hosts ({connected_count} connected, {cordoned} cordoned), "
            f"{devices} devices ({busy} busy)",
            style="dim",
        )
    )


def device_health(device: scheduler_pb2.Device) -> tuple[Text, str, str]:
    """Its condition (`ready`, or why it takes no work), battery and temperature as its
    host last probed them (`-`: not read); `+` after the battery: charging."""
    name = scheduler_pb2.DeviceCondition.Name(device.condition)
    condition = enum_name("DEVICE_CONDITION_", name) if device.condition else "ready"
    shown = Text(condition, style="green" if condition == "ready" else "yellow")
    battery = "-"
    if device.HasField("battery_percent"):
        battery = f"{device.battery_percent}%" + ("+" if device.charging else "")
    temp = f"{device.temperature_celsius:.0f}°C" if device.HasField("temperature_celsius") else "-"
    return shown, battery, temp


def host_work(host: scheduler_pb2.Host) -> Text:
    """Whether the host takes work: `draining`, `cordoned` or `yes`."""
    if host.draining:
        return Text("draining", style="magenta")
    if host.cordoned:
        return Text("cordoned", style="magenta")
    return Text("yes", style="green")


def host_line(host: scheduler_pb2.Host, leases: int) -> str:
    """One line on a host after an operation: whether it takes work, what it runs."""
    work = host_work(host).plain
    state = "takes work" if work == "yes" else work
    cordoned = [d.serial for d in host.devices if d.cordoned]
    devices = f"; cordoned devices: {', '.join(cordoned)}" if cordoned else ""
    return f"host {host.host_id}: {state}, {leases} task(s) running{devices}"


def _role(role: int) -> str:
    return enum_name("ROLE_", admin_pb2.Role.Name(role))


def tokens_table(tokens: Iterable[admin_pb2.TokenInfo]) -> None:
    out = console()
    table = Table(show_edge=False)
    for name in ("token id", "name", "role", "host", "team", "created", "revoked"):
        table.add_column(name, no_wrap=name == "token id")
    rows = 0
    for t in tokens:
        rows += 1
        revoked = when(t.revoked_at) if t.HasField("revoked_at") else ""
        table.add_row(
            t.token_id,
            Text(t.name or "-"),
            _role(t.role),
            Text(t.host_id or "-"),
            Text(t.team or "-"),
            when(t.created_at),
            Text(revoked, style="red"),
        )
    out.print(table if rows else "no tokens")


def host_detail(response: admin_pb2.GetHostResponse) -> None:
    """`amc hosts show`: the host as `amc hosts` lists it, then what operators did to it."""
    hosts_table(scheduler_pb2.ListHostsResponse(hosts=[response.host]))
    operator_events(
        response.events,
        "no operator events",
        ("what", "device"),
        lambda e: [e.kind, Text(e.serial or "-")],
    )


def token_info(info: admin_pb2.TokenInfo, verb: str) -> None:
    name = f" {info.name!r}" if info.name else ""
    host = f" for host {info.host_id}" if info.host_id else ""
    team = f" of team {info.team}" if info.team else ""
    console().print(Text(f"{verb} {_role(info.role)} token {info.token_id}{name}{host}{team}"))
