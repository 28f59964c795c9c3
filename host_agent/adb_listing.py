"""What the adb server and a phone say of the phones attached, read: `host:devices-l`'s
lines, `getprop`'s listing, and the `AttachedDevice` they make (host_agent.adb's source)."""

from __future__ import annotations

import re

from host_agent.devices import AttachedDevice


def parse_devices_l(listing: str) -> list[tuple[str, str, dict[str, str]]]:
    """`host:devices-l` lines → (serial, state, {"product": …, "transport_id": …})."""
    entries = []
    for line in listing.splitlines():
        words = line.split()
        if len(words) < 2:
            continue
        labels = dict(w.split(":", 1) for w in words[2:] if ":" in w)
        entries.append((words[0], words[1], labels))
    return entries


_PROP_LINE = re.compile(r"^\[(?P<key>[^\]]*)\]: \[(?P<value>.*)\]$")


def parse_getprop(output: str) -> dict[str, str]:
    """`getprop` output (``[key]: [value]`` per line) → dict; multi-line values are cut."""
    props = {}
    for line in output.splitlines():
        match = _PROP_LINE.match(line.strip())
        if match:
            props[match["key"]] = match["value"]
    return props


def info_from_props(
    serial: str, state: str, props: dict[str, str], labels: dict[str, str]
) -> AttachedDevice:
    """A phone attached, from its `getprop` listing and its `devices-l` labels."""
    sdk = props.get("ro.build.version.sdk", "")
    return AttachedDevice(
        serial=serial,
        state=state,
        model=props.get("ro.product.model", ""),
        manufacturer=props.get("ro.product.manufacturer", ""),
        sdk=int(sdk) if sdk.isdigit() else 0,
        abi=props.get("ro.product.cpu.abi", ""),
        labels=labels,
    )
