"""The installed version, for each command's --version (from the package metadata)."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "agentic-mobile-control"


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # imported from a checkout that was never installed
        return "unknown"


def version_line(prog: str) -> str:
    """`prog 0.1.0`: what `--version` prints."""
    return f"{prog} {version()}"
