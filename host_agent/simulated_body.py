"""A simulated phone's body and what it answers without acting: its props, a battery that
drains under load and charges while on power, a temperature that rises under load and
falls back when idle (at the `Physics` rates, all 0 by default: a phone stays as it is
set), its boot and its free storage. The health probe's reads (`PROBE_COMMANDS`) are
answered from the body (`probe_answer`); other shell commands get plausible output
(`shell_answer`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from host_agent.devices import ShellResult

SIMULATED_PROPS: dict[str, str] = {
    "ro.product.model": "Simulated",
    "ro.product.manufacturer": "AMC",
    "ro.build.version.sdk": "34",
    "ro.product.cpu.abi": "x86_64",
}


@dataclass
class Body:
    """A simulated phone's physical state."""

    battery: float = 100.0
    temperature: float = 30.0
    charging: bool = True
    hung: bool = False
    # What ends a hang: "reboot" (the phone itself), or "reconnect" (its transport: the
    # recovery ladder's `adb reconnect` clears it, as a reboot does).
    hang_cured_by: str = "reboot"
    # time.monotonic() until which it boots (sys.boot_completed is not 1).
    booting_until: float = 0.0
    free_kb: int = 8_000_000
    updated: float = field(default_factory=time.monotonic)

    def advance(self, physics: Physics, loaded: bool) -> None:
        """Bring the body up to now: what charging, and load (or its absence) since the
        last look did to it."""
        now = time.monotonic()
        elapsed, self.updated = now - self.updated, now
        if self.charging:
            self.battery += physics.charge * elapsed
        if loaded:
            self.battery -= physics.drain_under_load * elapsed
            self.temperature += physics.heat_under_load * elapsed
        else:
            self.temperature = max(ROOM_TEMPERATURE, self.temperature - physics.cool * elapsed)
        self.battery = max(0.0, min(100.0, self.battery))


# Where an idle phone's temperature settles.
ROOM_TEMPERATURE = 30.0
PROBE_COMMANDS = ("getprop sys.boot_completed", "dumpsys battery", "df /data")


@dataclass(frozen=True)
class Physics:
    """How fast bodies change, per second (0: not at all)."""

    drain_under_load: float = 0.0
    charge: float = 0.0
    heat_under_load: float = 0.0
    cool: float = 0.0


def battery_text(body: Body) -> str:
    """`dumpsys battery` as Android prints it."""
    return (
        "Current Battery Service state:\n"
        f"  AC powered: {str(body.charging).lower()}\n"
        "  USB powered: false\n"
        "  Wireless powered: false\n"
        f"  status: {2 if body.charging else 3}\n"
        "  health: 2\n"
        "  present: true\n"
        f"  level: {int(body.battery)}\n"
        "  scale: 100\n"
        "  voltage: 4100\n"
        f"  temperature: {round(body.temperature * 10)}\n"
        "  technology: Li-ion\n"
    )


def probe_answer(body: Body, booted: bool, command: str) -> ShellResult:
    """A health probe's read (one of PROBE_COMMANDS), answered from the body."""
    if command == "getprop sys.boot_completed":
        return ShellResult(0, "1\n" if booted else "\n")
    if command == "dumpsys battery":
        return ShellResult(0, battery_text(body))
    return ShellResult(
        0,
        "Filesystem     1K-blocks    Used Available Use% Mounted on\n"
        f"/dev/block/dm-5 16000000 {16_000_000 - body.free_kb} {body.free_kb} 50% /data\n",
    )


def shell_answer(command: str) -> ShellResult:
    """Plausible output for a few commands; anything else succeeds silently."""
    words = command.split()
    if not words:
        return ShellResult(0, "")
    if words[0] == "echo":
        return ShellResult(0, " ".join(words[1:]) + "\n")
    if words[0] == "getprop":
        if len(words) > 1:
            return ShellResult(0, SIMULATED_PROPS.get(words[1], "") + "\n")
        return ShellResult(0, "".join(f"[{k}]: [{v}]\n" for k, v in SIMULATED_PROPS.items()))
    if words[0] == "false":
        return ShellResult(1, "")
    return ShellResult(0, "")
