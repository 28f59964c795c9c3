"""The build hook: every build (wheel, sdist-to-wheel, editable) generates the `amc.v1`
package from protos/ with grpcio-tools, so the generated code is never committed and never
stale. Everything else about the package is in pyproject.toml."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _generate(out: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.generate(out, ROOT / "protos")


class BuildPyWithProtos(build_py):
    """build_py, then the `amc` package generated into the build (an editable install
    imports from the checkout, so there it is generated in place, as `make protos` does)."""

    def run(self) -> None:
        super().run()
        _generate(ROOT if self.editable_mode else Path(self.build_lib))


setup(cmdclass={"build_py": BuildPyWithProtos})
