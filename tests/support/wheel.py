"""The wheel as an operator gets it, built once per test session from the files of a clean
clone (as `make dist` does), and installed once into a fresh virtualenv as the install
recipes do (README's host install, docs/deploy.md): the session fixtures `dist` and
`prefix`, registered in conftest.py so that every test module shares the one build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


@dataclass(frozen=True)
class Dist:
    wheel: Path
    sdist: Path


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """`python -m build` on the files a clean clone has: the sdist, then the wheel from it."""
    source = tmp_path_factory.mktemp("clone")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    assert not (source / "amc").exists(), "the generated package is not part of a clone"
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], timeout=300)
    (wheel,) = out.glob("agentic_mobile_control-*.whl")  # the README's glob
    (sdist,) = out.glob("agentic_mobile_control-*.tar.gz")
    return Dist(wheel, sdist)


@pytest.fixture(scope="session")
def prefix(dist: Dist, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's host install, into a temporary prefix instead of /opt/amc."""
    prefix = tmp_path_factory.mktemp("opt") / "amc"
    run([sys.executable, "-m", "venv", str(prefix)])
    run([str(prefix / "bin" / "pip"), "install", "--quiet", str(dist.wheel)], timeout=300)
    return prefix


def run(argv: list[str], *, timeout: float = 120) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv[:4]} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done.stdout
