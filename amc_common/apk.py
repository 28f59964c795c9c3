"""What an APK says of itself: its package, version and SDK levels, read from the binary
AndroidManifest.xml inside it by apkInspector (a small pure-Python parser, no
dependencies), for the control plane's app library and the phones that install an APK
without being one (the simulated phones, the tests' fake phone).

An APK is a ZIP archive holding `AndroidManifest.xml` in Android's binary XML; only that
entry is read (the standard library's zipfile finds it from the archive's end, so a large
APK on disk is never read whole). Anything else is refused with `NotAnApk`, whose text is
one line saying what was wrong.

apkInspector sets up the root logger when it is imported (`logging.basicConfig` at DEBUG)
and logs its parse warnings through `logging.warning` (which sets the root logger up too
when it has no handler yet): it is imported and called here with the root logger's
handlers and level put back as they were after, and the records it logs dropped by a
filter on the root logger (they are about the file, which is refused anyway).
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import re
import xml.etree.ElementTree as ET
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MANIFEST = "AndroidManifest.xml"
# A manifest bigger than this is not one (real ones are tens of KiB).
MAX_MANIFEST_BYTES = 8 * 1024 * 1024
_ANDROID = "{http://schemas.android.com/apk/res/android}"
# Whole-string pattern (fullmatch only).
_PACKAGE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+")


class NotAnApk(ValueError):
    """The file is not an APK we can read; the message says why, in one line."""


@dataclass(frozen=True)
class ApkFacts:
    """What the manifest says. `version_name` is as written (a resource reference such as
    `@2131755036` when the APK takes it from its resources); 0 for an SDK level it leaves
    out (a `minSdkVersion` left out means 1 to Android)."""

    package: str
    version_name: str
    version_code: int
    min_sdk: int
    target_sdk: int


def read_apk(source: str | Path | IO[bytes] | bytes) -> ApkFacts:
    """The facts of the APK at `source` (a path, a seekable binary file, or its bytes)."""
    data: str | Path | IO[bytes] = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        with zipfile.ZipFile(data) as archive:
            try:
                entry = archive.getinfo(MANIFEST)
            except KeyError:
                raise NotAnApk(f"not an APK: the archive has no {MANIFEST}") from None
            if entry.file_size > MAX_MANIFEST_BYTES:
                raise NotAnApk(f"not an APK: its {MANIFEST} is {entry.file_size} bytes")
            raw = archive.read(entry)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError):
        raise NotAnApk("not an APK: not a ZIP archive") from None
    except (NotImplementedError, RuntimeError) as exc:  # an unknown compression, encryption
        raise NotAnApk(f"not an APK: its {MANIFEST} cannot be extracted ({exc})") from None
    return read_manifest(raw)


def read_manifest(raw: bytes) -> ApkFacts:
    """The facts of a binary AndroidManifest.xml."""
    try:
        with _root_logger_kept():
            text = _decoder()(io.BytesIO(raw))
        root = ET.fromstring(text)
    except Exception:  # the parser raises whatever broken input makes it raise
        raise NotAnApk(f"not an APK: its {MANIFEST} is not Android binary XML") from None
    if root.tag != "manifest":
        raise NotAnApk(f"not an APK: its {MANIFEST} has no <manifest> element")
    package = root.get("package", "")
    if not _PACKAGE.fullmatch(package):
        raise NotAnApk(f"not an APK: its manifest names no valid package ({package!r})")
    sdk = root.find("uses-sdk")
    return ApkFacts(
        package=package,
        version_name=root.get(f"{_ANDROID}versionName", ""),
        version_code=_number(root.get(f"{_ANDROID}versionCode")),
        min_sdk=_number(sdk.get(f"{_ANDROID}minSdkVersion") if sdk is not None else None),
        target_sdk=_number(sdk.get(f"{_ANDROID}targetSdkVersion") if sdk is not None else None),
    )


@contextlib.contextmanager
def _root_logger_kept() -> Iterator[None]:
    """The root logger's handlers and level as they were before, whatever the block did."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


@functools.cache
def _decoder() -> Any:
    """apkInspector's manifest decoder (imported on first use, under _root_logger_kept)."""
    from apkInspector.axml import get_manifest

    logging.getLogger().addFilter(_not_apkinspector)
    return get_manifest


def _not_apkinspector(record: logging.LogRecord) -> bool:
    return "apkInspector" not in record.pathname


def _number(text: str | None) -> int:
    """A whole number as the manifest writes it (decimal, or 0x… hex); 0 if absent or not
    a number (a resource reference)."""
    if not text:
        return 0
    try:
        return int(text, 0)
    except ValueError:
        return 0
