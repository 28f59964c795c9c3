"""The store's statements sit beside the module that sends them: each `store/<aggregate>.sql`
holds exactly the statements `store/<aggregate>.py` sends, so a transition's SQL is found
from the method that runs it (the rule in control_plane/store/__init__.py's docstring)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from control_plane.store import schema
from control_plane.store.sql import load

STORE = Path(__file__).resolve().parent.parent / "control_plane" / "store"
# A statement sent by name: db.fetch("x", ...), db.fetchrow("x", ...) or Q["x"].
SENT = re.compile(r"""(?:\.fetch|\.fetchrow|\bQ\[)\(?\s*"(\w+)\"""")


def _aggregate(sql: Path) -> str:
    """leases.acquire.sql -> leases: an aggregate's SQL may go on in <aggregate>.<part>.sql."""
    return sql.name.split(".", 1)[0]


@pytest.mark.parametrize("aggregate", sorted({_aggregate(p) for p in STORE.glob("*.sql")}))
def test_each_store_module_sends_exactly_the_statements_of_its_sql_files(aggregate: str) -> None:
    module = STORE / f"{aggregate}.py"
    assert module.exists(), f"store/{aggregate}*.sql has no module {module.name} beside it"
    files = [p for p in STORE.glob("*.sql") if _aggregate(p) == aggregate]
    named = {name for p in files for name in load(p.read_text("utf-8"))}
    sent = set(SENT.findall(module.read_text("utf-8")))
    assert named == sent, f"only in the .sql: {named - sent}; only in {module.name}: {sent - named}"


def test_every_store_module_that_sends_statements_has_its_sql_file() -> None:
    senders = [p.name for p in STORE.glob("*.py") if SENT.search(p.read_text("utf-8"))]
    missing = [n for n in senders if not (STORE / n).with_suffix(".sql").exists()]
    assert not missing, f"statements sent by {missing} are not in a .sql file beside them"


def test_the_functions_sit_with_their_aggregate_and_the_schema_applies_them() -> None:
    """THEN schema.sql defines no function; each store/*.sql that does is one the schema
    applies after it (store/schema.py FUNCTIONS), and every one of those defines some."""
    assert "CREATE OR REPLACE FUNCTION" not in (STORE.parent / "schema.sql").read_text("utf-8")
    defining = {
        p.stem for p in STORE.glob("*.sql") if "FUNCTION" in schema.functions(p.read_text())
    }
    assert defining == set(schema.FUNCTIONS)
