"""A device selector (a serial and labels a phone must have: amc.v1.DeviceSelector) as
people read it, written once for the control plane and the CLI."""

from __future__ import annotations

import re
from collections.abc import Mapping

ANY = "any device"
# The label the control plane gives every device: its host's id. A serial is unique on its
# host only (every first emulator is emulator-5554), so a serial with this label names one
# phone of the farm.
HOST_LABEL = "host_id"
# An emulator carries `snapshot/<name>=yes` for each snapshot it can load; a task that
# starts from a snapshot (TaskSpec.start_snapshot) asks for that label.
SNAPSHOT_LABEL = "snapshot/"
SNAPSHOT_YES = "yes"
# A host agent that runs Appium for WebDriver sessions (--appium) carries `appium=yes` on
# its phones; a WebDriver session asks for that label.
APPIUM_LABEL = "appium"
APPIUM_YES = "yes"
# A snapshot's name as the emulator console takes it (`avd snapshot load NAME`): one word.
SNAPSHOT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def snapshot_label(name: str) -> str:
    """The label of the emulators that can load snapshot `name`."""
    return SNAPSHOT_LABEL + name


def describe(
    serial: str | None, labels: Mapping[str, str], *, sep: str = ",", anything: str = ANY
) -> str:
    """`serial=R58M,model=Pixel9,rack=r1`: the serial (if any) first, then the labels by
    key; `anything` for a selector that asks for nothing.

    The texts that were pinned before this was shared are kept, through the two keywords:
    a pending reason and the console write `,` and `any device` (the defaults); the CLI's
    tables and warnings separate with a space (`sep=" "`); the queue's metric label says
    `any` (`anything="any"`), and its `other` series is the gauges' own, not a selector."""
    parts = [f"serial={serial}"] if serial else []
    parts += [f"{k}={v}" for k, v in sorted(labels.items())]
    return sep.join(parts) or anything
