"""Checks on amc.v1.Admin's requests, at the gRPC edge: tokens, the operations on hosts
and devices, fair shares. Each problem names its field; the limits and the rules every
field follows are control_plane.validate's."""

from __future__ import annotations

import uuid

from amc.v1 import admin_pb2
from control_plane.convert import ROLE_FROM_PB
from control_plane.domain import Role, ShareChange
from control_plane.errors import InvalidArgument
from control_plane.validate import (
    DEFAULT_HOST_EVENTS,
    MAX_HOST_EVENTS,
    MAX_KEY,
    identifier,
    no_nul,
    printable,
    reason,
    uuid_field,
)

HostRequest = (
    admin_pb2.CordonHostRequest
    | admin_pb2.UncordonHostRequest
    | admin_pb2.DrainHostRequest
    | admin_pb2.RemoveHostRequest
)
DeviceRequest = (
    admin_pb2.CordonDeviceRequest | admin_pb2.UncordonDeviceRequest | admin_pb2.ReleaseDeviceRequest
)


def token_id(value: str, field: str = "token_id") -> uuid.UUID:
    return uuid_field(value, field, "token id")


def token_name(value: str, field: str = "name") -> str:
    """A token's name: free text on one line, bounded."""
    if len(value) > MAX_KEY:
        raise InvalidArgument(field, f"longer than {MAX_KEY} characters")
    no_nul(value, field)
    printable(value, field)
    return value


def create_token(req: admin_pb2.CreateTokenRequest) -> tuple[Role, str | None]:
    """The role and the host (None: no host) of the token asked for."""
    if req.role not in ROLE_FROM_PB:
        raise InvalidArgument("role", "must be ROLE_CLIENT, ROLE_OPERATOR or ROLE_HOST")
    host_id = identifier(req.host_id, "host_id", required=False) or None
    token_name(req.name)
    identifier(req.team, "team", required=False)
    return ROLE_FROM_PB[req.role], host_id


def token_binding(role: Role, host_id: str | None, field: str = "host_id", team: str = "") -> None:
    """Host tokens, and only they, are bound to a host; they submit no tasks, so they have
    no team."""
    if role is Role.HOST and not host_id:
        raise InvalidArgument(field, "required for a host token")
    if role is not Role.HOST and host_id:
        raise InvalidArgument(field, "only host tokens are bound to a host")
    if role is Role.HOST and team:
        raise InvalidArgument("team", "host tokens submit no tasks, so they have no team")


# A fair share's bounds (fair_shares' checks): a weight, and the most phones a cap may say.
MAX_WEIGHT = 1000
MAX_CAP = 100_000


def set_fair_share(req: admin_pb2.SetFairShareRequest) -> tuple[str, ShareChange, str]:
    """(key, the change, reason) of SetFairShare; something must change."""
    key = identifier(req.fairness_key, "fairness_key")
    if not 0 <= req.weight <= MAX_WEIGHT:
        raise InvalidArgument(
            "weight", f"must be between 1 and {MAX_WEIGHT} (0 leaves it as it is)"
        )
    cap = req.max_devices if req.HasField("max_devices") else None
    if cap is not None and not 0 <= cap <= MAX_CAP:
        raise InvalidArgument("max_devices", f"must be between 0 and {MAX_CAP}")
    if cap is not None and req.clear_max_devices:
        raise InvalidArgument("clear_max_devices", "give max_devices or clear it, not both")
    if not (req.weight or cap is not None or req.clear_max_devices):
        raise InvalidArgument(
            "weight", "nothing to set: give weight, max_devices or clear_max_devices"
        )
    change = ShareChange(req.weight or None, cap, req.clear_max_devices)
    return key, change, reason(req.reason)


def get_fair_share(req: admin_pb2.GetFairShareRequest) -> tuple[str, int]:
    """(key, how many events: 20 by default, at most 1000)."""
    if not 0 <= req.events <= MAX_HOST_EVENTS:
        raise InvalidArgument("events", f"from 0 to {MAX_HOST_EVENTS}")
    return identifier(req.fairness_key, "fairness_key"), req.events or DEFAULT_HOST_EVENTS


def host_operation(req: HostRequest) -> tuple[str, str]:
    """(host id, reason) of Cordon-, Uncordon-, Drain- and RemoveHost."""
    return identifier(req.host_id, "host_id"), reason(req.reason)


def device_operation(req: DeviceRequest) -> tuple[str | None, str, str]:
    """(host id or None, serial, reason) of Cordon-, Uncordon- and ReleaseDevice."""
    host_id = identifier(req.host_id, "host_id", required=False) or None
    return host_id, identifier(req.serial, "serial"), reason(req.reason)


def get_host(req: admin_pb2.GetHostRequest) -> tuple[str, int]:
    """(host id, how many events: 20 by default, at most 1000)."""
    if not 0 <= req.events <= MAX_HOST_EVENTS:
        raise InvalidArgument("events", f"from 0 to {MAX_HOST_EVENTS}")
    return identifier(req.host_id, "host_id"), req.events or DEFAULT_HOST_EVENTS
