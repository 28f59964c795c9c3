"""`make setup`'s install step as a fresh machine runs it: the project installed editable
from the files of a clean clone, with no warning from the build backend, and what the
Makefile's targets import (the generated `amc` package, `scripts.launch`) importable."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(300)


def clone(into: Path) -> Path:
    """The files a clean clone has (tracked or not ignored), nothing generated."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, into / name)
    return into


def install_command() -> list[str]:
    """The Makefile's `pip install -e` line, as words."""
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(r"^\t\$\(PY\) -m pip install --quiet (-e .*)$", makefile, re.MULTILINE)
    assert match, "the Makefile installs the project with `$(PY) -m pip install --quiet -e …`"
    return [word.strip("'") for word in match.group(1).split()]


def test_the_editable_install_prints_no_build_backend_warning(tmp_path: Path) -> None:
    """THEN pip says nothing (no setuptools "compat editable mode" block), and the
    checkout's root is on the installed project's path: the generated `amc.v1` and
    `scripts.launch` import from it."""
    source = clone(tmp_path / "clone")
    venv = tmp_path / "venv"
    venv_argv = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
    subprocess.run(venv_argv, check=True, timeout=120)
    python = venv / "bin" / "python"
    # pip, setuptools and the dependencies come from this virtualenv (no index): only the
    # install step runs.
    here = sysconfig.get_paths()["purelib"]
    there = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(there) / "test-deps.pth").write_text(here + "\n")
    words = [w.replace(".[dev]", ".") for w in install_command()]
    done = subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            *words,
        ],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "", done.stderr
    probe = subprocess.run(
        [str(python), "-c", "import amc.v1.task_pb2, scripts.launch as s; print(s.__file__)"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    assert Path(probe.stdout.strip()) == source / "scripts" / "launch.py"
