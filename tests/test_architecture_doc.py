"""docs/architecture.md's module map matches the tree: every module of the control plane,
the host agent and the shared package is named there, and every module of `amc` in its
package docstring, so a new module cannot land without a line saying what it is."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAP = (ROOT / "docs" / "architecture.md").read_text("utf-8")


def modules(package: str) -> list[str]:
    """The package's modules and subpackages, as the map names them (`x.py`, `x/`)."""
    names = []
    for path in sorted((ROOT / package).iterdir()):
        if path.suffix in (".py", ".sql") and path.stem != "__init__":
            names.append(path.name)
        elif path.is_dir() and (path / "__init__.py").exists():
            names.append(f"{path.name}/")
    return names


@pytest.mark.parametrize("package", ["control_plane", "host_agent", "amc_common"])
def test_the_module_map_names_every_module(package: str) -> None:
    """THEN each module of the package appears in docs/architecture.md as `name.py`."""
    missing = [name for name in modules(package) if f"`{name}" not in MAP]
    assert not missing, f"docs/architecture.md does not mention {package}'s {missing}"


def test_the_cli_package_docstring_names_every_module() -> None:
    """THEN amc_cli/__init__.py's docstring has a line for each of its modules."""
    docstring = ast.get_docstring(ast.parse((ROOT / "amc_cli" / "__init__.py").read_text()))
    listed = {line.split()[0] for line in (docstring or "").splitlines()[1:] if line.strip()}
    missing = [n for n in modules("amc_cli") if n.removesuffix(".py") not in listed]
    assert not missing, f"amc_cli/__init__.py does not list {missing}"


def test_the_module_map_names_every_console_script() -> None:
    """THEN each of the console's ES modules appears in docs/architecture.md as `name.js`."""
    static = ROOT / "control_plane" / "console" / "static"
    missing = [p.name for p in sorted(static.glob("*.js")) if f"`{p.name}`" not in MAP]
    assert not missing, f"docs/architecture.md does not mention the console's {missing}"


def test_the_module_map_is_every_module_in_its_own_words() -> None:
    """THEN the map's table has one line per module of the product's packages, each the
    first sentence of that module's docstring (what it does), and no line for a module
    that is gone: a module added, moved, removed or re-described changes the table
    (`scripts/module_map.py --write`)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import module_map
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    made = module_map.table()
    assert "(no docstring)" not in made, [
        line for line in made.splitlines() if "(no docstring)" in line
    ]
    assert module_map.in_document() == made, (
        "docs/architecture.md's module map is not the tree's: run "
        "`.venv/bin/python scripts/module_map.py --write`"
    )


# What a newcomer reads at one sitting: a module over this is split by role (issue 26).
MOST_LINES = 400


def test_no_product_module_is_over_400_lines() -> None:
    """THEN every Python module of the product's packages, every SQL file the store sends
    and every script of the console is at most MOST_LINES lines (schema.sql's tables and
    the numbered migrations, which never change once shipped, aside)."""
    packages = ("control_plane", "host_agent", "amc_common", "amc_client", "amc_cli")
    paths = [p for package in packages for p in (ROOT / package).rglob("*.py")]
    paths += list((ROOT / "control_plane" / "store").glob("*.sql"))
    paths += list((ROOT / "control_plane" / "console" / "static").glob("*.js"))
    over = {
        str(p.relative_to(ROOT)): n
        for p in paths
        if (n := len(p.read_text("utf-8").splitlines())) > MOST_LINES
    }
    assert not over, f"over {MOST_LINES} lines: {over}"
