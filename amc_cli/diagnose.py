"""Why a call failed UNAVAILABLE, in words that say what to do.

UNAVAILABLE covers different troubles: nothing listens at the address; the control plane
is up but its database is down (its health service then says NOT_SERVING); or client and
server disagree about TLS, which gRPC reports only as `Socket closed` or a handshake
error. Only after such a failure (a working call costs nothing extra) the CLI asks the
health service and, when that cannot connect either, tries a TLS handshake of its own to
tell which it is.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# How long each probe may take: it runs only after a failure, to explain it.
PROBE_SECONDS = 2.0


@dataclass(frozen=True)
class Connection:
    """What the client tried: where, and with which TLS settings."""

    address: str
    ca_file: Path | None
    tls: bool

    @property
    def uses_tls(self) -> bool:
        return bool(self.ca_file or self.tls)


def unavailable(channel: grpc.Channel, conn: Connection, doing: str, details: str) -> str:
    """One line for a call that failed UNAVAILABLE (without the status code)."""
    serving = _health(channel, conn)
    if serving is False:
        return (
            f"{doing}: the control plane at {conn.address} is up but its database is "
            f"unavailable ({details}); try again once the database is back"
        )
    if serving is True:  # it answers: this was the server's own refusal
        return f"{doing}: {details}"
    tls_problem = _tls_mismatch(conn)
    if tls_problem:
        return f"cannot talk to the control plane at {conn.address}: {tls_problem}"
    if "connection refused" in details.lower():
        details = "connection refused: is it running, and is --addr (AMC_ADDR) right?"
    return f"cannot reach the control plane at {conn.address}: {details}"


def _health(channel: grpc.Channel, conn: Connection) -> bool | None:
    """True: serving; False: up, but not serving (its database is away); None: no answer."""
    stub = health_pb2_grpc.HealthStub(channel)
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=PROBE_SECONDS)
    except grpc.RpcError:
        return None
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def _tls_mismatch(conn: Connection) -> str | None:
    """What is wrong with the client's TLS settings for this server, if that is what
    failed; None when TLS is not the problem (or it cannot be told)."""
    where = _host_port(conn.address)
    if where is None:
        return None
    host, port = where
    if not conn.uses_tls:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        if _handshake(host, port, context) is None:
            return (
                "it serves TLS and this client spoke plaintext: add --tls (a certificate "
                "from a public CA) or --ca FILE (the CA that signed its certificate)"
            )
        return None
    try:
        context = ssl.create_default_context(cafile=conn.ca_file)
    except (OSError, ssl.SSLError):
        return None  # an unreadable --ca is reported before any call
    failure = _handshake(host, port, context)
    if isinstance(failure, ssl.SSLCertVerificationError):
        reason = failure.verify_message or "certificate verify failed"
        if conn.ca_file:
            fix = f"--ca {conn.ca_file} is not the CA that signed it; give the one that did"
        else:
            fix = "give --ca FILE with the CA that signed it (a self-signed server needs --ca)"
        return f"its TLS certificate is not trusted ({reason}): {fix}"
    if isinstance(failure, ssl.SSLError | ConnectionResetError | EOFError):
        flags = "--ca" if conn.ca_file else "--tls"
        return (
            f"it does not serve TLS and this client asked for it ({flags}): drop --tls and "
            "--ca (and AMC_TLS, AMC_CA)"
        )
    return None


def _handshake(host: str, port: int, context: ssl.SSLContext) -> BaseException | None:
    """None when a TLS handshake with host:port succeeds, else the error it ended with."""
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=PROBE_SECONDS) as raw:
            with context.wrap_socket(raw, server_hostname=host):
                return None
    except (OSError, EOFError) as exc:  # ssl.SSLError is an OSError
        return exc


def _host_port(address: str) -> tuple[str, int] | None:
    """`host:port` or `[v6]:port` as (host, port); None for other gRPC targets."""
    if "/" in address:
        return None
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)
