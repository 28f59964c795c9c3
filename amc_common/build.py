"""`amc_build_info`: which build of which AMC program is running (prometheus-client)."""

from __future__ import annotations

import platform
from importlib import metadata

from prometheus_client import Gauge

DISTRIBUTION = "agentic-mobile-control"

BUILD_INFO = Gauge(
    "amc_build_info",
    "Always 1: the running AMC program, its version and its Python",
    ["program", "version", "python"],
)


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def record_build(program: str) -> None:
    BUILD_INFO.labels(program, version(), platform.python_version()).set(1)
