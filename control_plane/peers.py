"""Channels to the other replicas of the farm (`Peers`), for the calls a replica relays to
the one that holds the other end: a session's host call to its client's replica
(control_plane.session_hosts, with the host's credentials: `RelayedCall`), an adb door's
calls to the same replica (control_plane.adb_doors, with their caller's), a phone's
screen from the replica holding its host's feed (control_plane.screens, made as the
replica: control_plane.auth)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import grpc

from amc.v1 import lease_pb2_grpc, scheduler_pb2_grpc

if TYPE_CHECKING:
    from control_plane.rpc import Context, TaskServicer

# A screen relay's channel: the receive window stays at 64 KiB (a few frames in transit).
SCREEN_OPTIONS = [("grpc.http2.bdp_probe", 0)]
# A relayed call carries what authenticated the host; nothing else of its metadata.
FORWARDED = ("authorization",)
PEER_OPTIONS = [
    # A screen's frame relayed is at most what a host may send (the server's 1 MiB), and
    # a little more for the host's id.
    ("grpc.max_receive_message_length", 2 << 20),
    ("grpc.max_send_message_length", 2 << 20),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
]


class Peers:
    """Channels to the other replicas, by address, opened on first use and kept for the
    replica's life (a farm has a few replicas). TLS when this replica serves TLS, trusting
    `roots` (its own certificate chain: the replicas of a farm share one)."""

    def __init__(self, roots: bytes | None) -> None:
        self._roots = roots
        self._channels: dict[str, grpc.aio.Channel] = {}

    def lease(self, address: str) -> lease_pb2_grpc.LeaseStub:
        """For an adb door's host call forwarded to the replica holding its client."""
        return lease_pb2_grpc.LeaseStub(self._channel(address))

    def raw_stream(
        self, address: str, method: str, serializer: Callable[[Any], bytes]
    ) -> grpc.aio.StreamStreamMultiCallable[Any, bytes]:
        """A bidirectional-streaming `method` of the replica at `address` whose requests
        are written by `serializer` and whose responses are read as their bytes."""
        return self._channel(address).stream_stream(
            method, request_serializer=serializer, response_deserializer=None
        )

    def doors(self, address: str) -> scheduler_pb2_grpc.SchedulerStub:
        """For an adb door's client call relayed to the replica holding its session: the
        channel the sessions' host calls take (bulk bytes: its window grows as it likes)."""
        return scheduler_pb2_grpc.SchedulerStub(self._channel(address))

    def scheduler(self, address: str) -> scheduler_pb2_grpc.SchedulerStub:
        """For a screen's frames relayed from the replica holding its host's feed: a
        channel of its own whose flow-control window stays small (no BDP probing), so a
        relay that reads slowly holds a few frames in transit, not seconds of them."""
        return scheduler_pb2_grpc.SchedulerStub(self._channel(address, screens=True))

    def _channel(self, address: str, *, screens: bool = False) -> grpc.aio.Channel:
        key = f"screens {address}" if screens else address
        channel = self._channels.get(key)
        if channel is None:
            options = [*PEER_OPTIONS, *SCREEN_OPTIONS] if screens else PEER_OPTIONS
            if self._roots is None:
                channel = grpc.aio.insecure_channel(address, options=options)
            else:
                creds = grpc.ssl_channel_credentials(root_certificates=self._roots)
                channel = grpc.aio.secure_channel(address, creds, options=options)
            self._channels[key] = channel
        return channel

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


class RelayedCall:
    """A call this replica may relay to another (over the servicer's `Peers`): what
    authenticated it goes along, with `RELAYED_BY` (this replica's id); a call that came
    relayed is never relayed on."""

    RELAYED_BY = ""

    def __init__(self, service: TaskServicer, context: Context) -> None:
        self._svc = service
        self._peers = service.peers
        self._metadata: Sequence[tuple[str, Any]] = [
            (key, value) for key, value in context.invocation_metadata() or ()
        ]

    @property
    def relayed(self) -> bool:
        """This call came from another replica."""
        return any(key == self.RELAYED_BY for key, _ in self._metadata)

    def forwarded(self) -> list[tuple[str, Any]]:
        """The metadata of the call relayed from this one."""
        metadata = [(k, v) for k, v in self._metadata if k in FORWARDED]
        metadata.append((self.RELAYED_BY, self._svc.hub.replica))
        return metadata
