"""Just enough of sd_notify(3) for a `Type=notify` unit, without libsystemd.

systemd passes a datagram socket in $NOTIFY_SOCKET (a path, or an abstract address
written with a leading "@"); each datagram is newline-separated `KEY=value` lines. The host
agent sends READY=1 after its first successful registration, the control plane once it
serves; both send WATCHDOG=1 at half of $WATCHDOG_USEC, STOPPING=1 when they start to stop
(the agent's drain) and STATUS=… lines for `systemctl status`. Outside systemd (no
$NOTIFY_SOCKET) every call is a no-op.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping

import structlog

log = structlog.get_logger(__name__)


def _address(raw: str) -> str | bytes:
    # Abstract socket names start with NUL on the wire; systemd writes it as "@".
    if raw.startswith("@"):
        return b"\0" + raw[1:].encode()
    return raw


class Notifier:
    def __init__(self, address: str | None = None, environ: Mapping[str, str] = os.environ) -> None:
        raw = address if address is not None else environ.get("NOTIFY_SOCKET", "")
        self._address = _address(raw) if raw else None
        self._socket: socket.socket | None = None
        self._warned = False
        self.watchdog_interval = watchdog_interval(environ)

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *lines: str) -> bool:
        """Send one datagram; False (logged once) if it could not be sent."""
        if self._address is None:
            return False
        try:
            if self._socket is None:
                self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                # A full receive queue must not stall the event loop; the message is lost.
                self._socket.setblocking(False)
            self._socket.sendto("\n".join(lines).encode(), self._address)
        except OSError as exc:
            if not self._warned:
                log.warning("systemd notification failed", error=str(exc))
                self._warned = True
            return False
        return True

    def ready(self, status: str) -> bool:
        return self.notify("READY=1", f"STATUS={status}")

    def status(self, status: str) -> bool:
        return self.notify(f"STATUS={status}")

    def stopping(self, status: str) -> bool:
        return self.notify("STOPPING=1", f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    async def pings(self) -> None:
        """WATCHDOG=1 from the event loop, if systemd asked for it (WatchdogSec=): a loop
        that stands still stops pinging, and systemd restarts the process."""
        if self.watchdog_interval is None:
            return
        while True:
            self.watchdog()
            await asyncio.sleep(self.watchdog_interval)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def watchdog_interval(environ: Mapping[str, str] = os.environ) -> float | None:
    """Seconds between WATCHDOG=1 pings (half the timeout), or None without a watchdog.

    $WATCHDOG_PID, when set, names the process the watchdog is meant for: a child that
    inherited the variables must not ping for its parent.
    """
    usec = environ.get("WATCHDOG_USEC", "")
    pid = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 1_000_000 / 2
