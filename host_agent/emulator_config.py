"""An emulator pool's configuration: what a pool is (`PoolSpec`: instances of one AVD,
reset to one snapshot, a minimum and a maximum), what one instance takes of the host
(`Budget`), the host's pools and their settings (`EmulatorSettings`), read from the
command line (`--emulator AVD[@SNAPSHOT]:MIN:MAX`) and a pool file (`--emulator-pools`,
YAML), against the AVDs on disk, and checked against the host's size (a pool larger than
the host is refused, one line).

An AVD is `$ANDROID_AVD_HOME/NAME.avd` (else ~/.android/avd/NAME.avd, where the SDK's
avdmanager makes them): its `config.ini` gives its API level (`image.sysdir.1=
system-images/android-34/…`) and ABI (`abi.type`), its `snapshots/` directory one
directory per snapshot.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from amc_common.device_selector import SNAPSHOT_NAME, SNAPSHOT_YES, snapshot_label

KIND_EMULATOR = "emulator"


@dataclass(frozen=True)
class Budget:
    """What one instance takes of the host: CPUs and bytes of memory."""

    cpus: float = 2.0
    memory: int = 2 << 30


@dataclass(frozen=True)
class PoolSpec:
    """One pool: instances of `avd`, reset to `snapshot`, `low` to `high` of them."""

    name: str
    avd: str
    low: int
    high: int
    snapshot: str
    # From the AVD on disk (host_agent.emulator.read_avd).
    api: int = 0
    abi: str = ""
    snapshots: tuple[str, ...] = ()
    # The pool file's own labels for its instances.
    labels: Mapping[str, str] = field(default_factory=dict)

    def device_labels(self, snapshots: tuple[str, ...] = ()) -> dict[str, str]:
        """The labels its instances carry (besides the host's): kind, avd, snapshot, api
        and a `snapshot/<name>=yes` for each snapshot one can load."""
        made = {"kind": KIND_EMULATOR, "avd": self.avd, "snapshot": self.snapshot}
        if self.api:
            made["api"] = str(self.api)
        made |= {snapshot_label(s): SNAPSHOT_YES for s in snapshots or self.snapshots}
        return made | dict(self.labels)


@dataclass(frozen=True)
class EmulatorSettings:
    pools: tuple[PoolSpec, ...]
    binary: Path
    budget: Budget = field(default_factory=Budget)
    # An instance idle this long, above its pool's minimum, is stopped.
    idle: float = 300.0
    # The console ports instances take (even numbers, first to last, both included).
    ports: tuple[int, int] = (5554, 5682)
    boot_timeout: float = 300.0
    load_timeout: float = 60.0
    # The adb server the instances register with (the agent's).
    adb_port: int = 5037
    token_file: Path | None = None


_POOL = re.compile(r"^(?P<avd>[^@:]+)(@(?P<snapshot>[^:]+))?:(?P<low>\d+):(?P<high>\d+)$")
DEFAULT_SNAPSHOT = "default_boot"
_POOL_KEYS = {"avd", "snapshot", "min", "max", "name", "labels"}


class PoolError(ValueError):
    """An emulator pool that cannot be run; the message is one line naming it."""


def avd_home(env: Mapping[str, str] = os.environ) -> Path:
    home = env.get("ANDROID_AVD_HOME")
    return Path(home) if home else Path.home() / ".android" / "avd"


def read_avd(name: str, home: Path) -> tuple[int, str, tuple[str, ...]]:
    """An AVD's API level, ABI and snapshots, from its directory."""
    path = home / f"{name}.avd"
    try:
        config = (path / "config.ini").read_text()
    except OSError:
        raise PoolError(f"no AVD named {name} in {home} ($ANDROID_AVD_HOME)") from None
    facts = dict(line.split("=", 1) for line in config.splitlines() if "=" in line)
    facts = {k.strip(): v.strip() for k, v in facts.items()}
    api = re.search(r"android-(\d+)", facts.get("image.sysdir.1", facts.get("target", "")))
    found = path / "snapshots"
    snapshots = sorted(p.name for p in found.iterdir() if p.is_dir()) if found.is_dir() else []
    return (int(api[1]) if api else 0), facts.get("abi.type", ""), tuple(snapshots)


def pool_flag(text: str) -> PoolSpec:
    """`--emulator AVD[@SNAPSHOT]:MIN:MAX` (not yet read against the AVD on disk)."""
    found = _POOL.match(text.strip())
    if found is None:
        raise PoolError(f"{text}: expected AVD[@SNAPSHOT]:MIN:MAX (e.g. Pixel_8:1:4)")
    snapshot = found["snapshot"] or DEFAULT_SNAPSHOT
    return _spec(text, found["avd"], snapshot, found["low"], found["high"])


def _spec(
    where: str, avd: Any, snapshot: Any, low: Any, high: Any, name: Any = None, labels: Any = None
) -> PoolSpec:
    if not isinstance(avd, str) or not SNAPSHOT_NAME.fullmatch(avd):
        raise PoolError(f"{where}: not an AVD name: {avd!r}")
    if not isinstance(snapshot, str) or not SNAPSHOT_NAME.fullmatch(snapshot):
        raise PoolError(f"{where}: not a snapshot name: {snapshot!r}")
    try:
        low, high = int(low), int(high)
    except (TypeError, ValueError):
        raise PoolError(f"{where}: min and max must be whole numbers") from None
    if not 0 <= low <= high or high < 1:
        raise PoolError(f"{where}: needs 0 <= min <= max and max >= 1")
    labels = labels or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise PoolError(f"{where}.labels: must be a map of text to text")
    if name is None:
        name = avd if snapshot == DEFAULT_SNAPSHOT else f"{avd}@{snapshot}"
    tags = {str(k): v for k, v in labels.items()}
    return PoolSpec(str(name), avd, low, high, snapshot, labels=tags)


def load_pools(path: Path) -> list[PoolSpec]:
    """The pool file (`--emulator-pools`): `pools:`, a list of {avd, snapshot, min, max,
    name, labels}."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise PoolError(f"{path}: {' '.join(str(exc).split())}") from None
    pools = data.get("pools") if isinstance(data, dict) else None
    if not isinstance(pools, list):
        raise PoolError(f"{path}: expected `pools:`, a list")
    made = []
    for i, entry in enumerate(pools):
        where = f"pools[{i}]"
        if not isinstance(entry, dict) or (extra := set(entry) - _POOL_KEYS):
            raise PoolError(f"{where}: unknown keys {sorted(extra) if entry else entry}")
        args = [entry.get(k) for k in ("avd", "snapshot", "min", "max", "name", "labels")]
        args[1] = args[1] or DEFAULT_SNAPSHOT
        made.append(_spec(where, *args))
    return made


def resolve(pools: Sequence[PoolSpec], home: Path) -> tuple[PoolSpec, ...]:
    """The pools read against their AVDs on disk: each AVD there, with its snapshot."""
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise PoolError(f"two pools named {max(set(names), key=names.count)}: name one of them")
    made = []
    for pool in pools:
        api, abi, snapshots = read_avd(pool.avd, home)
        if pool.snapshot not in snapshots:
            have = ", ".join(snapshots) or "none"
            raise PoolError(f"{pool.name}: AVD {pool.avd} has no snapshot {pool.snapshot} ({have})")
        made.append(replace(pool, api=api, abi=abi, snapshots=snapshots))
    return tuple(made)


def check_fits(pools: Sequence[PoolSpec], budget: Budget, cpus: int, memory: int) -> None:
    """The pools at their maximum fit the host, at `budget` per instance."""
    most = sum(p.high for p in pools)
    need_cpus, need_memory = most * budget.cpus, most * budget.memory
    if need_cpus > cpus or need_memory > memory:
        raise PoolError(
            f"the pools may run {most} emulators of {budget.cpus:g} CPUs and"
            f" {budget.memory / (1 << 30):.1f} GB each ({need_cpus:g} CPUs,"
            f" {need_memory / (1 << 30):.1f} GB); this host has {cpus} CPUs and"
            f" {memory / (1 << 30):.1f} GB (lower a maximum, or --emulator-budget)"
        )


def find_binary(env: Mapping[str, str] = os.environ) -> Path | None:
    """The `emulator` program: the SDK's ($ANDROID_HOME, $ANDROID_SDK_ROOT), else PATH's."""
    for var in ("ANDROID_HOME", "ANDROID_SDK_ROOT"):
        if env.get(var) and (candidate := Path(env[var]) / "emulator" / "emulator").is_file():
            return candidate
    found = shutil.which("emulator", path=env.get("PATH"))
    return Path(found) if found else None


def settings(
    flags: Sequence[str],
    pool_file: Path | None,
    binary: Path | None,
    env: Mapping[str, str],
    adb: tuple[str, int],
    **given: Any,
) -> EmulatorSettings | None:
    """The host's emulator pools (None: it runs none), from `--emulator` flags and a pool
    file, read against their AVDs and checked against the host's size; PoolError names
    the flag that is wrong."""
    if not flags and pool_file is None:
        return None
    try:
        pools = [pool_flag(f) for f in flags]
        pools += load_pools(pool_file) if pool_file is not None else []
        pools = list(resolve(pools, avd_home(env)))
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        check_fits(pools, given.get("budget", Budget()), os.cpu_count() or 1, total)
    except PoolError as exc:
        raise PoolError(f"--emulator: {exc}") from None
    binary = binary or find_binary(env)
    if binary is None or not binary.is_file():
        raise PoolError(f"--emulator-binary: no emulator program found ({binary or 'PATH'})")
    if adb[0] not in ("127.0.0.1", "localhost", "::1"):
        raise PoolError("--emulator: emulators register with the adb server here (--adb local)")
    return EmulatorSettings(tuple(pools), binary, adb_port=adb[1], **given)


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int:
    """MemAvailable, in bytes (a very large number where the kernel does not say)."""
    with contextlib.suppress(OSError, ValueError):
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 1 << 62
