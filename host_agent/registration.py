"""This host as the control plane knows it: the phones read from the device source and
registered with RegisterHost (retried until accepted at start-up; again when the control
plane forgot the host), read again every `inventory_interval` and registered again when
they changed.

A failed read offers no phones until they are back: phones the host cannot see must not
take work. Each registration is handed to the host session (`on_registered`): its timing,
which goes on to the renewal stream, and the phones the control plane records as
quarantined (a quarantine outlives a restart of the agent).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from amc.v1 import lease_pb2_grpc
from amc_common.device_selector import APPIUM_LABEL, APPIUM_YES, HOST_LABEL
from host_agent import metrics
from host_agent.config import AgentSettings
from host_agent.devices import AttachedDevice, DeviceError, DeviceSource
from host_agent.fencing import Timing
from host_agent.health import Health
from host_agent.retry import is_retryable, retrying
from host_agent.wire import held_from_proto, register_request, timing_from_proto

# Deadline of the short unary calls (RegisterHost, ReportDeviceHealth); Acquire gets its
# wait on top.
CALL_TIMEOUT = 10.0


@dataclass(eq=False)
class Registration:
    """The inventory last registered, and the calls that register it."""

    settings: AgentSettings
    source: DeviceSource
    stub: lease_pb2_grpc.LeaseStub
    on_registered: Callable[[Timing, list[tuple[str, Health]]], None]
    log: Any
    inventory: tuple[AttachedDevice, ...] = field(default=(), init=False)
    _refreshing: asyncio.Lock = field(default_factory=asyncio.Lock, init=False)

    def online(self) -> list[str]:
        """The serials of the phones online (state "device") as last registered."""
        return [d.serial for d in self.inventory if d.state == "device"]

    def labels(self, serial: str) -> dict[str, str]:
        """The labels a task's selector matches on `serial`, made as the control plane
        makes them (the host's, then the phone's facts and own labels, then host_id): what
        a cleaning profile's pool matches."""
        host = _host_labels(self.settings)
        for d in self.inventory:
            if d.serial == serial:
                facts = {"model": d.model, "manufacturer": d.manufacturer, "abi": d.abi}
                facts["sdk"] = str(d.sdk) if d.sdk else ""
                host |= {k: v for k, v in facts.items() if v} | d.labels
        return host | {HOST_LABEL: self.settings.host_id}

    async def until_accepted(self) -> Timing:
        async for attempt in retrying("registration", self.log):
            with attempt:
                return await self._register(await self._read())
        raise AssertionError("unreachable: AsyncRetrying retries until it returns or raises")

    async def again(self, refusal: grpc.aio.AioRpcError) -> None:
        """The control plane forgot this host while it was away (retention after a long
        disconnection, or `amc hosts remove`): register its devices again; the Acquire that
        was refused is then asked again."""
        self.log.warning(
            "the control plane does not know this host; registering again",
            reason=refusal.details(),
        )
        async with self._refreshing:
            await self._register(self.inventory)

    async def refresh(self) -> None:
        """Read the devices again and re-register if anything changed."""
        async with self._refreshing:
            inventory = await self._read()
            if inventory == self.inventory:
                return
            try:
                await self._register(inventory)
            except grpc.aio.AioRpcError as exc:
                if not is_retryable(exc):
                    raise
                self.log.warning("re-registration failed; will retry", code=exc.code().name)

    async def refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.inventory_interval)
            await self.refresh()

    async def _register(self, inventory: tuple[AttachedDevice, ...]) -> Timing:
        settings = self.settings
        request = register_request(settings.host_id, _host_labels(settings), inventory)
        response = await self.stub.RegisterHost(request, timeout=CALL_TIMEOUT)
        timing = timing_from_proto(response)
        self.inventory = inventory
        self.log.info(
            "registered",
            devices={d.serial: d.state for d in inventory},
            lease_ttl=timing.ttl,
            renew_interval=timing.interval,
        )
        self.on_registered(timing, held_from_proto(response))
        return timing

    async def _read(self) -> tuple[AttachedDevice, ...]:
        try:
            inventory = tuple(await self.source.inventory())
        except DeviceError as exc:
            # Phones we cannot see must not take work: offer none until they are back.
            self.log.warning("device inventory failed; offering no devices", error=str(exc))
            metrics.inventory_read(None)
            return ()
        metrics.inventory_read([d.state for d in inventory])
        return inventory


def _host_labels(settings: AgentSettings) -> dict[str, str]:
    """The host's labels, with `appium=yes` when it runs Appium for WebDriver sessions."""
    extra = {APPIUM_LABEL: APPIUM_YES} if settings.appium else {}
    return {**settings.labels, **extra}
