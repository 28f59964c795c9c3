"""`host-agent`: the host agent as a process (its flags in host_agent.flags).

Exit codes: 0 after a clean drain (SIGTERM or SIGINT), 1 when the agent cannot go on
(e.g. the control plane refuses its token), 2 for bad flags or settings.

Failing, the agent logs one line: what went wrong, the control plane's words and what to
do. `--debug` (or AMC_DEBUG=1) adds the traceback, which never shows local variables; the
token never appears in any line.
"""

from __future__ import annotations

import os

# No gRPC C-core lines (a failed TLS handshake, say) on stderr: the agent logs what went
# wrong itself, once. Set before grpc is imported; the user's own settings win.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")
os.environ.setdefault("GRPC_TRACE", "")

import asyncio
import signal
from collections.abc import Sequence

import grpc
import prometheus_client
import structlog

from amc_common import logs
from amc_common.build import record_build
from amc_common.channel import aio_channel
from amc_common.device_selector import HOST_LABEL
from amc_common.systemd import Notifier
from host_agent.adb import AdbSource
from host_agent.agent import Agent
from host_agent.config import Config
from host_agent.devices import DeviceSource
from host_agent.emulator import EmulatorSource
from host_agent.flags import parse
from host_agent.simulated import SimulatedSource

log = structlog.get_logger("host_agent")
# gRPC's default reconnect backoff grows to 120 s: far too slow for a host whose leases
# self-fence after one TTL. Back off to a few seconds at most.
RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 3000),
]


def main(argv: Sequence[str] | None = None) -> int:
    config = parse(argv)
    logs.configure(config.log_format, config.log_level)  # type: ignore[arg-type]
    try:
        return asyncio.run(serve(config))
    except Exception as exc:  # before the agent ran: the CA file, the metrics port, …
        _failed(exc, config)
        return 1


async def serve(config: Config) -> int:
    source = _device_source(config)
    channel = aio_channel(
        config.control_plane, config.token, config.ca, tls=config.tls, options=RECONNECT
    )
    if config.token is None:
        log.warning(
            "no token (--insecure): only a control plane without authentication accepts this"
        )
    if config.metrics_listen:
        _serve_metrics(config.metrics_listen)
    record_build("host-agent")
    notifier = Notifier()
    agent = Agent(config.agent, source, channel, notifier)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    log.info(
        "host agent starting",
        host_id=config.agent.host_id,
        control_plane=config.control_plane,
        tls=bool(config.ca or config.tls),
        devices=(
            f"{config.simulated_devices} simulated"
            if config.simulated_devices
            else f"adb at {config.adb_host}:{config.adb_port}"
        ),
        emulator_pools=[p.name for p in config.emulators.pools] if config.emulators else None,
        systemd=notifier.enabled,
    )
    faults = (
        asyncio.create_task(source.faults.follow(config.sim_faults))
        if isinstance(source, SimulatedSource) and config.sim_faults
        else None
    )
    try:
        await agent.run()
    except Exception as exc:
        _failed(exc, config)
        return 1
    finally:
        if faults is not None:
            faults.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await channel.close()
        await source.close()
        notifier.close()
    return 0


def _serve_metrics(listen: str) -> None:
    """/metrics on `listen`; a port taken is named as the metrics port, not blamed on the
    control plane the failure line also names."""
    host, _, port = listen.rpartition(":")
    try:
        prometheus_client.start_http_server(int(port), addr=host or "127.0.0.1")
    except OSError as exc:
        raise OSError(exc.errno, f"--metrics-listen {listen}: {exc.strerror or exc}") from None


# What to do when the control plane refuses the agent for good.
_HINTS = {
    grpc.StatusCode.UNAUTHENTICATED: (
        "the control plane does not accept this token (unknown, revoked or malformed): "
        "check --token-file, $AMC_TOKEN_FILE or $AMC_TOKEN"
    ),
    grpc.StatusCode.PERMISSION_DENIED: (
        "a host token acts only as the host it was made for: give the --host-id it was "
        "made for, or a host token for this host (amc tokens create --role host "
        "--host-id {host_id})"
    ),
    grpc.StatusCode.INVALID_ARGUMENT: "check --host-id and --label",
}


def _failed(exc: BaseException, config: Config) -> None:
    """The one line saying why the agent stops (with the traceback only under --debug)."""
    leaf = exc
    while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
        leaf = leaf.exceptions[0]
    code = leaf.code() if isinstance(leaf, grpc.aio.AioRpcError) else None
    hint = _HINTS.get(code, "") if code is not None else ""
    logs.failure(
        log,
        "host agent failed",
        exc,
        debug=config.debug,
        hint=hint.format(host_id=config.agent.host_id),
        control_plane=config.control_plane,
    )


def _device_source(config: Config) -> DeviceSource:
    if config.simulated_devices:
        source = SimulatedSource(
            config.simulated_devices, delay=config.sim_delay, action_log=config.action_log
        )
        source.call_timeout = config.adb_timeout  # a hung phone's calls time out as adb's
        return source
    adb = AdbSource(
        config.adb_host,
        config.adb_port,
        call_timeout=config.adb_timeout,
        scrcpy_server=config.scrcpy_server,
        video_max_fps=config.agent.screen_video_max_fps,
    )
    if config.emulators is None:
        return adb
    agent = config.agent
    return EmulatorSource(adb, config.emulators, {**agent.labels, HOST_LABEL: agent.host_id})


if __name__ == "__main__":
    raise SystemExit(main())
