"""The conditions a phone's life on this host sets over what its probes say: a held
phone's (the recovery ladder's), then a cleaning phone's `cleaning`.

The mapping the health monitor reads (its overrides), kept by host_agent.device_life.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol

from host_agent.health import Condition, Health


class Held(Protocol):
    @property
    def held(self) -> Mapping[str, Health]: ...


class Life(Protocol):
    """What the conditions ask of the phones' life."""

    @property
    def recovery(self) -> Held: ...

    def withheld(self) -> set[str]: ...

    def cleaning_reason(self, serial: str) -> str | None: ...


class Overrides(Mapping[str, Health]):
    """The conditions DeviceLife sets, for the health monitor: a held phone's (the
    ladder's), then a cleaning phone's `cleaning`."""

    def __init__(self, life: Life) -> None:
        self._life = life

    def __getitem__(self, serial: str) -> Health:
        held = self._life.recovery.held.get(serial)
        if held is not None:
            return held
        reason = self._life.cleaning_reason(serial)
        if reason is not None:
            return Health(Condition.CLEANING, reason)
        raise KeyError(serial)

    def __iter__(self) -> Iterator[str]:
        held = self._life.recovery.held
        yield from held
        yield from (s for s in self._life.withheld() if s not in held and s in self)

    def __contains__(self, serial: object) -> bool:
        return serial in self._life.recovery.held or (
            isinstance(serial, str) and self._life.cleaning_reason(serial) is not None
        )

    def __len__(self) -> int:
        return sum(1 for _ in self)
