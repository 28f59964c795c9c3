"""Loads `queries.sql`: blocks that start with `-- name: <name>`."""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load(text: str) -> dict[str, str]:
    parts = _NAME.split(text)
    return {name: body.strip() for name, body in zip(parts[1::2], parts[2::2], strict=True)}


QUERIES = load(resources.files(__package__).joinpath("queries.sql").read_text("utf-8"))
