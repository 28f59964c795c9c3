"""The client library's API pages (docs/api/, written by `make api-docs` with pdoc) stay in
step with the library: every public name has its entry, and the committed pages document
exactly what a fresh rendering of the docstrings does."""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
from pathlib import Path

import pytest

import amc_client
from amc_client import Farm, Phone, actions, retry

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "api"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pdoc") is None, reason="pdoc is not installed (the dev extra)"
)


def _anchors(page: Path) -> set[str]:
    """The names a page documents (pdoc gives each entry an id)."""
    return set(re.findall(r'id="([A-Za-z_][\w.]*)"', page.read_text()))


def _render(out: Path) -> list[Path]:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import api_docs
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return [p.relative_to(out) for p in api_docs.write(out)]


def test_the_committed_api_pages_document_what_the_docstrings_say_now(tmp_path: Path) -> None:
    """THEN the pages rendered afresh are the committed ones, page for page, and each
    documents the same names (a name added or removed without `make api-docs` fails)."""
    fresh = _render(tmp_path)
    committed = sorted(p.relative_to(API) for p in API.rglob("*.html"))
    assert fresh == committed, "run `make api-docs`"
    for page in fresh:
        assert _anchors(tmp_path / page) == _anchors(API / page), f"{page}: run `make api-docs`"


def _public(cls: type) -> set[str]:
    return {
        f"{cls.__name__}.{name}"
        for name, _ in inspect.getmembers(cls)
        if not name.startswith("_") and name in vars(cls)
    }


def test_every_public_name_of_the_library_has_its_entry() -> None:
    """THEN the package's names, Farm's and Phone's methods and properties, every action
    builder and the retry policy are each documented on their page."""
    package = _anchors(API / "amc_client.html")
    assert set(amc_client.__all__) <= package
    assert _public(Farm) | _public(Phone) <= package
    builders = {
        name
        for name, value in vars(actions).items()
        if inspect.isfunction(value) and value.__module__ == actions.__name__
        if not name.startswith("_")
    }
    assert builders and builders <= _anchors(API / "amc_client" / "actions.html")
    assert {"Retry", "Retry.call", "Reach"} <= _anchors(API / "amc_client" / "retry.html")
    assert retry.Retry.__doc__
