"""Reading a task-spec file: its text (a path, or stdin for `-`), parsed as JSON or YAML
into plain values, remembering the line of each mapping, list and item (YAML) so a
problem found later names its line. Duplicate keys are refused."""

from __future__ import annotations

import json
import sys
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from amc_cli.errors import BadInput, SpecError

STDIN = "-"


def read(path: str) -> tuple[str, str]:
    if path == STDIN:
        return "<stdin>", sys.stdin.read()
    try:
        return path, Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise BadInput(f"cannot read spec file {path}: {exc.strerror or exc}") from None


@dataclass
class Doc:
    """A parsed document and the line of each container and item (YAML only)."""

    source: str
    data: Any
    lines: dict[int, int] = field(default_factory=dict)
    item_lines: dict[tuple[int, Hashable], int] = field(default_factory=dict)
    # Containers made while normalising are kept alive, so their ids stay theirs.
    made: list[Any] = field(default_factory=list)

    def remember(self, made: Any, line: int | None) -> None:
        self.made.append(made)
        if line:
            self.lines[id(made)] = line

    def line(self, parent: Any, key: Hashable, value: Any = None) -> int | None:
        if isinstance(value, dict | list) and id(value) in self.lines:
            return self.lines[id(value)]
        return self.item_lines.get((id(parent), key)) or self.lines.get(id(parent))

    def error(self, parent: Any, key: Hashable, value: Any, path: str, problem: str) -> SpecError:
        where = f"{path}: " if path else ""
        return SpecError(self.source, self.line(parent, key, value), where + problem)


def parse(source: str, text: str, *, as_json: bool) -> Doc:
    if not text.strip():
        raise SpecError(source, None, "the file is empty; it needs actions or a workflow")
    looks_json = text.lstrip()[:1] in ("{", "[")
    if as_json or looks_json:
        try:
            return Doc(source, json.loads(text, object_pairs_hook=_no_duplicates(source)))
        except json.JSONDecodeError as exc:
            if as_json:
                raise SpecError(source, exc.lineno, f"invalid JSON: {exc.msg}") from None
            # A YAML flow mapping also starts with a brace; let YAML have a go.
    return _parse_yaml(source, text)


def _no_duplicates(source: str) -> Any:
    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise SpecError(source, None, f"duplicate key {key!r}")
            out[key] = value
        return out

    return hook


class _Loader(yaml.SafeLoader):
    """SafeLoader that remembers lines and refuses duplicate keys."""

    def __init__(self, source: str, text: str) -> None:
        super().__init__(text)
        self.doc = Doc(source, None)


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, Hashable):
            raise SpecError(loader.doc.source, line, "a mapping key must be a plain value")
        if key in out:
            raise SpecError(loader.doc.source, line, f"duplicate key {key!r}")
        out[key] = loader.construct_object(value_node, deep=True)
        loader.doc.item_lines[(id(out), key)] = value_node.start_mark.line + 1
    loader.doc.lines[id(out)] = node.start_mark.line + 1
    return out


def _construct_sequence(loader: _Loader, node: yaml.SequenceNode) -> list[Any]:
    out = [loader.construct_object(child, deep=True) for child in node.value]
    for i, child in enumerate(node.value):
        loader.doc.item_lines[(id(out), i)] = child.start_mark.line + 1
    loader.doc.lines[id(out)] = node.start_mark.line + 1
    return out


_Loader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)


def _parse_yaml(source: str, text: str) -> Doc:
    loader = _Loader(source, text)
    try:
        loader.doc.data = loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        raise SpecError(source, *_yaml_problem(exc)) from None
    except yaml.YAMLError as exc:
        raise SpecError(source, None, f"invalid YAML: {' '.join(str(exc).split())}") from None
    finally:
        loader.dispose()
    return loader.doc


def _yaml_problem(exc: yaml.MarkedYAMLError) -> tuple[int | None, str]:
    """PyYAML's context ("while parsing a block mapping", at its own line) then its
    problem, at the line and column reported."""
    mark = exc.problem_mark or exc.context_mark
    text = "invalid YAML: "
    if exc.context:
        text += exc.context
        if exc.context_mark is not None and exc.problem:
            text += f" on line {exc.context_mark.line + 1}"
        text += ", " if exc.problem else ""
    text += exc.problem or ""
    if mark is not None:
        text += f" (column {mark.column + 1})"
    return (mark.line + 1 if mark is not None else None), text
