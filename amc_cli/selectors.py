"""What `amc submit` says about a selector no registered device fits, before sending it.

A misspelt label key (`-l modle=Simulated`) or value is accepted by the control plane (a
farm may add such a phone later) and the task waits for ever; the person finds out only
from `amc get`'s `waiting`. So `amc submit` reads the farm's devices (ListHosts, each
device's labels as a selector matches them: its host's labels, its model, manufacturer,
sdk, abi, its own) and names each key, value or serial no device has, with the nearest one
that exists, or says that no one device has them all. These are warnings: the task is
submitted as asked; `--strict` makes them an error.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from amc.v1 import scheduler_pb2, task_pb2
from amc_common.device_selector import describe

# How many known names a message lists when none is near the one asked for.
SHOWN = 8


def problems(selector: task_pb2.DeviceSelector, hosts: Sequence[scheduler_pb2.Host]) -> list[str]:
    """One sentence per reason no registered device fits `selector`; none when one does
    (or when the selector asks for nothing)."""
    if not selector.serial and not selector.labels:
        return []
    devices = [d for host in hosts for d in host.devices]
    if not devices:
        return ["no device is registered yet; the task waits until one that fits registers"]
    found = [*_serial(selector.serial, devices), *_labels(dict(selector.labels), devices)]
    if found or any(_fits(selector, d) for d in devices):
        return found
    return [f"no one device has all of {_text(selector)} (each is on some device)"]


def _serial(serial: str, devices: Sequence[scheduler_pb2.Device]) -> list[str]:
    serials = sorted({d.serial for d in devices})
    if not serial or serial in serials:
        return []
    return [f"no device has serial {serial!r}{_nearest(serial, serials)}"]


def _labels(wanted: dict[str, str], devices: Sequence[scheduler_pb2.Device]) -> list[str]:
    known: dict[str, set[str]] = {}
    for device in devices:
        for key, value in device.labels.items():
            known.setdefault(key, set()).add(value)
    found = []
    for key, value in sorted(wanted.items()):
        if key not in known:
            found.append(f"no device has label {key!r}{_nearest(key, sorted(known))}")
        elif value not in known[key]:
            found.append(f"no device has {key}={value!r}{_nearest(value, sorted(known[key]))}")
    return found


def _nearest(word: str, names: Sequence[str]) -> str:
    """ "; did you mean 'x'?", or the names there are when none is near."""
    by_case = {name.lower(): name for name in names}
    close = difflib.get_close_matches(word.lower(), list(by_case), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {by_case[close[0]]!r}?"
    shown = ", ".join(names[:SHOWN]) + (", …" if len(names) > SHOWN else "")
    return f" (there are: {shown})"


def _fits(selector: task_pb2.DeviceSelector, device: scheduler_pb2.Device) -> bool:
    if selector.serial and selector.serial != device.serial:
        return False
    return all(device.labels.get(k) == v for k, v in selector.labels.items())


def _text(selector: task_pb2.DeviceSelector) -> str:
    return describe(selector.serial, selector.labels, sep=" ")
