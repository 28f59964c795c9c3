"""The console's Apps page in a real browser (Playwright on the system's Chromium): the app
library listed with what each APK's manifest says, an APK uploaded through the page's form
(its SHA-256 computed by the browser, checked by the control plane), a file that is not an
APK refused in one line, and an app removed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from control_plane.domain import Role
from tests.support import Farm
from tests.support.apks import NEW, OLD, ApkFile, apk_cache, new_apk, old_apk
from tests.support.library import library, upload_app
from tests.test_console import DOCS, browser, farm, open_page, pytestmark

__all__ = ["apk_cache", "browser", "farm", "new_apk", "old_apk", "pytestmark"]


# How long an upload through the page may take (its hash, its transfer, its manifest read).
UPLOAD_MS = 60_000


async def rows(farm: Farm) -> int:
    assert farm.db is not None
    return int(await farm.db.fetchval("SELECT count(*) FROM library_apps"))


async def test_the_apps_page_lists_uploads_and_removes_apps(
    farm: Farm, browser: Any, old_apk: ApkFile, new_apk: ApkFile, tmp_path: Path
) -> None:
    token = await farm.token(Role.OPERATOR)
    await upload_app(library(farm, token), new_apk.data, "settings-5.apk")
    page = await open_page(browser, farm, "/apps", token)
    await page.locator(f"tr[data-app='{NEW.sha256}']").wait_for()
    await page.get_by_label("APK file").set_input_files(str(old_apk.path))
    await page.get_by_role("button", name="Upload").click()
    # The browser hashes the APK, uploads it and the control plane reads its manifest: more
    # than the pages' usual 15 s on a loaded machine.
    kept = page.locator("#upload-message", has_text="kept io.appium.settings 3.0.0")
    await kept.wait_for(timeout=UPLOAD_MS)
    old = page.locator(f"tr[data-app='{OLD.sha256}']")
    await old.wait_for()
    cells = {
        name: await old.locator(f"td.{name}").inner_text()
        for name in ("package", "version", "min-sdk", "size", "sha256", "uploaded-by")
    }
    assert cells == {
        "package": "io.appium.settings", "version": "3.0.0 (24)", "min-sdk": "18",
        "size": "1.2 MiB", "sha256": OLD.sha256, "uploaded-by": "test",
    }  # fmt: skip
    assert await page.locator("#apps tbody tr td.package").all_inner_texts() == [
        "io.appium.settings", "io.appium.settings",
    ]  # fmt: skip
    assert await rows(farm) == 2
    await page.screenshot(path=str(DOCS / "console-apps.png"), full_page=True)

    text = tmp_path / "notes.apk"
    text.write_text("not an apk\n")
    await page.get_by_label("APK file").set_input_files(str(text))
    await page.get_by_role("button", name="Upload").click()
    refusal = page.locator(
        "#upload-message.error-text",
        has_text="INVALID_ARGUMENT: file: not an APK: not a ZIP archive; nothing was kept",
    )
    await refusal.wait_for(timeout=UPLOAD_MS)
    assert await rows(farm) == 2

    page.on("dialog", lambda dialog: dialog.accept())
    await old.get_by_role("button", name="Remove").click()
    await page.locator("#upload-message", has_text="removed io.appium.settings 3.0.0").wait_for()
    await old.wait_for(state="detached")
    assert await rows(farm) == 1
    assert page.errors == []
