"""The app library: APKs (with what their manifests say) and files for tasks to push, each
kept once by the sha256 of its bytes, and who uploaded it."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Uploader:
    """Who uploads: the token's name (its id when it has none; "anonymous" without
    authentication), the token's id and team. Clients may remove what their own token or
    their team uploaded."""

    name: str
    token_id: uuid.UUID | None
    team: str


@dataclass(frozen=True)
class Blob:
    """Bytes of the library: an APK or a file, by its sha256."""

    sha256: bytes
    size_bytes: int

    @property
    def id(self) -> str:
        """The id the API names it by: the sha256 in lowercase hex."""
        return self.sha256.hex()


@dataclass(frozen=True)
class NewApp:
    """An APK as uploaded: its bytes' digest and size, what its manifest says, its name."""

    blob: Blob
    package: str
    version_name: str
    version_code: int
    min_sdk: int
    target_sdk: int
    file_name: str


@dataclass(frozen=True)
class App(NewApp):
    """An app of the library."""

    uploader: Uploader
    created_at: datetime


@dataclass(frozen=True)
class LibraryFile:
    """A file of the library, for tasks to push to their phones."""

    blob: Blob
    file_name: str
    uploader: Uploader
    created_at: datetime
