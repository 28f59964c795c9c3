"""An emulator world for a test: the `emulator` double on PATH, its AVDs, its console token,
its faults and event files, and a real adb server (the adbutils wheel's) for its instances
to register with; and the agent's emulator backend over it.

    world = await EmulatorWorld.make(tmp_path, monkeypatch)
    source = world.source(EmulatorSettings(...))   # host_agent.emulator.EmulatorSource

The environment is the test process's (HOME, ANDROID_AVD_HOME, PATH, the double's knobs),
as the agent's emulators inherit its environment. Console ports from PORTS: outside
5554-5585, which every adb server scans when it starts, so another test's adb server on
this machine never picks up these instances.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from amc_testing.emulators import install_double, make_avd
from host_agent.adb import AdbSource
from host_agent.emulator import EmulatorSource
from host_agent.emulator_config import Budget, EmulatorSettings, PoolSpec, read_avd
from tests.support.fakes.real_adb import RealAdbServer

AVD = "Pixel_8_API_34"
SNAPSHOTS = ("default_boot", "login_screen")
PORTS = (5600, 5680)
# A small budget: a double takes next to nothing of the host.
TINY = Budget(0.01, 1 << 20)


@dataclass
class EmulatorWorld:
    root: Path
    adb: RealAdbServer
    events: Path
    faults: Path
    started: list[Any] = field(default_factory=list)

    @classmethod
    async def make(
        cls, root: Path, monkeypatch: pytest.MonkeyPatch, load_seconds: float = 0.2
    ) -> EmulatorWorld:
        home, avds, bin_dir = root / "home", root / "avd", root / "bin"
        home.mkdir(parents=True)
        make_avd(avds, AVD, snapshots=SNAPSHOTS)
        install_double(bin_dir)
        (home / ".emulator_console_auth_token").write_text("s3cret-token")
        world = cls(root, RealAdbServer(root / "adb-home"), root / "events", root / "faults")
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("ANDROID_AVD_HOME", str(avds))
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("AMC_FAKE_EMULATOR_LOAD_SECONDS", str(load_seconds))
        monkeypatch.setenv("AMC_FAKE_EMULATOR_BOOT_SECONDS", "0.1")
        monkeypatch.setenv("AMC_FAKE_EMULATOR_EVENTS", str(world.events))
        monkeypatch.setenv("AMC_FAKE_EMULATOR_FAULTS", str(world.faults))
        await world.adb.start()
        monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(world.adb.port))
        return world

    def pool(self, low: int = 1, high: int = 2, snapshot: str = "default_boot") -> PoolSpec:
        api, abi, snapshots = read_avd(AVD, self.root / "avd")
        return PoolSpec(AVD, AVD, low, high, snapshot, api, abi, snapshots)

    def settings(self, *pools: PoolSpec, **given: Any) -> EmulatorSettings:
        binary = self.root / "bin" / "emulator"
        made = EmulatorSettings(tuple(pools) or (self.pool(),), binary, TINY, ports=PORTS)
        return replace(made, adb_port=self.adb.port, boot_timeout=30.0, **given)

    def source(self, settings: EmulatorSettings, labels: Mapping[str, str] = {}) -> EmulatorSource:
        adb = AdbSource(self.adb.host, self.adb.port, call_timeout=10.0)
        made = EmulatorSource(adb, settings, labels)
        self.started.append(made)
        return made

    def set_fault(self, serial: str, fault: dict[str, Any] | None) -> None:
        """A fault of the instance `serial` (emulator-PORT), read by it at its next load."""
        port = serial.removeprefix("emulator-")
        faults = json.loads(self.faults.read_text()) if self.faults.exists() else {}
        if fault is None:
            faults.pop(port, None)
        else:
            faults[port] = fault
        self.faults.write_text(json.dumps(faults))

    def read_events(self, kind: str | None = None) -> list[dict[str, Any]]:
        if not self.events.exists():
            return []
        found = [json.loads(line) for line in self.events.read_text().splitlines() if line]
        return [e for e in found if kind is None or e["event"] == kind]

    async def close(self) -> None:
        for source in self.started:
            await source.close()
        await self.adb.stop()
