"""A control plane serving the console on a real HTTP port, for the console's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from control_plane.config import Settings
from control_plane.server import ControlPlane
from tests.support import Farm

SETTINGS = Settings(
    lease_ttl=timedelta(seconds=5),
    sweep_interval=timedelta(seconds=0.1),
    watch_refresh=timedelta(seconds=1),
    queue_count_every=timedelta(seconds=0.2),
)


@asynccontextmanager
async def console_farm(
    database_url: str, *, insecure: bool = False, settings: Settings = SETTINGS
) -> AsyncIterator[Farm]:
    """A Farm whose control plane also serves the console (`console_url`)."""
    farm = Farm(database_url, settings)
    farm.plane = ControlPlane(
        database_url,
        settings,
        listen="127.0.0.1:0",
        insecure=insecure,
        http_listen="127.0.0.1:0",
    )
    await farm.plane.start()
    await farm.reconnect_db()
    try:
        yield farm
    finally:
        await farm.stop()


def console_url(farm: Farm, path: str = "/") -> str:
    assert farm.plane is not None
    return f"http://127.0.0.1:{farm.plane.http_port}{path}"
