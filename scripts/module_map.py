"""docs/architecture.md's module map: one line per module of the product's packages, each
the first sentence of the module's own docstring (what it does, in its own words).

    python scripts/module_map.py           # print the map
    python scripts/module_map.py --write   # put it into docs/architecture.md

tests/test_architecture_doc.py checks that the map in the document is this one, so a
module cannot be added, moved, removed or re-described without the map following.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("control_plane", "host_agent", "amc_common", "amc_client", "amc_cli", "amc_testing")
BEGIN = "<!-- module map: made by scripts/module_map.py --write; do not edit by hand -->"
END = "<!-- end of the module map -->"


def summary(path: Path) -> str:
    """The first sentence of the module's docstring ('' if it has none)."""
    doc = ast.get_docstring(ast.parse(path.read_text("utf-8"))) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    sentence = re.match(r"(.+?\.)(\s|$)", first)
    return sentence.group(1) if sentence else first


def modules() -> list[Path]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "__init__.py" and not summary(path):
                continue
            found.append(path)
    return found


def table() -> str:
    lines = [BEGIN, "", "| module | what it does |", "|---|---|"]
    for path in modules():
        name = path.relative_to(ROOT).as_posix()
        text = summary(path).replace("|", "\\|") or "**(no docstring)**"
        lines.append(f"| `{name}` | {text} |")
    return "\n".join([*lines, "", END])


def in_document() -> str | None:
    text = DOC.read_text("utf-8")
    if BEGIN not in text or END not in text:
        return None
    return text[text.index(BEGIN) : text.index(END) + len(END)]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--write", action="store_true", help="replace the map in docs/architecture.md")
    args = p.parse_args(argv)
    made = table()
    if not args.write:
        print(made)
        return 0
    text = DOC.read_text("utf-8")
    old = in_document()
    if old is None:
        sys.exit(f"{DOC}: no module map between {BEGIN!r} and {END!r}")
    DOC.write_text(text.replace(old, made), "utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
