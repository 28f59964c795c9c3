"""Hosts and their devices: registration, health, cordons, release from quarantine,
removal and the hosts' events (their statements in hosts.sql; amc_set_host_cordon and
amc_remove_host above them there)."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from typing import Any

from amc_common.device_selector import SNAPSHOT_LABEL
from control_plane import errors
from control_plane.domain import (
    CancelNotice,
    DeviceHealth,
    DeviceInfo,
    HostEvent,
    HostInfo,
    LeaseId,
    Principal,
    StreamState,
    TaskId,
)
from control_plane.lifecycle import RemoveCode
from control_plane.store.database import Aggregate
from control_plane.store.rows import act, columns, when


class Hosts(Aggregate):
    async def register_host(
        self, host_id: str, labels: dict[str, str], devices: list[DeviceInfo]
    ) -> list[DeviceHealth]:
        """Record the host and its devices; those of them held quarantined or recovering
        (the conditions its agent last reported)."""
        rows = await self._db.fetch(
            "register_host",
            host_id,
            labels,
            *columns(devices, "serial", "state", "model", "manufacturer", "sdk", "abi"),
            [json.dumps(d.labels) for d in devices],
            sorted({k.removeprefix(SNAPSHOT_LABEL) for d in devices for k in _snapshots(d)}),
        )
        return [DeviceHealth(r["serial"], r["condition"], r["condition_reason"]) for r in rows]

    async def known_snapshots(self, names: list[str]) -> set[str]:
        """Those of `names` that some host's emulators can load."""
        rows = await self._db.fetch("known_snapshots", names)
        return {r["name"] for r in rows}

    async def host_registered(self, host_id: str) -> bool:
        row = await self._db.fetchrow("host_registered", host_id)
        return bool(row and row["registered"])

    async def set_device_health(self, host_id: str, health: list[DeviceHealth]) -> int:
        """Record the conditions host `host_id` reported for its own devices (others are
        ignored); how many of them turned ready."""
        row = await self._db.fetchrow(
            "set_device_health",
            host_id,
            *columns(
                health,
                "serial",
                "condition",
                "reason",
                "battery_percent",
                "temperature_celsius",
                "charging",
            ),
            [h.serial for h in health for _ in h.cleaned],
            [step.event_reason() for h in health for step in h.cleaned],
        )
        return int(row["freed"]) if row is not None else 0

    async def list_hosts(
        self, connected_within: timedelta, host_id: str | None = None
    ) -> list[HostInfo]:
        """Every host (or only `host_id`), with its devices."""
        rows = await self._db.fetch("list_hosts", connected_within, host_id)
        return [
            HostInfo(
                r["host_id"],
                r["labels"],
                r["connected"],
                r["last_seen_at"],
                [_device(d) for d in r["devices"]],
                r["cordoned"],
                r["draining"],
            )
            for r in rows
        ]

    async def get_host(self, connected_within: timedelta, host_id: str) -> HostInfo:
        hosts = await self.list_hosts(connected_within, host_id)
        if not hosts:
            raise errors.HostNotFound(f"no host '{host_id}'")
        return hosts[0]

    async def set_host_cordon(
        self, host_id: str, cordoned: bool, drain: bool, kind: str, actor: Principal, reason: str
    ) -> int:
        """Cordon (with `drain`: and drain) or uncordon the host, recorded as `kind`;
        the leases it holds now."""
        row = await self._db.fetchrow(
            "set_host_cordon", host_id, cordoned, drain, kind, actor.caller, actor.name, reason
        )
        if row is None:
            raise errors.HostNotFound(f"no host '{host_id}'")
        return int(row["leases"])

    async def set_device_cordon(
        self,
        host_id: str | None,
        serial: str,
        cordoned: bool,
        kind: str,
        actor: Principal,
        reason: str,
    ) -> str:
        """Cordon or uncordon one device; the host it is on. Without `host_id`, the serial
        must be on one host only."""
        row = await self._db.fetchrow(
            "set_device_cordon", host_id, serial, cordoned, kind, actor.caller, actor.name, reason
        )
        return _one_host(host_id, serial, list(row["hosts"]) if row else [])

    async def release_device(
        self,
        host_id: str | None,
        serial: str,
        connected_within: timedelta,
        actor: Principal,
        reason: str,
    ) -> str:
        """Record an operator's release of a quarantined device; the host it is on (whose
        agent is then told). Without `host_id`, the serial must be on one host only."""
        row = await self._db.fetchrow(
            "release_device",
            host_id,
            serial,
            connected_within,
            actor.caller,
            actor.name,
            reason,
        )
        assert row is not None
        host = _one_host(host_id, serial, list(row["hosts"]))
        if not row["released"]:
            if row["condition"] not in ("quarantined", "recovering"):
                raise errors.DeviceNotQuarantined(
                    f"device '{serial}' on host '{host}' is not quarantined ({row['condition']})"
                )
            raise errors.DeviceNotQuarantined(
                f"host '{host}' is not connected: its agent holds the quarantine (kept "
                "across its restarts); release it once the host is back"
            )
        return host

    async def remove_host(
        self, host_id: str, connected_within: timedelta, actor: Principal, reason: str
    ) -> None:
        """Forget a disconnected host that holds no lease, and its devices."""
        row = await self._db.fetchrow(
            "remove_host", host_id, connected_within, actor.caller, actor.name, reason
        )
        assert row is not None
        code, leases = RemoveCode(row["code"]), row["leases"]
        if code is RemoveCode.NOT_FOUND:
            raise errors.HostNotFound(f"no host '{host_id}'")
        if code is RemoveCode.CONNECTED:
            raise errors.HostInUse(
                f"host '{host_id}' is connected; stop its agent first (drain it to let its "
                "tasks finish)"
            )
        if code is RemoveCode.LEASES:
            raise errors.HostInUse(
                f"host '{host_id}' holds {leases} lease(s); they end when reported or expired"
            )

    async def host_draining(self, host_id: str) -> bool:
        row = await self._db.fetchrow("host_draining", host_id)
        return bool(row and row["draining"])

    async def stream_states(self, host_ids: list[str]) -> list[StreamState]:
        """What the renewal streams of `host_ids` should have been pushed, in one statement
        for them all (a registered host each; the others have none)."""
        rows = await self._db.fetch("stream_states", host_ids)
        return [
            StreamState(
                r["host_id"],
                r["draining"],
                tuple(r["released"]),
                tuple(
                    CancelNotice(r["host_id"], LeaseId(lease), TaskId(task), attempt, epoch)
                    for lease, task, attempt, epoch in zip(
                        r["cancel_leases"],
                        r["cancel_tasks"],
                        r["cancel_attempts"],
                        r["cancel_epochs"],
                        strict=True,
                    )
                ),
            )
            for r in rows
        ]

    async def stream_state(self, host_id: str) -> StreamState:
        """`stream_states` of one host (a host not registered: nothing to push)."""
        found = await self.stream_states([host_id])
        return found[0] if found else StreamState(host_id)

    async def host_events(self, host_id: str, limit: int) -> list[HostEvent]:
        """The host's latest `limit` events, newest first."""
        rows = await self._db.fetch("host_events", host_id, limit)
        return [HostEvent(r["kind"], r["serial"], act(r)) for r in rows]


def _one_host(host_id: str | None, serial: str, hosts: list[str]) -> str:
    """The one host a device named by `serial` (on `host_id`, if given) is on."""
    if not hosts:
        where = f" on host '{host_id}'" if host_id else ""
        raise errors.DeviceNotFound(f"no device '{serial}'{where}")
    if len(hosts) > 1:
        raise errors.InvalidArgument(
            "host_id", f"device '{serial}' is on hosts {', '.join(hosts)}: name the host"
        )
    return hosts[0]


def _device(d: dict[str, Any]) -> DeviceInfo:
    task_id = d.get("task_id")
    return DeviceInfo(
        d["serial"],
        d["state"],
        d["model"],
        d["manufacturer"],
        d["sdk"],
        d["abi"],
        d["labels"] or {},
        TaskId(uuid.UUID(task_id)) if task_id else None,
        bool(d.get("cordoned")),
        DeviceHealth(
            d["serial"],
            d.get("condition") or "ready",
            d.get("condition_reason") or "",
            d.get("battery_percent"),
            d.get("temperature_celsius"),
            d.get("charging"),
            when(d.get("probed_at")),
        ),
    )


def _snapshots(device: DeviceInfo) -> list[str]:
    """The `snapshot/<name>` labels of a device: the snapshots it can load."""
    return [k for k in device.labels if k.startswith(SNAPSHOT_LABEL) and k != SNAPSHOT_LABEL]
