"""The client library's API pages (docs/api/): amc_client's public names, the action
builders and the retry policy, rendered from their docstrings by pdoc.

    python scripts/api_docs.py            # writes docs/api/
    python scripts/api_docs.py --out DIR  # elsewhere (the test compares the two)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pdoc
import pdoc.render

ROOT = Path(__file__).resolve().parent.parent
# What a user of the library imports: the package's names, and the modules named in its
# docstring's examples.
MODULES = ("amc_client", "amc_client.actions", "amc_client.retry")


def write(out: Path) -> list[Path]:
    """The pages, written to `out`; the HTML files written."""
    pdoc.render.configure(show_source=False, search=False, docformat="markdown")
    pdoc.pdoc(*MODULES, output_directory=out)
    return sorted(out.rglob("*.html"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "api")
    args = parser.parse_args()
    for page in write(args.out):
        print(page.relative_to(args.out))


if __name__ == "__main__":
    main()
