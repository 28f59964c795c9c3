"""The action log of simulated phones: each action they were asked for (a clean's commands
as `clean` actions), kept in memory and appended as one JSON line to a file that several
processes may share, so a test or a chaos run can tell from outside what drove which phone
when."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ActionRecord:
    """One action a simulated phone was asked for, when and how it ended."""

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
    """The actions (and, apart, a clean's commands) in memory, each also appended to the
    action log file when there is one."""

    log_path: Path | None
    records: list[ActionRecord] = field(default_factory=list)
    cleans: list[ActionRecord] = field(default_factory=list)

    def add(self, record: ActionRecord) -> None:
        (self.cleans if record.action == "clean" else self.records).append(record)
        if self.log_path is not None:
            # Open, write, close per line: several sources (processes) may share the file.
            with self.log_path.open("a", encoding="utf-8") as log:
                log.write(record.to_json() + "\n")
                log.flush()
