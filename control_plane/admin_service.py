"""amc.v1.Admin: bearer tokens, hosts and devices from the centre (cordon, drain, remove,
release from quarantine),
and fairness keys' shares of the phones, for operators. Each host operation is recorded in
host_events, each change of a share in fair_share_events, with the caller's token and the
reason given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from google.protobuf.message import Message

from amc.v1 import admin_pb2, admin_pb2_grpc
from control_plane import validate_admin
from control_plane.auth import new_token
from control_plane.convert import (
    fair_share_event_to_pb,
    fair_share_to_pb,
    host_event_to_pb,
    host_to_pb,
    timestamp,
    token_to_pb,
)
from control_plane.domain import FairShare, Role, TokenInfo
from control_plane.errors import FairnessKeyNotFound
from control_plane.lifecycle import HostEventKind
from control_plane.rpc import Context, TaskServicer, principal, rpc
from control_plane.store import Store

log = structlog.get_logger(__name__)


# ListFairShares answers at most this many keys (the most queued first).
MAX_KEYS = 500
# A cap raised or removed offers at most this many of the key's queued tasks to the parked
# Acquires (one per phone it may now take).
MAX_OFFERS = 1000


async def create_token(
    store: Store, role: Role, host_id: str | None, name: str, team: str = ""
) -> tuple[TokenInfo, str]:
    """Shared by the RPC and the `control-plane tokens create` bootstrap command."""
    validate_admin.token_binding(role, host_id, team=team)
    token_id, token, secret_hash = new_token()
    info = await store.tokens.create_token(token_id, name, role, host_id, secret_hash, team)
    log.info("token created", token_id=str(token_id), role=str(role), host_id=host_id, team=team)
    return info, token


def _room(cap_before: int | None, share: FairShare) -> int:
    """How many more of the key's tasks may start now that its share changed: none unless
    its cap was raised or removed (a weight orders tasks; it holds none back)."""
    if cap_before is None:
        return 0
    if share.max_devices is None:
        return MAX_OFFERS
    if share.max_devices <= cap_before:
        return 0
    return max(0, min(MAX_OFFERS, share.max_devices - share.running))


def _operation(name: str, kind: HostEventKind, device: bool = False) -> Callable[..., Any]:
    """The RPC `name` of AdminService: operation `kind` on a host, or on one device."""

    async def operation(self: AdminService, request: Any, context: Context) -> Message:
        if device:
            return await self._device_operation(request, kind)
        return await self._host_cordon(request, kind)

    operation.__name__ = operation.__qualname__ = name
    return rpc(operation)


class AdminService(TaskServicer, admin_pb2_grpc.AdminServicer):
    @rpc
    async def CreateToken(
        self, request: admin_pb2.CreateTokenRequest, context: Context
    ) -> admin_pb2.CreateTokenResponse:
        role, host_id = validate_admin.create_token(request)
        info, token = await create_token(self.store, role, host_id, request.name, request.team)
        return admin_pb2.CreateTokenResponse(info=token_to_pb(info), token=token)

    @rpc
    async def RevokeToken(
        self, request: admin_pb2.RevokeTokenRequest, context: Context
    ) -> admin_pb2.RevokeTokenResponse:
        token_id = validate_admin.token_id(request.token_id)
        info = await self.store.tokens.revoke_token(token_id)
        self.auth.forget(token_id)
        log.info("token revoked", token_id=str(token_id))
        return admin_pb2.RevokeTokenResponse(info=token_to_pb(info))

    @rpc
    async def ListTokens(
        self, request: admin_pb2.ListTokensRequest, context: Context
    ) -> admin_pb2.ListTokensResponse:
        tokens = await self.store.tokens.list_tokens()
        return admin_pb2.ListTokensResponse(tokens=[token_to_pb(t) for t in tokens])

    # -- hosts and devices -----------------------------------------------------------------

    async def _host_cordon(
        self, request: validate_admin.HostRequest, kind: HostEventKind
    ) -> admin_pb2.HostOperationResponse:
        host_id, reason = validate_admin.host_operation(request)
        cordon = kind is not HostEventKind.UNCORDON
        drain = kind is HostEventKind.DRAIN
        who = principal()
        leases = await self.store.hosts.set_host_cordon(host_id, cordon, drain, kind, who, reason)
        self.effects.host_changed(host_id, kind, who, reason, leases=leases)
        host = await self.store.hosts.get_host(self.settings.lease_ttl, host_id)
        return admin_pb2.HostOperationResponse(host=host_to_pb(host), leases=leases)

    async def _device_operation(
        self, request: validate_admin.DeviceRequest, kind: HostEventKind
    ) -> admin_pb2.DeviceOperationResponse:
        """Cordon or uncordon a device, or release it from quarantine (RELEASE)."""
        host_id, serial, reason = validate_admin.device_operation(request)
        who = principal()
        if kind is HostEventKind.RELEASE:
            host_id = await self.store.hosts.release_device(
                host_id, serial, self.settings.lease_ttl, who, reason
            )
            self.effects.device_released(host_id, serial, who, reason)
        else:
            cordon = kind is HostEventKind.CORDON
            host_id = await self.store.hosts.set_device_cordon(
                host_id, serial, cordon, kind, who, reason
            )
            self.effects.host_changed(host_id, kind, who, reason, serial=serial)
        host = await self.store.hosts.get_host(self.settings.lease_ttl, host_id)
        return admin_pb2.DeviceOperationResponse(host=host_to_pb(host))

    CordonHost = _operation("CordonHost", HostEventKind.CORDON)
    UncordonHost = _operation("UncordonHost", HostEventKind.UNCORDON)
    DrainHost = _operation("DrainHost", HostEventKind.DRAIN)
    CordonDevice = _operation("CordonDevice", HostEventKind.CORDON, device=True)
    UncordonDevice = _operation("UncordonDevice", HostEventKind.UNCORDON, device=True)
    ReleaseDevice = _operation("ReleaseDevice", HostEventKind.RELEASE, device=True)

    @rpc
    async def RemoveHost(
        self, request: admin_pb2.RemoveHostRequest, context: Context
    ) -> admin_pb2.RemoveHostResponse:
        host_id, reason = validate_admin.host_operation(request)
        who = principal()
        await self.store.hosts.remove_host(host_id, self.settings.lease_ttl, who, reason)
        self.effects.host_logged(host_id, HostEventKind.REMOVE, who, reason)
        return admin_pb2.RemoveHostResponse()

    @rpc
    async def GetHost(
        self, request: admin_pb2.GetHostRequest, context: Context
    ) -> admin_pb2.GetHostResponse:
        host_id, limit = validate_admin.get_host(request)
        host = await self.store.hosts.get_host(self.settings.lease_ttl, host_id)
        events = await self.store.hosts.host_events(host_id, limit)
        return admin_pb2.GetHostResponse(
            host=host_to_pb(host),
            leases=sum(1 for d in host.devices if d.task_id is not None),
            events=[host_event_to_pb(e) for e in events],
        )

    # -- fair shares -------------------------------------------------------------------------

    @rpc
    async def SetFairShare(
        self, request: admin_pb2.SetFairShareRequest, context: Context
    ) -> admin_pb2.SetFairShareResponse:
        key, change, reason = validate_admin.set_fair_share(request)
        who = principal()
        cap_before = await self.store.queue.set_fair_share(key, change, who, reason)
        (share,), _ = await self.store.queue.fair_shares(1, key)
        room = _room(cap_before, share)
        heads = await self.store.queue.fair_share_heads(key, room) if room else []
        self.effects.fair_share_set(share, who, reason, heads)
        return admin_pb2.SetFairShareResponse(share=fair_share_to_pb(share))

    @rpc
    async def ListFairShares(
        self, request: admin_pb2.ListFairSharesRequest, context: Context
    ) -> admin_pb2.ListFairSharesResponse:
        shares, counted_at = await self.store.queue.fair_shares(MAX_KEYS)
        return admin_pb2.ListFairSharesResponse(
            shares=[fair_share_to_pb(s) for s in shares], counted_at=timestamp(counted_at)
        )

    @rpc
    async def GetFairShare(
        self, request: admin_pb2.GetFairShareRequest, context: Context
    ) -> admin_pb2.GetFairShareResponse:
        key, limit = validate_admin.get_fair_share(request)
        shares, counted_at = await self.store.queue.fair_shares(1, key)
        events = await self.store.queue.fair_share_events(key, limit)
        if not shares and not events:
            raise FairnessKeyNotFound(
                f"no fairness key '{key}': no share set, and no task of it queued or running"
            )
        share = shares[0] if shares else FairShare(key)
        return admin_pb2.GetFairShareResponse(
            share=fair_share_to_pb(share),
            events=[fair_share_event_to_pb(e) for e in events],
            counted_at=timestamp(counted_at),
        )
