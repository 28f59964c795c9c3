"""The fake phones' end of adb's sync protocol: host_agent.simulated_sync (the simulated
phones' own) on a `FakePhone`'s files, each push recorded among its commands.

`stdin_size` reads the size an install from stdin announces (`cmd package install -S N`).
"""

from __future__ import annotations

import time

from host_agent.simulated_sync import Read, Write, stdin_size
from host_agent.simulated_sync import serve_sync as _serve_sync
from tests.support.fakes.phone import FakePhone

__all__ = ["serve_sync", "stdin_size"]


async def serve_sync(phone: FakePhone, read: Read, write: Write) -> None:
    """Answer sync packets on `phone`'s files until QUIT or the end of the connection."""

    def pushed(path: str) -> None:
        phone.commands.append((time.monotonic(), f"push {path}"))

    await _serve_sync(phone.files, read, write, pushed)
