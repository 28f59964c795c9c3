#!/usr/bin/env python3
"""Fetches a real, signed APK to try the app library with (`amc apps upload`): Appium's
settings app, io.appium.settings 3.0.0 (Apache-2.0; 1.2 MB, minSdkVersion 18), from the
npm registry, whose package `io.appium.settings` ships it as apks/settings_apk-debug.apk.
Only the standard library: no npm needed.

    python3 scripts/fetch_example_apk.py settings.apk
"""

import hashlib
import io
import sys
import tarfile
import urllib.request

URL = "https://registry.npmjs.org/io.appium.settings/-/io.appium.settings-3.0.0.tgz"
# The registry's sha1 of that tarball (its `dist.shasum`).
TARBALL_SHA1 = "ca40ea8fcfa1859bed86268198b5c8f7d3b09e29"
MEMBER = "package/apks/settings_apk-debug.apk"


def main() -> int:
    target = sys.argv[1] if len(sys.argv) > 1 else "settings.apk"
    with urllib.request.urlopen(URL, timeout=60) as response:
        tarball = response.read()
    if hashlib.sha1(tarball).hexdigest() != TARBALL_SHA1:
        print(
            f"fetch_example_apk: {URL} is not the tarball the registry published", file=sys.stderr
        )
        return 1
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        member = archive.extractfile(MEMBER)
        assert member is not None
        data = member.read()
    with open(target, "wb") as out:
        out.write(data)
    print(f"wrote io.appium.settings 3.0.0 ({len(data)} bytes) to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
