"""Loads the store's statements: the blocks of `store/*.sql` that start with
`-- name: <name>`, each file beside the module that sends its statements."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load(text: str) -> dict[str, str]:
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def load_all() -> dict[str, str]:
    """Every statement of every `store/*.sql`, by name; a name used twice is an error."""
    found: dict[str, str] = {}
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            statements = load(entry.read_text("utf-8"))
            twice = found.keys() & statements.keys()
            assert not twice, f"{entry.name} names {sorted(twice)} again"
            found.update(statements)
    return found


QUERIES = load_all()
