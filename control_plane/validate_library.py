"""Checks on the app library's requests (amc.v1.Library, and a host's Lease.FindApp and
Lease.FetchFile), at the gRPC edge: an upload's header, app and file ids, package names."""

from __future__ import annotations

import re

from amc.v1 import library_pb2
from control_plane.errors import InvalidArgument, TooLargeForLibrary
from control_plane.validate import printable

MAX_FILE_NAME = 255
# Whole-string patterns (fullmatch only).
_DIGEST = re.compile(r"[0-9a-f]{64}")
_PACKAGE = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+")


def upload_header(h: library_pb2.UploadHeader, max_size: int, field: str = "header") -> bytes:
    """An upload's header; its sha256 as bytes. Past `max_size`: TooLargeForLibrary, before
    any byte is read."""
    name = h.file_name
    if not name:
        raise InvalidArgument(f"{field}.file_name", "required")
    if len(name) > MAX_FILE_NAME:
        raise InvalidArgument(f"{field}.file_name", f"longer than {MAX_FILE_NAME} characters")
    if "/" in name or name in (".", ".."):
        raise InvalidArgument(f"{field}.file_name", "a file's own name, without its folder")
    printable(name, f"{field}.file_name")
    if h.size_bytes <= 0:
        raise InvalidArgument(f"{field}.size_bytes", "must be 1 or more")
    if h.size_bytes > max_size:
        raise TooLargeForLibrary(
            f"{field}.size_bytes: {h.size_bytes} bytes is over this control plane's limit of"
            f" {max_size} bytes (--max-app-size); nothing was kept"
        )
    return digest(h.sha256, f"{field}.sha256")


def digest(value: str, field: str) -> bytes:
    """An app or file id: a sha256 as 64 lowercase hex digits."""
    if not value:
        raise InvalidArgument(field, "required")
    if not _DIGEST.fullmatch(value):
        raise InvalidArgument(field, "must be 64 lowercase hex digits (a sha256)")
    return bytes.fromhex(value)


def app_ref(value: str, field: str = "app") -> tuple[bytes | None, str | None]:
    """An app, by its id or its package: (sha256, None) or (None, package)."""
    if _DIGEST.fullmatch(value):
        return bytes.fromhex(value), None
    if not value:
        raise InvalidArgument(field, "required: an app id or a package name")
    if len(value) > MAX_FILE_NAME or not _PACKAGE.fullmatch(value):
        raise InvalidArgument(
            field, "must be an app id (64 lowercase hex digits) or a package name"
        )
    return None, value


def package_filter(value: str, field: str = "package") -> str | None:
    if not value:
        return None
    if len(value) > MAX_FILE_NAME or not _PACKAGE.fullmatch(value):
        raise InvalidArgument(field, "must be a package name, e.g. com.example.app")
    return value
