"""amc.v1.Admin: bearer tokens, and hosts and devices from the centre (cordon, drain,
remove), for operators. Each host operation is recorded in host_events with the caller's
token and the reason given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from google.protobuf.message import Message

from amc.v1 import admin_pb2, admin_pb2_grpc
from control_plane import validate
from control_plane.auth import new_token
from control_plane.convert import host_event_to_pb, host_to_pb, token_to_pb
from control_plane.domain import Role, TokenInfo
from control_plane.lifecycle import HostEventKind
from control_plane.rpc import Context, TaskServicer, principal, rpc
from control_plane.store import Store

log = structlog.get_logger(__name__)


async def create_token(
    store: Store, role: Role, host_id: str | None, name: str
) -> tuple[TokenInfo, str]:
    """Shared by the RPC and the `control-plane tokens create` bootstrap command."""
    validate.token_binding(role, host_id)
    token_id, token, secret_hash = new_token()
    info = await store.create_token(token_id, name, role, host_id, secret_hash)
    log.info("token created", token_id=str(token_id), role=str(role), host_id=host_id)
    return info, token


def _operation(name: str, kind: HostEventKind, device: bool = False) -> Callable[..., Any]:
    """The RPC `name` of AdminService: operation `kind` on a host, or on one device."""

    async def operation(self: AdminService, request: Any, context: Context) -> Message:
        if device:
            return await self._device_cordon(request, kind)
        return await self._host_cordon(request, kind)

    operation.__name__ = operation.__qualname__ = name
    return rpc(operation)


class AdminService(TaskServicer, admin_pb2_grpc.AdminServicer):
    SERVICE = "amc.v1.Admin"

    @rpc
    async def CreateToken(
        self, request: admin_pb2.CreateTokenRequest, context: Context
    ) -> admin_pb2.CreateTokenResponse:
        role, host_id = validate.create_token(request)
        info, token = await create_token(self.store, role, host_id, request.name)
        return admin_pb2.CreateTokenResponse(info=token_to_pb(info), token=token)

    @rpc
    async def RevokeToken(
        self, request: admin_pb2.RevokeTokenRequest, context: Context
    ) -> admin_pb2.RevokeTokenResponse:
        token_id = validate.token_id(request.token_id)
        info = await self.store.revoke_token(token_id)
        self.auth.forget(token_id)
        log.info("token revoked", token_id=str(token_id))
        return admin_pb2.RevokeTokenResponse(info=token_to_pb(info))

    @rpc
    async def ListTokens(
        self, request: admin_pb2.ListTokensRequest, context: Context
    ) -> admin_pb2.ListTokensResponse:
        tokens = await self.store.list_tokens()
        return admin_pb2.ListTokensResponse(tokens=[token_to_pb(t) for t in tokens])

    # -- hosts and devices -----------------------------------------------------------------

    async def _host_cordon(
        self, request: validate.HostRequest, kind: HostEventKind
    ) -> admin_pb2.HostOperationResponse:
        host_id, reason = validate.host_operation(request)
        cordon = kind is not HostEventKind.UNCORDON
        drain = kind is HostEventKind.DRAIN
        who = principal()
        leases = await self.store.set_host_cordon(host_id, cordon, drain, kind, who, reason)
        self.effects.host_changed(host_id, kind, who, reason, leases=leases)
        host = await self.store.get_host(self.settings.lease_ttl, host_id)
        return admin_pb2.HostOperationResponse(host=host_to_pb(host), leases=leases)

    async def _device_cordon(
        self, request: validate.DeviceRequest, kind: HostEventKind
    ) -> admin_pb2.DeviceOperationResponse:
        host_id, serial, reason = validate.device_operation(request)
        who = principal()
        cordon = kind is HostEventKind.CORDON
        host_id = await self.store.set_device_cordon(host_id, serial, cordon, kind, who, reason)
        self.effects.host_changed(host_id, kind, who, reason, serial=serial)
        host = await self.store.get_host(self.settings.lease_ttl, host_id)
        return admin_pb2.DeviceOperationResponse(host=host_to_pb(host))

    CordonHost = _operation("CordonHost", HostEventKind.CORDON)
    UncordonHost = _operation("UncordonHost", HostEventKind.UNCORDON)
    DrainHost = _operation("DrainHost", HostEventKind.DRAIN)
    CordonDevice = _operation("CordonDevice", HostEventKind.CORDON, device=True)
    UncordonDevice = _operation("UncordonDevice", HostEventKind.UNCORDON, device=True)

    @rpc
    async def RemoveHost(
        self, request: admin_pb2.RemoveHostRequest, context: Context
    ) -> admin_pb2.RemoveHostResponse:
        host_id, reason = validate.host_operation(request)
        who = principal()
        await self.store.remove_host(host_id, self.settings.lease_ttl, who, reason)
        self.effects.host_logged(host_id, HostEventKind.REMOVE, who, reason)
        return admin_pb2.RemoveHostResponse()

    @rpc
    async def GetHost(
        self, request: admin_pb2.GetHostRequest, context: Context
    ) -> admin_pb2.GetHostResponse:
        host_id, limit = validate.get_host(request)
        host = await self.store.get_host(self.settings.lease_ttl, host_id)
        events = await self.store.host_events(host_id, limit)
        return admin_pb2.GetHostResponse(
            host=host_to_pb(host),
            leases=sum(1 for d in host.devices if d.task_id is not None),
            events=[host_event_to_pb(e) for e in events],
        )
