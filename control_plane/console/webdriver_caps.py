"""Reads a WebDriver new-session request (W3C capabilities) as the interactive session it
asks for: the phone's selector, its apps, timeouts and priority, and the capabilities left
for Appium.

W3C's processing: `capabilities.alwaysMatch` merged with each of `firstMatch` in turn (a
name in both is refused), the first merged set that is valid taken. A name that is
neither a standard capability nor an extension one (`vendor:name`) is refused, as W3C
says; so is an `amc:` name AMC does not know. What AMC reads:

- `platformName`: required, `Android` (any case).
- `appium:app`: an app of the library, by id or package (installed before the session's
  first command, as a session's `apps`); not passed to Appium. Any other `appium:`
  capability goes to Appium as given (`appium:automationName`, `appium:appPackage`, ...).
- `appium:udid`: the phone's serial; `appium:deviceName`: its `model` label; `amc:labels`:
  an object of labels the phone must have. Together they are the session's selector,
  with `appium=yes`: the label of a host that runs Appium (the host agent's `--appium`;
  not added to a maintenance session's, which names one phone and nothing else).
- `amc:queueTimeout` (seconds, default 300): how long the request waits for a phone;
  `amc:idleTimeout` (seconds, 1 to 3600, default 60, as Appium's newCommandTimeout): a
  session sent no command for that long ends; `amc:priority` (a whole number).
- `amc:maintenance` (true): an operator's maintenance session (OpenSession's rules).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from google.protobuf import duration_pb2

from amc.v1 import scheduler_pb2, task_pb2
from amc_common.device_selector import APPIUM_LABEL, APPIUM_YES
from control_plane.errors import InvalidArgument

STANDARD = frozenset({
    "acceptInsecureCerts", "browserName", "browserVersion", "platformName",
    "pageLoadStrategy", "proxy", "setWindowRect", "timeouts", "strictFileInteractability",
    "unhandledPromptBehavior", "webSocketUrl", "userAgent",
})  # fmt: skip
AMC = frozenset({
    "amc:labels", "amc:queueTimeout", "amc:idleTimeout", "amc:priority", "amc:maintenance",
})  # fmt: skip
# What AMC takes for itself and does not pass on to Appium.
TAKEN = AMC | {"appium:app"}
DEFAULT_QUEUE_TIMEOUT = 300.0
DEFAULT_IDLE_TIMEOUT = 60.0
MAX_IDLE_TIMEOUT = 3600.0
MAX_QUEUE_TIMEOUT = 30 * 86400.0
METADATA = {"webdriver": "session"}


@dataclass(frozen=True)
class NewSession:
    """What a new-session request asks: the opening of its session, and the capabilities
    passed on to Appium (as one `alwaysMatch`)."""

    open: scheduler_pb2.SessionOpen
    caps: dict[str, Any]

    def appium_request(self) -> bytes:
        return json.dumps({"capabilities": {"alwaysMatch": self.caps, "firstMatch": [{}]}}).encode()


def parse(body: bytes) -> NewSession:
    """The request's body as a NewSession; InvalidArgument naming what is wrong."""
    try:
        document = json.loads(body)
    except ValueError:
        raise InvalidArgument("body", "not JSON") from None
    capabilities = document.get("capabilities") if isinstance(document, dict) else None
    if not isinstance(capabilities, dict):
        raise InvalidArgument("capabilities", "required: W3C capabilities (an object)")
    always = capabilities.get("alwaysMatch", {})
    first = capabilities.get("firstMatch", [{}])
    if not isinstance(always, dict):
        raise InvalidArgument("capabilities.alwaysMatch", "an object")
    if not isinstance(first, list) or not first or not all(isinstance(f, dict) for f in first):
        raise InvalidArgument("capabilities.firstMatch", "a list of objects")
    _names(always)
    refusal: InvalidArgument | None = None
    for extra in first:
        _names(extra)
        both = sorted(set(always) & set(extra))
        if both:
            raise InvalidArgument(both[0], "in both alwaysMatch and firstMatch")
        try:
            return _session({**always, **extra})
        except InvalidArgument as exc:
            refusal = refusal or exc
    assert refusal is not None
    raise refusal


def _names(caps: dict[str, Any]) -> None:
    for name in caps:
        if name not in STANDARD and ":" not in name:
            raise InvalidArgument(name, "not a W3C capability, nor an extension (vendor:name)")
        if name.startswith("amc:") and name not in AMC:
            raise InvalidArgument(name, f"not an AMC capability (those are {', '.join(AMC)})")


def _session(caps: dict[str, Any]) -> NewSession:
    platform = caps.get("platformName")
    if not isinstance(platform, str) or platform.lower() != "android":
        raise InvalidArgument("platformName", "required: Android (this farm's phones)")
    selector = task_pb2.DeviceSelector(serial=_text(caps, "appium:udid"))
    model = _text(caps, "appium:deviceName")
    if model:
        selector.labels["model"] = model
    labels = caps.get("amc:labels", {})
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise InvalidArgument("amc:labels", "an object of label names to text values")
    selector.labels.update(labels)
    opening = scheduler_pb2.SessionOpen(
        selector=selector,
        idle_timeout=_seconds(caps, "amc:idleTimeout", DEFAULT_IDLE_TIMEOUT, MAX_IDLE_TIMEOUT),
        queue_timeout=_seconds(caps, "amc:queueTimeout", DEFAULT_QUEUE_TIMEOUT, MAX_QUEUE_TIMEOUT),
        priority=_whole(caps, "amc:priority"),
        metadata=METADATA,
        webdriver=True,
    )
    maintenance = caps.get("amc:maintenance", False)
    if not isinstance(maintenance, bool):
        raise InvalidArgument("amc:maintenance", "true or false")
    opening.maintenance = maintenance
    if not maintenance:  # (a maintenance session names its phone, and nothing else)
        opening.selector.labels[APPIUM_LABEL] = APPIUM_YES  # a host running Appium (--appium)
    app = _text(caps, "appium:app")
    if app:
        opening.apps.append(task_pb2.InstallApp(app=app, replace=True, grant_permissions=True))
    return NewSession(opening, {k: v for k, v in caps.items() if k not in TAKEN})


def _text(caps: dict[str, Any], name: str) -> str:
    value = caps.get(name, "")
    if not isinstance(value, str):
        raise InvalidArgument(name, "text")
    return value


def _seconds(caps: dict[str, Any], name: str, default: float, most: float) -> duration_pb2.Duration:
    value = caps.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidArgument(name, "a number of seconds")
    if not 1 <= value <= most:
        raise InvalidArgument(name, f"between 1 and {most:.0f} seconds")
    d = duration_pb2.Duration()
    d.FromMilliseconds(round(value * 1000))
    return d


def _whole(caps: dict[str, Any], name: str) -> int:
    value = caps.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(name, "a whole number")
    if abs(value) > 1_000_000:
        raise InvalidArgument(name, "between -1000000 and 1000000")
    return value
