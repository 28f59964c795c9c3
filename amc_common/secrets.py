"""Keeping secrets out of log lines and error messages.

`redact(text)` masks, wherever they appear in the text:

* the secret of an AMC token, `amc_<token id>_<secret>` -> `amc_<token id>_***` (the id is
  not secret: `amc tokens list` shows it, and it says which token was used);
* any other bearer token, `Bearer xyz` -> `Bearer ***`;
* the password of a URL, `postgresql://amc:pw@db/amc` -> `postgresql://amc:***@db/amc`;
* `password=...` in a URL's query or a libpq keyword/value string.

Every log line goes through it as rendered (amc_common.logs), tracebacks included;
messages built for people (the one line of a failed start) use it directly.
"""

from __future__ import annotations

import re

MASK = "***"

_TOKEN = re.compile(r"\b(amc_[0-9a-f]{32}_)[A-Za-z0-9_\-]+")
_BEARER = re.compile(r"(?i)\b(bearer\s+)(?!amc_[0-9a-f]{32}_)[^\s'\"]+")
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^\s:/?#@]*:)[^\s@/?#]*@")
_PASSWORD_SETTING = re.compile(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'|[^&\s'\"]+)")
# A cheap test first: most lines carry none of these, and are left alone.
_MAYBE = re.compile(r"(?i)amc_|bearer|://|password")


def redact(text: str) -> str:
    """`text` with every secret in it masked."""
    if not _MAYBE.search(text):
        return text
    text = _TOKEN.sub(rf"\g<1>{MASK}", text)
    text = _BEARER.sub(rf"\g<1>{MASK}", text)
    text = _URL_PASSWORD.sub(rf"\g<1>{MASK}@", text)
    return _PASSWORD_SETTING.sub(rf"\g<1>{MASK}", text)


def mask_url(url: str) -> str:
    """A database URL (or libpq keyword string) fit to print: its password masked."""
    return redact(url)
