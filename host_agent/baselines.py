"""Each phone's baseline: the state a clean between leases brings it back to — the
third-party packages it had and the files under its file roots when the host agent first
saw it (taken to be clean then), unless its cleaning profile names the packages.

Kept in memory, and in a JSON file when the agent is given one (`--clean-baselines`), so a
restarted agent cleans against the baseline recorded before rather than recording the
phone as it finds it (a lease's leftovers included, had it stopped mid-lease). The file is
written whole and renamed into place: a crash leaves the old one or the new one. Delete a
phone's entry (or the file) to have its baseline recorded again at its next first sight.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Baseline:
    """Third-party packages, and every path under `roots` (the file roots it was listed
    with), as first seen."""

    packages: frozenset[str]
    files: frozenset[str]
    roots: tuple[str, ...]


class BaselineError(Exception):
    """The baselines file cannot be read or written; the message is one line."""


class Baselines:
    """Every phone's baseline by serial, kept in `path` when one is given."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._known: dict[str, Baseline] = {}
        if path is not None and path.exists():
            self._known = _read(path)

    def get(self, serial: str) -> Baseline | None:
        return self._known.get(serial)

    def put(self, serial: str, baseline: Baseline) -> None:
        self._known[serial] = baseline
        log.info(
            "baseline recorded",
            device=serial,
            packages=len(baseline.packages),
            files=len(baseline.files),
        )
        if self.path is not None:
            _write(self.path, self._known)


def _read(path: Path) -> dict[str, Baseline]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return {
            serial: Baseline(
                frozenset(entry["packages"]), frozenset(entry["files"]), tuple(entry["roots"])
            )
            for serial, entry in data.items()
        }
    except OSError as exc:
        raise BaselineError(f"cannot read {path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BaselineError(f"{path} is not a baselines file: {exc}") from None


def _write(path: Path, known: dict[str, Baseline]) -> None:
    data = {
        serial: {"packages": sorted(b.packages), "files": sorted(b.files), "roots": list(b.roots)}
        for serial, b in sorted(known.items())
    }
    part = path.with_name(path.name + ".part")
    try:
        part.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        os.replace(part, path)
    except OSError as exc:
        # Kept in memory still: the phone is cleaned against it while this process runs.
        log.warning("baselines not saved", path=str(path), error=exc.strerror)
