"""`amc apps` and `amc files` as a person runs them (the `amc` process against a real
control plane): an APK uploaded, listed and removed, a spec's `apps:` submitted, and every
mistake one line with its exit code, before anything is sent where it can be told."""

from __future__ import annotations

from pathlib import Path

from control_plane.domain import Role
from tests.support import Farm
from tests.support.apks import NEW, OLD, ApkFile, apk_cache, new_apk, old_apk
from tests.test_cli import Cli, amc

__all__ = ["amc", "apk_cache", "new_apk", "old_apk"]


async def test_an_apk_is_uploaded_listed_and_removed(
    amc: Cli, farm: Farm, old_apk: ApkFile, new_apk: ApkFile
) -> None:
    """THEN upload says what the manifest says and the id; a second upload of the same file
    answers the same app; list shows both versions, newest first; rm by package is refused
    while it names two versions, and removes one named by its id's start."""
    run = await amc("apps", "upload", str(old_apk.path))
    assert run.code == 0, run.err
    assert run.out.strip() == (
        f"kept io.appium.settings 3.0.0 (version code 24, min SDK 18, 1.2 MiB) as {OLD.sha256}"
    )
    again = await amc("apps", "upload", str(old_apk.path), "-o", "json")
    assert again.code == 0 and again.json()["app_id"] == OLD.sha256
    assert (await amc("apps", "upload", str(new_apk.path))).code == 0
    listed = await amc("apps", "list")
    assert listed.code == 0
    rows = [line for line in listed.out.splitlines() if "io.appium.settings" in line]
    assert [r.split()[0] for r in rows] == [NEW.sha256[:12], OLD.sha256[:12]]
    assert "5.0.0" in rows[0] and "3.0.0" in rows[1]
    both = await amc("apps", "rm", "io.appium.settings")
    assert both.code == 2
    assert "io.appium.settings has 2 versions in the library" in both.assert_one_error_line()
    removed = await amc("apps", "rm", OLD.sha256[:8])
    assert removed.code == 0 and removed.out.startswith("removed io.appium.settings 3.0.0")
    listed = await amc("apps", "list", "-o", "json")
    assert [a["app_id"] for a in listed.json()["apps"]] == [NEW.sha256]


async def test_a_file_for_tasks_to_push_is_uploaded_listed_and_removed(
    amc: Cli, tmp_path: Path
) -> None:
    data = tmp_path / "fixture.json"
    data.write_text('{"user": "alice"}\n')
    run = await amc("files", "upload", str(data), "-o", "json")
    assert run.code == 0, run.err
    file_id = run.json()["file_id"]
    listed = await amc("files", "list")
    assert file_id[:12] in listed.out and "fixture.json" in listed.out
    assert (await amc("files", "rm", file_id[:10])).code == 0
    assert "the library has no files" in (await amc("files", "list")).out


async def test_upload_mistakes_are_one_line_and_send_nothing(
    amc: Cli, farm: Farm, tmp_path: Path
) -> None:
    """THEN a missing file, a folder and a file that is not an APK are refused in one line
    (exit 2) naming the file and why, and the library stays empty; an unknown app to
    remove is not found (exit 3)."""
    text = tmp_path / "notes.apk"
    text.write_text("not a zip\n")
    cases = [
        (str(tmp_path / "missing.apk"), "missing.apk: no such file"),
        (str(tmp_path), "not a file"),
        (str(text), "notes.apk: not an APK: not a ZIP archive"),
    ]
    for path, words in cases:
        run = await amc("apps", "upload", path)
        assert run.code == 2, (path, run.err)
        assert words in run.assert_one_error_line()
    assert farm.db is not None
    assert await farm.db.fetchval("SELECT count(*) FROM library_blobs") == 0
    gone = await amc("apps", "rm", "com.example.none")
    assert gone.code == 3 and "the library has no app com.example.none" in gone.err


async def test_a_client_may_not_remove_another_teams_app(
    amc: Cli, farm: Farm, old_apk: ApkFile
) -> None:
    assert (await amc("apps", "upload", str(old_apk.path))).code == 0
    client = await farm.token(Role.CLIENT)
    run = await amc("apps", "rm", OLD.sha256, token=client)
    assert run.code == 6
    assert "only an operator, that token or its team may remove it" in run.assert_one_error_line()


async def test_a_spec_files_apps_are_submitted_and_an_unknown_one_refused(
    amc: Cli, old_apk: ApkFile, tmp_path: Path
) -> None:
    """THEN `apps:` with a package and an id goes into the spec; a package the library
    lacks is NOT_FOUND (exit 3), naming the field, and one that is no package is refused by
    amc itself (exit 2) with its line."""
    assert (await amc("apps", "upload", str(old_apk.path))).code == 0
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"apps:\n  - io.appium.settings\n  - {{app: {OLD.sha256}, grant_permissions: true}}\n"
        "actions:\n  - launch_app: io.appium.settings\n"
    )
    task = await amc.submit(str(spec))
    apps = task["spec"]["apps"]
    assert apps == [
        {"app": "io.appium.settings", "replace": False, "grant_permissions": False},
        {"app": OLD.sha256, "replace": False, "grant_permissions": True},
    ]
    spec.write_text("apps: [com.example.none]\nactions:\n  - tap: [1, 2]\n")
    missing = await amc("submit", str(spec))
    assert missing.code == 3
    assert "spec.apps[0].app: the library has no app of package com.example.none" in missing.err
    spec.write_text("apps: [not a package]\nactions:\n  - tap: [1, 2]\n")
    bad = await amc("submit", str(spec))
    assert bad.code == 2 and "spec.yaml:1: apps[0].app: must be an app id" in bad.err
