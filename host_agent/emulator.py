"""Emulators as devices of kind `emulator`: the device backend of the emulators a host runs
itself (`EmulatorSource`, over the same adb server as its other phones, host_agent.adb),
how one is reset between leases (`SnapshotCleaner`: one step, `snapshot`: a load of its
pool's snapshot over its console, host_agent.emulator_console) and brought to the
snapshot a task starts from (`prepare`). The instances themselves are
host_agent.emulator_pool's, their configuration host_agent.emulator_config's.

An instance is labelled `kind=emulator`, `avd`, `snapshot` (its pool's: what it is reset
to), `api`, and `snapshot/<name>=yes` for each snapshot it can load (its console's `avd
snapshot list`), which is what a task that starts from a snapshot asks for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from host_agent import devices
from host_agent.adb import AdbSource
from host_agent.baselines import Baselines
from host_agent.clean_profile import CleanProfile
from host_agent.devices import AttachedDevice, Cleaner, CleanStepRun, Device, DeviceError, Pools
from host_agent.emulator_config import EmulatorSettings
from host_agent.emulator_pool import Emulators


class SnapshotCleaner:
    """An emulator is reset between leases by loading its pool's snapshot (one step), not
    rebooted; a load that fails starts the instance afresh within the step."""

    def __init__(self, emulators: Emulators, serial: str, snapshot: str) -> None:
        self._emulators = emulators
        self._serial = serial
        self._snapshot = snapshot

    def steps(self, *, first: bool, reboot: bool) -> list[tuple[str, CleanStepRun]]:
        return [("snapshot", self._reset)]

    async def _reset(self) -> str:
        return await self._emulators.reset(self._serial, self._snapshot, heal=True)


class EmulatorSource:
    """The adb server's phones, with this host's emulators among them (see the module
    docstring): an instance is listed once it is up, with its labels."""

    def __init__(
        self, adb: AdbSource, settings: EmulatorSettings, labels: Mapping[str, str] = {}
    ) -> None:
        self._adb = adb
        self.emulators = Emulators(settings, self._answers, labels)

    async def _answers(self, serial: str) -> bool:
        try:
            booted = await self._adb.device(serial).shell("getprop sys.boot_completed", 5.0)
        except DeviceError:
            return False
        return booted.output.strip() == "1"

    async def inventory(self) -> list[AttachedDevice]:
        listed = []
        for device in await self._adb.inventory():
            instance = self.emulators.instance(device.serial)
            if instance is None:
                if not self.emulators.on_our_ports(device.serial):  # not ours: a leftover
                    listed.append(device)
            elif self.emulators.shown(device.serial):
                labels = instance.pool.device_labels(instance.snapshots)
                listed.append(replace(device, labels={**device.labels, **labels}))
        return listed

    def device(self, serial: str) -> Device:
        return self._adb.device(serial)

    def cleaner(self, serial: str, profile: CleanProfile, baselines: Baselines) -> Cleaner:
        instance = self.emulators.instance(serial)
        if instance is None:
            return self._adb.cleaner(serial, profile, baselines)
        return SnapshotCleaner(self.emulators, serial, instance.pool.snapshot)

    async def prepare(self, serial: str, snapshot: str) -> str:
        """The task's start snapshot loaded, unless the instance is fresh from it."""
        if self.emulators.instance(serial) is None:
            return await devices.prepare(self._adb, serial, snapshot)
        fresh = self.emulators.begin_lease(serial)
        if not snapshot or snapshot == fresh:
            return f"fresh from {snapshot}" if snapshot else ""
        return await self.emulators.reset(serial, snapshot, heal=False)

    def pools(self) -> Pools:
        return self.emulators

    async def reconnect_device(self, serial: str) -> None:
        await self._adb.reconnect_device(serial)

    async def reboot_device(self, serial: str) -> None:
        """The recovery ladder's reboot: an instance is started afresh."""
        if self.emulators.instance(serial) is None:
            await self._adb.reboot_device(serial)
        else:
            await self.emulators.restart(serial, "the recovery ladder's reboot")

    async def close(self) -> None:
        await self.emulators.close()
        await self._adb.close()
