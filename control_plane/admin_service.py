"""amc.v1.Admin: bearer tokens, for operators."""

from __future__ import annotations

import structlog

from amc.v1 import admin_pb2, admin_pb2_grpc
from control_plane import validate
from control_plane.auth import Authenticator, new_token
from control_plane.convert import token_to_pb
from control_plane.domain import Role, TokenInfo
from control_plane.rpc import Context, Servicer, rpc
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


class AdminService(Servicer, admin_pb2_grpc.AdminServicer):
    SERVICE = "amc.v1.Admin"

    def __init__(self, auth: Authenticator, store: Store) -> None:
        super().__init__(auth)
        self.store = store

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
