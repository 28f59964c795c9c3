"""What was done on simulated phones (host_agent.simulated): one record per action, kept
in memory and, when a path is given, appended to a JSON-lines file as it ends, so a test
can check from outside that two attempts never drove the same phone at the same time."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ActionRecord:
    serial: str
    action: str
    args: dict[str, Any]
    started_monotonic: float
    ended_monotonic: float
    started_wall: float
    ended_wall: float
    # "ok", "lost" or "cancelled" (which is also how a caller's timeout looks from here).
    outcome: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass
class Recorder:
    log_path: Path | None
    records: list[ActionRecord] = field(default_factory=list)

    def add(self, record: ActionRecord) -> None:
        self.records.append(record)
        if self.log_path is not None:
            # Open, write, close per line: several sources (processes) may share the file.
            with self.log_path.open("a", encoding="utf-8") as log:
                log.write(record.to_json() + "\n")
                log.flush()
